"""The memory model against what llama.cpp really allocates, over a grid of synthetic models.

For each of 12 model shapes (dense llama-style, MoE, Gemma-3-style sliding window,
DeepSeek-style latent attention, gpt-oss) × 3 contexts × 3 KV-cache settings, the model is
loaded by the real engine and every buffer llama.cpp logs (weights, KV cache, compute, per
device) is compared with `autotune.memory.estimate_memory`'s prediction. Then the large
cases (tests/fixtures/large_memory_shapes.py): loads whose weights, KV cache and compute
buffers reach 320 MiB and more, where 5% is the only bound; the worst relative error per
buffer kind over those rows is printed.

    .venv/bin/python benchmarks/memory_model.py [--workdir DIR] [--json]

Target: every buffer within 5% of llama.cpp's figure (below 320 MiB: 5% + 1 MiB), counted
apart for the grid and the large cases. Exit status 1 otherwise. It reads nothing from a
data folder (synthetic models in a scratch folder, the engine loaded directly).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fixtures

from _setup import print_settings
from _targets import Target, report

from hearthside.autotune.memory import (
    REPACKED_ON_X86_AVX2,
    compare_with_load,
    estimate_memory,
    pieces_from_gguf,
    repacked_types,
)
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.engine import Engine
from hearthside.core.models.gguf_validator import validate_gguf
from hearthside.core.models.spec import spec_from_gguf_info
from hearthside.core.probe.base import ProbeContext
from hearthside.core.probe.cpu import probe as probe_cpu
from tests.fixtures.large_memory_shapes import LARGE_CASES, LARGE_SHAPES, case_settings
from tests.fixtures.synthetic_gguf import SHAPES, SyntheticShape, write_synthetic_gguf

MIB = 1024 * 1024
GRID_SHAPES: dict[str, tuple[SyntheticShape, str]] = {
    "tiny-dense": (SHAPES["tiny-dense"], "Q8_0"),
    "tiny-moe": (SHAPES["tiny-moe"], "Q4_0"),
    "tiny-gemma3": (SHAPES["tiny-gemma3"], "Q8_0"),
    "tiny-deepseek2": (SHAPES["tiny-deepseek2"], "Q8_0"),
    "tiny-gpt-oss": (SHAPES["tiny-gpt-oss"], "Q8_0"),
    "narrow-llama": (SyntheticShape("llama", 4, 512, 8, 2, 1536, n_vocab=8000), "Q8_0"),
    "wide-vocab-llama": (SyntheticShape("llama", 4, 1024, 16, 4, 2816, n_vocab=32000), "Q4_0"),
    "wide-ffn-llama": (SyntheticShape("llama", 2, 2048, 16, 8, 5632, n_vocab=4096), "Q4_K_M"),
    "gemma3-window": (
        SyntheticShape(
            "gemma3",
            12,
            256,
            4,
            1,
            768,
            head_dim=64,
            sliding_window=128,
            tied_embeddings=True,
            n_vocab=16000,
        ),
        "Q8_0",
    ),
    "many-experts": (
        SyntheticShape(
            "qwen3moe",
            4,
            512,
            8,
            2,
            1536,
            n_vocab=8000,
            n_expert=16,
            n_expert_used=4,
            n_ff_expert=256,
        ),
        "Q4_0",
    ),
    "wide-experts": (
        SyntheticShape(
            "qwen3moe",
            2,
            1024,
            16,
            4,
            1536,
            n_vocab=4000,
            n_expert=8,
            n_expert_used=8,
            n_ff_expert=2048,
        ),
        "Q8_0",
    ),
    "dense-0.5b": (SHAPES["dense-0.5b"], "Q4_0"),
}
CONTEXTS = (1024, 4096, 16384)
KV_SETTINGS = (("f16", False), ("q8_0", True), ("q4_0", True))  # (cache type, flash attention)


def cpu_repacked_types() -> frozenset[str]:
    cpu = probe_cpu(ProbeContext()).cpu
    return REPACKED_ON_X86_AVX2 if cpu is None else repacked_types(cpu.flags, cpu.arch)


def check_shape(path: Path, repacked: frozenset[str]) -> list[dict[str, object]]:
    rows = []
    for n_ctx in CONTEXTS:
        for cache_type, flash_attn in KV_SETTINGS:
            config = EngineConfig(
                str(path),
                n_ctx=n_ctx,
                type_k=cache_type,
                type_v=cache_type,
                flash_attn=flash_attn,
                n_threads=1,
            )
            rows.extend(check_load(config, repacked))
    return rows


def check_large_cases(workdir: Path, repacked: frozenset[str]) -> list[dict[str, object]]:
    paths = {}
    for name, (shape, quant) in LARGE_SHAPES.items():
        paths[name] = workdir / f"large-{name}-{quant}.gguf"
        if not paths[name].exists():
            write_synthetic_gguf(paths[name], shape, quant)
    rows: list[dict[str, object]] = []
    for case in LARGE_CASES:
        config = EngineConfig(str(paths[case.shape]), **case_settings(case))
        rows.extend({**row, "case": case.name} for row in check_load(config, repacked))
        print(f"checked large case {case.name}", file=sys.stderr, flush=True)
    return rows


def check_load(config: EngineConfig, repacked: frozenset[str]) -> list[dict[str, object]]:
    """One real load against the prediction: a row per device and buffer kind."""
    path = Path(config.model_path)
    info = validate_gguf(path)
    engine = Engine(config)
    report = engine.load_report
    engine.close()
    estimate = estimate_memory(
        spec_from_gguf_info(info), config, repacked=repacked, pieces=pieces_from_gguf(info)
    )
    return [
        {
            "model": path.stem,
            "n_ctx": config.n_ctx,
            "kv": config.type_k,
            "flash_attn": config.flash_attn,
            "device": comparison.device,
            "purpose": comparison.purpose,
            "predicted_mib": round(comparison.predicted_bytes / MIB, 2),
            "allocated_mib": round(comparison.allocated_bytes / MIB, 2),
            "relative_error": round(comparison.relative_error, 4),
            "large": comparison.is_large,
            "ok": comparison.within_tolerance,
        }
        for comparison in compare_with_load(estimate, report)
    ]


def targets_of(
    grid_rows: list[dict[str, object]], large_rows: list[dict[str, object]]
) -> list[Target]:
    return [
        Target(f"{name}: buffers off by more than the tolerance", float(sum(
            1 for row in rows if not row["ok"])), 0, "at most", unit="buffers")
        for name, rows in (("grid", grid_rows), ("large cases", large_rows))
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None, help="where to write the models")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="hearthside-memory-"))
    workdir.mkdir(parents=True, exist_ok=True)
    repacked = cpu_repacked_types()
    print_settings(
        "loads",
        {
            "shapes": {name: quant for name, (_shape, quant) in GRID_SHAPES.items()},
            "contexts": CONTEXTS,
            "KV settings (type, flash attention)": KV_SETTINGS,
            "large cases": [case.name for case in LARGE_CASES],
            "threads": 1,
            "repacked weight types on this CPU": sorted(repacked),
            "models folder": str(workdir),
        },
    )
    started = time.monotonic()
    rows: list[dict[str, object]] = []
    for name, (shape, quant) in GRID_SHAPES.items():
        path = workdir / f"{name}-{quant}.gguf"
        if not path.exists():
            write_synthetic_gguf(path, shape, quant)
        rows.extend(check_shape(path, repacked))
        print(f"checked {name}", file=sys.stderr, flush=True)
    large_rows = check_large_cases(workdir, repacked)
    failures = [row for row in rows + large_rows if not row["ok"]]
    out = sys.stderr if args.json else sys.stdout
    if args.json:
        print(json.dumps({"rows": rows + large_rows, "failures": len(failures)}, indent=1))
    else:
        print_summary(rows + large_rows)
        print_large_summary(rows + large_rows)
    loads = len(GRID_SHAPES) * len(CONTEXTS) * len(KV_SETTINGS)
    grid_ok = sum(1 for row in rows if row["ok"])
    large_ok = sum(1 for row in large_rows if row["ok"])
    print(
        f"{len(GRID_SHAPES)} shapes x {len(CONTEXTS)} contexts x {len(KV_SETTINGS)} KV settings "
        f"= {loads} loads, + {len(LARGE_CASES)} large loads, in "
        f"{time.monotonic() - started:.0f} s; grid: {grid_ok}/{len(rows)} buffers within 5% "
        f"(+ 1 MiB under 320 MiB); large cases: {large_ok}/{len(large_rows)}",
        file=sys.stderr,
    )
    return report(targets_of(rows, large_rows), out)


def worst_by_kind(rows: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    """Per buffer kind, the ≥ 320 MiB row with the largest relative error."""
    worst: dict[str, dict[str, object]] = {}
    for row in rows:
        if not row["large"]:
            continue
        kind = str(row["purpose"])
        error = abs(float(str(row["relative_error"])))
        if kind not in worst or error > abs(float(str(worst[kind]["relative_error"]))):
            worst[kind] = row
    return worst


def print_large_summary(rows: list[dict[str, object]]) -> None:
    large = [row for row in rows if row["large"]]
    held = sum(1 for row in large if row["ok"])
    print(f"\nbuffers >= 320 MiB: {len(large)} rows, {held} within 5% (no absolute slack)")
    print(f"{'kind':8} {'rows':>4} {'worst error':>11}  case")
    for kind, row in sorted(worst_by_kind(rows).items()):
        count = sum(1 for other in large if other["purpose"] == kind)
        where = row.get("case") or f"{row['model']} ctx {row['n_ctx']} {row['kv']}"
        print(f"{kind:8} {count:>4} {float(str(row['relative_error'])):>+10.2%}  {where}")


def print_summary(rows: list[dict[str, object]]) -> None:
    print(f"{'model':22} {'ctx':>6} {'kv':5} {'purpose':8} {'predicted':>10} {'llama.cpp':>10}  ok")
    for row in rows:
        if row["purpose"] == "total" or not row["ok"]:
            print(
                f"{row['model']:22} {row['n_ctx']:>6} {row['kv']:5} {row['purpose']:8} "
                f"{row['predicted_mib']:>9.1f}M {row['allocated_mib']:>9.1f}M  "
                f"{'yes' if row['ok'] else 'NO'}"
            )


if __name__ == "__main__":
    sys.exit(main())
