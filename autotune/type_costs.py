"""CPU costs for the weight types a model holds that the calibration did not measure.

The calibration probes a few types (`kernels.engine_run.PROBE_TYPES`); a model may hold
others (Q4_1, Q5_1, IQ4_XS, MXFP4, ...). Until measured, such a type costs what its nearest
measured type costs and the plan says so ("Q4_1 estimated from Q5_0", `KernelCosts.source`).
`measure_type_costs` measures them on demand (`hearthside plan MODEL --measure-types`): per
type, uniform synthetic probes of that type at the calibration's probe widths, timed with
the calibration's own code (`kernels.engine_run.measure_cpu`) in interleaved rounds beside
probes of the type it was estimated from. The reference's costs are known from the
calibration, so its probes tell how much slower or faster the machine runs now than then (a
shared machine's neighbours come and go); the new type's times, scaled by that, less the
calibration's fixed costs per layer and token, give its seconds per byte (or weight) and per
row. They are stored in the autotune DB under the machine's fingerprint, against the
calibration they were fitted to: a new calibration makes them "estimated" again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hearthside.autotune.calibration import logits_seconds, planner_figures
from hearthside.autotune.cpu_costs import KernelCosts, last_token_seconds
from hearthside.autotune.fingerprint import machine_fingerprint
from hearthside.autotune.memory import WeightPiece
from hearthside.autotune.planner import Machine, describe_machine
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.probe.profile import HardwareProfile
from hearthside.kernels.engine_run import (
    LAST_TOKEN_BYTES,
    LAST_TOKEN_ROWS,
    PREFILL_ROWS,
    PREFILL_WEIGHTS,
    READ_BYTES,
    READ_ROWS,
    SpeedProbe,
    StepCallback,
    base_type,
    experts_key,
    is_experts_key,
    measure_cpu,
    speed_probes,
    type_bits,
    work_by_type,
)
from hearthside.kernels.measurement import Budget, Measurement
from hearthside.kernels.results import CalibrationReport
from hearthside.kernels.synthetic_model import SyntheticShape, uniform_writable

KINDS = ("decode", "prefill")
_WORK_KEYS = {"decode": (READ_BYTES, READ_ROWS), "prefill": (PREFILL_WEIGHTS, PREFILL_ROWS)}
DEFAULT_BUDGET_S = 30.0  # all the types of one model together, after writing the probes


@dataclass(frozen=True)
class TypeCost:
    """What measuring one weight type gave: its planner figures ({} when it could not be
    measured: `note` says why, and the plan keeps estimating it from `reference`)."""

    type_name: str
    reference: str | None
    figures: dict[str, float] = field(default_factory=dict)
    note: str = ""

    @property
    def measured(self) -> bool:
        return bool(self.figures)


def model_weight_types(pieces: Iterable[WeightPiece]) -> list[str]:
    """The cost keys of the matrices a model multiplies, sorted: their ggml types, and
    "<type>+experts" for routed experts (`experts_key`)."""
    return sorted(
        {
            experts_key(t) if "_exps" in piece.name else t
            for piece in pieces
            if piece.matmul
            for t in piece.type_names
        }
    )


def unmeasured_types(type_names: Iterable[str], figures: dict[str, float]) -> list[str]:
    """The types among `type_names` whose decode or prefill cost `figures` lack
    (of the kinds the calibration costed per type: all when it costed none)."""
    kinds = [k for k in KINDS if any(key.startswith(f"{k}_efficiency:") for key in figures)]
    return sorted(
        {
            t
            for t in type_names
            for kind in kinds or KINDS
            if f"{kind}_efficiency:{t}" not in figures
        }
    )


def measure_type_costs(
    type_names: Sequence[str],
    profile: HardwareProfile,
    db: WisdomDB,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    max_probe_bytes: int | None = None,
    widths: Sequence[int] | None = None,
    step: StepCallback | None = None,
) -> list[TypeCost]:
    """Measure each of `type_names` on this machine's CPU and store its costs; the types the
    latest calibration measured itself are left alone. Needs a calibration with speed probes
    (`hearthside calibrate`): without one every type reports why it was not measured.

    `budget_s` covers writing and loading the probes too (a probe left unloaded when it runs
    out is not measured; the types' own probes load first, their references after);
    `max_probe_bytes` caps a probe's weights (by default they are the calibration's size);
    `widths`, the probe widths (by default the calibration's; one width gives no row cost).
    """
    fingerprint = machine_fingerprint(profile)
    stored = db.latest_calibration(fingerprint)
    figures = planner_figures(CalibrationReport.from_dict(stored)) if stored else {}
    machine = describe_machine(profile, figures)
    costs = machine.cpu_costs("decode")
    wanted = unmeasured_types(type_names, figures)
    if stored is None or not costs.per_unit:
        why = "not measured: measure this machine first, then its weight types"
        return [TypeCost(t, None, note=why) for t in wanted]
    plans = [_TypePlan(t, costs.nearest(t)) for t in wanted]
    results = [
        TypeCost(p.type_name, p.reference, note=f"no synthetic writer for {base_type(p.type_name)}")
        for p in plans
        if not uniform_writable(base_type(p.type_name))
    ]
    plans = [p for p in plans if uniform_writable(base_type(p.type_name))]
    if not plans:
        return results
    probes = _probes(plans, profile.cpu.l3_cache_bytes, max_probe_bytes, widths)
    measured = measure_cpu(None, probes, quick=True, budget=Budget(budget_s, 1.0), step=step)
    runs = _runs_by_probe(measured, machine.cpu_bandwidth)
    # dense types first: an experts probe's attention is of its type, costed by then
    for type_plan in sorted(plans, key=lambda p: is_experts_key(p.type_name)):
        cost = _fit_type(type_plan, runs, machine)
        if cost.measured:
            db.save_type_costs(fingerprint, cost.type_name, str(stored["created_at"]), cost.figures)
            machine = replace(machine, kernel_figures=machine.kernel_figures | cost.figures)
        results.append(cost)
    return results


@dataclass(frozen=True)
class _TypePlan:
    type_name: str
    reference: str | None  # the calibrated type it is estimated from, timed beside it


def _probes(
    plans: Sequence[_TypePlan],
    cache_bytes: int | None,
    max_probe_bytes: int | None,
    widths: Sequence[int] | None,
) -> list[SpeedProbe]:
    """Per type, then per reference, a probe shaped like the calibration's speed probe of
    each width, with as many layers as read the same bytes (capped at `max_probe_bytes`)."""
    calibration_probes = [p for p in speed_probes(cache_bytes) if "@" in p.name]
    calibrated_widths = sorted({p.shape.n_embd for p in calibration_probes})
    types = sorted({p.type_name for p in plans})
    references = sorted({p.reference for p in plans if p.reference} - set(types))
    probes = []
    for key in types + references:
        type_name = base_type(key)
        for width in widths or calibrated_widths:
            base = min(calibration_probes, key=lambda p: abs(p.shape.n_embd - width))
            base_bytes = base.shape.n_layers * base.shape.n_embd**2 * type_bits(base.type_name)
            layers = max(1, round(base_bytes / (width**2 * type_bits(type_name))))
            if max_probe_bytes is not None:
                layer_bytes = 14.5 * width**2 * type_bits(type_name) / 8
                layers = max(1, min(layers, int(max_probe_bytes / layer_bytes)))
            shape = replace(
                base.shape,
                n_layers=layers,
                n_embd=width,
                n_head=width // 64,
                n_head_kv=max(1, width // 256),
                n_ff=4 * width,
            )
            if is_experts_key(key):
                shape = _experts_shape(shape)
            probes.append(SpeedProbe(f"{key}@{width}", type_name, shape))
    return probes


EXPERTS_PER_PROBE, EXPERTS_USED = 8, 2


def _experts_shape(dense: SyntheticShape) -> SyntheticShape:
    """A Mixtral-style llama probe (llama.cpp's llama architecture takes routed experts)
    that multiplies what `dense` does per token: 2 of 8 experts of half its FFN width, so
    its file is ~3.5x the dense probe's. llama's experts are as wide as n_ff. A small
    vocabulary: the output layer, of the same type, would be most of a token's other work,
    and the experts' cost is what is left of the token's time after that."""
    width = dense.n_ff // EXPERTS_USED
    return replace(
        dense,
        n_ff=width,
        n_expert=EXPERTS_PER_PROBE,
        n_expert_used=EXPERTS_USED,
        n_ff_expert=width,
        n_vocab=512,
    )


@dataclass(frozen=True)
class _Run:
    """One probe's times per token and what a token of it reads and multiplies."""

    seconds: dict[str, float]  # "decode" / "prefill" -> seconds per token
    params: dict[str, Any]

    def work(self, key: str) -> dict[str, float]:
        return {t: float(v) for t, v in work_by_type(self.params, key).items()}


def _runs_by_probe(measurements: list[Measurement], bandwidth: float) -> dict[str, _Run]:
    runs: dict[str, _Run] = {}
    for m in measurements:
        probe = m.params.get("probe")
        if not (m.ok and probe and m.value):
            continue
        run = runs.setdefault(str(probe), _Run({}, dict(m.params)))
        run.params.update(m.params)  # the prefill's n_prompt beside the decode's n_gen
        seconds = 1 / m.value
        if m.kind == "engine_decode":
            run.seconds["decode"] = seconds - logits_seconds(int(m.params["n_vocab"]), bandwidth)
        elif m.kind == "engine_prefill":
            run.seconds["prefill"] = seconds
    return runs


def _fit_type(type_plan: _TypePlan, runs: dict[str, _Run], machine: Machine) -> TypeCost:
    type_name, reference = type_plan.type_name, type_plan.reference
    figures: dict[str, float] = {}
    for kind in KINDS:
        if not machine.cpu_costs(kind).per_unit:
            continue  # the calibration costed no type for it: its overall figure applies
        fitted = _fit_kind(type_name, reference, kind, runs, machine)
        if fitted is None:
            why = f"{type_name}'s {kind} probes did not run or could not be fitted"
            return TypeCost(type_name, reference, note=why)
        per_unit, per_row = fitted
        figures[f"{kind}_efficiency:{type_name}"] = _ideal_per_unit(machine, kind) / per_unit
        figures[f"{kind}_row_s:{type_name}"] = per_row
        # a prefill probe's last-token matrices are of this type: read at its decode cost
        machine = replace(machine, kernel_figures=machine.kernel_figures | figures)
    note = f"measured beside {reference}" if reference else "measured"
    return TypeCost(type_name, reference, figures, note)


def _fit_kind(
    type_name: str, reference: str | None, kind: str, runs: dict[str, _Run], machine: Machine
) -> tuple[float, float] | None:
    """Seconds per unit and per row of `type_name` for `kind`, at the calibration's speed:
    per width, its weights' seconds = its time x `_speed_now` less the fixed costs; then a
    per-unit and per-row cost that explain both widths (per unit only when a row cost would
    come out negative)."""
    costs = machine.cpu_costs(kind)
    units_key, rows_key = _WORK_KEYS[kind]
    references = [run for name, run in runs.items() if name.partition("@")[0] == reference]
    speed_now = _speed_now(references, kind, costs, machine)
    equations = []
    for name, run in runs.items():
        if name.partition("@")[0] != type_name or kind not in run.seconds:
            continue
        units, rows = run.work(units_key), run.work(rows_key)
        others = {t: amount for t, amount in units.items() if t != type_name}
        # an experts probe's other matrices (attention, router) at their known costs
        fixed = _fixed_seconds(kind, run, machine) + (costs.seconds(others, rows) if others else 0)
        weights_s = run.seconds[kind] * speed_now - fixed
        if weights_s > 0 and units.get(type_name):
            equations.append((units[type_name], rows.get(type_name, 0.0), weights_s))
    return _solve(equations)


def _speed_now(
    references: Sequence[_Run], kind: str, costs: KernelCosts, machine: Machine
) -> float:
    """How much faster the machine ran the reference's probes in the calibration's terms
    than now: their predicted seconds over their measured ones, all widths together (1 when
    none ran). One factor for all widths: on a shared 2-core VM one few-layer reference
    probe ran 1.4x faster in one of three runs minutes apart, the new type's probes did not."""
    units_key, rows_key = _WORK_KEYS[kind]
    ran = [run for run in references if kind in run.seconds]
    predicted = sum(
        costs.seconds(run.work(units_key), run.work(rows_key)) + _fixed_seconds(kind, run, machine)
        for run in ran
    )
    measured = sum(run.seconds[kind] for run in ran)
    return predicted / measured if ran else 1.0


def _fixed_seconds(kind: str, run: _Run, machine: Machine) -> float:
    """A token's seconds beside its weights': its layers', the call's, and for prefill its
    share of what the batch runs once (`last_token_seconds`)."""
    figures = machine.kernel_figures
    # the layer cost fitted together with the calibration's probes, which these imitate; not
    # `layer_seconds` of "llama": when the shipped model is llama-shaped that is what its own
    # run left after its weights (41 us a layer for SmolLM2 on the Xeon, 14x the probes'),
    # which made a 107-layer probe's fixed costs exceed its whole time
    per_layer = figures.get(f"{kind}_overhead_s_per_layer", 0.0)
    per_token = figures.get(f"{kind}_overhead_s_per_token", 0.0)
    n_prompt = int(run.params.get("n_prompt") or 0)
    if kind == "prefill" and n_prompt:
        once = last_token_seconds(
            machine.cpu_costs("decode"),
            figures,
            run.work(LAST_TOKEN_BYTES),
            run.work(LAST_TOKEN_ROWS),
        )
        per_token += once / n_prompt
    return int(run.params.get("n_layers", 0)) * per_layer + per_token


def _solve(equations: list[tuple[float, float, float]]) -> tuple[float, float] | None:
    """(per_unit, per_row) from (units, rows, seconds) equations, each weighed by its own
    time (relative errors matter)."""
    if not equations:
        return None
    units, rows, seconds = (np.array(column) for column in zip(*equations, strict=True))
    if len(equations) >= 2:
        matrix = np.stack([units, rows], axis=1) / seconds[:, None]
        (per_unit, per_row), *_ = np.linalg.lstsq(matrix, np.ones(len(seconds)), rcond=None)
        if per_unit > 0 and per_row >= 0:
            return float(per_unit), float(per_row)
    per_unit = float(np.sum(seconds) / np.sum(units))
    return (per_unit, 0.0) if per_unit > 0 else None


def _ideal_per_unit(machine: Machine, kind: str) -> float:
    return 1 / machine.cpu_bandwidth if kind == "decode" else 2 / machine.cpu_flops


def describe_type_cost(cost: TypeCost) -> str:
    if cost.measured:
        return f"{cost.type_name}: {cost.note}"
    stays = f"; stays estimated from {cost.reference}" if cost.reference else ""
    return f"{cost.type_name}: not measured ({cost.note}){stays}"
