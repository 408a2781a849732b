"""`hearthside remote ...`: save, list and remove OpenAI-compatible servers to chat through.

A saved remote is used as `--model remote:NAME` by `hearthside chat` and `hearthside serve`.
Keys are read from a file or stdin (never from the command line, where other users' `ps`
would see them), stored in a private file, and never printed: `list` shows "set" or "none".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hearthside.app.cli_support import reports_errors, text_table
from hearthside.core.engine.remote import RemoteConfigError, fetch_models
from hearthside.core.engine.remotes import Remote, RemoteRegistry

MAX_KEY_INPUT_BYTES = 8192


def add_remote_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    remote = subparsers.add_parser(
        "remote",
        help="chat through an OpenAI-compatible server (vLLM, llama-server, Ollama …)",
        description="Save servers to use as `--model remote:NAME` in `chat` and `serve`.",
    )
    commands = remote.add_subparsers(dest="remote_command", metavar="COMMAND", required=True)

    adding = commands.add_parser("add", help="save a server")
    adding.add_argument("name", metavar="NAME", help="a short name, used as remote:NAME")
    adding.add_argument("url", metavar="URL", help="the API address, e.g. http://HOST:8000/v1")
    adding.add_argument("--model", help="the server's model to use (default: the first listed)")
    key = adding.add_mutually_exclusive_group()
    key.add_argument("--api-key-file", type=Path, help="a file holding the server's API key")
    key.add_argument("--api-key-stdin", action="store_true", help="read the API key from stdin")
    adding.add_argument("--replace", action="store_true", help="replace a remote of that name")
    adding.set_defaults(handler=_add)

    listing = commands.add_parser("list", help="show the saved servers")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(handler=_list)

    removing = commands.add_parser("remove", help="forget a server and its key")
    removing.add_argument("name", metavar="NAME")
    removing.set_defaults(handler=_remove)

    models = commands.add_parser("models", help="list the models a saved server offers")
    models.add_argument("name", metavar="NAME")
    models.set_defaults(handler=_models)


@reports_errors
def _add(args: argparse.Namespace) -> int:
    api_key = _read_key(args)
    remote = RemoteRegistry().add(
        args.name, args.url, model=args.model, api_key=api_key, replace_existing=args.replace
    )
    key_note = "with its key" if remote.has_key else "without a key"
    print(f"Saved remote '{remote.name}' ({remote.base_url}) {key_note}.")
    print(f"Check it with `hearthside remote models {remote.name}`; chat with --model "
          f"remote:{remote.name}.")  # fmt: skip
    return 0


@reports_errors
def _list(args: argparse.Namespace) -> int:
    remotes = RemoteRegistry().all()
    if args.json:
        print(json.dumps({"schema": 1, "remotes": [_summary(r) for r in remotes]}, indent=2))
        return 0
    if not remotes:
        print("No remote servers saved. Add one with `hearthside remote add NAME URL`.")
        return 0
    rows = [("NAME", "URL", "MODEL", "KEY")]
    rows += [(r.name, r.base_url, r.model or "(first listed)", _key_state(r)) for r in remotes]
    print(text_table(rows))
    return 0


@reports_errors
def _remove(args: argparse.Namespace) -> int:
    remote = RemoteRegistry().remove(args.name)
    print(f"Removed remote '{remote.name}'" + (" and its key." if remote.has_key else "."))
    return 0


@reports_errors
def _models(args: argparse.Namespace) -> int:
    registry = RemoteRegistry()
    remote = registry.get(args.name)
    models = fetch_models(remote.config(registry.root))
    if not models:
        print(f"{remote.base_url} serves no models.")
        return 0
    rows = [("MODEL", "CONTEXT", "OWNER")]
    for model in models:
        context = str(model.context_length) if model.context_length else "-"
        chosen = " *" if model.id == remote.model else ""
        rows.append((model.id + chosen, context, model.owned_by or "-"))
    print(text_table(rows))
    return 0


def _read_key(args: argparse.Namespace) -> str | None:
    if args.api_key_stdin:
        raw = sys.stdin.read(MAX_KEY_INPUT_BYTES)
    elif args.api_key_file is not None:
        try:
            raw = args.api_key_file.read_text(encoding="utf-8")[:MAX_KEY_INPUT_BYTES]
        except (OSError, UnicodeDecodeError) as exc:
            raise RemoteConfigError(
                f"Could not read the key file {args.api_key_file}.",
                hint=f"Check the path and that it is a text file ({type(exc).__name__}).",
            ) from None
    else:
        return None
    key = raw.strip()
    if not key:
        raise RemoteConfigError("The API key given is empty.")
    return key


def _key_state(remote: Remote) -> str:
    return "set" if remote.has_key else "none"


def _summary(remote: Remote) -> dict[str, object]:
    return {
        "name": remote.name,
        "base_url": remote.base_url,
        "model": remote.model,
        "key": _key_state(remote),
    }
