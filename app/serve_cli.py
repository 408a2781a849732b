"""`hearthside serve`: the local OpenAI-compatible API in the foreground.

With `--model remote:NAME` it is a proxy over a saved remote server: same address, same key
and the same queue as for a local model, the remote's model behind it.

`--parallel N` sets how many requests the local model answers at once (slots, each with its
own `--ctx` tokens of KV cache); without it the planner chooses (up to 4 where memory allows,
autotune/planner.py). A number that does not fit is backed off, and the loading line says so.
"""

from __future__ import annotations

import argparse
import re
import socket
from collections.abc import Iterable
from pathlib import Path

from hearthside.app.api_models import LoadKnobs, on_demand_models
from hearthside.app.cli_support import add_thread_options, parallel_requests
from hearthside.app.terminal_chat import config_for, start_loading, status
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.remote import RemoteConfig
from hearthside.core.engine.service import EngineService
from hearthside.core.paths import data_dir
from hearthside.core.server.app import ServerSettings
from hearthside.core.server.controller import check_bind_address, serve_foreground
from hearthside.core.server.keys import (
    check_bind_is_safe,
    is_loopback_host,
    load_or_create_api_key,
    load_or_create_user_key_file,
)
from hearthside.core.server.model_pool import DEFAULT_MAX_LOADED
from hearthside.core.settings import Settings

DEFAULT_PORT = 8765
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
    with EngineService(max_queue=args.max_queue) as service:
        loaded = start_loading(service, chosen).result()
        settings = ServerSettings(
            host=args.host,
            port=args.port,
            api_key=api_key,
            extra_hosts=lan_hosts,
            cors_origins=tuple(args.cors_origin),
            model_id=served_model_id(loaded),
            max_on_demand_models=args.max_models,
        )
        host = f"[{args.host}]" if ":" in args.host else args.host
        status(f"Serving {settings.model_id} at http://{host}:{args.port}/v1")
        if isinstance(loaded, EngineConfig):
            status(slots_note(loaded))
        if api_key:
            status(f"API key: {api_key}")
        if not is_loopback_host(args.host):
            status(lan_access_note(settings.security_policy().allowed_hosts()))
        status("Press Ctrl-C to stop.")
        knobs = LoadKnobs(
            n_ctx=args.ctx,
            n_threads=args.threads,
            n_threads_batch=args.batch_threads,
            n_parallel=args.parallel,
        )  # for models named by requests
        serve_foreground(settings, service, on_demand_models(data_dir(), knobs))
    return 0


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"give a whole number of at least 1, not {text!r}")
    return value


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
