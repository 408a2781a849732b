"""Fingerprints change when a measurement stops being valid, and only then."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hearthside.autotune.fingerprint import (
    engine_fingerprint,
    machine_fingerprint,
    model_fingerprint,
    tuning_key,
)
from hearthside.core.probe.spec import load_spec

pytestmark = pytest.mark.beside

SPECS = Path(__file__).parents[1] / "fixtures" / "probe" / "specs"


def test_the_same_machine_gets_the_same_fingerprint() -> None:
    first = load_spec(SPECS / "two-rtx-3090.json")
    second = load_spec(SPECS / "two-rtx-3090.json")
    assert machine_fingerprint(first) == machine_fingerprint(second)
    assert len(machine_fingerprint(first)) == 16


def test_free_memory_and_drivers_do_not_change_the_machine() -> None:
    profile = load_spec(SPECS / "two-rtx-3090.json")
    busier = replace(
        profile,
        memory=replace(profile.memory, available_bytes=1 << 30),
        gpus=tuple(replace(gpu, vram_free_bytes=1, driver_version="999.1") for gpu in profile.gpus),
    )
    assert machine_fingerprint(busier) == machine_fingerprint(profile)


def test_other_hardware_is_another_machine() -> None:
    fingerprints = {machine_fingerprint(load_spec(path)) for path in SPECS.glob("*.json")}
    assert len(fingerprints) == len(list(SPECS.glob("*.json")))
    profile = load_spec(SPECS / "two-rtx-3090.json")
    one_gpu = replace(profile, gpus=profile.gpus[:1])
    assert machine_fingerprint(one_gpu) != machine_fingerprint(profile)
    more_ram = replace(profile, memory=replace(profile.memory, total_bytes=128 << 30))
    assert machine_fingerprint(more_ram) != machine_fingerprint(profile)


def test_another_engine_build_is_another_engine() -> None:
    profile = load_spec(SPECS / "two-rtx-3090.json")
    assert profile.engine is not None
    cpu_only = replace(profile, engine=replace(profile.engine, backends=("CPU",), devices=()))
    assert engine_fingerprint(cpu_only) != engine_fingerprint(profile)
    assert machine_fingerprint(cpu_only) == machine_fingerprint(profile)


def test_model_files_differing_anywhere_sampled_differ(tmp_path: Path) -> None:
    size = 10 << 20
    original = tmp_path / "a.gguf"
    original.write_bytes(bytes(size))
    copy = tmp_path / "b.gguf"
    copy.write_bytes(bytes(size))
    tail_changed = tmp_path / "c.gguf"
    tail_changed.write_bytes(bytes(size - 1) + b"\x01")
    truncated = tmp_path / "d.gguf"
    truncated.write_bytes(bytes(size - 1))
    assert model_fingerprint(original) == model_fingerprint(copy)
    assert model_fingerprint(tail_changed) != model_fingerprint(original)
    assert model_fingerprint(truncated) != model_fingerprint(original)


def test_a_tuning_key_names_all_three(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(100))
    profile = load_spec(SPECS / "mac-m3-ultra.json")
    key = tuning_key(profile, model)
    assert key.to_dict() == {
        "machine": machine_fingerprint(profile),
        "engine": engine_fingerprint(profile),
        "model": model_fingerprint(model),
    }
