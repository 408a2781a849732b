"""The steps of `benchmarks/device_check.sh`, each writing one JSON part to OUT/parts/.

    python benchmarks/device_check.py STEP --out DIR [--dry]
    python benchmarks/device_check.py carry CACHE CARRY [ARCH]   (--prepare: slimmed wheels)

Steps, in the order the script runs them (docs/gpu.md says what each compares):
    preflight  the GPUs nvidia-smi lists (none: stop, unless --dry)
    engine     the CUDA wheel carried for this GPU, else a compile with every core; its
               self-test with every layer on the GPU; `hearthside engine info --json`
    probe      `hearthside probe --json` against nvidia-smi, field by field
    plan       predicted against allocated memory per device and predicted against measured
               decode/prefill, per model and offload setting
    tune       `hearthside tune --budget-s 60` on the 8B shape against llama.cpp's defaults
    report     every part in OUT/device-check.json, the ratios printed, PASS/MISS

`--dry` runs what needs no GPU (this is what the tests run): the wheel is looked up and read
but not installed, the self-test and `engine info` run on the installed build, predictions are
made for the recorded H200 profile, and every measurement is "skipped: dry run".
preflight is standard library only, so a machine without a GPU is told so before anything is
installed or imported.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
H200_FIXTURE = REPO / "tests" / "fixtures" / "probe" / "gpu" / "h200" / "golden.json"
NVIDIA_SMI = (
    "nvidia-smi",
    "--query-gpu=name,memory.total,compute_cap,driver_version,memory.used",
    "--format=csv,noheader,nounits",
)
NO_GPU_EXIT = 3
NO_GPU_MESSAGE = (
    "device_check: no NVIDIA GPU here ({why}). This check measures a CUDA build on a GPU: "
    "run it on the device machine (docs/gpu.md), or with --dry for its plumbing only."
)
MEMORY_WITHIN = 0.05  # llama.cpp's buffers and NVML's used memory against the prediction
SPEED_WITHIN = 0.20  # measured decode/prefill against the prediction
N_PROMPT, N_GEN = 512, 64
LENT_ARCH = "90"  # the device machines lent (H100, H200) are sm_90
CONTEXT = 4096
MIB = 2**20
# The synthetic shapes written on the device (kernels/synthetic_model.py SHAPES) and their
# quantization; the dry run predicts for tiny ones instead.
MODELS = {"llama-8b": ("llama-3.1-8b", "Q4_0"), "moe": ("qwen3-30b-a3b", "Q4_0")}
DRY_MODELS = {"llama-8b": ("tiny-dense", "Q8_0"), "moe": ("tiny-moe", "Q8_0")}


# --- parts ---------------------------------------------------------------------------------------


def write_part(out: Path, name: str, payload: Mapping[str, Any]) -> None:
    folder = out / "parts"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(payload, indent=2, default=str))


def read_part(out: Path, name: str) -> dict[str, Any]:
    path = out / "parts" / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def skipped(why: str) -> dict[str, Any]:
    return {"status": "skipped", "why": why}


# --- preflight (standard library only) -----------------------------------------------------------


def nvidia_smi_rows(run: Callable[[Sequence[str]], str | None] | None = None) -> list[dict]:
    """nvidia-smi's GPUs: name, memory_mib, compute_cap ("9.0"), driver, used_mib."""
    text = (run or _run_text)(NVIDIA_SMI) or ""
    rows = []
    for line in text.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) >= 5 and fields[0]:
            name, total, cap, driver, used = fields[:5]
            rows.append(
                {
                    "name": name,
                    "memory_mib": _int(total),
                    "compute_cap": cap,
                    "driver": driver,
                    "used_mib": _int(used),
                }
            )
    return rows


def _run_text(command: Sequence[str]) -> str | None:
    if shutil.which(command[0]) is None:
        return None
    done = subprocess.run(list(command), capture_output=True, text=True, timeout=30, check=False)
    return done.stdout if done.returncode == 0 else None


def _int(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def preflight(out: Path, dry: bool) -> int:
    rows = nvidia_smi_rows()
    why = "nvidia-smi is not installed" if shutil.which("nvidia-smi") is None else "it lists none"
    write_part(
        out,
        "preflight",
        {
            "status": "ok" if rows else ("dry" if dry else "no_gpu"),
            "gpus": rows,
            "no_gpu_reason": None if rows else why,
            "cpu_count": os.cpu_count(),
            "python": sys.version.split()[0],
            "dry": dry,
        },
    )
    if not rows and not dry:
        print(NO_GPU_MESSAGE.format(why=why), file=sys.stderr)
        return NO_GPU_EXIT
    print(f"preflight: {len(rows)} NVIDIA GPU(s)" + ("" if rows else f" ({why}; dry run)"))
    return 0


def sm_arch(compute_cap: str) -> str:
    """ "9.0" → "90" (CMake's number)."""
    major, _, minor = compute_cap.partition(".")
    return f"{major}{minor}"


# --- engine ------------------------------------------------------------------------------------


def wheel_search_folders() -> list[Path]:
    """Where a carried or cached CUDA wheel may be: $ENGINE_WHEELS, the carried folder
    (.device-carry/engine-wheels) and the engine-wheel cache."""
    from hearthside.core.probe.engine_ladder import engine_wheel_cache

    folders = [Path(os.environ["ENGINE_WHEELS"])] if os.environ.get("ENGINE_WHEELS") else []
    return [*folders, REPO / ".device-carry" / "engine-wheels", engine_wheel_cache()]


def find_cuda_wheel(arch: str, folders: Sequence[Path]) -> tuple[Path, dict] | None:
    """The newest wheel whose cuda-build.json says it holds code for `arch` ("90")."""
    found = []
    for folder in folders:
        for record_path in sorted(folder.glob("*/cuda-build.json")):
            record = json.loads(record_path.read_text())
            wheels = sorted(record_path.parent.glob("*.whl"))
            if wheels and arch in record.get("archs_found", []):
                found.append((record_path.stat().st_mtime, wheels[-1], record))
    if not found:
        return None
    _, wheel, record = max(found, key=lambda item: item[0])
    return wheel, record


def cpu_flags_missing(record: Mapping[str, Any]) -> list[str]:
    """Instruction sets the wheel's build machine had and this CPU lacks: a CUDA build's CPU
    backend is compiled with -march=native (the ladder's CUDA rung leaves GGML_NATIVE on)."""
    from hearthside.core.probe.engine_build import read_cpu_flags

    wanted = {flag for flag in record.get("host_cpu_flags", []) if flag.startswith("avx")}
    return sorted(wanted - read_cpu_flags())


def engine(out: Path, dry: bool, site: Path) -> int:
    gpus = read_part(out, "preflight").get("gpus", [])
    arch = sm_arch(gpus[0]["compute_cap"]) if gpus else "90"
    part: dict[str, Any] = {"arch": arch}
    found = find_cuda_wheel(arch, wheel_search_folders())
    if found is not None:
        wheel, record = found
        part["wheel"] = {"path": str(wheel), "bytes": wheel.stat().st_size, "record": record}
        part["wheel"]["holds_libggml_cuda"] = _holds_cuda_library(wheel)
        missing = cpu_flags_missing(record)
        if missing:
            part["wheel"]["unusable"] = (
                f"built on a CPU with {', '.join(missing)}, which this lacks"
            )
            found = None
    if dry:
        part["install"] = skipped("dry run: the wheel is read, not installed")
    else:
        part["install"] = install_engine(found[0] if found else None, site)
        if part["install"]["status"] != "ok":
            write_part(out, "engine", {**part, "status": "failed"})
            print(f"engine: {part['install']['why']}", file=sys.stderr)
            return 1
    part["self_test"] = gpu_self_test(out)
    part["engine_info"] = hearthside_json(["engine", "info", "--json"])
    passed = part["self_test"].get("status") == "passed"
    part["status"] = "ok" if passed else "failed"
    write_part(out, "engine", part)
    print(f"engine: self-test {part['self_test'].get('status')} ({_cuda_words(part)})")
    return 0 if passed else 1


# What `import llama_cpp` loads: libllama.so and libmtmd.so by path, and through their
# DT_NEEDED entries (found beside them, RUNPATH $ORIGIN) each library's soname, "*.so.0".
def _kept_in_carry(name: str) -> bool:
    if not name.startswith("llama_cpp/lib/"):
        return not name.startswith(("lib/", "include/", "bin/"))  # CMake's install tree
    file = Path(name).name
    return file in {"libllama.so", "libmtmd.so"} or file.endswith(".so.0")


def slim_wheel(source: Path, target: Path) -> int:
    """`source` without the copies a wheel makes of symlinks (each shared library three times
    in llama_cpp/lib and three more in lib/: 256 MiB for one CUDA architecture, past the 64 MiB
    a device run carries), with its RECORD listing what is kept; the bytes written."""
    with (
        zipfile.ZipFile(source) as wheel,
        zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as slim,
    ):
        record_name = next(n for n in wheel.namelist() if n.endswith(".dist-info/RECORD"))
        kept = [n for n in wheel.namelist() if n != record_name and _kept_in_carry(n)]
        for name in kept:
            slim.writestr(wheel.getinfo(name), wheel.read(name), zipfile.ZIP_DEFLATED)
        lines = wheel.read(record_name).decode().splitlines()
        record = [line for line in lines if line.split(",", 1)[0] in kept]
        slim.writestr(record_name, "\n".join([*record, f"{record_name},,"]) + "\n")
    return target.stat().st_size


def carry_cuda_wheels(cache: Path, carry: Path, arch: str = LENT_ARCH) -> int:
    """Each cached CUDA wheel (a folder with cuda-build.json) with code for `arch` into
    `carry`, slimmed; 1 when there is none. Only that architecture's: the sm_70 wheel alone is
    67 MiB slimmed (its CUDA 12.4 library is 182 MiB, sm_90's 57 MiB)."""
    records = [
        record
        for record in sorted(cache.glob("*/cuda-build.json"))
        if arch in json.loads(record.read_text()).get("archs_found", [])
    ]
    for record in records:
        folder = carry / record.parent.name
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(record, folder / record.name)
        for wheel in record.parent.glob("*.whl"):
            size = slim_wheel(wheel, folder / wheel.name)
            print(f"carry: {wheel.name} {wheel.stat().st_size / MIB:.0f} -> {size / MIB:.0f} MiB")
    return 0 if records else 1


def _holds_cuda_library(wheel: Path) -> bool:
    with zipfile.ZipFile(wheel) as archive:
        return any(Path(name).name.startswith("libggml-cuda.so") for name in archive.namelist())


def _cuda_words(part: Mapping[str, Any]) -> str:
    info = str(part["self_test"].get("system_info", ""))
    return "CUDA in the build" if "CUDA" in info else "no CUDA in the build"


def install_engine(wheel: Path | None, site: Path) -> dict[str, Any]:
    """pip install of the carried wheel into `site`; without one, a compile with every core
    from a carried sdist ($LLAMA_CPP_SDIST) with the flags the ladder picks for this GPU."""
    started = time.perf_counter()
    if wheel is None:
        wheel_or_why = compile_here()
        if isinstance(wheel_or_why, str):
            return {"status": "failed", "why": wheel_or_why}
        wheel = wheel_or_why
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    command += ["--upgrade", "--target", str(site), str(wheel)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"status": "failed", "why": f"pip install failed: {done.stderr[-1500:]}"}
    return {"status": "ok", "wheel": str(wheel), "seconds": round(time.perf_counter() - started)}


def compile_here() -> Path | str:
    from hearthside.core.probe.engine_build import choose_build, quick_gpu_scan, read_cpu_flags

    sdist = os.environ.get("LLAMA_CPP_SDIST")
    if not sdist or not Path(sdist).exists():
        return (
            "no CUDA wheel for this GPU was carried and no llama-cpp-python sdist either "
            "($LLAMA_CPP_SDIST): build one with benchmarks/cuda_build.py and carry it "
            "(docs/gpu.md)"
        )
    build = choose_build(
        quick_gpu_scan(), platform=sys.platform, machine="x86_64", cpu_flags=read_cpu_flags()
    )
    scratch = Path(tempfile.mkdtemp(prefix="device-check-wheel-"))
    env = {
        **os.environ,
        "CMAKE_ARGS": build.env.get("CMAKE_ARGS", ""),
        "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 4),
    }
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    command += ["-w", str(scratch), sdist]
    print(f"engine: compiling with CMAKE_ARGS={env['CMAKE_ARGS']!r} …", flush=True)
    if subprocess.call(command, env=env) != 0:
        return "the compile failed (its log is above)"
    wheels = sorted(scratch.glob("*.whl"))
    return wheels[-1] if wheels else "the compile wrote no wheel"


def gpu_self_test(out: Path) -> dict[str, Any]:
    """The ladder's self-test (every layer offloaded) on a tiny synthetic model."""
    from dataclasses import asdict

    from hearthside.core.probe.engine_ladder import run_self_test
    from hearthside.kernels.synthetic_model import write_synthetic_gguf

    model = models_dir() / "selftest-tiny-dense.gguf"
    if not model.exists():
        model.parent.mkdir(parents=True, exist_ok=True)
        write_synthetic_gguf(model, "tiny-dense", "Q8_0", name="device check self-test")
    result = asdict(run_self_test(sys.executable, model, gpu_layers=-1))
    result["log_tail"] = list(result["log_tail"])[-12:]
    return result


def hearthside_json(arguments: Sequence[str], home: Path | None = None) -> dict[str, Any]:
    """`hearthside ARGS` (its JSON), run in a child as a user would run it."""
    env = dict(os.environ)
    if home is not None:
        env["HEARTHSIDE_HOME"] = str(home)
    command = [sys.executable, "-m", "hearthside.app.cli", *arguments]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        return {"status": "failed", "exit_code": done.returncode, "stderr": done.stderr[-2000:]}
    try:
        return {"status": "ok", "json": json.loads(done.stdout)}
    except json.JSONDecodeError:
        return {"status": "failed", "stdout": done.stdout[-2000:]}


# --- probe against nvidia-smi --------------------------------------------------------------------


def compare_probe(profile: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> list[dict]:
    """One row per GPU and field: what the probe says, what nvidia-smi says, agreed or not."""
    gpus = [gpu for gpu in profile.get("gpus", []) if gpu.get("vendor") == "nvidia"]
    checks = []
    for index, row in enumerate(rows):
        gpu = gpus[index] if index < len(gpus) else {}
        total = gpu.get("vram_total_bytes")
        pairs = {
            "name": (gpu.get("name"), row["name"]),
            "memory_mib": (total // MIB if total else None, row["memory_mib"]),
            "arch": (gpu.get("arch"), f"sm_{sm_arch(row['compute_cap'])}"),
            "driver": (gpu.get("driver_version"), row["driver"]),
        }
        for field, (probed, smi) in pairs.items():
            checks.append(
                {"gpu": index, "field": field, "probe": probed, "nvidia_smi": smi,
                 "agrees": probed == smi}
            )  # fmt: skip
    return checks


def probe(out: Path, dry: bool) -> int:
    rows = read_part(out, "preflight").get("gpus", [])
    result = hearthside_json(["probe", "--json"])
    if result["status"] != "ok":
        write_part(out, "probe", {"status": "failed", "probe": result})
        return 1
    checks = compare_probe(result["json"], rows)
    status = "ok" if checks and all(c["agrees"] for c in checks) else "mismatch"
    if not rows:
        status = "skipped"
    write_part(out, "probe", {"status": status, "checks": checks, "profile": result["json"]})
    agreed = sum(c["agrees"] for c in checks)
    print(f"probe: {agreed} of {len(checks)} fields agree with nvidia-smi" + (" (dry)" * dry))
    return 0


# --- plan against reality ------------------------------------------------------------------------


def offload_settings(spec: Any) -> dict[str, dict[str, Any]]:
    """Full offload, half the layers, and (a MoE) every layer's experts in RAM."""
    from hearthside.autotune.planner import experts_on_cpu

    layers = spec.n_layers or 1
    settings: dict[str, dict[str, Any]] = {
        "full offload": {"n_gpu_layers": -1},
        "half the layers": {"n_gpu_layers": max(1, layers // 2)},
    }
    if spec.n_expert:
        settings["experts on the CPU"] = {
            "n_gpu_layers": -1,
            "tensor_overrides": experts_on_cpu(layers),
        }
    return settings


def models_dir() -> Path:
    """Where the models are written: $MODELS_DIR, else the temporary folder (not OUT, whose
    files all travel back from the device machine, 8 at most)."""
    return Path(os.environ.get("MODELS_DIR") or Path(tempfile.gettempdir()) / "device-check-models")


def write_models(folder: Path, shapes: Mapping[str, tuple[str, str]]) -> dict[str, Path]:
    from hearthside.kernels.synthetic_model import write_synthetic_gguf

    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, (shape, quant) in shapes.items():
        path = folder / f"{shape}-{quant}.gguf"
        if not path.exists():
            started = time.perf_counter()
            write_synthetic_gguf(path, shape, quant, name=f"{shape} synthetic")
            print(f"plan: wrote {path.name} in {time.perf_counter() - started:.0f} s", flush=True)
        paths[name] = path
    return paths


def default_model() -> Path | None:
    from hearthside.core.models.default_model import cached_default_model_file

    try:
        path = Path(cached_default_model_file())
    except Exception:  # noqa: BLE001 - any failure means "not here": the check goes on without it
        return None
    return path if path.exists() else None


def predicted_row(path: Path, profile: Any, setting: Mapping[str, Any]) -> dict[str, Any]:
    from hearthside.autotune.memory import estimate_memory, pieces_from_gguf
    from hearthside.autotune.planner import describe_machine, evaluate_config
    from hearthside.core.engine.config import EngineConfig
    from hearthside.core.models.gguf_validator import validate_gguf
    from hearthside.core.models.spec import spec_from_gguf

    info = validate_gguf(path)
    spec, pieces = spec_from_gguf(path), pieces_from_gguf(info)
    config = EngineConfig(str(path), n_ctx=CONTEXT, flash_attn=True, **setting)
    candidate = evaluate_config(spec, profile, config, {}, pieces=pieces)
    machine = describe_machine(profile, {})
    estimate = estimate_memory(
        spec, config, gpus=machine.gpus, repacked=machine.repacked, pieces=pieces
    )
    return {
        "config": config,
        "estimate": estimate,
        "predicted": {
            "devices_mib": {
                name: round(memory.total_bytes / MIB, 1)
                for name, memory in estimate.devices.items()
            },
            "decode_tps": round(candidate.speed.decode_tps_empty_context, 1),
            "prefill_tps": round(candidate.speed.prefill_tps_at(N_PROMPT), 1),
            "fits": candidate.fits,
        },
    }


def measured_row(config: Any, estimate: Any) -> dict[str, Any]:
    """Load with the real engine: llama.cpp's buffers per device against the estimate, NVML's
    used memory, and tgN/ppN timed as the speed benchmarks time them (median of 3)."""
    from hearthside.autotune.memory import compare_with_load
    from hearthside.core.engine.engine import Engine

    before = nvml_used_bytes()
    engine = Engine(config)
    try:
        used = nvml_used_bytes() - before
        comparisons = compare_with_load(estimate, engine.load_report)
        tokens = list(range(100, 100 + N_PROMPT + N_GEN + 1))
        engine.time_prefill(tokens[:N_PROMPT])  # warm-up
        prefill = statistics.median(
            N_PROMPT / engine.time_prefill(tokens[:N_PROMPT]) for _ in range(3)
        )
        decode = statistics.median(
            N_GEN / engine.time_decode(tokens[: N_GEN + 1]) for _ in range(3)
        )
    finally:
        engine.close()
    return {
        "buffers": [
            {
                "device": c.device,
                "purpose": c.purpose,
                "predicted_mib": round(c.predicted_bytes / MIB, 1),
                "allocated_mib": round(c.allocated_bytes / MIB, 1),
                "relative_error": round(c.relative_error, 4),
            }
            for c in comparisons
        ],
        "nvml_used_mib": round(used / MIB, 1),
        "decode_tps": round(decode, 1),
        "prefill_tps": round(prefill, 1),
    }


def nvml_used_bytes() -> int:
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    finally:
        pynvml.nvmlShutdown()


def ratios(row: Mapping[str, Any]) -> dict[str, float | None]:
    """predicted / measured for decode, prefill and the GPU's memory (buffers and NVML)."""
    predicted, measured = row["predicted"], row.get("measured")
    if not measured:
        return {}
    gpu_predicted = sum(v for k, v in predicted["devices_mib"].items() if k != "CPU")
    gpu_buffers = sum(
        b["allocated_mib"]
        for b in measured["buffers"]
        if b["device"] != "CPU" and b["purpose"] != "total"
    )
    return {
        "decode": _ratio(predicted["decode_tps"], measured["decode_tps"]),
        "prefill": _ratio(predicted["prefill_tps"], measured["prefill_tps"]),
        "gpu_buffers": _ratio(gpu_predicted, gpu_buffers),
        "gpu_nvml": _ratio(gpu_predicted, measured["nvml_used_mib"]),
    }


def _ratio(predicted: float, measured: float) -> float | None:
    return round(predicted / measured, 3) if measured else None


def recorded_h200() -> Any:
    """The recorded H200 profile as a CUDA build of the engine would see it (its GPU as
    ggml's CUDA0): what the dry run predicts for."""
    from dataclasses import replace

    from hearthside.core.probe.profile import EngineDevice, EngineInfo, HardwareProfile

    profile = HardwareProfile.from_json(H200_FIXTURE.read_text())
    gpu = profile.gpus[0]
    device = EngineDevice("CUDA0", gpu.name, "gpu", gpu.vram_total_bytes, gpu.vram_free_bytes)
    cpu = EngineDevice("CPU", "CPU", "cpu")
    engine = EngineInfo(backends=("CPU", "CUDA"), devices=(device, cpu), gpu_offload=True)
    return replace(profile, engine=engine)


def plan(out: Path, dry: bool) -> int:
    from hearthside.core.probe.profile import HardwareProfile

    if dry:
        profile = recorded_h200()
        paths = write_models(models_dir(), DRY_MODELS)
    else:
        profile = HardwareProfile.from_json(json.dumps(read_part(out, "probe")["profile"]))
        paths = write_models(models_dir(), MODELS)
        chat = default_model()
        if chat is not None:
            paths = {"default": chat, **paths}
    rows = []
    for name, path in paths.items():
        rows += plan_rows(name, path, profile, dry)
    write_part(out, "plan", {"status": "dry" if dry else "ok", "rows": rows})
    print(f"plan: {len(rows)} model × setting rows" + (" predicted (dry)" if dry else ""))
    return 0


def plan_rows(name: str, path: Path, profile: Any, dry: bool) -> list[dict[str, Any]]:
    from hearthside.core.models.spec import spec_from_gguf

    rows = []
    for setting_name, setting in offload_settings(spec_from_gguf(path)).items():
        row = predicted_row(path, profile, setting)
        config, estimate = row.pop("config"), row.pop("estimate")
        row = {"model": name, "file": path.name, "setting": setting_name, **row}
        if dry:
            row["measured"] = None
            row["why"] = "dry run: predicted for the recorded H200, nothing loaded"
        else:
            try:
                row["measured"] = measured_row(config, estimate)
            except Exception as error:  # noqa: BLE001 - one failed load is a row, not the end
                row["measured"], row["why"] = None, f"{type(error).__name__}: {error}"
        row["ratios"] = ratios(row)
        rows.append(row)
        print(f"plan: {name} / {setting_name}: {row['ratios'] or row.get('why')}", flush=True)
    return rows


# --- tune against llama.cpp's defaults -----------------------------------------------------------


def tune(out: Path, dry: bool) -> int:
    if dry:
        write_part(out, "tune", skipped("dry run: no GPU to tune on"))
        print("tune: skipped (dry)")
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import native_anchor as anchor

    from hearthside.core.engine.config import EngineConfig

    model = models_dir() / "llama-3.1-8b-Q4_0.gguf"
    home = Path(tempfile.mkdtemp(prefix="device-check-home-"))
    tuned = anchor.run_tune(model, 60, home)
    pick = tuned["best"]
    pick_config = EngineConfig.from_dict({**pick["config"], "model_path": str(model)})
    bench = os.environ.get("LLAMA_BENCH") or shutil.which("llama-bench")
    part: dict[str, Any] = {"pick": pick["config"], "shown": tuned.get("speedup_over_defaults")}
    part["pick_in_engine"] = vars(anchor.run_in_engine(pick_config, 3))
    if bench:
        part["defaults"] = vars(anchor.run_native(Path(bench), model, ["-ngl", "999"], 3))
        part["defaults_are"] = "native llama-bench -ngl 999 (llama.cpp's defaults otherwise)"
    else:
        from hearthside.autotune.tuner import llama_cpp_defaults
        from hearthside.core.probe.runner import probe_hardware

        defaults = llama_cpp_defaults(str(model), probe_hardware(), n_ctx=CONTEXT)
        part["defaults"] = vars(anchor.run_in_engine(defaults, 3))
        part["defaults_are"] = "llama.cpp's defaults in the engine (no llama-bench carried)"
    part["decode_ratio"] = _ratio(
        part["pick_in_engine"]["decode_tps"], part["defaults"]["decode_tps"]
    )
    part["prompt_ratio"] = _ratio(
        part["pick_in_engine"]["prompt_tps"], part["defaults"]["prompt_tps"]
    )
    part["status"] = "ok"
    write_part(out, "tune", part)
    print(f"tune: pick / defaults decode {part['decode_ratio']}, prompt {part['prompt_ratio']}")
    return 0


# --- the report ----------------------------------------------------------------------------------


def targets_of(report: Mapping[str, Any]) -> list[Any]:
    """What the device run must show: the engine's self-test passed on the GPU, every probe
    field agrees with nvidia-smi, every buffer within 5% and NVML's figure too, every
    predicted speed within ±20%, and the tuner's pick at least as fast as the defaults."""
    from _targets import Target

    parts = report["parts"]
    targets = [Target.holds("CUDA self-test passed", parts["engine"].get("status") == "ok")]
    checks = parts["probe"].get("checks", [])
    targets.append(Target.holds("probe agrees with nvidia-smi", bool(checks) and all(
        c["agrees"] for c in checks)))  # fmt: skip
    for row in parts["plan"].get("rows", []):
        label = f"{row['model']} {row['setting']}"
        for kind, value in row.get("ratios", {}).items():
            within = MEMORY_WITHIN if kind.startswith("gpu") else SPEED_WITHIN
            error = None if value is None else abs(value - 1)
            targets.append(Target(f"{label} {kind}", error, within, "at most", unit=""))
    if "decode_ratio" in parts.get("tune", {}):
        targets.append(Target("tuned decode / defaults", parts["tune"]["decode_ratio"], 1.0))
    return targets


def report(out: Path, dry: bool) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _targets import report as print_targets

    names = ("preflight", "engine", "probe", "plan", "tune")
    parts = {name: read_part(out, name) for name in names}
    payload: dict[str, Any] = {"schema": 1, "dry": dry, "parts": parts}
    (out / "device-check.json").write_text(json.dumps(payload, indent=2, default=str))
    print(f"report: {out / 'device-check.json'}")
    print_ratio_table(parts["plan"].get("rows", []))
    if dry:
        missing = [name for name in names if not parts[name]]
        print("dry run: every step wrote its part" if not missing else f"missing: {missing}")
        return 1 if missing else 0
    return print_targets(targets_of(payload))


def print_ratio_table(rows: Sequence[Mapping[str, Any]]) -> None:
    print(f"{'model':10} {'setting':20} {'decode':>7} {'prefill':>7} {'GPU buf':>7} {'NVML':>7}")
    for row in rows:
        found = row.get("ratios") or {}
        cells = [
            f"{found[k]:7.3f}" if found.get(k) is not None else f"{'n/a':>7}"
            for k in ("decode", "prefill", "gpu_buffers", "gpu_nvml")
        ]
        print(f"{row['model']:10} {row['setting']:20} {' '.join(cells)}")
    print("(predicted / measured; memory: the GPU's predicted MiB / allocated)")


STEPS = {"preflight", "engine", "probe", "plan", "tune", "report"}


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["carry"] and len(arguments) in (3, 4):  # --prepare: CACHE CARRY [ARCH]
        return carry_cuda_wheels(Path(arguments[1]), Path(arguments[2]), *arguments[3:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=sorted(STEPS))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry", action="store_true")
    parser.add_argument("--site", type=Path, default=Path("/tmp/hearthside-site"))
    args = parser.parse_args(arguments)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.step == "preflight":
        return preflight(args.out, args.dry)
    if args.step == "engine":
        return engine(args.out, args.dry, args.site)
    steps = {"probe": probe, "plan": plan, "tune": tune, "report": report}
    return steps[args.step](args.out, args.dry)


if __name__ == "__main__":
    sys.exit(main())
