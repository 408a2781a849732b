"""The memory model against what llama.cpp really allocates, over a grid of synthetic models.

For each of 12 model shapes (dense llama-style, MoE, Gemma-3-style sliding window,
DeepSeek-style latent attention, gpt-oss) × 3 contexts × 3 KV-cache settings, the model is
loaded by the real engine and every buffer llama.cpp logs (weights, KV cache, compute, per
device) is compared with `autotune.memory.estimate_memory`'s prediction.

    .venv/bin/python benchmarks/memory_model.py [--workdir DIR] [--json]

Target: every buffer within 5% (or 16 MiB) of llama.cpp's figure. Exit status 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fixtures

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
    info = validate_gguf(path)
    spec = spec_from_gguf_info(info)
    pieces = pieces_from_gguf(info)
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
            engine = Engine(config)
            report = engine.load_report
            engine.close()
            estimate = estimate_memory(spec, config, repacked=repacked, pieces=pieces)
            for comparison in compare_with_load(estimate, report):
                rows.append(
                    {
                        "model": path.stem,
                        "n_ctx": n_ctx,
                        "kv": cache_type,
                        "flash_attn": flash_attn,
                        "device": comparison.device,
                        "purpose": comparison.purpose,
                        "predicted_mib": round(comparison.predicted_bytes / MIB, 2),
                        "allocated_mib": round(comparison.allocated_bytes / MIB, 2),
                        "ok": comparison.within_tolerance,
                    }
                )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None, help="where to write the models")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="hearthside-memory-"))
    workdir.mkdir(parents=True, exist_ok=True)
    repacked = cpu_repacked_types()
    started = time.monotonic()
    rows: list[dict[str, object]] = []
    for name, (shape, quant) in GRID_SHAPES.items():
        path = workdir / f"{name}-{quant}.gguf"
        if not path.exists():
            write_synthetic_gguf(path, shape, quant)
        rows.extend(check_shape(path, repacked))
        print(f"checked {name}", file=sys.stderr, flush=True)
    failures = [row for row in rows if not row["ok"]]
    if args.json:
        print(json.dumps({"rows": rows, "failures": len(failures)}, indent=1))
    else:
        print_summary(rows)
    loads = len(GRID_SHAPES) * len(CONTEXTS) * len(KV_SETTINGS)
    print(
        f"{len(GRID_SHAPES)} shapes x {len(CONTEXTS)} contexts x {len(KV_SETTINGS)} KV settings "
        f"= {loads} loads in {time.monotonic() - started:.0f} s; "
        f"{len(rows) - len(failures)}/{len(rows)} buffers within 5% or 16 MiB",
        file=sys.stderr,
    )
    return 1 if failures else 0


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
