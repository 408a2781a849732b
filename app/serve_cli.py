"""`hearthside serve`: the local OpenAI-compatible API in the foreground.

With `--model remote:NAME` it is a proxy over a saved remote server: same address, same key
and the same queue as for a local model, the remote's model behind it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hearthside.app.terminal_chat import config_for, start_loading, status
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.remote import RemoteConfig
from hearthside.core.engine.service import EngineService
from hearthside.core.paths import data_dir
from hearthside.core.server.app import ServerSettings
from hearthside.core.server.controller import serve_foreground
from hearthside.core.server.keys import check_bind_is_safe, load_or_create_api_key
from hearthside.core.settings import Settings

DEFAULT_PORT = 8765


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
    serve.add_argument("--ctx", type=int, default=settings.context_size, help="context tokens")
    serve.add_argument(
        "--api-key-file", type=Path, help="file holding the key (default: one per install)"
    )
    serve.add_argument(
        "--no-key", action="store_true", help="accept requests without a key (loopback only)"
    )
    serve.add_argument("--lan-host", action="append", default=[], help="extra Host name:port")
    serve.add_argument("--cors-origin", action="append", default=[], help="allowed web origin")
    serve.add_argument("--max-queue", type=int, default=settings.max_queue)
    serve.set_defaults(handler=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    chosen = config_for(args.model, args.ctx, None, None)
    api_key = None
    if not args.no_key:
        api_key = load_or_create_api_key(args.api_key_file or data_dir() / "api_key")
    check_bind_is_safe(args.host, api_key)  # before the model loads: fail fast
    with EngineService(max_queue=args.max_queue) as service:
        loaded = start_loading(service, chosen).result()
        settings = ServerSettings(
            host=args.host,
            port=args.port,
            api_key=api_key,
            extra_hosts=tuple(args.lan_host),
            cors_origins=tuple(args.cors_origin),
            model_id=served_model_id(loaded),
        )
        host = f"[{args.host}]" if ":" in args.host else args.host
        status(f"Serving {settings.model_id} at http://{host}:{args.port}/v1")
        if api_key:
            status(f"API key: {api_key}")
        status("Press Ctrl-C to stop.")
        serve_foreground(settings, service)
    return 0


def served_model_id(config: EngineConfig | RemoteConfig) -> str:
    """The name clients see: the file's stem, or the remote server's own model id."""
    if isinstance(config, RemoteConfig):
        return config.model or config.model_path
    return Path(config.model_path).stem
