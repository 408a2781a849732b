"""Fingerprints that key the autotune database: this machine, this engine build, this model.

A fingerprint changes exactly when a measurement stops being valid: another CPU or GPU, more
or less memory, a different llama.cpp build or backend, a different model file. Free memory,
driver patch levels and the hostname do not count, so results survive a reboot.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from hearthside.autotune.records import TuningKey as TuningKey  # its home: plain data
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.units import GIB

# Read from each end of a model file: enough to tell files apart without hashing gigabytes.
_MODEL_SAMPLE_BYTES = 4 << 20


def machine_fingerprint(profile: HardwareProfile) -> str:
    return _digest(machine_identity(profile))


def machine_identity(profile: HardwareProfile) -> dict[str, Any]:
    """What about the hardware decides speed and fit (a readable summary, stored with results)."""
    cpu = profile.cpu
    return {
        "os": profile.os,
        "cpu": {
            "arch": cpu.arch,
            "model": cpu.model,
            "flags": list(cpu.flags),
            "physical_cores": cpu.physical_cores,
            "logical_cores": cpu.logical_cores,
            "performance_cores": cpu.performance_cores,
            "sockets": cpu.sockets,
            "numa_nodes": cpu.numa_nodes,
        },
        # Rounded: the kernel reports a few MiB more or less between boots.
        "memory_gib": _rounded_gib(profile.memory.cgroup_limit_bytes or profile.memory.total_bytes),
        "gpus": [
            {
                "vendor": gpu.vendor,
                "name": gpu.name,
                "arch": gpu.arch,
                "vram_gib": _rounded_gib(gpu.vram_total_bytes),
                "pcie": [gpu.pcie_generation, gpu.pcie_width],
            }
            for gpu in sorted(profile.gpus, key=lambda gpu: (gpu.index or 0, gpu.name))
        ],
    }


def engine_fingerprint(profile: HardwareProfile) -> str:
    engine = profile.engine
    if engine is None:
        return _digest({"engine": None})
    return _digest(
        {
            "version": engine.package_version,
            "backends": sorted(engine.backends),
            "devices": sorted(device.name for device in engine.devices),
            "system_info": engine.system_info,
        }
    )


def model_fingerprint(path: Path) -> str:
    """Size plus the first and last 4 MiB: cheap for a 100 GB file, and any re-quantization,
    re-conversion or truncation changes it."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as handle:
        digest.update(handle.read(_MODEL_SAMPLE_BYTES))
        if size > 2 * _MODEL_SAMPLE_BYTES:
            handle.seek(size - _MODEL_SAMPLE_BYTES)
            digest.update(handle.read(_MODEL_SAMPLE_BYTES))
    return digest.hexdigest()[:16]


def spec_fingerprint(identity: dict[str, Any]) -> str:
    """For what-if models (catalog ids, descriptors) that have no file."""
    return "spec-" + _digest(identity)


def tuning_key(profile: HardwareProfile, model_path: Path) -> TuningKey:
    return TuningKey(
        machine_fingerprint(profile), engine_fingerprint(profile), model_fingerprint(model_path)
    )


def _rounded_gib(value: int | None) -> int | None:
    return None if value is None else round(value / GIB)


def _digest(data: Any) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
