"""Every weight type a model holds gets a CPU cost: measured by the calibration, measured on
demand (`autotune/type_costs.py`), or estimated from a named measured type until then."""

from __future__ import annotations

from pathlib import Path

import pytest

from hearthside.autotune.calibration import calibration_for, planner_figures, store_calibration
from hearthside.autotune.cpu_costs import KernelCosts
from hearthside.autotune.memory import CPU, REPACKED_ON_X86_AVX2, pieces_from_gguf
from hearthside.autotune.planner import (
    Plan,
    TokenWork,
    describe_machine,
    plan,
    weight_cost_reasons,
    weight_cost_sources,
)
from hearthside.autotune.type_costs import (
    measure_type_costs,
    model_weight_types,
    unmeasured_types,
)
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.engine import Engine
from hearthside.core.models.gguf_validator import validate_gguf
from hearthside.core.models.spec import spec_from_gguf
from hearthside.core.probe.runner import probe_hardware
from hearthside.kernels.engine_run import PROBE_TYPES
from tests.autotune.test_calibration import recorded_report
from tests.fixtures.synthetic_gguf import SyntheticShape, write_uniform_gguf

SMALL = SyntheticShape("llama", 2, 256, 4, 1, 1024, n_vocab=512)


def probed_costs() -> KernelCosts:
    """Costs of the calibration's probe types on an AVX2 machine (values do not matter)."""
    return KernelCosts(dict.fromkeys(PROBE_TYPES, 1e-10), {}, REPACKED_ON_X86_AVX2)


@pytest.mark.parametrize(
    ("unmeasured", "source"),
    [
        ("Q4_1", "Q5_0"),  # a legacy type, not repacked on AVX2 (Q4_0 is): the closest bits
        ("Q5_1", "Q5_0"),
        ("Q2_K", "Q3_K"),  # a K-quant: the nearest K-quant by bits
        ("Q5_K", "Q6_K"),  # Q4_K is repacked on AVX2, Q5_K is not
        ("IQ4_NL", "Q4_0"),  # 32-weight blocks, repacked like Q4_0
        ("IQ4_XS", "Q3_K"),  # 256-weight blocks dot against Q8_K like the K-quants
        ("IQ2_XXS", "Q3_K"),
        ("TQ2_0", "Q3_K"),
        ("MXFP4", "Q4_0"),  # 32-weight blocks, repacked on AVX2 like Q4_0
        ("Q8_0", None),  # measured itself
    ],
)
def test_an_unmeasured_type_is_estimated_from_a_named_type_alike(
    unmeasured: str, source: str | None
) -> None:
    costs = probed_costs()
    assert costs.source(unmeasured) == (
        "measured" if source is None else f"estimated from {source}"
    )


def test_nothing_measured_names_no_source() -> None:
    assert KernelCosts({}).source("Q4_1") is None


def cost_reason(result: Plan) -> str:
    return next(reason.why for reason in result.reasons if reason.setting == "weight costs")


def uniform_model(folder: Path, type_name: str) -> Path:
    return write_uniform_gguf(folder / f"small-{type_name}.gguf", SMALL, type_name)


def planned(path: Path, calibration: dict[str, float]) -> Plan:
    pieces = pieces_from_gguf(validate_gguf(path))
    return plan(
        spec_from_gguf(path), probe_hardware(), n_ctx=512, calibration=calibration, pieces=pieces
    )


def test_the_plan_says_which_type_an_estimate_came_from(tmp_path: Path) -> None:
    figures = planner_figures(recorded_report())  # the EPYC VM's calibration: 6 probe types
    q4_1 = planned(uniform_model(tmp_path, "Q4_1"), figures)
    assert (
        "Q4_1 estimated from Q5_0 (not measured on this machine; `hearthside plan MODEL "
        "--measure-types` measures it)" in cost_reason(q4_1)
    )
    assert "Q8_0: measured" in cost_reason(planned(uniform_model(tmp_path, "Q8_0"), figures))
    uncalibrated = planned(uniform_model(tmp_path, "Q8_0"), {})
    assert all(reason.setting != "weight costs" for reason in uncalibrated.reasons)


def test_the_synthetic_writer_covers_the_types_llama_cpp_runs(tmp_path: Path) -> None:
    types = ("Q4_1", "Q5_1", "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ2_XXS", "IQ1_S", "TQ1_0", "MXFP4")
    types += ("F32", "F16")  # a MoE's routers are F32: --measure-types probes them too
    for type_name in types:
        path = uniform_model(tmp_path, type_name)
        assert model_weight_types(pieces_from_gguf(validate_gguf(path))) == [type_name]
        engine = Engine(EngineConfig(str(path), n_ctx=64, n_threads=1))
        try:
            assert engine.time_decode([1, 2, 3]) > 0
        finally:
            engine.close()
        path.unlink()


def test_measuring_a_missing_type_stores_its_cost_and_the_next_plan_says_measured(
    tmp_path: Path,
) -> None:
    profile = probe_hardware()
    model = uniform_model(tmp_path, "Q4_1")
    with WisdomDB(tmp_path / "wisdom.db") as wisdom:
        store_calibration(recorded_report(), profile, wisdom)
        before = calibration_for(profile, wisdom)
        assert unmeasured_types(["Q4_1", "Q4_0"], before) == ["Q4_1"]
        assert "Q4_1 estimated from Q5_0" in cost_reason(planned(model, before))
        costs = measure_type_costs(
            ["Q4_1", "Q4_0"], profile, wisdom, budget_s=4, max_probe_bytes=8 << 20, widths=[512]
        )
        assert [(c.type_name, c.reference, c.measured) for c in costs] == [("Q4_1", "Q5_0", True)]
        after = calibration_for(profile, wisdom)
    assert after["decode_efficiency:Q4_1"] > 0 and after["prefill_efficiency:Q4_1"] > 0
    assert unmeasured_types(["Q4_1"], after) == []
    assert "Q4_1: measured on this machine" in cost_reason(planned(model, after))


def test_a_type_no_probe_can_be_written_for_says_so() -> None:
    machine = describe_machine(probe_hardware(), planner_figures(recorded_report()))
    cpu = {"IQ1_M": 1e6, "Q4_1": 1e6, "Q8_0": 1e3}
    work = TokenWork({CPU: cpu}, {CPU: cpu}, {CPU: 1})
    assert weight_cost_sources(machine, work) == {
        "IQ1_M": "estimated from Q3_K",
        "Q4_1": "estimated from Q5_0",
        "Q8_0": "measured",
    }
    (reason,) = weight_cost_reasons(machine, work)
    assert reason.value == "estimated"
    assert reason.why == (
        "Q4_1 estimated from Q5_0 (not measured on this machine; `hearthside plan MODEL "
        "--measure-types` measures it); IQ1_M estimated from Q3_K (no probe of it can be "
        "written here). Q8_0: measured."
    )


def test_type_costs_hold_for_the_calibration_they_were_fitted_to(tmp_path: Path) -> None:
    with WisdomDB(tmp_path / "wisdom.db") as wisdom:
        wisdom.save_type_costs("machine", "Q4_1", "2026-11-29", {"decode_efficiency:Q4_1": 0.5})
        assert wisdom.type_costs("machine", "2026-11-29") == {"decode_efficiency:Q4_1": 0.5}
        assert wisdom.type_costs("machine", "2026-12-01") == {}  # a newer calibration
        assert wisdom.type_costs("other", "2026-11-29") == {}


def test_a_type_is_unmeasured_for_the_kinds_the_calibration_costed_per_type() -> None:
    decode_only = {"decode_efficiency:Q4_0": 0.8, "prefill_efficiency": 0.5}
    assert unmeasured_types(["Q4_0", "Q4_1", "F32"], decode_only) == ["F32", "Q4_1"]
    both = decode_only | {"prefill_efficiency:Q4_0": 0.6}
    assert unmeasured_types(["Q4_0", "Q4_1"], both) == ["Q4_1"]
    assert unmeasured_types(["Q4_0"], {"prefill_efficiency:Q4_1": 0.6}) == ["Q4_0"]


# Routed experts run through llama.cpp's mul_mat_id, not the dense kernels: measured 1.8x
# slower per weight in a prompt batch on a 2-core EPYC, so they are costed under their own key.
SMALL_MOE = SyntheticShape(
    "llama", 2, 256, 4, 1, 512, n_vocab=512, n_expert=4, n_expert_used=2, n_ff_expert=512
)


def test_routed_experts_are_costed_apart_and_estimated_from_their_type_until_measured() -> None:
    costs = probed_costs()
    assert costs.source("Q8_0+experts") == "estimated from Q8_0"
    assert costs.source("Q4_1+experts") == "estimated from Q5_0"  # as the dense Q4_1
    measured = KernelCosts({"Q8_0": 1e-10, "Q8_0+experts": 2e-10})
    assert measured.source("Q8_0+experts") == "measured"
    assert measured.nearest("Q5_0") == "Q8_0"  # a dense type never borrows the experts' cost


def test_a_moe_models_experts_are_their_own_cost_and_the_plan_follows_it(tmp_path: Path) -> None:
    path = write_uniform_gguf(tmp_path / "moe.gguf", SMALL_MOE, "Q8_0")
    pieces = pieces_from_gguf(validate_gguf(path))
    assert model_weight_types(pieces) == ["F32", "Q8_0", "Q8_0+experts"]  # F32: the routers
    figures = planner_figures(recorded_report())
    before = planned(path, figures)
    assert "Q8_0 (routed experts) estimated from Q8_0" in cost_reason(before)
    slower = {
        f"{kind}_efficiency:Q8_0+experts": figures[f"{kind}_efficiency:Q8_0"] / 2
        for kind in ("decode", "prefill")
    }
    after = planned(path, figures | slower)
    assert after.speed.prefill_tps < 0.9 * before.speed.prefill_tps
    # a tiny model's decode is mostly the fixed costs per layer and token
    assert after.speed.decode_tps_empty_context < before.speed.decode_tps_empty_context


def test_measuring_a_moe_models_experts_stores_their_cost(tmp_path: Path) -> None:
    profile = probe_hardware()
    model = write_uniform_gguf(tmp_path / "moe.gguf", SMALL_MOE, "Q4_0")
    with WisdomDB(tmp_path / "wisdom.db") as wisdom:
        store_calibration(recorded_report(), profile, wisdom)
        costs = measure_type_costs(
            ["Q4_0+experts"], profile, wisdom, budget_s=10, max_probe_bytes=8 << 20, widths=[512]
        )
        assert [(c.type_name, c.reference, c.measured) for c in costs] == [
            ("Q4_0+experts", "Q4_0", True)
        ]
        after = calibration_for(profile, wisdom)
    assert after["prefill_efficiency:Q4_0+experts"] > 0
    assert "Q4_0 (routed experts)" in cost_reason(planned(model, after))
    assert "routed experts) estimated" not in cost_reason(planned(model, after))


def test_a_deep_probe_is_fitted_with_the_probes_layer_cost_not_the_shipped_models(
    tmp_path: Path,
) -> None:
    """When the shipped model is llama-shaped, the calibration stores what its run left after
    its weights as llama's layer cost (41 us a layer for SmolLM2 on the 2-core Xeon, 14x the
    probes' own). Charged to a 107-layer type probe, that exceeded the probe's whole time:
    the narrow probe was dropped and the routed experts' prefill cost came out 1.2x too slow
    (a Qwen3-30B-A3B's prefill predicted at 0.70-0.76 of llama-bench's). Recorded here: two
    Q4_1 probes, a deep narrow one and a shallow wide one, that run exactly as the
    calibration costs Q5_0 (its probes' layer cost included); the fit must give Q5_0's."""
    from hearthside.autotune.cpu_costs import last_token_seconds
    from hearthside.autotune.type_costs import _fit_type, _Run, _TypePlan
    from hearthside.kernels.engine_run import (
        LAST_TOKEN_BYTES,
        LAST_TOKEN_ROWS,
        PREFILL_ROWS,
        PREFILL_WEIGHTS,
        READ_BYTES,
        READ_ROWS,
        per_token_work,
    )

    figures = planner_figures(recorded_report()) | {"prefill_overhead_s_per_layer:llama": 41e-6}
    machine = describe_machine(probe_hardware(), figures)
    prefill, decode = machine.cpu_costs("prefill"), machine.cpu_costs("decode")

    def as_q5_0(run: _Run, key: str) -> dict[str, float]:
        return {"Q5_0" if t == "Q4_1" else t: v for t, v in run.work(key).items()}

    runs = {}
    for width, layers in ((256, 60), (1024, 4)):
        shape = SyntheticShape("llama", layers, width, width // 64, 1, 4 * width, n_vocab=512)
        path = write_uniform_gguf(tmp_path / f"{width}.gguf", shape, "Q4_1")
        run = _Run({}, {**per_token_work(validate_gguf(path)), "n_prompt": 128})
        once = last_token_seconds(
            decode, figures, as_q5_0(run, LAST_TOKEN_BYTES), as_q5_0(run, LAST_TOKEN_ROWS)
        )
        run.seconds["prefill"] = (
            prefill.seconds(as_q5_0(run, PREFILL_WEIGHTS), as_q5_0(run, PREFILL_ROWS))
            + layers * figures["prefill_overhead_s_per_layer"]
            + figures.get("prefill_overhead_s_per_token", 0.0)
            + once / 128
        )
        run.seconds["decode"] = (
            decode.seconds(as_q5_0(run, READ_BYTES), as_q5_0(run, READ_ROWS))
            + layers * figures["decode_overhead_s_per_layer"]
            + figures["decode_overhead_s_per_token"]
        )
        runs[f"Q4_1@{width}"] = run
    fitted = _fit_type(_TypePlan("Q4_1", None), runs, machine).figures
    assert fitted["prefill_efficiency:Q4_1"] == pytest.approx(
        figures["prefill_efficiency:Q5_0"], rel=0.01
    )
