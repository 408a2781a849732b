"""`hearthside serve`: the local OpenAI-compatible API in the foreground.

With `--model remote:NAME` it is a proxy over a saved remote server: same address, same key
and the same queue as for a local model, the remote's model behind it.

`--parallel N` sets how many requests the local model answers at once (slots, each with its
own `--ctx` tokens of KV cache); without it the planner chooses (up to 4 where memory allows,
autotune/planner.py). A number that does not fit is backed off, and the loading line says so.

`--idle-unload-s N` (or `idle_unload_s` in the settings file) unloads a model no request has
used for N seconds, the served one included, so its engine worker ends and its memory
returns; the next request for it waits while it loads again (core/server/model_pool.py).

Ctrl-C or SIGTERM stops it within seconds whatever a load is doing: requests waiting for a
model are answered, every engine worker is killed on the way out, and if a clean stop takes
longer than STOP_GRACE_S (or the signal comes twice) the workers are killed and the process
exits at once.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import socket
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import FrameType

from hearthside.app.api_models import LoadKnobs, on_demand_models, probed_once, speed_meters
from hearthside.app.cli_support import add_thread_options, parallel_requests
from hearthside.app.terminal_chat import config_for, start_loading, status
from hearthside.autotune.load_settings import LoadSettings
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.remote import RemoteConfig
from hearthside.core.engine.service import EngineService
from hearthside.core.engine.worker_engine import kill_every_worker
from hearthside.core.paths import data_dir
from hearthside.core.server.app import ServerSettings
from hearthside.core.server.controller import check_bind_address, serve_foreground
from hearthside.core.server.keys import (
    check_bind_is_safe,
    is_loopback_host,
    load_or_create_api_key,
    load_or_create_user_key_file,
)
from hearthside.core.server.model_pool import DEFAULT_MAX_LOADED, PoolEvent
from hearthside.core.settings import Settings

DEFAULT_PORT = 8765
STOP_GRACE_S = 5.0  # after Ctrl-C/SIGTERM, the most a clean stop may take
EXIT_INTERRUPTED = 130
# "name:port", "1.2.3.4:port" or "[v6]:port": a Host value that already names its port.
_HAS_PORT = re.compile(r"(\[[^\]]*\]|[^:\[\]]+):\d+")


def add_serve_parser(subparsers: argparse._SubParsersAction) -> None:
    settings = Settings()
    serve = subparsers.add_parser("serve", help="run the local OpenAI-compatible API")
    serve.add_argument(
        "--model",
        default="default",
        help="model id, GGUF path, 'default', or remote:NAME (a saved `hearthside remote`)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (loopback by default)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT)
    serve.add_argument(
        "--ctx", type=int, default=settings.context_size, help="context tokens per request"
    )
    add_thread_options(serve, settings.threads, settings.batch_threads)
    serve.add_argument(
        "--parallel",
        type=parallel_requests,
        default=settings.parallel,
        metavar="N",
        help="requests answered at once, 1 to 64, each with its own context "
        "(default: the planner's choice, up to 4 where memory allows)",
    )
    serve.add_argument(
        "--max-models",
        type=_at_least_one,
        default=DEFAULT_MAX_LOADED,
        metavar="N",
        help="installed models a request may load by name and keep loaded beside the served "
        f"one; the least recently used is unloaded first (default {DEFAULT_MAX_LOADED})",
    )
    serve.add_argument(
        "--idle-unload-s",
        type=_idle_seconds,
        default=settings.idle_unload_s,
        metavar="SECONDS",
        help="unload a model no request has used for this long, this one included, so its "
        "memory returns; the next request loads it again (0: never; default: "
        f"{_idle_text(settings.idle_unload_s)})",
    )
    serve.add_argument(
        "--api-key-file", type=Path, help="file holding the key (default: one per install)"
    )
    serve.add_argument(
        "--no-key", action="store_true", help="accept requests without a key (loopback only)"
    )
    serve.add_argument(
        "--lan-host",
        "--allow-host",
        dest="lan_host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests addressed to NAME or NAME:PORT (repeatable), e.g. studio.local",
    )
    serve.add_argument("--cors-origin", action="append", default=[], help="allowed web origin")
    serve.add_argument("--max-queue", type=int, default=settings.max_queue)
    serve.set_defaults(handler=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    check_bind_address(args.host)  # before anything loads: fail fast
    chosen = config_for(args.model, args.ctx, args.threads, args.batch_threads, args.parallel)
    api_key = None if args.no_key else _api_key(args.api_key_file)
    check_bind_is_safe(args.host, api_key)  # before the model loads: fail fast
    lan_hosts = allowed_lan_hosts(args.lan_host, args.port)
    stopper = _Stopper()
    service = EngineService(max_queue=args.max_queue).start()
    try:
        with stopper.handling_signals():
            _serve(args, service, chosen, api_key, lan_hosts, stopper)
    finally:
        service.stop(timeout=0)  # no restart of a worker killed next
        kill_every_worker(for_good=stopper.signalled_once)  # a load still running ends now
    return 0


def _serve(
    args: argparse.Namespace,
    service: EngineService,
    chosen: LoadSettings | RemoteConfig,
    api_key: str | None,
    lan_hosts: tuple[str, ...],
    stopper: _Stopper,
) -> None:
    loaded = start_loading(service, chosen).result()
    settings = ServerSettings(
        host=args.host,
        port=args.port,
        api_key=api_key,
        extra_hosts=lan_hosts,
        cors_origins=tuple(args.cors_origin),
        model_id=served_model_id(loaded),
        max_on_demand_models=args.max_models,
        idle_unload_s=args.idle_unload_s,
        unload_served_when_idle=True,
    )
    _announce(args, settings, loaded)
    knobs = LoadKnobs(
        n_ctx=args.ctx,
        n_threads=args.threads,
        n_threads_batch=args.batch_threads,
        n_parallel=args.parallel,
    )  # for models named by requests
    hardware = probed_once(data_dir())
    serve_foreground(
        settings,
        service,
        on_demand_models(data_dir(), knobs, hardware),
        on_signal=stopper.signalled,
        on_pool_event=say_pool_event,
        meters=speed_meters(hardware),
    )


def _announce(
    args: argparse.Namespace, settings: ServerSettings, loaded: EngineConfig | RemoteConfig
) -> None:
    host = f"[{args.host}]" if ":" in args.host else args.host
    status(f"Serving {settings.model_id} at http://{host}:{args.port}/v1")
    if isinstance(loaded, EngineConfig):
        status(slots_note(loaded))
    if settings.idle_unload_s is not None and isinstance(loaded, EngineConfig):
        status(idle_unload_note(settings.idle_unload_s))
    if settings.api_key:
        status(f"API key: {settings.api_key}")
    if not is_loopback_host(args.host):
        status(lan_access_note(settings.security_policy().allowed_hosts()))
    status("Press Ctrl-C to stop.")


class _Stopper:
    """Makes Ctrl-C and SIGTERM end `serve` promptly. Both raise KeyboardInterrupt in the
    main thread (uvicorn, while it runs, handles them itself and raises them again once it
    has stopped); the first also starts a deadline after which every worker is killed and the
    process exits, and a second one does that at once."""

    def __init__(self) -> None:
        self._first = threading.Event()

    @property
    def signalled_once(self) -> bool:
        return self._first.is_set()

    @contextlib.contextmanager
    def handling_signals(self) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self._interrupt) for sig in _STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _interrupt(self, sig: int, _frame: FrameType | None) -> None:
        self.signalled(sig)
        raise KeyboardInterrupt

    def signalled(self, _sig: int) -> None:
        if self._first.is_set():
            _exit_now()
        self._first.set()
        threading.Thread(target=self._exit_after_grace, name="stop-deadline", daemon=True).start()

    def _exit_after_grace(self) -> None:
        threading.Event().wait(STOP_GRACE_S)
        status(f"Hearthside did not stop within {STOP_GRACE_S:.0f} s; stopping it at once.")
        _exit_now()


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _exit_now() -> None:
    kill_every_worker(for_good=True)
    os._exit(EXIT_INTERRUPTED)


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"give a whole number of at least 1, not {text!r}")
    return value


def _idle_seconds(text: str) -> int | None:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"give a whole number of seconds (0: never), not {text!r}")
    return value or None


def _idle_text(seconds: int | None) -> str:
    return "never" if seconds is None else f"{seconds} s"


def idle_unload_note(seconds: float) -> str:
    """What `serve` says about idle unloading when it starts."""
    return (
        f"A model nobody uses for {seconds:g} s is unloaded to free its memory; the next "
        "request waits while it loads again."
    )


def say_pool_event(event: PoolEvent) -> None:
    """A model unloaded or loading again, in the terminal (on the pool's threads)."""
    if event.kind == "unloaded":
        status(f"Unloaded {event.model_id} ({event.reason}); its memory is free again.")
    elif event.kind == "loading":
        status(f"Loading {event.model_id} for a request…")


def _api_key(key_file: Path | None) -> str:
    if key_file is None:
        return load_or_create_api_key(data_dir() / "api_key")
    return load_or_create_user_key_file(key_file)


def slots_note(config: EngineConfig) -> str:
    """What `serve` says about its slots: "Answers 4 requests at once, 8192 tokens each." """
    if config.n_parallel == 1:
        return f"Answers one request at a time ({config.n_ctx} tokens); others wait their turn."
    return f"Answers {config.n_parallel} requests at once, {config.n_ctx} tokens each."


def served_model_id(config: EngineConfig | RemoteConfig) -> str:
    """The name clients see: the file's stem, or the remote server's own model id."""
    if isinstance(config, RemoteConfig):
        return config.model or config.model_path
    return Path(config.model_path).stem


def allowed_lan_hosts(names: Iterable[str], port: int) -> tuple[str, ...]:
    """The exact Host values to accept for `--lan-host` names: a name without a port gets the
    port the API listens on, since clients send `Host: name:port`."""
    return tuple(_with_port(name.strip(), port) for name in names if name.strip())


def _with_port(name: str, port: int) -> str:
    if _HAS_PORT.fullmatch(name):
        return name
    if ":" in name and not name.startswith("["):
        name = f"[{name}]"  # a bare IPv6 address
    return f"{name}:{port}"


def lan_access_note(allowed_hosts: Iterable[str]) -> str:
    """What `serve` says when it listens beyond this computer: the Host names it answers, and
    how to add the one other computers will use."""
    example = f"{socket.gethostname()}.local"
    return (
        f"Answering requests addressed to {', '.join(sorted(allowed_hosts))}. Other computers "
        f"reach it by a name or address: add each one with --lan-host NAME (e.g. --lan-host "
        f"{example} or --lan-host 192.168.1.20)."
    )
