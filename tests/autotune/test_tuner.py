"""The tuner measures with the real engine, remembers every run and never repeats a failure."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path

import psutil
import pytest

from hearthside.autotune.calibration import planner_figures
from hearthside.autotune.fingerprint import TuningKey
from hearthside.autotune.planner import plan
from hearthside.autotune.tuner import (
    TuneEvent,
    _learn,
    candidates,
    llama_cpp_defaults,
    llama_cpp_python_defaults,
    predicted_speeds,
    save_tuned_defaults,
    tune,
)
from hearthside.autotune.wisdom import RunRecord, WisdomDB, config_key
from hearthside.core.engine.config import EngineConfig, TensorOverride
from hearthside.core.engine.worker_engine import WorkerEngine
from hearthside.core.errors import EngineOutOfMemoryError
from hearthside.core.models.catalog import catalog_spec
from hearthside.core.models.spec import spec_from_gguf
from hearthside.core.probe.runner import probe_hardware
from hearthside.core.probe.spec import expand_spec
from hearthside.kernels.measurement import Measurement
from hearthside.kernels.results import CalibrationReport
from tests.fixtures.synthetic_gguf import write_synthetic_gguf


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tuner")
    return write_synthetic_gguf(folder / "tiny-dense.gguf", "tiny-dense", "Q8_0")


@pytest.fixture(scope="module")
def profile():  # noqa: ANN201
    return probe_hardware()


def test_candidates_vary_one_thing_at_a_time_and_stay_valid(profile) -> None:  # noqa: ANN001
    base = EngineConfig("m.gguf", n_ctx=2048, flash_attn=True, type_k="q8_0", type_v="q8_0")
    configs = candidates(base, profile)
    assert configs[0] == base
    assert len({c.n_threads for c in configs}) >= 2 or (profile.cpu.logical_cores or 1) == 1
    assert any(not c.flash_attn for c in configs)
    assert all(c.flash_attn or c.type_v == "f16" for c in configs)  # llama.cpp's rule
    assert len(configs) == len({str(c.to_dict()) for c in configs})


@pytest.mark.usefixtures("repeat_noise_ignored")
def test_a_tuning_run_is_stored_and_answers_the_next_one(
    small_model: Path,
    profile,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    from hearthside.autotune import tuner

    # the defaults and the planner's pick only: the run ends when they, speculation and the
    # audit are done, well within a budget that leaves room for a machine under load
    monkeypatch.setattr(tuner, "candidates", lambda base, _profile: [base])
    events: list[TuneEvent] = []
    with WisdomDB(tmp_path / "wisdom.db") as wisdom:
        first = tune(small_model, profile, budget_s=60, wisdom=wisdom, listener=events.append)
        assert first.best is not None and first.baseline is not None
        assert first.best.decode_tps and first.best.decode_tps > 0
        assert first.speedup is not None and first.speedup > 0
        measured = [event for event in events if event.kind == "measured"]
        assert len(measured) >= 2 and events[-1].kind == "done"
        default = wisdom.default_for(first.key)
        assert default is not None and default.run_id == first.best.id
        # checked to 90% full: a tiny model fills its context in well under the time held back
        assert first.audit is not None, [note.reason for note in first.notes]
        assert first.audit.complete and first.audit.holds, first.audit.message
        assert wisdom.latest_audit(first.key, first.best.config) == first.audit.to_dict()
        assert wisdom.efficiency(first.key.machine, first.key.engine, "CPU", "decode").samples
        # Speculation was measured on the winner, per workload, with a reason either way.
        assert [d.workload for d in first.speculation] == ["chat", "code_edit", "summarise"]
        assert all(decision.reason for decision in first.speculation)
        chat = first.speculation[0]
        assert default.config["speculative"] == asdict(chat.chosen)

        events.clear()
        second = tune(
            small_model,
            profile,
            budget_s=5,  # what it measured before answers at once
            wisdom=wisdom,
            listener=events.append,
            save_default=False,  # as the wizard does: it saves on Apply
        )
        assert wisdom.default_for(first.key) == default
        assert save_tuned_defaults(wisdom, second)  # what the wizard's Apply does
        saved = wisdom.default_for(first.key)
        assert saved is not None and saved.updated_at > default.updated_at
        again = {_measured(event) for event in events if event.kind == "measured"}
        assert not again & {_measured(event) for event in measured}  # nothing measured twice
        reused = {_measured(event) for event in events if event.kind == "reused"}
        assert {_measured(e) for e in measured if e.workload is None} <= reused
        assert second.baseline is not None
        assert second.baseline.id == first.baseline.id


@pytest.mark.usefixtures("repeat_noise_ignored")
def test_on_a_sliding_window_model_llama_cpps_window_sized_cache_is_never_the_pick(
    profile,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    """llama.cpp's defaults keep a window-sized cache on a sliding-window model (as llama-bench
    does): a chat would read the whole conversation again each turn, and the audit finds the
    early positions gone. Even measured 100x faster, it stays the comparison."""
    from hearthside.autotune import tuner

    monkeypatch.setattr(tuner, "candidates", lambda base, _profile: [base])
    model = write_synthetic_gguf(tmp_path / "tiny-gemma3.gguf", "tiny-gemma3", "Q8_0")
    with WisdomDB(tmp_path / "wisdom.db") as wisdom:
        first = tune(model, profile, budget_s=30, wisdom=wisdom, speculation=False)
        assert first.baseline is not None and first.best is not None
        assert first.baseline.config["swa_full"] is False
        # the same settings measured again, far faster: the next run reuses this figure
        faster = 100 * (first.baseline.decode_tps or 0)
        wisdom.record_run(replace(first.baseline, id=None, created_at="", decode_tps=faster))
        second = tune(model, profile, budget_s=5, wisdom=wisdom, speculation=False)
    assert second.baseline is not None and second.baseline.decode_tps == faster
    assert second.best is not None and second.best.config["swa_full"] is True
    assert second.speedup is not None and second.speedup < 0.1  # and says it is slower


def _measured(event: TuneEvent) -> tuple[str | None, str]:
    """What a measurement was of: the workload (speculation) or None, and the settings."""
    return event.workload, config_key(event.config)


def test_a_failed_configuration_is_recorded_and_never_retried(
    small_model: Path,
    profile,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    from hearthside.autotune import tuner

    broken = EngineConfig(str(small_model), tensor_overrides=(TensorOverride("ffn", "CUDA9"),))
    monkeypatch.setattr(tuner, "candidates", lambda base, profile: [broken])
    events: list[TuneEvent] = []
    with WisdomDB(tmp_path / "wisdom.db") as wisdom:
        # speculation is left to the stored-run test
        tune_once = partial(
            tune,
            small_model,
            profile,
            budget_s=30,
            wisdom=wisdom,
            listener=events.append,
            speculation=False,
        )
        tune_once()
        assert [e.kind for e in events if e.config == broken.to_dict()] == ["start", "failed"]
        # a device this machine lacks: the planner cannot size it, so it has no predicted bar
        assert all(e.predicted_decode_tps is None for e in events if e.config == broken.to_dict())
        events.clear()
        tune_once()
        assert [e.kind for e in events if e.config == broken.to_dict()] == ["skipped"]
        # (on a busy machine others may time out: a timeout is no failure, and is retried)
        (failure,) = [run for run in wisdom.runs(wisdom_key(wisdom)) if run.outcome == "failed"]
        assert failure.outcome == "failed" and "CUDA9" in (failure.error or "")


def wisdom_key(wisdom: WisdomDB):  # noqa: ANN201
    run = wisdom.export()["runs"][0]  # one model, one machine: every run has the same key
    from hearthside.autotune.fingerprint import TuningKey

    return TuningKey(**run["key"])


def test_the_baselines_are_llama_cpps_and_llama_cpp_pythons_own_defaults(profile) -> None:  # noqa: ANN001
    server = llama_cpp_defaults("m.gguf", profile, 2048)
    cores = profile.cpu.performance_cores or profile.cpu.physical_cores
    assert server.n_threads == server.n_threads_batch == cores  # llama.cpp: -tb defaults to -t
    assert server.flash_attn and server.type_k == server.type_v == "f16"  # flash attn auto: on
    assert (server.n_batch, server.n_ubatch, server.n_ctx) == (2048, 512, 2048)
    constructor = llama_cpp_python_defaults("m.gguf")
    assert constructor.n_ctx == 512 and not constructor.flash_attn
    assert constructor.n_threads == max(1, (os.cpu_count() or 2) // 2)
    assert constructor.n_threads_batch == os.cpu_count()  # not a copy of n_threads


def test_the_tuner_learns_against_the_prediction_before_what_it_learned(
    profile,  # noqa: ANN001
    tmp_path: Path,
) -> None:
    spec = catalog_spec("gemma-3-1b")
    key = TuningKey("machine", "engine", "model")
    unlearned = plan(spec, profile, n_ctx=2048)
    tier = unlearned.speed.decode_bound_by
    learned = plan(spec, profile, n_ctx=2048, calibration={f"learned_decode:{tier}": 2.0})
    assert learned.speed.decode_tps_empty_context == pytest.approx(
        2 * unlearned.speed.decode_tps_empty_context
    )
    measured = 1.5 * unlearned.speed.decode_tps_empty_context
    run = RunRecord(key, {}, "quick", "ok", decode_tps=measured, prefill_tps=None)
    with WisdomDB(tmp_path / "wisdom.db") as wisdom:
        _learn(wisdom, key, run, learned)
        # 1.5x the planner's own figure, not 0.75x of the figure it had already corrected
        assert wisdom.efficiency("machine", "engine", tier, "decode").factor == pytest.approx(1.5)


def test_a_candidate_that_crashes_the_engine_is_recorded_and_the_next_is_measured(
    small_model: Path,
    profile,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    """The second candidate's worker gets a real SIGSEGV: it is `crashed`, the third is
    measured, and a later tuning run skips the crashed one."""
    from hearthside.autotune import tuner

    base = EngineConfig(str(small_model), n_ctx=512)
    doomed, third = base.with_changes(n_threads=1), base.with_changes(n_ubatch=256)
    monkeypatch.setattr(tuner, "candidates", lambda _base, _profile: [base, doomed, third])
    events: list[TuneEvent] = []

    def listen(event: TuneEvent) -> None:
        events.append(event)
        if event.kind == "start" and event.config == doomed.to_dict():
            threading.Thread(target=segfault_next_worker, args=(worker_pids(),)).start()

    with WisdomDB(tmp_path / "wisdom.db") as wisdom:
        tune(small_model, profile, budget_s=600, wisdom=wisdom, listener=listen, speculation=False)
        kinds = {config_key(e.config): e.kind for e in events if e.kind in ("measured", "failed")}
        assert kinds[config_key(doomed.to_dict())] == "failed"
        predicted = {config_key(e.config): e.predicted_decode_tps for e in events[:-1]}
        if (profile.cpu.physical_cores or 1) > 1:  # one thread of several: a lower bar
            assert predicted[config_key(doomed.to_dict())] < predicted[config_key(base.to_dict())]
        assert kinds[config_key(third.to_dict())] == "measured"
        (crashed,) = [run for run in wisdom.export()["runs"] if run["outcome"] == "crashed"]
        assert "SIGSEGV" in crashed["error"]
        events.clear()
        tune(
            small_model,
            profile,
            budget_s=600,
            wisdom=wisdom,
            listener=events.append,
            speculation=False,
        )
        assert [e.kind for e in events if e.config == doomed.to_dict()] == ["skipped"]


def worker_pids() -> set[int]:
    return {
        child.pid
        for child in psutil.Process().children()
        if "hearthside.core.engine.worker" in " ".join(child.cmdline())
    }


def segfault_next_worker(before: set[int], timeout_s: float = 30.0) -> None:
    """SIGSEGV to the first engine worker started after `before` was taken."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if new := worker_pids() - before:
            os.kill(new.pop(), signal.SIGSEGV)
            return
        time.sleep(0.01)


def recorded(kind: str, value: float, threads: int, **params: object) -> Measurement:
    unit = "GB/s" if kind == "memory_read" else "tok/s"
    return Measurement(
        kind, "cpu", value, unit, value, 0.02, 3, "recorded", {"threads": threads, **params}
    )


def test_each_candidate_is_predicted_at_its_own_threads(small_model: Path) -> None:
    """What the wizard's bars show: a 1-thread candidate's predicted speed against the
    2-thread one's follows what calibration measured at each count, on a 2-core machine."""
    two_cores = expand_spec(
        {"schema": 1, "cpu": {"cores": 2, "threads": 2}, "memory_gb": 16, "disk": {}}
    )
    decode, prefill = {2: 40.0, 1: 22.0}, {2: 300.0, 1: 160.0}
    shipped = {"model_path": str(small_model)}
    measurements = [
        recorded("memory_read", 10.0, 1),
        recorded("memory_read", 18.0, 2),
        recorded("engine_decode", decode[2], 2, **shipped),
        recorded("engine_prefill", prefill[2], 2, **shipped),
        recorded("engine_decode", decode[1], 1, **shipped, thread_variant=True),
        recorded("engine_prefill", prefill[1], 1, **shipped, thread_variant=True),
    ]
    figures = planner_figures(
        CalibrationReport(1, "2026-12-01T00:00:00+00:00", "0.1.0", {}, tuple(measurements), (), 9)
    )
    spec = spec_from_gguf(small_model)
    base = plan(spec, two_cores, n_ctx=2048, calibration=figures, n_parallel=1).config
    one = next(c for c in candidates(base, two_cores) if c == base.with_changes(n_threads=1))
    both_one = base.with_changes(n_threads=1, n_threads_batch=1)
    two_speed, one_speed, both_one_speed = predicted_speeds(
        spec, two_cores, [base, one, both_one], figures
    )
    assert base.n_threads == 2
    assert one_speed.decode_tps_empty_context / two_speed.decode_tps_empty_context == (
        pytest.approx(decode[1] / decode[2], rel=0.05)
    )
    assert one_speed.decode_tps < two_speed.decode_tps
    assert one_speed.prefill_tps == pytest.approx(two_speed.prefill_tps)  # batch threads kept
    assert both_one_speed.prefill_tps / two_speed.prefill_tps == pytest.approx(
        prefill[1] / prefill[2], rel=0.01
    )


def test_every_engine_comes_from_the_sessions_loader_and_an_out_of_memory_load_is_kept(
    small_model: Path,
    profile,  # noqa: ANN001
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loader is the measure part's one door to the engine. Here it refuses one candidate
    as a machine without the memory would: that candidate is `oom`, announced as failed, the
    next is measured, every run and the winner's context audit loaded through it, and a
    later run does not try the refused one again while memory is as it was."""
    from hearthside.autotune import tuner

    base = EngineConfig(str(small_model), n_ctx=512)
    too_big, third = base.with_changes(n_ubatch=128), base.with_changes(n_ubatch=256)
    monkeypatch.setattr(tuner, "candidates", lambda _base, _profile: [base, too_big, third])
    loaded: list[dict[str, object]] = []

    def load(config: EngineConfig) -> WorkerEngine:
        loaded.append(config.to_dict())
        if config_key(config.to_dict()) == config_key(too_big.to_dict()):
            raise EngineOutOfMemoryError("could not allocate the compute buffer (recorded)")
        return WorkerEngine(config)

    events: list[TuneEvent] = []
    with WisdomDB(tmp_path / "wisdom.db") as wisdom:
        result = tune(
            small_model,
            profile,
            budget_s=600,
            wisdom=wisdom,
            listener=events.append,
            speculation=False,
            load=load,
        )
        outcomes = {config_key(run.config): run.outcome for run in result.runs}
        assert outcomes[config_key(too_big.to_dict())] == "oom"
        assert outcomes[config_key(third.to_dict())] == "ok"
        (refused,) = [e for e in events if e.config == too_big.to_dict() and e.kind == "failed"]
        assert "compute buffer" in refused.message and refused.outcome == "oom"
        measured = [e for e in events if e.kind == "measured" and not e.workload]
        assert measured and all(e.memory_bytes for e in measured)  # the chart's memory strip
        loaded_keys = [config_key(settings) for settings in loaded]
        for run in result.runs:
            if run.outcome == "ok":
                assert config_key(run.config) in loaded_keys
        assert result.audit is not None  # the audit's engine came from `load` too
        assert loaded_keys.count(config_key(result.best.config)) >= 2
        events.clear()
        tune(
            small_model,
            profile,
            budget_s=600,
            wisdom=wisdom,
            listener=events.append,
            speculation=False,
        )
        skipped = [e for e in events if e.config == too_big.to_dict()]
        assert [(e.kind, e.outcome) for e in skipped] == [("skipped", "oom")]
