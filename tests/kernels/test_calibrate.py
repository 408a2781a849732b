"""run_calibration: the machine summary, the default model, and a whole run on this machine."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from hearthside.core.engine.config import logical_core_count, physical_core_count
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir
from hearthside.core.probe.spec import expand_spec
from hearthside.kernels.calibrate import (
    DEFAULT_BUDGET_S,
    default_model_path,
    gpu_label,
    run_calibration,
    summarize_machine,
)
from hearthside.kernels.engine_run import (
    CACHE_PROBE,
    OVERHEAD_PROBE,
    PROBE_TYPES,
    PROBE_WIDTHS,
    SHORT_OVERHEAD_PROBE,
    scanned_thread_counts,
)
from hearthside.kernels.measurement import NO_GPU_NOTE


def test_profiled_gpus_get_the_device_names_torch_uses() -> None:
    profile = expand_spec({"gpus": [{"model": "rtx-3090", "count": 2}], "memory_gb": 64})
    machine = summarize_machine(profile, torch_version=None)
    assert [gpu["device"] for gpu in machine["gpus"]] == ["cuda:0", "cuda:1"]
    assert machine["gpus"][0]["memory_bandwidth_gb_s"] == pytest.approx(936.0)
    assert machine["gpus"][0]["fp16_tflops"] == pytest.approx(71.0)
    apple = expand_spec({"gpus": [{"model": "apple-m3-ultra"}], "memory_gb": 256})
    assert gpu_label(apple.gpus[0], 0) == "mps"


def test_the_default_model_is_found_but_never_installed(default_model_file: Path) -> None:
    assert default_model_path() is None
    assert not (data_dir() / "models.db").exists()  # looking did not create a registry
    with ModelStore(data_dir()) as store:
        record = store.add(default_model_file, link=True, check_native=False)
        store.set_default(record.id)
    assert default_model_path() == default_model_file


@pytest.mark.slow
def test_a_whole_calibration_fits_its_budget_with_every_figure(default_model_file: Path) -> None:
    progress: list[tuple[str, float]] = []
    with most_processes_alive() as alive:
        report = run_calibration(
            model_path=default_model_file, progress=lambda name, done: progress.append((name, done))
        )
    # Each probe in a worker of its own held 16 processes (about 3.8 GB) at once on a 2-core
    # machine; the probes share one host process beside the model's own.
    assert 1 <= alive[0] <= 2
    assert psutil.Process().children(recursive=True) == []  # and both are gone after
    # A kernel still running at the deadline finishes its minimum repetitions (and llama_decode
    # cannot be interrupted): some slack for a shared, busy machine.
    assert report.duration_s <= DEFAULT_BUDGET_S * 1.2
    cores = report.machine["logical_cores"]
    for params in ({"threads": 1}, {"threads": cores}):
        assert report.best("memory_read", **params) is not None, params
    assert report.best("memory_copy") is not None and report.best("memory_triad") is not None
    assert report.best("matmul", library="numpy", dtype="fp32", m=1) is not None
    assert report.best("matmul", library="numpy", dtype="fp32", m=512) is not None
    assert report.best("engine_prefill") is not None and report.best("engine_decode") is not None
    disk = [m for m in report.measurements if m.kind == "disk_read"]
    assert len(disk) == 1 and disk[0].ok and disk[0].device.startswith("disk")
    gpu_notes = {m.note for m in report.measurements if m.device == "gpu"}
    assert gpu_notes == {NO_GPU_NOTE}
    fractions = [done for _name, done in progress]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    steps = {name for name, _ in progress}
    assert {"memory read, 1 thread(s)", "engine round 1", "disk read"} <= steps
    # the shipped model and every speed probe, timed in the same rounds
    decode = report.measured("engine_decode", "cpu")
    runs = [m for m in decode if not m.params.get("thread_variant")]
    probes = {None, OVERHEAD_PROBE, SHORT_OVERHEAD_PROBE, CACHE_PROBE, *probe_names()}
    assert {m.params.get("probe") for m in runs} == probes
    assert len({m.repetitions for m in runs}) == 1
    # and the shipped model in their first rounds at the tuner's other thread counts
    variants = {m.params["threads"] for m in decode if m.params.get("thread_variant")}
    own = (physical_core_count(), logical_core_count())  # its decode and batch threads
    assert variants == {n for n in scanned_thread_counts(*own) if (n, n) != own}


@contextmanager
def most_processes_alive() -> Iterator[list[int]]:
    """The most child processes alive at once while the block runs (in its one item)."""
    most, done = [0], threading.Event()

    def count() -> None:
        while not done.wait(0.05):
            most[0] = max(most[0], len(psutil.Process().children(recursive=True)))

    watcher = threading.Thread(target=count)
    watcher.start()
    try:
        yield most
    finally:
        done.set()
        watcher.join()


def probe_names() -> list[str]:
    return [f"{type_name}@{width}" for type_name in PROBE_TYPES for width in PROBE_WIDTHS]
