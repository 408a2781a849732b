"""`hearthside models ...`: list, add, remove and choose the models Hearthside runs.

Each subcommand sets `handler`, a function of the parsed arguments returning the exit code;
the main CLI calls `args.handler(args)`. Errors a user can act on are printed as
`error: ...` on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from hearthside.app.cli_support import printable, reports_errors, text_table
from hearthside.app.models_hub_cli import add_hub_commands
from hearthside.app.progress import ProgressLine
from hearthside.core.display_text import shortened
from hearthside.core.errors import HearthsideError
from hearthside.core.models.catalog import resolve_spec
from hearthside.core.models.default_model import ensure_default_model, ensure_default_model_once
from hearthside.core.models.spec import ModelSpec, TensorGroup, human_params
from hearthside.core.models.store import DEFAULT_REF, ModelRecord, ModelStore
from hearthside.core.paths import data_dir
from hearthside.core.units import format_bytes

LIST_JSON_SCHEMA = 1
EXIT_OK = 0
EXIT_NO_DEFAULT = 1


def add_models_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    models = subparsers.add_parser(
        "models",
        help="list, add and remove models",
        description="Manage the GGUF model files Hearthside can run.",
    )
    commands = models.add_subparsers(dest="models_command", metavar="COMMAND", required=True)

    listing = commands.add_parser("list", help="show installed models")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(handler=_list_models)

    adding = commands.add_parser("add", help="add a GGUF model file")
    adding.add_argument("path", metavar="PATH", help="the .gguf file to add")
    adding.add_argument(
        "--link", action="store_true", help="use the file where it is instead of copying it"
    )
    adding.add_argument("--name", help="a display name (default: the name inside the file)")
    adding.set_defaults(handler=_add_model)

    removing = commands.add_parser("remove", help="remove a model")
    removing.add_argument("model_id", metavar="ID")
    removing.add_argument(
        "--keep-file", action="store_true", help="unregister it but keep the model file"
    )
    removing.set_defaults(handler=_remove_model)

    default = commands.add_parser("default", help="show or choose the default model")
    default.add_argument("model_id", metavar="ID", nargs="?", help="the model to make default")
    default.set_defaults(handler=_default_model)

    install = commands.add_parser("install-default", help="install the bundled default model")
    install.set_defaults(handler=_install_default)
    add_hub_commands(commands)

    showing = commands.add_parser(
        "show",
        help="show a model's architecture, parameters and sizes",
        description="Show the spec the planner uses for a model: an installed model id, "
        "'default', a .gguf path, a catalog id (e.g. llama-3.1-70b) or a descriptor .json.",
    )
    showing.add_argument("ref", metavar="REF", help="what to show (see above)")
    showing.add_argument("--json", action="store_true", help="print the ModelSpec as JSON")
    showing.set_defaults(handler=_show_model)


# --- plumbing --------------------------------------------------------------------------------


def _open_store() -> ModelStore:
    return ModelStore(data_dir())


def _install_default_on_first_use(store: ModelStore) -> None:
    with ProgressLine("Installing the default model") as line:
        ensure_default_model_once(store, progress=line.callback)


# --- formatting ------------------------------------------------------------------------------


def _shown(value: object) -> str:
    """Text from a model file as one printed field: shortened, then escaped."""
    return printable(shortened(str(value)))


def format_models(records: Sequence[ModelRecord]) -> str:
    """The human listing: a table, then the licence notices of the listed models."""
    if not records:
        return (
            "No models installed.\n"
            "Add one with `hearthside models add PATH`, or install the default model with "
            "`hearthside models install-default`."
        )
    header = ("ID", "NAME", "SIZE", "QUANT", "ARCH", "DEFAULT")
    rows = [
        (
            _shown(record.id),
            _shown(record.name) + (" (linked)" if record.linked else "") + _variant_note(record),
            format_bytes(record.size_bytes),
            _shown(record.quant or "?"),
            _shown(record.architecture or "?"),
            "*" if record.is_default else "",
        )
        for record in records
    ]
    text = text_table([header, *rows])
    notices = [
        f"  {_shown(record.id)}: {_shown(record.licence)}" for record in records if record.licence
    ]
    if notices:
        text += "\n\nLicences:\n" + "\n".join(notices)
    return text


def _variant_note(record: ModelRecord) -> str:
    return f" (variant of {_shown(record.variant_of)})" if record.variant_of else ""


def _describe(record: ModelRecord) -> str:
    """A record in one line; its id and name come from the model file, hence `printable`."""
    return f"{_shown(record.id)} ({_shown(record.name)}, {format_bytes(record.size_bytes)})"


# --- handlers --------------------------------------------------------------------------------


@reports_errors
def _list_models(args: argparse.Namespace) -> int:
    with _open_store() as store:
        _install_default_on_first_use(store)
        records = store.list()
    if args.json:
        payload = {"schema": LIST_JSON_SCHEMA, "models": [r.to_dict() for r in records]}
        print(json.dumps(payload, indent=2))
    else:
        print(format_models(records))
    return EXIT_OK


@reports_errors
def _add_model(args: argparse.Namespace) -> int:
    label = "Hashing" if args.link else "Copying"
    with _open_store() as store, ProgressLine(label) as line:
        record = store.add(Path(args.path), link=args.link, name=args.name, progress=line.callback)
        has_default = store.default() is not None
    print(f"Added {_describe(record)}.")
    if record.linked:
        print(f"It stays at {printable(record.path)}; Hearthside will never delete that file.")
    if not has_default:
        print(f"Make it the default with `hearthside models default {printable(record.id)}`.")
    return EXIT_OK


@reports_errors
def _remove_model(args: argparse.Namespace) -> int:
    with _open_store() as store:
        will_delete = not args.keep_file and store.owns_file(store.get(args.model_id))
        record = store.remove(args.model_id, delete_file=not args.keep_file)
    print(f"Removed {printable(record.id)}.")
    if will_delete:
        print("Its file was deleted.")
    else:
        print(f"Its file was left at {printable(record.path)}.")
    return EXIT_OK


@reports_errors
def _default_model(args: argparse.Namespace) -> int:
    with _open_store() as store:
        if args.model_id is not None:
            record = store.set_default(args.model_id)
            print(f"{_describe(record)} is now the default model.")
            return EXIT_OK
        _install_default_on_first_use(store)
        current = store.default()
    if current is None:
        print(
            "No default model is set. Choose one with `hearthside models default ID`, or run "
            "`hearthside models install-default`.",
            file=sys.stderr,
        )
        return EXIT_NO_DEFAULT
    print(_describe(current))
    return EXIT_OK


@reports_errors
def _install_default(args: argparse.Namespace) -> int:
    with _open_store() as store, ProgressLine("Installing the default model") as line:
        record = ensure_default_model(store, progress=line.callback)
    marker = " (the default)" if record.is_default else ""
    print(f"Installed {_describe(record)}{marker}.")
    if record.licence:
        print(printable(record.licence))
    return EXIT_OK


@reports_errors
def _show_model(args: argparse.Namespace) -> int:
    with _open_store() as store:
        if args.ref == DEFAULT_REF:
            _install_default_on_first_use(store)
        spec = resolve_spec(args.ref, store)
    if args.json:
        print(json.dumps(spec.to_dict(), indent=2))
    else:
        print(format_spec(spec))
    return EXIT_OK


# --- `models show` ---------------------------------------------------------------------------


def format_spec(spec: ModelSpec) -> str:
    """The readable summary of a model spec: the numbers, then bytes per tensor group."""
    name, architecture = _shown(spec.name), _shown(spec.architecture)
    lines = [f"{name}  ({architecture}, from {_shown(_spec_origin(spec))})", ""]
    lines += [f"  {label:<13}{_shown(value)}" for label, value in _spec_facts(spec)]
    rows = [tuple(_shown(cell) for cell in row) for row in _group_rows(spec)]
    lines += ["", *("  " + row for row in text_table(rows).splitlines())]
    if spec.unknown:
        unknown = ", ".join(_shown(field) for field in spec.unknown)
        lines += ["", f"Could not be determined: {unknown}."]
    return "\n".join(lines)


def _spec_origin(spec: ModelSpec) -> str:
    kind = {"gguf": "GGUF file", "catalog": "catalog", "descriptor": "descriptor"}
    where = f" {spec.ref}" if spec.ref else ""
    return kind.get(spec.source, spec.source) + where


def _spec_facts(spec: ModelSpec) -> list[tuple[str, str]]:
    facts = [
        ("parameters", _params_text(spec)),
        ("layers", _layers_text(spec)),
        ("widths", _widths_text(spec)),
        ("attention", _attention_text(spec)),
        ("experts", _experts_text(spec)),
        ("context", f"{_num(spec.context_length)} tokens (trained)"),
        (
            "vocabulary",
            _num(spec.vocab_size) + (", tied to the output" if spec.tied_embeddings else ""),
        ),
        ("weights", _weights_text(spec)),
        ("KV cache", _kv_text(spec)),
    ]
    if spec.licence:
        facts.append(("licence", spec.licence))
    if spec.gguf_repo:
        facts.append(("GGUF on hub", spec.gguf_repo))
    return facts


def _num(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _vocab_text(spec: ModelSpec) -> str:
    return _num(spec.vocab_size) + (", tied to the output" if spec.tied_embeddings else "")


def _params_text(spec: ModelSpec) -> str:
    text = f"{human_params(spec.total_params)} total"
    if spec.n_expert:
        text += f", {human_params(spec.active_params)} active per token"
    return text


def _widths_text(spec: ModelSpec) -> str:
    no_dense_ffn = spec.n_ff is None and spec.n_ff_expert is not None
    ffn = "no dense FFN" if no_dense_ffn else f"FFN {_num(spec.n_ff)}"
    return f"embedding {_num(spec.n_embd)}, {ffn}"


def _layers_text(spec: ModelSpec) -> str:
    text = _num(spec.n_layers)
    if spec.sliding_window is not None:
        text += (
            f" ({len(spec.swa_layers)} with a {spec.sliding_window:,}-token sliding window, "
            f"{len(spec.layers) - len(spec.swa_layers)} global)"
        )
    return text


def _attention_text(spec: ModelSpec) -> str:
    kv_heads = _num(spec.n_head_kv) + (" latent (MLA)" if spec.mla else "")
    kv_label = "KV head" if spec.n_head_kv == 1 else "KV heads"
    return (
        f"{_num(spec.n_head)} heads, {kv_heads} {kv_label}, "
        f"head dims K {_num(spec.head_dim_k)} / V {_num(spec.head_dim_v)}"
    )


def _experts_text(spec: ModelSpec) -> str:
    if not spec.n_expert:
        return "none (dense)"
    text = f"{spec.n_expert} routed, {spec.n_expert_used} used per token"
    if spec.n_expert_shared:
        text += f", {spec.n_expert_shared} shared"
    if spec.n_ff_expert:
        text += f", FFN {spec.n_ff_expert:,} each"
    if spec.n_layer_dense_lead:
        text += f"; first {spec.n_layer_dense_lead} layers dense"
    return text


def _weights_text(spec: ModelSpec) -> str:
    size = "?" if spec.size_bytes is None else format_bytes(spec.size_bytes)
    bits = "?" if spec.bits_per_weight is None else f"{spec.bits_per_weight:.2f}"
    return f"{spec.file_type or 'custom'}, {bits} bits per weight, {size}"


def _kv_text(spec: ModelSpec) -> str:
    try:
        per_token = spec.kv_bytes_per_token()
    except HearthsideError:
        return "?"
    text = f"{per_token / 1024:,.1f} KiB per token at f16"
    if spec.sliding_window is not None:
        text += " (global layers; sliding-window layers hold a fixed window)"
    return text


def _group_rows(spec: ModelSpec) -> list[tuple[str, str, str, str]]:
    def summed(name: str) -> TensorGroup:
        return TensorGroup.sum(getattr(layer, name) for layer in spec.layers)

    groups = [
        ("embeddings", spec.embeddings),
        ("output", spec.output),
        ("output norm", spec.output_norm),
        ("attention", summed("attention")),
        ("dense FFN", summed("ffn")),
        ("experts", summed("experts")),
        ("shared experts", summed("shared_experts")),
        ("norms", summed("norms")),
        ("router, other", summed("other")),
        ("other tensors", spec.other_tensors),
    ]
    rows = [("TENSORS", "PARAMS", "SIZE", "TYPES")]
    for label, group in groups:
        if group.params == 0 and not (label == "output" and spec.tied_embeddings):
            continue
        if group.params == 0:
            rows.append((label, "-", "-", "tied to embeddings"))
            continue
        types = ", ".join(group.quant_types) or "?"
        rows.append((label, human_params(group.params), format_bytes(group.bytes), types))
    return rows
