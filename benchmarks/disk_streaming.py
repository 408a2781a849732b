"""Decode streamed from disk under a real cgroup memory limit, against the plan's prediction.

A synthetic model larger than the limit is written (dense llama-style; with --moe also a
qwen3moe one), its pages are dropped from the page cache (posix_fadvise DONTNEED), and a
child process in a fresh cgroup v1/v2 memory cgroup loads it with mmap and decodes: the
kernel keeps what fits of the weights in the page cache and every token faults the rest in
from disk. The planner is asked about the same file on this machine with RAM = the limit
(less what the child holds before the load), the disk's speed measured on the model file
itself (a cold sequential read) and the data folder's stored calibration if there is one:
the run uses a fresh data folder (none: the planner's priors for the CPU) unless
`--use-my-data`.

    .venv/bin/python benchmarks/disk_streaming.py [--moe] [--random-access] [--limit-mib 768]
        [--use-my-data]

The plan is told the read-ahead of the disk holding the file (`/sys/block/*/queue/read_ahead_kb`):
each page fault reads a window of the file around it, so a MoE token brings in more than its
active experts' slices. `--random-access` (diagnostic) also runs the MoE with its mapping
advised MADV_RANDOM in the child, one page per fault, planned with a one-page window.

Needs root and a writable memory controller (skips with the reason otherwise). Prints
predicted and measured decode tok/s, their ratio, and what stays in RAM and what each token
reads from disk, predicted and measured (/proc/self/io read_bytes). Targets, per model
(MADV_RANDOM rows are diagnostics): measured / predicted tok/s and disk bytes per token each
within 2x either way; exit status 1 on a miss.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.cgroup_limit
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _setup, _targets when imported

from _setup import add_data_option, data_home  # noqa: E402
from _targets import Target, report  # noqa: E402

MIB = 1 << 20
DECODE_TOKENS = 6
WARMUP_TOKENS = 3
N_CTX = 512
TARGET_RATIO = 2.0
# Q8_0: llama.cpp repacks no Q8_0 weights on x86 or NEON, so all of them stay file-backed and
# can be streamed; a repacked type (Q4_0 on AVX2) is copied into anonymous memory at load.
QUANT = "Q8_0"


@dataclass(frozen=True)
class Case:
    name: str
    shape: Any  # SyntheticShape
    limit_bytes: int


def cases(limit_mib: int, moe: bool) -> list[Case]:
    from hearthside.kernels.synthetic_model import SHAPES, SyntheticShape

    found = [Case("dense-1.5b Q8_0", SHAPES["dense-1.5b"], limit_mib * MIB)]
    if moe:
        # ~1.4 GB: 24 layers of 32 experts (4 used), a token reads ~20% of the weights
        shape = SyntheticShape(
            "qwen3moe",
            24,
            1024,
            16,
            4,
            3072,
            n_vocab=32000,
            n_expert=32,
            n_expert_used=4,
            n_ff_expert=512,
        )
        found.append(Case("moe-1.4b-a0.3b Q8_0", shape, limit_mib * MIB))
    return found


# --- the child: runs in the cgroup ----------------------------------------------------------


def child(model: Path, usage_file: Path, decode_tokens: int, random_access: bool = False) -> None:
    """Load `model` with mmap and time `decode_tokens` of decode; print one JSON line."""
    from hearthside.core.engine.config import EngineConfig
    from hearthside.core.engine.engine import Engine

    baseline = int(usage_file.read_text())  # charged to the cgroup before the load
    config = EngineConfig(
        str(model), n_ctx=N_CTX, n_threads=os.cpu_count() or 1, flash_attn=True, use_mmap=True
    )
    engine = Engine(config)
    if random_access:
        _advise_random(model)
    tokens = [(17 * i + 101) % engine.n_vocab for i in range(decode_tokens + 1)]
    engine.time_decode(tokens[: WARMUP_TOKENS + 1])  # the page cache settles on what stays
    read_before = _read_bytes()
    seconds = engine.time_decode(tokens)
    read_after = _read_bytes()
    # time_decode evaluates its first token before timing: that token's reads are not timed
    timed = decode_tokens
    result = {
        "baseline_bytes": baseline,
        "decode_tps": timed / seconds,
        "disk_read_bytes_per_token": (read_after - read_before) / (timed + 1),
        "usage_bytes": int(usage_file.read_text()),
    }
    print(json.dumps(result), flush=True)
    engine.close()


def _advise_random(model: Path) -> None:
    """MADV_RANDOM on this process's mappings of `model`: a fault reads its page only."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(str(model.resolve())):
            start, end = (int(part, 16) for part in line.split()[0].split("-"))
            if libc.madvise(start, end - start, mmap.MADV_RANDOM) != 0:
                raise OSError(ctypes.get_errno(), "madvise(MADV_RANDOM) failed")


def _read_bytes() -> int:
    """Bytes this process has made the kernel fetch from storage (page faults included)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise RuntimeError("no read_bytes in /proc/self/io")


# --- the parent ------------------------------------------------------------------------------


def write_model(case: Case, folder: Path) -> Path:
    from hearthside.kernels.synthetic_model import write_synthetic_gguf

    path = folder / f"{case.name.replace(' ', '-')}.gguf"
    if not path.exists():
        write_synthetic_gguf(path, case.shape, QUANT)
    with path.open("rb") as written:
        os.fsync(written.fileno())  # DONTNEED drops clean pages only
    return path


def cold_read_bytes_per_s(path: Path) -> float:
    from hearthside.kernels.disk import read_file_s

    return path.stat().st_size / read_file_s(path, drop_cache=True)


def fault_read_bytes_per_s(path: Path) -> float:
    """The file brought in cold by page faults, as the calibration times its test file."""
    from hearthside.kernels.disk import fault_read_s

    return path.stat().st_size / fault_read_s(path)


def drop_from_page_cache(path: Path) -> None:
    from hearthside.kernels.disk import drop_cached_pages

    fd = os.open(path, os.O_RDONLY)
    try:
        drop_cached_pages(fd)
    finally:
        os.close(fd)


def measure(
    case: Case, path: Path, decode_tokens: int = DECODE_TOKENS, random_access: bool = False
) -> dict[str, Any]:
    """Decode in a child under the case's memory limit, the model's pages dropped first."""
    from tests.cgroup_limit import memory_limited_cgroup

    with memory_limited_cgroup(case.limit_bytes) as cgroup:
        usage = "memory.usage_in_bytes" if cgroup.version == 1 else "memory.current"
        drop_from_page_cache(path)
        command = [sys.executable, __file__, "--child", str(path), str(cgroup.path / usage)]
        command += [str(decode_tokens), "random" if random_access else "default"]
        result = subprocess.run(cgroup.command(command), capture_output=True, text=True)
        kills = cgroup.oom_kills
    if result.returncode != 0:
        raise RuntimeError(
            f"{case.name}: the child failed ({result.returncode}, OOM kills {kills}): "
            + result.stderr[-2000:]
        )
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def predict(
    case: Case,
    path: Path,
    measured: dict[str, Any],
    disk_bps: float,
    profile: Any = None,
    random_access: bool = False,
    fault_bps: float | None = None,
) -> Any:
    """The plan for `path` on this machine (or `profile`) with `case.limit_bytes` of RAM, the
    child's memory before the load kept free, and the disk (its read-ahead) holding `path`."""
    from hearthside.autotune.calibration import calibration_for
    from hearthside.autotune.memory import pieces_from_gguf
    from hearthside.autotune.planner import plan
    from hearthside.autotune.wisdom import WisdomDB
    from hearthside.core.models.gguf_validator import validate_gguf
    from hearthside.core.models.spec import spec_from_gguf
    from hearthside.core.probe.runner import probe_hardware

    profile = profile or probe_hardware()
    with WisdomDB() as wisdom:
        calibration = dict(calibration_for(profile, wisdom))
    calibration["disk_read_bytes_per_s"] = disk_bps
    calibration.pop("disk_fault_read_bytes_per_s", None)
    if fault_bps:
        calibration["disk_fault_read_bytes_per_s"] = fault_bps
    memory = replace(profile.memory, cgroup_limit_bytes=case.limit_bytes)
    limited = replace(profile, memory=memory, disks=model_disk(path, random_access))
    return plan(
        spec_from_gguf(path),
        limited,
        n_ctx=N_CTX,
        n_parallel=1,
        calibration=calibration,
        free_margin_bytes=measured["baseline_bytes"],
        pieces=pieces_from_gguf(validate_gguf(path)),
    )


def model_disk(path: Path, random_access: bool) -> tuple[Any, ...]:
    """The probed disk holding `path`; with `random_access`, a read-ahead of half a page (the
    planner's fault window is twice the read-ahead: one page)."""
    from hearthside.core.probe import disks
    from hearthside.core.probe.base import ProbeContext

    found = disks.probe(ProbeContext(models_dir=path.parent)).disks
    if random_access:
        found = tuple(replace(disk, read_ahead_bytes=mmap_page_bytes() // 2) for disk in found)
    return found


def mmap_page_bytes() -> int:
    import mmap

    return mmap.PAGESIZE


def row(
    case: Case,
    path: Path,
    decode_tokens: int = DECODE_TOKENS,
    profile: Any = None,
    random_access: bool = False,
) -> dict[str, Any]:
    disk_bps = cold_read_bytes_per_s(path)
    # faults one page at a time (MADV_RANDOM) are not what the calibration times
    fault_bps = None if random_access else fault_read_bytes_per_s(path)
    measured = measure(case, path, decode_tokens, random_access)
    print(f"{case.name}: measured {measured}", file=sys.stderr, flush=True)
    result = predict(case, path, measured, disk_bps, profile, random_access, fault_bps)
    speed = result.speed
    reason = next((r.why for r in result.reasons if r.setting == "use_mmap"), "")
    return {
        "model": case.name + (" MADV_RANDOM" if random_access else ""),
        "random_access": random_access,
        "read_ahead_bytes": next((d.read_ahead_bytes for d in model_disk(path, False)), None),
        "expert_fetch_share": speed.expert_fetch_share,
        "file_bytes": path.stat().st_size,
        "limit_bytes": case.limit_bytes,
        "child_before_load_bytes": measured["baseline_bytes"],
        "disk_cold_read_gb_s": disk_bps / 1e9,
        "disk_fault_read_gb_s": (fault_bps or 0) / 1e9,
        "streams_from_disk": result.streams_from_disk,
        "predicted_tps": speed.decode_tps_empty_context,
        "measured_tps": measured["decode_tps"],
        "ratio": measured["decode_tps"] / speed.decode_tps_empty_context,
        "predicted_resident_bytes": speed.resident_weights_bytes,
        "predicted_disk_bytes_per_token": speed.disk_read_bytes_per_token,
        "measured_disk_bytes_per_token": measured["disk_read_bytes_per_token"],
        "reason": reason,
    }


def print_rows(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'model':32} {'limit':>7} {'file':>7} {'pred tok/s':>10} {'meas tok/s':>10} "
        f"{'meas/pred':>9} {'disk/token pred':>15} {'meas':>7} {'meas/pred':>9}"
    )
    for r in rows:
        print(
            f"{r['model']:32} {r['limit_bytes'] / MIB:5.0f}Mi {r['file_bytes'] / MIB:5.0f}Mi "
            f"{r['predicted_tps']:10.3f} {r['measured_tps']:10.3f} {r['ratio']:9.2f} "
            f"{r['predicted_disk_bytes_per_token'] / MIB:13.0f}Mi "
            f"{r['measured_disk_bytes_per_token'] / MIB:5.0f}Mi {disk_ratio(r):9.2f}"
        )
        read_ahead = (r["read_ahead_bytes"] or 0) / 1024
        print(
            f"  disk {r['disk_cold_read_gb_s']:.2f} GB/s cold, "
            f"{r['disk_fault_read_gb_s']:.2f} GB/s by page faults, "
            f"read-ahead {read_ahead:.0f} KiB, "
            f"expert fetch share {r['expert_fetch_share']:.2f}; plan: {r['reason']}"
        )


def disk_ratio(r: dict[str, Any]) -> float:
    return float(r["measured_disk_bytes_per_token"] / max(1, r["predicted_disk_bytes_per_token"]))


def factor_off(ratio: float) -> float:
    """How many times apart two figures are, whichever is larger: 0.5 and 2 are both 2."""
    return max(ratio, 1 / ratio) if ratio > 0 else float("inf")


def targets_of(rows: list[dict[str, Any]]) -> list[Target]:
    """The measured-to-predicted ratios, within TARGET_RATIO either way, for what llama.cpp
    does by itself (MADV_RANDOM rows check the bytes read only, and have no target)."""
    targets = []
    for r in rows:
        if r["random_access"]:
            continue
        targets.append(
            Target(
                f"{r['model']}: tok/s measured / predicted, times apart",
                factor_off(r["ratio"]),
                TARGET_RATIO,
                "at most",
            )
        )
        targets.append(
            Target(
                f"{r['model']}: disk bytes/token measured / predicted, times apart",
                factor_off(disk_ratio(r)),
                TARGET_RATIO,
                "at most",
            )
        )
    return targets  # fmt: skip


def main() -> int:
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        child(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "random")
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit-mib", type=int, default=768)
    parser.add_argument("--moe", action="store_true", help="also a MoE model")
    parser.add_argument(
        "--random-access", action="store_true", help="also the MoE advised MADV_RANDOM"
    )
    parser.add_argument("--no-dense", action="store_true", help="skip the dense model")
    parser.add_argument("--workdir", type=Path, help="where the models go (default: a temp dir)")
    parser.add_argument("--json", action="store_true")
    add_data_option(parser)
    args = parser.parse_args()
    with data_home(args.use_my_data) as home:
        print(home.describe(), file=sys.stderr)
        rows = measure_rows(args)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print_rows(rows)
    return report(targets_of(rows), sys.stderr if args.json else sys.stdout)


def measure_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(dir=args.workdir) as folder:
        rows = []
        for case in cases(args.limit_mib, args.moe):
            if args.no_dense and not case.shape.n_expert:
                continue
            path = write_model(case, Path(folder))
            rows.append(row(case, path))
            if args.random_access and case.shape.n_expert:
                rows.append(row(case, path, random_access=True))
    return rows


if __name__ == "__main__":
    sys.exit(main())
