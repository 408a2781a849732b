"""`hearthside models search|pull|quantize`: find GGUF models on the hub, download one, or
make a re-quantized variant of an installed model.

`add_hub_commands(commands)` registers the three subcommands on the `models` subparsers; each
sets `handler` like the other `models` subcommands. Errors a user can act on are printed as
`error: ...` on stderr with exit code 2; Ctrl-C stops a download (it resumes on the next run)
or a quantization (nothing is kept) with exit code 130.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from hearthside.app.cli_support import printable, reports_errors, text_table
from hearthside.app.progress import ProgressLine
from hearthside.core.models.download import download_model
from hearthside.core.models.hub import (
    HubFile,
    HubRepoSummary,
    list_repo_gguf_files,
    parse_pull_ref,
    pick_by_quant,
    search_models,
)
from hearthside.core.models.hub_http import HubEndpoint, HubError
from hearthside.core.models.quantize import QUANT_TYPES, quantize_model
from hearthside.core.models.store import ModelRecord, ModelStore
from hearthside.core.paths import data_dir
from hearthside.core.serialize import to_jsonable
from hearthside.core.units import format_bytes

JSON_SCHEMA = 1
EXIT_OK = 0
EXIT_INTERRUPTED = 130


def add_hub_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    search = commands.add_parser("search", help="search the model hub for GGUF models")
    search.add_argument("query", metavar="QUERY", help="words in the repo name")
    search.add_argument("--limit", type=int, default=20, help="most results to show (20)")
    search.add_argument("--json", action="store_true", help="print JSON instead of a table")
    search.set_defaults(handler=_search)

    pull = commands.add_parser("pull", help="download a GGUF model from the hub")
    pull.add_argument(
        "ref", metavar="REPO[:FILE]", help="owner/name, optionally :file.gguf inside the repo"
    )
    pull.add_argument("--quant", help="pick the file of this quantization, e.g. Q4_K_M")
    pull.add_argument("--yes", action="store_true", help="do not ask before downloading")
    pull.add_argument("--json", action="store_true", help="print the added model as JSON")
    pull.set_defaults(handler=_pull)

    quantize = commands.add_parser(
        "quantize",
        help="make a re-quantized variant of an installed model",
        description="Types: " + ", ".join(QUANT_TYPES) + ".",
    )
    quantize.add_argument("model_id", metavar="ID", help="an installed model, or 'default'")
    quantize.add_argument("type", metavar="TYPE", help="e.g. Q4_0, Q4_K_M, Q8_0")
    quantize.add_argument("--threads", type=int, default=None, help="CPU threads to use")
    quantize.add_argument("--json", action="store_true", help="print the new model as JSON")
    quantize.set_defaults(handler=_quantize)


# --- plumbing --------------------------------------------------------------------------------


def _is_interactive() -> bool:
    return sys.stdin.isatty()


def _print_json(kind: str, payload: object) -> None:
    print(json.dumps({"schema": JSON_SCHEMA, kind: payload}, indent=2))


def _size(size_bytes: int | None) -> str:
    return format_bytes(size_bytes) if size_bytes is not None else "?"


def _describe(record: ModelRecord) -> str:
    return f"{printable(record.id)} ({printable(record.name)}, {format_bytes(record.size_bytes)})"


# --- search ----------------------------------------------------------------------------------


def format_search_results(results: Sequence[HubRepoSummary]) -> str:
    if not results:
        return "No GGUF repos found."
    header = ("REPO", "DOWNLOADS", "LIKES", "UPDATED")
    rows = [
        (
            printable(result.repo) + (" (gated)" if result.gated else ""),
            str(result.downloads) if result.downloads is not None else "?",
            str(result.likes) if result.likes is not None else "?",
            printable((result.last_modified or "?")[:10]),
        )
        for result in results
    ]
    return text_table([header, *rows])


@reports_errors
def _search(args: argparse.Namespace) -> int:
    results = search_models(args.query, limit=args.limit, endpoint=HubEndpoint.from_settings())
    if args.json:
        _print_json("results", to_jsonable(results))
    else:
        print(format_search_results(results))
        if results:
            print("\nDownload one with `hearthside models pull REPO`.")
    return EXIT_OK


# --- pull ------------------------------------------------------------------------------------


def format_hub_files(files: Sequence[HubFile]) -> str:
    header = ("#", "FILE", "SIZE", "QUANT")
    rows = [
        (
            str(number),
            printable(hub_file.display_name),
            _size(hub_file.size_bytes),
            printable(hub_file.quant or "?"),
        )
        for number, hub_file in enumerate(files, start=1)
    ]
    return text_table([header, *rows])


@reports_errors
def _pull(args: argparse.Namespace) -> int:
    endpoint = HubEndpoint.from_settings()
    repo, filename = parse_pull_ref(args.ref)
    files = list_repo_gguf_files(repo, endpoint=endpoint)
    if not files:
        raise HubError(
            f"{repo} has no GGUF model files.",
            hint="Search for GGUF repos with `hearthside models search WORDS`.",
        )
    chosen = _choose(repo, files, filename, args.quant, assume_yes=args.yes)
    if chosen is None:
        print("Nothing downloaded.")
        return EXIT_OK
    with ModelStore(data_dir()) as store:
        try:
            with ProgressLine(f"Downloading {chosen.display_name}") as line:
                record = download_model(chosen, store, endpoint=endpoint, progress=line.callback)
        except KeyboardInterrupt:
            print("\nStopped. Run the same command again to resume the download.", file=sys.stderr)
            return EXIT_INTERRUPTED
    if args.json:
        _print_json("model", record.to_dict())
        return EXIT_OK
    print(f"Added {_describe(record)}.")
    print(f"Chat with it: `hearthside chat --model {printable(record.id)}`.")
    return EXIT_OK


def _choose(
    repo: str,
    files: Sequence[HubFile],
    filename: str | None,
    quant: str | None,
    *,
    assume_yes: bool,
) -> HubFile | None:
    if filename is not None:
        return _confirmed(repo, _by_filename(files, filename), assume_yes)
    if quant is not None:
        return _confirmed(repo, pick_by_quant(files, quant), assume_yes)
    if len(files) == 1:
        return _confirmed(repo, files[0], assume_yes)
    if not _is_interactive():
        raise HubError(
            f"{repo} has {len(files)} GGUF files; say which one to download.",
            hint="Add --quant TYPE or write REPO:FILE. The files:\n" + format_hub_files(files),
        )
    return _ask_for_number(repo, files)


def _by_filename(files: Sequence[HubFile], filename: str) -> HubFile:
    for hub_file in files:
        if filename in hub_file.filenames:
            return hub_file
    raise HubError(
        f"There is no GGUF model file {filename} in this repo.",
        hint="The files:\n" + format_hub_files(files),
    )


def _confirmed(repo: str, hub_file: HubFile, assume_yes: bool) -> HubFile | None:
    if assume_yes or not _is_interactive():
        return hub_file
    question = f"Download {hub_file.display_name} ({_size(hub_file.size_bytes)}) from {repo}?"
    answer = input(f"{question} [Y/n] ").strip().lower()
    return hub_file if answer in ("", "y", "yes") else None


def _ask_for_number(repo: str, files: Sequence[HubFile]) -> HubFile | None:
    print(f"GGUF files in {repo}:")
    print(format_hub_files(files))
    while True:
        try:
            answer = input(f"Pick a number (1-{len(files)}), or q to quit: ").strip().lower()
        except EOFError:
            return None
        if answer in ("q", "quit"):
            return None
        if answer.isdigit() and 1 <= int(answer) <= len(files):
            return files[int(answer) - 1]
        print(f"Type a number from 1 to {len(files)}.")


# --- quantize --------------------------------------------------------------------------------


def _print_warning(text: str) -> None:
    print(f"warning: {text}", file=sys.stderr)


@reports_errors
def _quantize(args: argparse.Namespace) -> int:
    label = f"Quantizing {args.model_id} to {args.type.upper()}"
    with ModelStore(data_dir()) as store:
        try:
            with ProgressLine(label) as line:
                record = quantize_model(
                    store,
                    args.model_id,
                    args.type,
                    progress=line.callback,
                    nthread=args.threads,
                    on_warning=_print_warning,
                )
        except KeyboardInterrupt:
            print("\nStopped; nothing was kept.", file=sys.stderr)
            return EXIT_INTERRUPTED
    if args.json:
        _print_json("model", record.to_dict())
        return EXIT_OK
    print(
        f"Added {_describe(record)}, a {printable(record.quant)} variant of "
        f"{printable(record.variant_of)}."
    )
    return EXIT_OK
