"""`ChatSession`: what happens when the user chats — history, engine and view kept in step.

A reply is saved as it streams: the assistant message is inserted (incomplete) before the
first token; each flush goes to the ReplyWriter's thread and reaches the view only once it is
saved; the end (text, metrics, complete) is saved the same way before the chat is idle again —
so whatever was on screen is on disk when the process dies, and a slow disk never blocks the
window. Nothing is written for a request the engine refused (a full queue, no model yet).
A reply that fails part-way — the engine worker crashed, say — keeps what it had written, in
the view and the history, complete like a stopped one; a crash is `reply_crashed`, for the
window to say what happened and what the engine does next.

A reply belongs to its chat: switching chats while it streams leaves it streaming there (the
engine writes one reply at a time, so the other chats wait — "busy" — until it ends or is
stopped); switching back shows it as far as it has been saved. Each reply records the model
writing it. Regenerate keeps the earlier reply as a version (the store's `new_version`), and
the ‹ › under a reply flips between versions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal, Slot

from hearthside.app.gui.chat_pane import ChatPane, PaneMode
from hearthside.app.gui.chat_settings_dialog import ChatSettings
from hearthside.app.gui.engine_bridge import EngineBridge, LoadedModel
from hearthside.app.gui.reply_writer import ReplyWriter, SavedText
from hearthside.core.errors import EngineCrashedError, HearthsideError, JobCancelledError
from hearthside.core.history.store import Conversation, ConversationStore, StoredMessage

if TYPE_CHECKING:
    from hearthside.core.engine.engine import ChatMessage, GenerationMetrics, GenerationResult


FAILED_NOTE = "the reply failed part-way"
CRASHED_NOTE = "the engine crashed while writing this reply"


@dataclass(frozen=True)
class ContextUse:
    used_tokens: int | None  # None: not known until the next reply
    total_tokens: int | None  # None: no model loaded


@dataclass
class _Reply:
    conversation_id: int
    message_id: int
    model_name: str | None  # the model writing it, for its header
    version: tuple[int, int] = (1, 1)  # which version of the reply, of how many
    text: str = ""  # everything the engine has sent so far
    saved_text: str = ""  # what is on disk, and so may be on screen
    result: GenerationResult | None = None  # set when the engine is done, before it is saved

    @property
    def regenerated(self) -> bool:
        return self.version[1] > 1


def engine_messages(
    conversation: Conversation, messages: Sequence[StoredMessage]
) -> list[ChatMessage]:
    """What the model is shown: the system prompt, then every message with text in it."""
    # Imported here: the window is shown before the engine module (llama_cpp) is loaded.
    from hearthside.core.engine.engine import ChatMessage

    history = (
        [ChatMessage("system", conversation.system_prompt)] if conversation.system_prompt else []
    )
    history += [ChatMessage(m.role, m.content) for m in messages if m.content or m.role == "user"]
    return history


class ChatSession(QObject):
    conversations_changed = Signal()  # titles, order or membership changed
    conversation_opened = Signal(int)
    state_changed = Signal(str)  # the pane's mode: idle / generating / unavailable
    reply_metrics = Signal(object)  # GenerationMetrics of the reply that just ended
    context_changed = Signal(object)  # ContextUse
    error = Signal(object)  # an exception to show in plain words
    # EngineCrashedError, and whether any of the reply was written (and so kept)
    reply_crashed = Signal(object, bool)

    def __init__(
        self,
        store: ConversationStore,
        bridge: EngineBridge,
        pane: ChatPane,
        writer: ReplyWriter,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.store = store
        self.bridge = bridge
        self.writer = writer
        self.pane = pane
        self.view = pane.view
        self.current_id: int | None = None
        self.editing_message_id: int | None = None
        self._reply: _Reply | None = None
        self._used_tokens: int | None = None
        self._model_pending = False
        self._after_wake: Callable[[], object] | None = None  # what waits for an idle model
        bridge.text_flushed.connect(self._on_text_flushed)
        writer.saved.connect(self._on_saved)
        writer.failed.connect(self.error)
        bridge.reply_finished.connect(self._on_reply_finished)
        bridge.reply_failed.connect(self._on_reply_failed)
        bridge.load_started.connect(self.refresh_state)
        bridge.load_finished.connect(self._on_model_loaded)
        bridge.load_failed.connect(self._on_load_failed)
        bridge.unloaded_idle.connect(self.refresh_state)
        pane.send_requested.connect(self.send)
        pane.stop_requested.connect(self.stop)
        pane.regenerate_requested.connect(self.regenerate)
        pane.edit_cancelled.connect(self.cancel_edit)
        self.view.edit_requested.connect(self.begin_edit)
        self.view.version_requested.connect(self.show_version)

    # ---- state -------------------------------------------------------------------------

    @property
    def mode(self) -> PaneMode:
        """The open chat's: "busy" while a reply streams into another chat."""
        if self.bridge.generating or self._reply is not None:
            elsewhere = self._reply is not None and self._reply.conversation_id != self.current_id
            return "busy" if elsewhere else "generating"
        if self._model_pending or self.bridge.loading:
            return "unavailable"
        if self.bridge.loaded_model is None and self.bridge.asleep is None:
            return "unavailable"
        return "idle"  # a model unloaded for being idle loads again when a message is sent

    def set_model_pending(self, pending: bool) -> None:
        """A model is being prepared (installed, resolved) before it loads: no chatting."""
        self._model_pending = pending
        self.refresh_state()

    @property
    def model_pending(self) -> bool:
        return self._model_pending

    @property
    def replying_to(self) -> int | None:
        """The conversation whose reply is streaming, if any."""
        return self._reply.conversation_id if self._reply is not None else None

    @property
    def reply_text(self) -> str | None:
        """The text of the reply streaming now, as received from the engine so far."""
        return self._reply.text if self._reply is not None else None

    def context_use(self) -> ContextUse:
        loaded = self.bridge.loaded_model
        return ContextUse(self._used_tokens, loaded.n_ctx if loaded is not None else None)

    @Slot()
    def refresh_state(self) -> None:
        self.pane.set_mode(self.mode)
        self.state_changed.emit(self.mode)

    @Slot(object)
    def _on_model_loaded(self, _loaded: LoadedModel) -> None:
        self.refresh_state()
        self.context_changed.emit(self.context_use())
        waiting, self._after_wake = self._after_wake, None
        if waiting is not None:
            waiting()

    @Slot(object)
    def _on_load_failed(self, _error: BaseException) -> None:
        self._after_wake = None  # the window says why; sending again tries again
        self.refresh_state()

    def _woken_for(self, action: Callable[[], object]) -> bool:
        """True when the model was unloaded for being idle: it loads again, then `action`
        runs (the message is sent as soon as the model is back)."""
        if self.bridge.loaded_model is not None or self.bridge.asleep is None:
            return False
        self._after_wake = action
        self.bridge.wake()
        self.refresh_state()
        return True

    # ---- conversations -----------------------------------------------------------------

    def open(self, conversation_id: int) -> None:
        """Show a conversation; a reply streaming in another one goes on streaming there."""
        if conversation_id == self.current_id:
            return
        conversation = self.store.get(conversation_id)
        self.cancel_edit()
        self.current_id = conversation.id
        messages = self.store.messages(conversation.id)
        self._show(messages)
        self._used_tokens = _context_after(messages)
        self.refresh_state()
        self.context_changed.emit(self.context_use())
        self.conversation_opened.emit(conversation.id)

    def _show(self, messages: Sequence[StoredMessage]) -> None:
        """Show the open chat's messages, with its reply streaming at the end, if it has one."""
        reply = self._reply
        if reply is None or reply.conversation_id != self.current_id:
            self.view.show_messages(messages)
            return
        self.view.show_messages([m for m in messages if m.id != reply.message_id])
        self.view.begin_reply(reply.model_name, reply.version)
        self.view.update_reply(reply.saved_text)

    def new_conversation(self) -> int:
        """Open a new, empty chat (or stay in the current one if it is still empty)."""
        if self.current_id is not None and not self.store.messages(self.current_id):
            self.pane.input.setFocus()
            return self.current_id
        current = self.store.get(self.current_id) if self.current_id is not None else None
        created = self.store.create(
            system_prompt=current.system_prompt if current else "",
            sampling=current.sampling if current else None,
        )
        self.conversations_changed.emit()
        self.open(created.id)
        self.pane.input.setFocus()
        return created.id

    def open_latest_or_new(self, preferred_id: int | None = None) -> None:
        conversations = self.store.list()
        ids = [c.id for c in conversations]
        if preferred_id is not None and preferred_id in ids:
            self.open(preferred_id)
        elif ids:
            self.open(ids[0])
        else:
            self.new_conversation()

    def rename(self, conversation_id: int, title: str) -> None:
        self.store.rename(conversation_id, title)
        self.conversations_changed.emit()

    def delete(self, conversation_id: int) -> None:
        if self.replying_to == conversation_id:
            self.bridge.stop()
            self._reply = None  # nothing left to save it into
        self.store.delete(conversation_id)
        if conversation_id == self.current_id:
            self.current_id = None
            self.open_latest_or_new()
        self.conversations_changed.emit()

    def settings(self) -> ChatSettings:
        conversation = self._current_conversation()
        return ChatSettings(conversation.system_prompt, conversation.sampling)

    def apply_settings(self, settings: ChatSettings) -> None:
        conversation = self._current_conversation()
        self.store.update_settings(
            conversation.id, system_prompt=settings.system_prompt, sampling=settings.sampling
        )

    # ---- chatting ----------------------------------------------------------------------

    @Slot(str)
    def send(self, text: str) -> bool:
        """Send `text` (or, while editing, resend the edited message); False if refused."""
        text = text.strip()
        if not text or self.mode in ("generating", "busy"):
            return False
        if self._woken_for(lambda: self.send(text)):
            return True
        conversation = self._current_conversation()
        messages = self.store.messages(conversation.id)
        editing = self._message_being_edited(messages)
        if editing is not None:
            messages = messages[: messages.index(editing)]
        from hearthside.core.engine.engine import ChatMessage

        history = [*engine_messages(conversation, messages), ChatMessage("user", text)]
        if not self._start_reply(conversation, history):
            return False
        if editing is not None:
            self.view.show_messages(self.store.edit_message(editing.id, text))
        else:
            self.view.append_message(self.store.add_message(conversation.id, "user", text))
        self.cancel_edit()
        self.pane.input.clear()
        self._begin_saving_reply(conversation.id, None)
        return True

    @Slot()
    def regenerate(self) -> bool:
        """Write the last reply again, keeping the earlier one as a version (or answer a last
        user message left without a reply)."""
        if self.mode != "idle" or self.current_id is None:
            return False
        if self._woken_for(self.regenerate):
            return True
        conversation = self._current_conversation()
        messages = self.store.messages(conversation.id)
        previous = messages.pop() if messages and messages[-1].role == "assistant" else None
        if not messages or messages[-1].role != "user":
            return False
        if not self._start_reply(conversation, engine_messages(conversation, messages)):
            return False
        self.view.show_messages(messages)
        self._begin_saving_reply(conversation.id, previous)
        return True

    @Slot(int, int)
    def show_version(self, message_id: int, version: int) -> None:
        """Show another version of a regenerated reply (not while this chat's reply streams)."""
        if self.mode == "generating" or self.current_id is None:
            return
        try:
            self.store.show_version(message_id, version)
        except HearthsideError as exc:
            self.error.emit(exc)
            return
        messages = self.store.messages(self.current_id)
        self.view.show_messages(messages)
        self._used_tokens = _context_after(messages)
        self.context_changed.emit(self.context_use())

    @Slot()
    def stop(self) -> None:
        self.bridge.stop()

    @Slot(int)
    def begin_edit(self, message_id: int) -> None:
        if self.mode == "generating":  # the open chat's own reply is still being written
            return
        message = self.store.message(message_id)
        if message.role != "user" or message.conversation_id != self.current_id:
            return
        self.editing_message_id = message.id
        self.pane.begin_edit(message.content)

    @Slot()
    def cancel_edit(self) -> None:
        if self.editing_message_id is None:
            return
        self.editing_message_id = None
        self.pane.end_edit()
        self.pane.input.clear()

    def _start_reply(self, conversation: Conversation, history: list[ChatMessage]) -> bool:
        try:
            self.bridge.send(history, conversation.sampling)
        except HearthsideError as exc:
            self.error.emit(exc)
            return False
        return True

    def _begin_saving_reply(self, conversation_id: int, previous: StoredMessage | None) -> None:
        """Save the reply as it comes: a new message, or a new version of `previous`."""
        loaded = self.bridge.loaded_model
        model_id = loaded.model_id if loaded is not None else None
        model_name = loaded.name if loaded is not None else None
        if model_id is not None:
            self.store.set_model(conversation_id, model_id)  # the chat's latest model
        if previous is not None:
            reply = self.store.new_version(previous.id, model_id=model_id, model_name=model_name)
        else:
            reply = self.store.add_message(
                conversation_id, "assistant", "", complete=False,
                model_id=model_id, model_name=model_name,
            )  # fmt: skip
        version = (reply.version, reply.version_count)
        self._reply = _Reply(conversation_id, reply.id, model_name, version)
        self.view.begin_reply(model_name, version)
        self.conversations_changed.emit()
        self.refresh_state()

    def finish_pending_reply(self, timeout_s: float = 2.0) -> None:
        """At shutdown, with no event loop left to deliver it: wait for the stopped reply,
        hand its final text and metrics to the writer and wait until they are saved."""
        reply, self._reply = self._reply, None
        if reply is not None:
            result = reply.result or self.bridge.wait_for_reply(timeout_s)
            if result is not None:
                self.writer.finish(reply.message_id, result.text, result.metrics)
        self.writer.wait_until_idle(timeout_s)

    def rerender(self) -> None:
        """Draw the open conversation again (after a theme change)."""
        if self.current_id is not None and not self.view.streaming:
            self.view.show_messages(self.store.messages(self.current_id))

    # ---- the reply streaming in ----------------------------------------------------------

    @Slot(str)
    def _on_text_flushed(self, piece: str) -> None:
        reply = self._reply
        if reply is None:
            return
        reply.text += piece
        self.writer.save(reply.message_id, reply.text)

    @Slot(object)
    def _on_saved(self, saved: SavedText) -> None:
        """Text is on disk: now it may be shown. The final save makes the chat idle."""
        reply = self._reply
        if reply is None or saved.message_id != reply.message_id:
            return
        showing = reply.conversation_id == self.current_id
        if not saved.final:
            reply.saved_text = saved.text
            if showing:
                self.view.update_reply(saved.text)
            return
        self._reply = None
        assert reply.result is not None
        metrics = reply.result.metrics
        if showing and reply.regenerated:  # drawn again, with the ‹ › to its other versions
            self.view.show_messages(self.store.messages(reply.conversation_id))
        elif showing:
            self.view.finish_reply(saved.text, self.view.metered_note(metrics))
        if showing:
            self._used_tokens = _tokens_in_context(metrics)
        self.conversations_changed.emit()
        self.refresh_state()
        self.reply_metrics.emit(metrics)
        self.context_changed.emit(self.context_use())

    @Slot(object)
    def _on_reply_finished(self, result: GenerationResult) -> None:
        reply = self._reply
        if reply is None:  # its chat was deleted meanwhile
            self.refresh_state()
            return
        reply.result = result
        self.writer.finish(reply.message_id, result.text, result.metrics)

    @Slot(object)
    def _on_reply_failed(self, error: BaseException) -> None:
        reply, self._reply = self._reply, None
        crashed = isinstance(error, EngineCrashedError)
        if reply is not None:
            self.writer.wait_until_idle()  # its saves first, then the repair below
            note = CRASHED_NOTE if crashed else FAILED_NOTE
            self._keep_or_drop_failed_reply(reply, note)
        self.refresh_state()
        if crashed:
            self.reply_crashed.emit(error, reply is not None and bool(reply.text))
        elif not isinstance(error, JobCancelledError):
            self.error.emit(error)

    def _keep_or_drop_failed_reply(self, reply: _Reply, note: str) -> None:
        showing = reply.conversation_id == self.current_id
        if reply.text:
            self.store.update_message(reply.message_id, reply.text, complete=True)
            if showing:
                self.view.finish_reply(reply.text, note)
            return
        if reply.regenerated:  # the version before it is shown again
            self.store.drop_shown_version(reply.message_id)
            if showing:
                self.view.show_messages(self.store.messages(reply.conversation_id))
            return
        self.store.delete_message(reply.message_id)
        if showing:
            self.view.discard_reply()

    # ---- helpers -----------------------------------------------------------------------

    def _current_conversation(self) -> Conversation:
        if self.current_id is None:
            self.new_conversation()
        assert self.current_id is not None
        return self.store.get(self.current_id)

    def _message_being_edited(self, messages: list[StoredMessage]) -> StoredMessage | None:
        if self.editing_message_id is None:
            return None
        return next((m for m in messages if m.id == self.editing_message_id), None)


def _tokens_in_context(metrics: GenerationMetrics) -> int:
    return metrics.prompt_tokens + metrics.completion_tokens


def _context_after(messages: Sequence[StoredMessage]) -> int | None:
    if not messages:
        return 0
    last = messages[-1]
    if last.role == "assistant" and last.metrics is not None:
        return _tokens_in_context(last.metrics)
    return None
