"""The terminal chat's conversations, kept in the window's history (core/history/store.py).

A terminal chat is an ordinary conversation: the window lists it, and `hearthside chat
--resume` continues a chat from either. As in the window, a reply is saved while it streams
(the assistant message is inserted incomplete, rewritten every half second and completed at
its end), so a killed terminal loses nothing that was already printed.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime
from typing import Literal

from hearthside.core.engine.config import SamplingParams
from hearthside.core.engine.engine import ChatMessage, GenerationResult
from hearthside.core.history.store import Conversation, ConversationStore, HistoryError

LATEST: Literal["latest"] = "latest"
Resume = int | Literal["latest"] | None  # a chat's id, the latest chat, or a new one
RECENT_LISTED = 10
SAVE_EVERY_S = 0.5


class TerminalChatRecord:
    """One conversation being chatted in the terminal, and the reply being written, if any."""

    def __init__(self, store: ConversationStore, conversation: Conversation) -> None:
        self.store = store
        self.conversation = conversation
        self._reply_id: int | None = None
        self._saved_text = ""
        self._saved_at = 0.0

    @classmethod
    def open(
        cls,
        store: ConversationStore,
        resume: Resume,
        system_prompt: str | None,
        sampling: SamplingParams,
    ) -> TerminalChatRecord:
        """A new chat, or the one `resume` names; `system_prompt`, when given, replaces a
        resumed chat's own."""
        if resume is None:
            return cls(store, _new_conversation(store, system_prompt or "", sampling))
        conversation = _conversation_to_resume(store, resume)
        if system_prompt is not None:
            conversation = store.update_settings(
                conversation.id, system_prompt=system_prompt, sampling=conversation.sampling
            )
        return cls(store, conversation)

    @property
    def id(self) -> int:
        return self.conversation.id

    def messages(self) -> list[ChatMessage]:
        """What the model is shown, as in the window: the system prompt, then every message
        with text in it."""
        system = self.conversation.system_prompt
        history = [ChatMessage("system", system)] if system else []
        stored = self.store.messages(self.id)
        return history + [
            ChatMessage(m.role, m.content) for m in stored if m.content or m.role == "user"
        ]

    def start_over(self, system_prompt: str) -> None:
        """`/new` and `/system`: the next message opens a new chat (an empty one is reused)."""
        if not self.store.messages(self.id):
            self.conversation = self.store.update_settings(
                self.id, system_prompt=system_prompt, sampling=self.conversation.sampling
            )
            return
        self.conversation = _new_conversation(self.store, system_prompt, self.conversation.sampling)

    def add_user_message(self, text: str) -> int:
        return self.store.add_message(self.id, "user", text).id

    def begin_reply(self) -> None:
        reply = self.store.add_message(self.id, "assistant", "", complete=False)
        self._reply_id, self._saved_text, self._saved_at = reply.id, "", time.monotonic()

    def save_progress(self, text: str) -> None:
        """Rewrite the streaming reply's text, at most every SAVE_EVERY_S."""
        now = time.monotonic()
        if (
            self._reply_id is None
            or text == self._saved_text
            or now - self._saved_at < SAVE_EVERY_S
        ):
            return
        self.store.update_message(self._reply_id, text)
        self._saved_text, self._saved_at = text, now

    def finish_reply(self, result: GenerationResult) -> None:
        if self._reply_id is not None:
            self.store.finish_message(self._reply_id, result.text, result.metrics)
            self._reply_id = None

    def keep_partial_reply(self, text: str, user_message_id: int) -> None:
        """The engine crashed part-way: keep what it wrote, complete like a stopped reply (the
        window does the same); with nothing written, forget the request as a failed one."""
        if not text:
            self.forget_reply(user_message_id)
            return
        if self._reply_id is not None:
            self.store.update_message(self._reply_id, text, complete=True)
            self._reply_id = None

    def forget_reply(self, user_message_id: int) -> None:
        """The request failed: forget it and its reply, so the chat can go on from before."""
        if self._reply_id is not None:
            self.store.delete_message(self._reply_id)
            self._reply_id = None
        self.store.delete_message(user_message_id)


def _new_conversation(
    store: ConversationStore, system_prompt: str, sampling: SamplingParams
) -> Conversation:
    # The reply length is kept as a chat setting, as the window does; the seed is not: a
    # resumed chat should not repeat the same draws.
    return store.create(system_prompt=system_prompt, sampling=replace(sampling, seed=None))


def _conversation_to_resume(
    store: ConversationStore, resume: int | Literal["latest"]
) -> Conversation:
    conversations = store.list()
    if not conversations:
        raise HistoryError(
            "There is no saved chat to resume yet.",
            hint="Start one with `hearthside chat`; it is saved as you go.",
        )
    if resume == LATEST:
        return conversations[0]
    for conversation in conversations:
        if conversation.id == resume:
            return conversation
    raise HistoryError(
        f"There is no saved chat with id {resume}.",
        hint="`/history` in `hearthside chat` lists the saved chats and their ids.",
    )


def recent_chats_text(store: ConversationStore, current_id: int | None = None) -> str:
    """The `/history` listing: the latest chats, newest first, with the id `--resume` takes."""
    conversations = store.list()
    if not conversations:
        return "No saved chats yet."
    lines = ["Recent chats (continue one with `hearthside chat --resume ID`):"]
    for conversation in conversations[:RECENT_LISTED]:
        marker = "*" if conversation.id == current_id else " "
        when = datetime.fromisoformat(conversation.updated_at).astimezone()
        title = _printable(conversation.title)
        lines.append(f"{marker} {conversation.id:>5}  {when:%Y-%m-%d %H:%M}  {title}")
    if len(conversations) > RECENT_LISTED:
        lines.append(f"  … and {len(conversations) - RECENT_LISTED} older ones (see the window).")
    return "\n".join(lines)


def _printable(text: str) -> str:
    """A title pasted with terminal escapes in it must not drive the terminal."""
    return "".join(char if char.isprintable() else "?" for char in text)
