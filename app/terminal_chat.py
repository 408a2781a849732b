"""Chat in the terminal: a streaming REPL, or one answer on stdout for scripts.

Ctrl-C while a reply streams stops that reply and keeps the chat; Ctrl-C or Ctrl-D at the
prompt leaves. Status lines go to stderr so stdout carries only the model's words.

When the engine worker crashes mid-reply, the part already printed stays on screen and in the
chat (complete, like a stopped reply), the crash goes to the log file, and the REPL waits for
the service to restart the engine before the next prompt; if it cannot, the REPL ends with a
non-zero status. For `--prompt` a crash is an error: a line on stderr and exit status 2.
"""

from __future__ import annotations

import queue
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from hearthside.app.cli_support import EXIT_ERROR, printable
from hearthside.app.engine_crash import after_crash_text, crashed_words, log_crash
from hearthside.app.progress import ProgressLine
from hearthside.app.terminal_history import Resume, TerminalChatRecord, recent_chats_text
from hearthside.autotune.load_settings import LoadSettings, choose_load_settings
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.engine.config import EngineConfig, SamplingParams
from hearthside.core.engine.engine import ChatMessage, GenerationMetrics, GenerationResult
from hearthside.core.engine.remote import RemoteConfig
from hearthside.core.engine.remotes import remote_config, remote_name
from hearthside.core.engine.service import EngineNotice, EngineService, Job
from hearthside.core.errors import EngineCrashedError
from hearthside.core.history.store import ConversationStore
from hearthside.core.models.default_model import ensure_default_model
from hearthside.core.models.store import ModelStore, resolve_model_path
from hearthside.core.paths import data_dir, models_dir
from hearthside.core.probe.base import ProbeContext
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.probe.runner import probe_hardware

T = TypeVar("T")
HELP = (
    "Commands: /new starts a new chat, /system TEXT sets the system prompt, /history lists "
    "saved chats, /exit leaves."
)
# The window's suggested "Longest reply" (app/gui/chat_settings_dialog.py): a reply ends
# there rather than running on until the context is full.
DEFAULT_MAX_TOKENS = 512
RESTART_WAIT_S = 600.0  # a big model on a slow disk takes minutes to load again


@dataclass(frozen=True)
class ChatOptions:
    model: str = "default"
    n_ctx: int = 4096
    n_threads: int | None = None
    n_threads_batch: int | None = None
    # one conversation in a terminal: one slot (None would let the planner add more)
    n_parallel: int | None = 1
    system_prompt: str | None = None
    max_tokens: int | None = DEFAULT_MAX_TOKENS  # None: until the model stops
    temperature: float = 0.7
    seed: int | None = None
    show_stats: bool = False
    resume: Resume = None  # continue this saved chat (or the latest) instead of a new one
    keep_history: bool = True

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature, max_tokens=self.max_tokens, seed=self.seed
        )


def status(text: str, end: str = "\n") -> None:
    print(text, end=end, file=sys.stderr, flush=True)


def resolve_model(ref: str) -> Path:
    """The GGUF to load for `ref`, installing the default model on first use."""
    with ModelStore(data_dir()) as store:
        if ref == "default" and store.default() is None:
            with ProgressLine("Installing the default model") as line:
                ensure_default_model(store, progress=line.callback)
        return resolve_model_path(store, ref)


def load_settings_for(
    model_ref: str,
    n_ctx: int,
    n_threads: int | None,
    n_threads_batch: int | None,
    profile: HardwareProfile | None = None,
    *,
    n_parallel: int | None = None,
) -> LoadSettings:
    """The model's settings on this machine: measured, else planned (autotune/load_settings.py),
    with `n_parallel` slots where they fit (None: the planner's choice). Without `profile` the
    hardware is probed here (half a second)."""
    path = resolve_model(model_ref)
    if profile is None:
        profile = probe_hardware(ProbeContext(models_dir=models_dir(data_dir())))
    with WisdomDB() as wisdom:
        return choose_load_settings(
            path,
            profile,
            wisdom,
            n_ctx=n_ctx,
            n_threads=n_threads,
            n_threads_batch=n_threads_batch,
            n_parallel=n_parallel,
        )


def engine_config_for(
    model_ref: str, n_ctx: int, n_threads: int | None, n_threads_batch: int | None
) -> EngineConfig:
    """One slot: what `hearthside bench` measures is one request."""
    return load_settings_for(model_ref, n_ctx, n_threads, n_threads_batch, n_parallel=1).config


def config_for(
    model_ref: str,
    n_ctx: int,
    n_threads: int | None,
    n_threads_batch: int | None,
    n_parallel: int | None = None,
) -> LoadSettings | RemoteConfig:
    """`remote:NAME` is a saved remote server (its context and slots are the server's);
    anything else is a local model, with the settings chosen for this machine."""
    if remote_name(model_ref) is not None:
        return remote_config(model_ref)
    return load_settings_for(model_ref, n_ctx, n_threads, n_threads_batch, n_parallel=n_parallel)


def loading_note(chosen: LoadSettings | RemoteConfig) -> str:
    if isinstance(chosen, RemoteConfig):
        return f"Connecting to {chosen.describe()} …"
    return f"Loading {printable(Path(chosen.config.model_path).name)} … {chosen.why}"


def config_of(chosen: LoadSettings | RemoteConfig) -> EngineConfig | RemoteConfig:
    return chosen if isinstance(chosen, RemoteConfig) else chosen.config


def start_loading(
    service: EngineService,
    chosen: LoadSettings | RemoteConfig,
    note: Callable[[str], None] = status,
) -> Job[EngineConfig | RemoteConfig]:
    """Load `chosen` in `service`, saying what loads and why (a back-off to settings that fit
    included); where llama.cpp still cannot allocate them, smaller ones are tried and `note`
    hears that too. The job's result is the config as loaded."""
    note(loading_note(chosen))
    return service.load(config_of(chosen), on_retry=note)


def _start_service(options: ChatOptions) -> EngineService:
    chosen = config_for(
        options.model,
        options.n_ctx,
        options.n_threads,
        options.n_threads_batch,
        options.n_parallel,
    )
    service = EngineService().start()
    try:
        start_loading(service, chosen).result()
    except BaseException:
        service.stop()
        raise
    return service


def _write_reply_piece(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _wait(job: Job[T], on_tick: Callable[[], None] = lambda: None) -> T:
    """Wait for `job`, calling `on_tick` as it runs; Ctrl-C cancels it (within one token) and
    the partial reply is kept."""
    try:
        while not job.done():
            on_tick()
            time.sleep(0.05)
    except KeyboardInterrupt:
        job.cancel()
    return job.result()


def _describe(metrics: GenerationMetrics) -> str:
    parts = [f"{metrics.completion_tokens} tokens"]
    if metrics.decode_tok_s:
        parts.append(f"{metrics.decode_tok_s:.1f} tok/s")
    speculative = metrics.speculative
    if speculative is not None and speculative.acceptance_rate is not None:
        parts.append(
            f"{speculative.acceptance_rate:.0%} of drafts accepted "
            f"({speculative.mean_accepted_length or 0:.1f} per step)"
        )
    if metrics.ttft_s is not None:
        parts.append(f"first token {metrics.ttft_s:.2f} s")
    parts.append(
        f"{metrics.prompt_tokens_evaluated}/{metrics.prompt_tokens} prompt tokens evaluated"
    )
    if metrics.stop_reason == "cancelled":
        parts.append("stopped")
    return "[" + " · ".join(parts) + "]"


def _ask(
    service: EngineService, record: TerminalChatRecord, text: str, options: ChatOptions
) -> GenerationResult:
    """Send `text` in the chat, stream the reply to stdout and save both as they come. Nothing
    stays saved for a request that fails (the chat never holds two user turns in a row), except
    a reply the engine crashed in: what it wrote is kept, as a stopped reply's is."""
    pieces: list[str] = []  # appended on the engine thread; read here, under the GIL

    def on_text(piece: str) -> None:
        pieces.append(piece)
        _write_reply_piece(piece)

    job = service.chat([*record.messages(), ChatMessage("user", text)], options.sampling(), on_text)
    user_message_id = record.add_user_message(text)
    record.begin_reply()
    try:
        result = _wait(job, on_tick=lambda: record.save_progress("".join(pieces)))
    except EngineCrashedError:
        record.keep_partial_reply("".join(pieces), user_message_id)
        raise
    except BaseException:
        record.forget_reply(user_message_id)
        raise
    finally:
        sys.stdout.write("\n")
        sys.stdout.flush()
    record.finish_reply(result)
    return result


@contextmanager
def _chat_record(options: ChatOptions) -> Iterator[TerminalChatRecord]:
    """The chat in the window's history, or in a throwaway one with `--no-history`."""
    with ExitStack() as stack:
        root = data_dir()
        if not options.keep_history:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hearthside-")))
        store = stack.enter_context(ConversationStore(root))
        yield TerminalChatRecord.open(
            store, options.resume, options.system_prompt, options.sampling()
        )


def run_one_prompt(options: ChatOptions, prompt: str) -> int:
    with _chat_record(options) as record:
        service = _start_service(options)
        try:
            try:
                result = _ask(service, record, prompt, options)
            except EngineCrashedError as crash:
                status(_one_prompt_crash_text(crash, record, options))
                return EXIT_ERROR
            if options.show_stats:
                status(_describe(result.metrics))
            return 130 if result.metrics.stop_reason == "cancelled" else 0
        finally:
            service.stop()


def _one_prompt_crash_text(
    crash: EngineCrashedError, record: TerminalChatRecord, options: ChatOptions
) -> str:
    kept = (
        f"the part printed is saved in the chat (`hearthside chat --resume {record.id}` "
        "continues it)"
        if options.keep_history
        else "the part printed is all it wrote"
    )
    return (
        f"error: {crashed_words(crash)} while writing the reply; {kept}. "
        f"The details are in {log_crash(crash)}."
    )


def run_repl(options: ChatOptions) -> int:
    with _chat_record(options) as record:
        service = _start_service(options)
        notices: queue.Queue[EngineNotice] = queue.Queue()
        service.add_listener(notices.put)  # called on a service thread; the queue hands over
        try:
            _greet(service, record)
            return _converse(service, record, options, notices)
        finally:
            service.stop()


def _greet(service: EngineService, record: TerminalChatRecord) -> None:
    name = Path(service.loaded_config.model_path).name  # type: ignore[union-attr]
    if record.messages():
        status(f"Continuing chat {record.id} ({record.conversation.title}) with {name}. {HELP}")
    else:
        status(f"Chatting with {name}. {HELP}")


def _converse(
    service: EngineService,
    record: TerminalChatRecord,
    options: ChatOptions,
    notices: queue.Queue[EngineNotice],
) -> int:
    while True:
        try:
            line = input("\nyou> ").strip()
        except (EOFError, KeyboardInterrupt):
            status("\nBye.")
            return 0
        if not line:
            continue
        if line == "/exit":
            return 0
        if line.startswith("/"):
            _apply_command(line, record)
            continue
        try:
            result = _ask(service, record, line, options)
        except EngineCrashedError as crash:
            if not _recover(crash, notices, record):
                return 1
            continue
        if options.show_stats or result.metrics.stop_reason == "cancelled":
            status(_describe(result.metrics))


def _recover(
    crash: EngineCrashedError, notices: queue.Queue[EngineNotice], record: TerminalChatRecord
) -> bool:
    """Say what crashed and wait for the service to restart the engine; False if it could not."""
    status(
        f"{crashed_words(crash)} while writing this reply; the part above is kept in the chat "
        f"(details in {log_crash(crash)}). Restarting it…"
    )
    notice = _wait_for_restart(notices)
    if notice is None:
        status("The engine is still restarting; your next message waits for it.")
        return True
    if notice.kind == "restarted":
        status(f"{notice.message} Go on with your next message.")
        return True
    status(
        f"{after_crash_text(crash, notice)} The chat is saved: "
        f"`hearthside chat --resume {record.id}` continues it."
    )
    return False


def _wait_for_restart(notices: queue.Queue[EngineNotice]) -> EngineNotice | None:
    """The service's "restarted" or "restart_failed"; None after RESTART_WAIT_S or Ctrl-C
    (the next message then waits in the service's queue)."""
    deadline = time.monotonic() + RESTART_WAIT_S
    try:
        while time.monotonic() < deadline:
            try:
                notice = notices.get(timeout=0.1)
            except queue.Empty:
                continue
            if notice.kind != "crashed":
                return notice
    except KeyboardInterrupt:
        pass
    return None


def _apply_command(line: str, record: TerminalChatRecord) -> None:
    command, _, argument = line.partition(" ")
    if command == "/new":
        record.start_over(record.conversation.system_prompt)
        status("New chat.")
    elif command == "/system":
        record.start_over(argument)
        status("System prompt set for a new chat." if argument else "System prompt cleared.")
    elif command == "/history":
        status(recent_chats_text(record.store, record.id))
    else:
        status(HELP)
