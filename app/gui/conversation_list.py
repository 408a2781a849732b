"""`ConversationList`: the sidebar of chats: new, search, select, rename, delete.

It only shows conversations and asks for changes through signals; the window applies them to
the history. Rename and delete ask in dialogs that are opened, not exec'd, so the event loop
(and a reply streaming meanwhile) keeps running while the user decides.

Each chat shows when it was last active under its title ("Today 14:02", "Yesterday", "3 Dec"),
in more detail where two chats of the same title would otherwise read the same, and
"writing a reply…" while its reply streams.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta

from PySide6.QtCore import (
    QModelIndex,
    QPersistentModelIndex,
    QPoint,
    QSize,
    Qt,
    QTimer,
    Signal,
    Slot,
)
from PySide6.QtGui import QAction, QFont, QFontMetrics, QKeySequence, QPainter, QPalette
from PySide6.QtWidgets import (
    QAbstractButton,
    QApplication,
    QInputDialog,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPushButton,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from hearthside.core.history.store import Conversation

SEARCH_DELAY_MS = 150
ID_ROLE = Qt.ItemDataRole.UserRole
TITLE_ROLE = Qt.ItemDataRole.UserRole + 1
WRITING_TEXT = "writing a reply…"


def when_text(updated_at: str, now: datetime, *, detailed: int = 0) -> str:
    """When a chat was last active, in the user's time zone: "Today 14:02", "Yesterday",
    "3 Dec", "3 Dec 2025". `detailed` tells two chats apart: 1 adds the time (and year),
    2 the seconds too. `now` is an aware local datetime."""
    when = datetime.fromisoformat(updated_at).astimezone(now.tzinfo)
    clock = f"{when:%H:%M:%S}" if detailed > 1 else f"{when:%H:%M}"
    day = f"{when.day} {when:%b}"
    if when.date() == now.date():
        return f"Today {clock}"
    if when.date() == (now - timedelta(days=1)).date():
        return f"Yesterday {clock}" if detailed else "Yesterday"
    if detailed:
        return f"{day} {when.year} {clock}"
    return day if when.year == now.year else f"{day} {when.year}"


def when_texts(conversations: Sequence[Conversation], now: datetime) -> list[str]:
    """`when_text` for each chat, in more detail where a same-titled chat reads the same."""
    detail = [0] * len(conversations)
    for level in (1, 2):
        texts = [
            when_text(c.updated_at, now, detailed=d)
            for c, d in zip(conversations, detail, strict=True)
        ]
        alike = Counter(zip((c.title for c in conversations), texts, strict=True))
        detail = [
            level if alike[(c.title, text)] > 1 else d
            for c, text, d in zip(conversations, texts, detail, strict=True)
        ]
    return [
        when_text(c.updated_at, now, detailed=d) for c, d in zip(conversations, detail, strict=True)
    ]


class _ChatItemDelegate(QStyledItemDelegate):
    """Draws a chat as its title over a smaller, muted line saying when it was active."""

    def paint(
        self,
        painter: QPainter,
        option: QStyleOptionViewItem,
        index: QModelIndex | QPersistentModelIndex,
    ) -> None:
        item = QStyleOptionViewItem(option)
        self.initStyleOption(item, index)
        title, _, when = str(index.data(Qt.ItemDataRole.DisplayRole)).partition("\n")
        item.text = ""
        style = item.widget.style() if item.widget is not None else QApplication.style()
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, item, painter, item.widget)
        selected = bool(item.state & QStyle.StateFlag.State_Selected)
        text_role = QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text
        muted_role = text_role if selected else QPalette.ColorRole.PlaceholderText
        rect = item.rect.adjusted(6, 3, -6, -3)
        painter.save()
        painter.setFont(item.font)
        painter.setPen(item.palette.color(text_role))
        metrics = QFontMetrics(item.font)
        elided = metrics.elidedText(title, Qt.TextElideMode.ElideRight, rect.width())
        painter.drawText(rect, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop, elided)
        painter.setFont(_small(item.font))
        painter.setPen(item.palette.color(muted_role))
        painter.drawText(rect, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignBottom, when)
        painter.restore()

    def sizeHint(
        self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
    ) -> QSize:  # noqa: N802
        size = super().sizeHint(option, index)
        lines = QFontMetrics(option.font).height() + QFontMetrics(_small(option.font)).height()
        return QSize(size.width(), lines + 8)


def _small(font: QFont) -> QFont:
    smaller = QFont(font)
    smaller.setPointSizeF(max(font.pointSizeF() * 0.85, 6.0))
    return smaller


class ConversationList(QWidget):
    conversation_selected = Signal(int)
    new_requested = Signal()
    rename_requested = Signal(int, str)
    delete_requested = Signal(int)
    search_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.new_button = QPushButton("New chat", self)
        self.new_button.setToolTip("Start a new chat (Ctrl+N)")
        self.new_button.clicked.connect(self.new_requested)
        self.search_box = QLineEdit(self)
        self.search_box.setPlaceholderText("Search chats")
        self.search_box.setClearButtonEnabled(True)
        self.search_box.setAccessibleName("Search chats")
        self.list = QListWidget(self)
        self.list.setAccessibleName("Chats")
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setItemDelegate(_ChatItemDelegate(self.list))
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._show_menu)
        self.list.currentItemChanged.connect(self._on_current_changed)
        self._search_timer = QTimer(self, singleShot=True, interval=SEARCH_DELAY_MS)
        self._search_timer.timeout.connect(self._emit_search)
        self.search_box.textChanged.connect(self._search_timer.start)
        self.rename_action = self._list_action("Rename…", QKeySequence(Qt.Key.Key_F2), self.rename)
        self.delete_action = self._list_action(
            "Delete…", QKeySequence(QKeySequence.StandardKey.Delete), self.delete
        )
        self.dialog: QInputDialog | QMessageBox | None = None  # the open question, if any
        self._layout()

    def _layout(self) -> None:
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search_box)
        layout.addWidget(self.list, 1)
        self.setTabOrder(self.new_button, self.search_box)
        self.setTabOrder(self.search_box, self.list)

    def _list_action(self, text: str, shortcut: QKeySequence, slot: object) -> QAction:
        action = QAction(text, self.list)
        action.setShortcut(shortcut)
        action.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
        action.triggered.connect(slot)
        self.list.addAction(action)
        return action

    # ---- contents ----------------------------------------------------------------------

    def set_conversations(
        self,
        conversations: Sequence[Conversation],
        current_id: int | None,
        *,
        replying_id: int | None = None,
        now: datetime | None = None,
    ) -> None:
        """Show `conversations`, keeping `current_id` selected without announcing it;
        `replying_id` is the chat whose reply is being written."""
        now = now or datetime.now().astimezone()
        self.list.blockSignals(True)
        try:
            self.list.clear()
            for conversation, when in zip(
                conversations, when_texts(conversations, now), strict=True
            ):
                status = WRITING_TEXT if conversation.id == replying_id else when
                item = QListWidgetItem(f"{conversation.title}\n{status}", self.list)
                item.setData(ID_ROLE, conversation.id)
                item.setData(TITLE_ROLE, conversation.title)
                detailed = when_text(conversation.updated_at, now, detailed=True)
                item.setToolTip(f"{conversation.title}\nlast active {detailed}")
                if conversation.id == current_id:
                    self.list.setCurrentItem(item)
        finally:
            self.list.blockSignals(False)

    def ids(self) -> list[int]:
        return [int(self.list.item(row).data(ID_ROLE)) for row in range(self.list.count())]

    def titles(self) -> list[str]:
        return [str(self.list.item(row).data(TITLE_ROLE)) for row in range(self.list.count())]

    def when_shown(self) -> list[str]:
        """The second line of each chat: when it was last active, or that it is replying."""
        return [self.list.item(row).text().split("\n", 1)[1] for row in range(self.list.count())]

    def current_id(self) -> int | None:
        item = self.list.currentItem()
        return None if item is None else int(item.data(ID_ROLE))

    def search_text(self) -> str:
        return self.search_box.text()

    # ---- questions ---------------------------------------------------------------------

    @Slot()
    def rename(self) -> None:
        item = self.list.currentItem()
        if item is None:
            return
        conversation_id = int(item.data(ID_ROLE))
        dialog = QInputDialog(self)
        dialog.setWindowTitle("Rename chat")
        dialog.setLabelText("New name:")
        dialog.setTextValue(str(item.data(TITLE_ROLE)))
        dialog.textValueSelected.connect(
            lambda title: self.rename_requested.emit(conversation_id, title)
        )
        self._ask(dialog)

    @Slot()
    def delete(self) -> None:
        item = self.list.currentItem()
        if item is None:
            return
        conversation_id = int(item.data(ID_ROLE))
        dialog = QMessageBox(
            QMessageBox.Icon.Question,
            "Delete chat",
            f"Delete “{item.data(TITLE_ROLE)}” and all its messages? This cannot be undone.",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
            self,
        )
        dialog.setDefaultButton(QMessageBox.StandardButton.Cancel)

        def on_answer(button: QAbstractButton) -> None:
            if dialog.standardButton(button) == QMessageBox.StandardButton.Yes:
                self.delete_requested.emit(conversation_id)

        dialog.buttonClicked.connect(on_answer)
        self._ask(dialog)

    def _ask(self, dialog: QInputDialog | QMessageBox) -> None:
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.setWindowModality(Qt.WindowModality.WindowModal)
        dialog.destroyed.connect(self._forget_dialog)
        self.dialog = dialog
        dialog.open()

    @Slot()
    def _forget_dialog(self) -> None:
        self.dialog = None

    # ---- signals -----------------------------------------------------------------------

    @Slot(QPoint)
    def _show_menu(self, position: QPoint) -> None:
        if self.list.itemAt(position) is None:
            return
        menu = QMenu(self)
        menu.addAction(self.rename_action)
        menu.addAction(self.delete_action)
        menu.popup(self.list.viewport().mapToGlobal(position))

    @Slot(QListWidgetItem, QListWidgetItem)
    def _on_current_changed(self, current: QListWidgetItem | None, _previous: object) -> None:
        if current is not None:
            self.conversation_selected.emit(int(current.data(ID_ROLE)))

    @Slot()
    def _emit_search(self) -> None:
        self.search_changed.emit(self.search_box.text())
