"""`ConversationList`: the sidebar of chats: new, search, select, rename, delete.

It only shows conversations and asks for changes through signals; the window applies them to
the history. Rename and delete ask in dialogs that are opened, not exec'd, so the event loop
(and a reply streaming meanwhile) keeps running while the user decides.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QPoint, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QAbstractButton,
    QInputDialog,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from hearthside.core.history.store import Conversation

SEARCH_DELAY_MS = 150
ID_ROLE = Qt.ItemDataRole.UserRole


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
        self, conversations: Sequence[Conversation], current_id: int | None
    ) -> None:
        """Show `conversations`, keeping `current_id` selected without announcing it."""
        self.list.blockSignals(True)
        try:
            self.list.clear()
            for conversation in conversations:
                item = QListWidgetItem(conversation.title, self.list)
                item.setData(ID_ROLE, conversation.id)
                item.setToolTip(f"{conversation.title}\nlast active {conversation.updated_at}")
                if conversation.id == current_id:
                    self.list.setCurrentItem(item)
        finally:
            self.list.blockSignals(False)

    def ids(self) -> list[int]:
        return [int(self.list.item(row).data(ID_ROLE)) for row in range(self.list.count())]

    def titles(self) -> list[str]:
        return [self.list.item(row).text() for row in range(self.list.count())]

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
        dialog.setTextValue(item.text())
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
            f"Delete “{item.text()}” and all its messages? This cannot be undone.",
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
