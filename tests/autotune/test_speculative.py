"""The speculative cost model, the per-workload decision, and the tuner measuring it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hearthside.autotune.fingerprint import tuning_key
from hearthside.autotune.speculative import (
    MIN_GAIN,
    DraftOption,
    Trial,
    VerifyCost,
    Workload,
    WorkloadPrompt,
    alpha_from_stats,
    best_draft_tokens,
    best_possible_speedup,
    decide_for_workload,
    expected_tokens_per_step,
    load_workloads,
    predicted_speedup,
    speculative_key,
)
from hearthside.autotune.tuner import (
    TuneEvent,
    decide_speculation,
    save_speculation_defaults,
    stored_speculation,
)
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.engine.config import EngineConfig, SpeculativeConfig
from hearthside.core.engine.speculative import SpeculationStats
from hearthside.core.probe.runner import probe_hardware

# Measured on this machine's CPU for the default model (batch of n tokens with n logits rows
# over one decode step): the 262k-row output layer makes each verified position cost ~0.2.
CPU_VERIFY = VerifyCost(((1, 1.0), (2, 1.25), (4, 1.6), (8, 2.4), (16, 4.0)))


def test_expected_tokens_per_step_follows_the_geometric_formula() -> None:
    assert expected_tokens_per_step(0.0, 4) == 1.0
    assert expected_tokens_per_step(1.0, 4) == 5.0
    assert expected_tokens_per_step(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens_per_step(0.8, 8) == pytest.approx((1 - 0.8**9) / 0.2)
    with pytest.raises(ValueError):
        expected_tokens_per_step(1.5, 2)


def test_verify_cost_interpolates_and_extends() -> None:
    assert CPU_VERIFY.at(1) == 1.0
    assert CPU_VERIFY.at(3) == pytest.approx(1.425)
    assert CPU_VERIFY.at(32) == pytest.approx(4.0 + 16 * 0.2)
    assert VerifyCost().at(9) == 1.0  # nothing measured: free verification


def test_predicted_gain_rises_with_acceptance_and_falls_with_draft_cost() -> None:
    cheap = [predicted_speedup(alpha, 4, verify_cost=CPU_VERIFY) for alpha in (0.3, 0.6, 0.9)]
    assert cheap == sorted(cheap) and cheap[0] < 1 < cheap[-1]
    costly = predicted_speedup(0.9, 4, verify_cost=CPU_VERIFY, draft_cost=0.5)
    assert costly < cheap[-1]
    # A lookup that finds a draft on few steps keeps only a little of the gain.
    rare = predicted_speedup(0.9, 4, verify_cost=CPU_VERIFY, coverage=0.1)
    assert rare == pytest.approx((0.1 * 4.0951 + 0.9) / (0.1 * 1.8 + 0.9), rel=1e-4)
    assert 1 < rare < cheap[-1]


def test_the_best_k_grows_with_acceptance() -> None:
    low_k, low_gain = best_draft_tokens(0.5, verify_cost=CPU_VERIFY)
    high_k, high_gain = best_draft_tokens(0.97, verify_cost=CPU_VERIFY)
    assert low_k < high_k and low_gain < high_gain


def test_a_draft_as_costly_as_the_target_can_never_pay() -> None:
    # A Q4_0 variant of a Q4_K_M model is 95% of its size: decode costs about the same.
    assert best_possible_speedup(verify_cost=CPU_VERIFY, draft_cost=0.95) < 1.0
    assert best_possible_speedup(verify_cost=VerifyCost(), draft_cost=0.1) > 3


def test_alpha_counts_each_verified_drafted_token_as_a_trial() -> None:
    stats = SpeculationStats("prompt_lookup", 4, 20, 12, 10, 6, 3, 0.6, 2.0)
    assert alpha_from_stats(stats) == pytest.approx(12 / 15)


WORKLOAD = Workload("code_edit", "Code edit", 0.0, 64, (WorkloadPrompt("x"),))


def scripted(speed):  # noqa: ANN001, ANN201
    """measure() replaying (decode tok/s, α) per (mode, k) as a run would measure them:
    10 steps with a k-token draft each, accepted tokens stopping at the first rejection."""
    calls: list[SpeculativeConfig] = []

    def measure(config: SpeculativeConfig, workload: Workload) -> Trial | None:
        calls.append(config)
        k = config.draft_tokens
        tps, alpha = speed(config.mode, k)
        if config.mode == "off":
            return Trial(config, tps, None)
        accepted_per_step = round(alpha / (1 - alpha) * (1 - alpha**k)) if alpha < 1 else k
        rejections = 10 if accepted_per_step < k else 0
        accepted = 10 * accepted_per_step
        stats = SpeculationStats(config.mode, k, 10 * k, accepted, 10, 10, rejections,
                                 accepted / (10 * k), accepted / 10)  # fmt: skip
        return Trial(config, tps, stats)

    return measure, calls


def test_speculation_is_switched_on_only_above_the_threshold() -> None:
    def pays(mode: str, k: int) -> tuple[float, float]:
        return (70.0, 0.0) if mode == "off" else (70.0 + 5 * k, 0.9)

    measure, calls = scripted(pays)
    decision = decide_for_workload(WORKLOAD, measure, verify_cost=lambda: CPU_VERIFY)
    probed = [c.draft_tokens for c in calls if c.mode != "off"]
    assert probed[0] == 4 and len(probed) == 2  # the probe, then the cost model's k
    probe_stats = decision.trials[0].stats
    assert probe_stats is not None
    alpha = alpha_from_stats(probe_stats)
    assert alpha == pytest.approx(30 / 40)  # 3 accepted per step, then a rejection
    assert probed[1] == best_draft_tokens(alpha, verify_cost=CPU_VERIFY)[0]
    assert decision.enabled and decision.chosen.draft_tokens == max(probed)
    assert decision.gain == pytest.approx((70 + 5 * max(probed)) / 70)
    assert "on:" in decision.reason and decision.acceptance_rate is not None

    measure, _ = scripted(lambda mode, k: (70.0, 0.0) if mode == "off" else (72.0, 0.3))
    off = decide_for_workload(WORKLOAD, measure, verify_cost=lambda: CPU_VERIFY)
    assert not off.enabled and f"not above {MIN_GAIN:.2f}x" in off.reason
    assert off.trials and off.reference_decode_tps == 70.0


def test_a_draft_model_that_cannot_pay_is_not_measured() -> None:
    measure, calls = scripted(lambda mode, k: (70.0, 0.0) if mode == "off" else (60.0, 0.2))
    decision = decide_for_workload(
        WORKLOAD,
        measure,
        verify_cost=lambda: CPU_VERIFY,
        drafts=[DraftOption("/models/gemma-q4_0.gguf", 0.95)],
    )
    assert all(config.mode != "draft_model" for config in calls)
    assert "gemma-q4_0.gguf not tried" in decision.reason and not decision.enabled


def test_the_shipped_workloads_cover_chat_code_edit_and_summarising() -> None:
    workloads = {workload.id: workload for workload in load_workloads()}
    assert set(workloads) == {"chat", "code_edit", "summarise"}
    for workload in workloads.values():
        assert workload.prompts and all(p.completion and p.messages for p in workload.prompts)
    # A base model edits code by repeating the file: the continuation starts the same code.
    edit = workloads["code_edit"].prompts[0].completion
    code = edit.split("```python\n")[1].split("```")[0]
    assert edit.endswith("\n".join(code.splitlines()[:8]) + "\n")


@pytest.mark.slow
def test_the_tuner_turns_lookup_on_for_code_edits_and_records_why(
    default_model_file: Path, tmp_path: Path
) -> None:
    """On the default model, prompt lookup pays where the reply repeats the prompt."""
    profile = probe_hardware()
    key = tuning_key(profile, default_model_file)
    chosen = {workload.id: workload for workload in load_workloads()}
    code_edit = replace(chosen["code_edit"], max_tokens=48)  # shorter: a test
    events: list[TuneEvent] = []
    config = EngineConfig(str(default_model_file), n_ctx=1024).to_dict()
    with WisdomDB(tmp_path / "wisdom.db") as wisdom:
        (decision,) = decide_speculation(
            wisdom, key, default_model_file, config, workloads=[code_edit], listener=events.append
        )
        assert decision.enabled and decision.chosen.mode == "prompt_lookup", decision.reason
        assert decision.gain is not None and decision.gain > MIN_GAIN
        assert decision.acceptance_rate is not None and decision.acceptance_rate > 0.5
        runs = wisdom.runs(speculative_key(key, "code_edit"))
        assert len(runs) == len(decision.trials) + 1  # the reference and each trial
        assert {run.config["speculative"]["mode"] for run in runs} == {"off", "prompt_lookup"}
        assert all(event.workload == "code_edit" for event in events)

        events.clear()
        (again,) = decide_speculation(
            wisdom, key, default_model_file, config, workloads=[code_edit], listener=events.append
        )
        assert [event.kind for event in events] == ["reused"] * len(events)
        assert again.chosen == decision.chosen

        save_speculation_defaults(wisdom, key, config, "fastest", [decision])
        (stored,) = stored_speculation(wisdom, key, [code_edit])  # what the plan page shows
        assert (stored.workload, stored.chosen) == ("code_edit", decision.chosen)
        assert stored.gain == pytest.approx(decision.gain)
        assert stored.acceptance_rate == pytest.approx(decision.acceptance_rate)
