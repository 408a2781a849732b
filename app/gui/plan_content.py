"""What the Plan page shows, as data and plain words: no widgets here.

`compute_plan` is the page's blocking work (run on a worker thread): resolve the model, read
this machine's calibration and measured runs from the autotune database, and plan.
`compute_recipe` is the same for what-if hardware with several GPUs or nodes: a vLLM or
llama-server serving recipe (autotune/serving.py) with its commands as paste-ready blocks.
The rest are pure functions from a `Plan` (or a checked override, or a recipe) to the
sentences and rows the page displays, so they are tested without a window.
"""

from __future__ import annotations

import shlex
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hearthside.autotune.calibration import calibration_for
from hearthside.autotune.family_quality import kv_priors_of
from hearthside.autotune.fingerprint import tuning_key
from hearthside.autotune.goals import RunQuality, kv_prior, kv_quality_text
from hearthside.autotune.memory import CPU
from hearthside.autotune.planner import (
    DEFAULT_FREE_MARGIN_BYTES,
    Candidate,
    Goal,
    Plan,
    Reason,
    SpeedEstimate,
    cpu_expert_layers,
    describe_slots,
    evaluate_config,
    plan,
)
from hearthside.autotune.recipes import shipped_recipes
from hearthside.autotune.serving import (
    ClusterSetup,
    LlamaServerRecipe,
    ServingPlan,
    llama_server_command,
    llama_server_recipe,
    plan_vllm,
    shell_groups,
    vllm_command,
)
from hearthside.autotune.wisdom import RunRecord, WisdomDB
from hearthside.core.engine.config import EngineConfig
from hearthside.core.errors import HearthsideError
from hearthside.core.models.catalog import resolve_spec
from hearthside.core.models.spec import ModelSpec
from hearthside.core.models.store import registered_file
from hearthside.core.paths import data_dir, models_dir
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.probe.runner import probe_in_subprocess
from hearthside.core.probe.spec import ClusterSpec, load_cluster_spec
from hearthside.core.units import format_bytes

if TYPE_CHECKING:  # the tuner loads the engine (llama.cpp): not before the window shows
    from hearthside.autotune.tuner import StoredSpeculation

GOAL_NAMES: dict[str, str] = {
    "balanced": "Balanced",
    "fastest": "Fastest",
    "quality": "Best quality",
    "longest-context": "Longest context",
}
CONFIDENCE_TEXT: dict[str, str] = {
    "estimated": "Estimated from the hardware's specifications",
    "calibrated": "Calibrated with this machine's measured bandwidth and compute",
    "measured": "Calibrated, then corrected by the runs measured on this machine",
}
SETTING_NAMES: dict[str, str] = {
    "n_gpu_layers": "GPU layers",
    "experts": "Expert placement",
    "type_k/type_v": "KV cache type",
    "flash_attn": "Flash attention",
    "n_ctx": "Context",
    "n_parallel": "Parallel requests",
    "n_threads": "Threads",
    "n_batch": "Batch",
    "speculative": "Speculative decoding",
    "use_mmap": "Memory mapping",
    "numa": "NUMA",
    "weight costs": "Weight type costs",
}
# Which row a recipe's reason belongs to, by the settings the recipe sets.
RECIPE_SETTING_ROWS: dict[str, str] = {
    "n_threads": "n_threads",
    "n_threads_batch": "n_threads",
    "kv_types": "type_k/type_v",
    "n_gpu_layers": "n_gpu_layers",
    "expert_placement": "experts",
    "use_mmap": "use_mmap",
    "numa": "numa",
}


# ---- what to plan, and the plan's outcome: plain data ----------------------------------------


@dataclass(frozen=True)
class PlanRequest:
    ref: str  # an installed model's id, "default", a GGUF path, or a catalog id
    goal: Goal = "balanced"
    n_ctx: int | None = None  # None: the planner chooses
    free_margin_bytes: int = DEFAULT_FREE_MARGIN_BYTES
    hardware: str = ""  # THIS_MACHINE, or a what-if hardware choice (see load_hardware)
    n_parallel: int | None = None  # slots; None: the planner chooses


@dataclass(frozen=True)
class MeasuredSpeed:
    """A run from the autotune database for this model on this machine and engine."""

    prefill_tps: float | None
    decode_tps: float | None
    ttft_s: float | None
    rigor: str
    same_settings: bool  # measured with exactly the planned settings (else: the best run)
    runs: int  # successful measured runs of this model here


@dataclass(frozen=True)
class PlanView:
    request: PlanRequest
    plan: Plan
    spec: ModelSpec
    calibration: dict[str, float]
    model_file: Path | None  # None for a what-if (catalog) model: nothing to load
    measured: MeasuredSpeed | None
    speculation: tuple[StoredSpeculation, ...] = ()  # what tuning chose per kind of prompt
    kv_quality: RunQuality | None = None  # what the plan's KV cache does to the answers

    @property
    def what_if(self) -> bool:
        return self.model_file is None

    @property
    def loadable(self) -> bool:
        return not self.what_if and (self.plan.fits or self.plan.streams_from_disk)


@dataclass(frozen=True)
class SettingRow:
    name: str
    value: str
    why: str


@dataclass(frozen=True)
class OverrideResult:
    config: EngineConfig | None
    candidate: Candidate | None
    problems: tuple[str, ...]  # empty when the settings can be loaded

    @property
    def ok(self) -> bool:
        return not self.problems and self.candidate is not None


# ---- blocking work (worker thread) -----------------------------------------------------------


def compute_plan(
    request: PlanRequest, profile: HardwareProfile, calibration: Mapping[str, float] | None = None
) -> PlanView:
    """Resolve the model, read measurements, and plan; blocking. `calibration` is this
    machine's figures (its `MachineContext`'s); None reads them from the autotune DB."""
    spec = resolve_spec(request.ref)
    model_file = registered_file(request.ref)
    this_machine = request.hardware == THIS_MACHINE
    with WisdomDB() as wisdom:
        # This machine's calibration and measurements say nothing about what-if hardware.
        figures: dict[str, float] = {}
        if this_machine:
            figures = dict(calibration_for(profile, wisdom) if calibration is None else calibration)
        priors = kv_priors_of(wisdom, spec.architecture, model_file)
        result = plan(
            spec,
            profile,
            goal=request.goal,
            n_ctx=request.n_ctx,
            free_margin_bytes=request.free_margin_bytes,
            calibration=figures or None,
            n_parallel=request.n_parallel,
            kv_priors=priors,
        )
        measured: MeasuredSpeed | None = None
        speculation: tuple[StoredSpeculation, ...] = ()
        if model_file is not None and this_machine:
            measured = measured_speed(wisdom, profile, model_file, result.config)
            from hearthside.autotune.tuner import stored_speculation  # loads the engine: here only

            speculation = stored_speculation(wisdom, tuning_key(profile, model_file))
    kv_quality = kv_prior(result.config.type_k, priors)
    return PlanView(request, result, spec, figures, model_file, measured, speculation, kv_quality)


def measured_speed(
    wisdom: WisdomDB, profile: HardwareProfile, model_file: Path, config: EngineConfig
) -> MeasuredSpeed | None:
    key = tuning_key(profile, model_file)
    # runs measure one request: the plan's other slots do not change what was measured
    exact = wisdom.lookup(key, config.with_changes(n_parallel=1).to_dict(), rigor="quick")
    run: RunRecord | None = exact or wisdom.best_run(key)
    if run is None:
        return None
    measured_runs = [r for r in wisdom.runs(key, outcome="ok") if r.rigor != "estimate"]
    return MeasuredSpeed(
        prefill_tps=run.prefill_tps,
        decode_tps=run.decode_tps,
        ttft_s=run.ttft_s,
        rigor=run.rigor,
        same_settings=exact is not None,
        runs=len(measured_runs),
    )


def default_probe(probe_command: Sequence[str] | None) -> Callable[[], HardwareProfile]:
    command = list(probe_command) if probe_command is not None else None
    return lambda: probe_in_subprocess(models_dir(data_dir()), command=command)


# ---- what to show: pure functions of a plan --------------------------------------------------


def verdict(plan: Plan) -> tuple[str, str]:
    """(kind, sentence): "fits", "streams" or "no"."""
    if plan.fits:
        return "fits", f"Fits in memory — {placement_text(plan.config, plan.devices)}"
    if plan.streams_from_disk:
        return "streams", "Larger than memory: it would stream from disk, slowly"
    return "no", "Won't fit on this computer"


def placement_text(config: EngineConfig, devices: Sequence[Any]) -> str:
    gpus = [device.device for device in devices if device.device != CPU]
    if not gpus or config.n_gpu_layers == 0:
        return "runs on the CPU"
    where = " and ".join(gpus)
    if config.n_gpu_layers == -1 and not config.tensor_overrides:
        return f"every layer on {where}"
    if config.tensor_overrides:
        return f"layers on {where}, some experts in system memory"
    return f"{config.n_gpu_layers} layers on {where}, the rest on the CPU"


def gpu_layers_text(value: int) -> str:
    return "all" if value == -1 else str(value)


def setting_rows(plan: Plan) -> list[SettingRow]:
    """Each setting of the plan's config with the planner's reason (and any rule behind it)."""
    config = plan.config
    reasons = {reason.setting: reason for reason in plan.reasons if reason.setting != "recipe"}
    rules = _rules_by_row(plan.reasons)
    values: dict[str, tuple[str, str]] = {
        "n_gpu_layers": (gpu_layers_text(config.n_gpu_layers), ""),
        "type_k/type_v": (_kv_text(config), ""),
        "flash_attn": ("on" if config.flash_attn else "off", ""),
        "n_ctx": (f"{config.n_ctx:,} tokens", ""),
        "n_parallel": (describe_slots(plan), ""),
        "n_threads": (
            _threads_text(config),
            "Decode uses the physical cores; prompt processing uses every logical core.",
        ),
        "n_batch": (
            f"{config.n_batch} tokens (micro-batch {config.n_ubatch})",
            "llama.cpp's prompt batch; the planner leaves it at the default.",
        ),
    }
    if config.tensor_overrides:
        values["experts"] = (f"first {cpu_expert_layers(config)} layers' experts on the CPU", "")
    if config.speculative.mode != "off":
        values["speculative"] = (
            f"{config.speculative.mode.replace('_', ' ')}, {config.speculative.draft_tokens} "
            "drafted tokens",
            "Drafted tokens are checked in one pass; it pays off when decode is memory-bound.",
        )
    if "use_mmap" in reasons or "use_mmap" in rules:
        values["use_mmap"] = ("on" if config.use_mmap else "off", "")
    if config.numa != "off":
        values["numa"] = (config.numa, "")
    if "weight costs" in reasons:  # which types' CPU costs were measured, which estimated
        values["weight costs"] = (reasons["weight costs"].value, "")
    rows = []
    for setting, (value, fallback) in values.items():
        reason = reasons.get(setting)
        rule_whys = rules.pop(setting, [])
        why = " ".join([reason.why, *rule_whys] if reason else rule_whys) or fallback
        rows.append(SettingRow(SETTING_NAMES[setting], value, why or "The engine's default."))
    rows += [SettingRow("Rule", rule_id, why) for rule_id, why in _leftover_rules(plan, rules)]
    return rows


def _kv_text(config: EngineConfig) -> str:
    if config.type_k == config.type_v:
        return config.type_k
    return f"K {config.type_k}, V {config.type_v}"


def _threads_text(config: EngineConfig) -> str:
    decode = config.n_threads or "physical cores"
    batch = config.n_threads_batch or "all logical cores"
    return f"{decode} for decode, {batch} for prompts"


def _recipe_rows() -> dict[str, str]:
    rows = {}
    for recipe in shipped_recipes():
        known = [RECIPE_SETTING_ROWS[k] for k in recipe.settings if k in RECIPE_SETTING_ROWS]
        rows[recipe.id] = known[0] if known else ""
    return rows


def _rules_by_row(reasons: Sequence[Reason]) -> dict[str, list[str]]:
    rows = _recipe_rows()
    by_row: dict[str, list[str]] = {}
    for reason in reasons:
        if reason.setting == "recipe":
            row = rows.get(reason.value) or "other"
            by_row.setdefault(row, []).append(reason.why)
    return by_row


def _leftover_rules(plan: Plan, rules: dict[str, list[str]]) -> list[tuple[str, str]]:
    """Rules whose setting has no row of its own (e.g. one that applies only at NUMA)."""
    leftover = {why for whys in rules.values() for why in whys}
    return [(r.value, r.why) for r in plan.reasons if r.setting == "recipe" and r.why in leftover]


def alternative_text(summary: dict[str, Any]) -> str:
    """One runner-up (`Candidate.summary()`) in plain words."""
    layers = summary.get("n_gpu_layers", 0)
    where = "all on the CPU" if layers == 0 else f"GPU layers {gpu_layers_text(int(layers))}"
    experts = summary.get("expert_layers_on_cpu") or 0
    if experts:
        where += f", experts of {experts} layers on the CPU"
    fit = "fits" if summary.get("fits") else "streams from disk"
    return (
        f"{where}, KV {summary.get('type_k')}, context {int(summary.get('n_ctx', 0)):,} — "
        f"~{summary.get('decode_tps', 0):.1f} tok/s decode, "
        f"~{summary.get('prefill_tps', 0):.0f} tok/s prefill ({fit})"
    )


def rate_text(value: float | None, unit: str = "tok/s") -> str:
    if value is None:
        return "—"
    return f"{value:,.1f} {unit}" if value < 100 else f"{value:,.0f} {unit}"


def seconds_text(value: float | None) -> str:
    if value is None or value == float("inf"):
        return "—"
    return f"{value:.2f} s" if value < 10 else f"{value:.0f} s"


def speculation_rows(stored: Sequence[StoredSpeculation]) -> list[SettingRow]:
    """One row per kind of prompt the tuner measured speculative decoding on."""
    from hearthside.autotune.speculative import describe  # the engine is loaded by now

    rows = []
    for choice in stored:
        if choice.chosen.mode == "off":
            why = "Measured: drafting did not make these replies faster, so it stays off."
        else:
            gain = f"{choice.gain:.2f}× faster" if choice.gain else "faster"
            accepted = (
                f", {choice.acceptance_rate:.0%} of drafts accepted"
                if choice.acceptance_rate is not None
                else ""
            )
            why = f"Measured {gain} than plain decoding{accepted}."
        rows.append(SettingRow(f"Speculation ({choice.title})", describe(choice.chosen), why))
    return rows


def speed_rows(speed: SpeedEstimate, measured: MeasuredSpeed | None) -> list[tuple[str, str, str]]:
    """(what, predicted, measured) for prefill, decode and time to first token."""
    return [
        ("Prompt (prefill)", rate_text(speed.prefill_tps), rate_text(_get(measured, "prefill"))),
        ("Generation (decode)", rate_text(speed.decode_tps), rate_text(_get(measured, "decode"))),
        ("First token", seconds_text(speed.ttft_s), seconds_text(_get(measured, "ttft"))),
    ]


def _get(measured: MeasuredSpeed | None, which: str) -> float | None:
    if measured is None:
        return None
    return {"prefill": measured.prefill_tps, "decode": measured.decode_tps}.get(
        which, measured.ttft_s
    )


def measured_note(view: PlanView) -> str:
    if view.what_if:
        return "A what-if model: there is nothing to measure until its file is here."
    measured = view.measured
    if measured is None:
        return "Not measured yet — “Optimize for my hardware” measures it."
    runs = f"{measured.runs} measured run{'' if measured.runs == 1 else 's'}"
    if measured.same_settings:
        return f"Measured with these settings ({measured.rigor}); {runs} of this model here."
    return f"Best measured settings so far ({measured.rigor}); {runs} of this model here."


def quality_note(view: PlanView) -> str:
    """What the plan's KV cache does to the answers, and where that figure comes from."""
    kv_type = view.plan.config.type_k
    quality = view.kv_quality
    if kv_type == "f16" or quality is None:
        return "Quality: an f16 KV cache, as the reference."
    until = "" if quality.measured else " “Optimize for my hardware” measures it on this model."
    return f"Quality: {kv_quality_text(kv_type, quality)}.{until}"


def confidence_text(view: PlanView) -> str:
    confidence = "measured" if view.measured and view.measured.same_settings else None
    key = confidence or view.plan.confidence
    return f"Confidence: {key} — {CONFIDENCE_TEXT.get(key, key)}."


def check_override(
    view: PlanView, profile: HardwareProfile, build: Callable[[], EngineConfig]
) -> OverrideResult:
    """The planner's verdict on settings the user typed in."""
    try:
        config = build()
    except HearthsideError as exc:  # contradictory settings (EngineConfigError)
        return OverrideResult(None, None, (exc.user_text(),))
    candidate = evaluate_config(
        view.spec, profile, config, view.calibration, view.request.free_margin_bytes
    )
    problems = []
    trained = view.spec.context_length
    if trained and config.n_ctx > trained:
        problems.append(
            f"A context of {config.n_ctx:,} tokens is beyond what this model was trained for "
            f"({trained:,}); it would lose track of anything further back. Use {trained:,} or "
            "less."
        )
    if not candidate.fits and not candidate.streams_from_disk:
        problems.append(_short_text(candidate))
    return OverrideResult(config, candidate, tuple(problems))


def _short_text(candidate: Candidate) -> str:
    worst = min(candidate.devices, key=lambda device: device.free_bytes)
    fewer_layers = "" if worst.device == CPU else "put fewer layers on the GPU, "
    fewer_slots = "answer fewer requests at once, " if candidate.config.n_parallel > 1 else ""
    return (
        f"Doesn't fit: {worst.device} needs {format_bytes(worst.used_bytes)} but only "
        f"{format_bytes(worst.capacity_bytes)} is usable "
        f"({format_bytes(-worst.free_bytes)} short). "
        f"Lower the context, {fewer_slots}{fewer_layers}pick a smaller KV cache type or keep "
        "less memory free."
    )


def override_summary(result: OverrideResult) -> str:
    candidate = result.candidate
    if candidate is None or not result.ok:
        return " ".join(result.problems)
    speed = candidate.speed
    fit = "Fits" if candidate.fits else "Larger than memory: streams from disk"
    return (
        f"{fit} — {placement_text(candidate.config, candidate.devices)}. Predicted "
        f"~{rate_text(speed.decode_tps)} decode, ~{rate_text(speed.prefill_tps)} prefill, first "
        f"token after {seconds_text(speed.ttft_s)}."
    )


# ---- what-if hardware and serving recipes ----------------------------------------------------

THIS_MACHINE = ""  # the hardware choice that plans for the probed machine
EXAMPLE_PREFIX = "example:"
# The shipped what-if specs (assets/), by the name the hardware list shows.
HARDWARE_EXAMPLES: dict[str, str] = {
    "hardware-example-2x-rtx-3090.json": "2× RTX 3090 workstation",
    "hardware-example-8x-h100.json": "8× H100 80 GB server",
    "hardware-example-2x-dgx-spark.json": "2× DGX Spark (GB10)",
}
ENGINE_NAMES: dict[str, str] = {"vllm": "vLLM", "llama-server": "llama-server"}
Engine = Literal["vllm", "llama-server"]
COMMENT_WIDTH = 88


def example_choice(filename: str) -> str:
    return EXAMPLE_PREFIX + filename


def load_hardware(choice: str) -> ClusterSpec | None:
    """The what-if hardware a choice names (an example's asset or a spec file); None for this
    machine. Raises SpecError for a spec that is not valid."""
    if choice == THIS_MACHINE:
        return None
    if choice.startswith(EXAMPLE_PREFIX):
        asset = resources.files("hearthside.assets").joinpath(choice[len(EXAMPLE_PREFIX) :])
        with resources.as_file(asset) as path:
            return load_cluster_spec(path)
    return load_cluster_spec(choice)


def needs_recipe(cluster: ClusterSpec) -> bool:
    """More than one GPU or node: a serving recipe rather than a local plan."""
    return cluster.nodes > 1 or cluster.gpus_per_node > 1


@dataclass(frozen=True)
class RecipeRequest:
    ref: str  # as PlanRequest.ref
    hardware: str  # a hardware choice (example or spec path)
    engine: Engine = "vllm"
    checkpoint: str | None = None  # a Hugging Face repo instead of the planned one (vLLM)
    n_ctx: int | None = None  # vLLM's --max-model-len, llama-server's -c; None: planned


@dataclass(frozen=True)
class CommandBlock:
    """One paste-ready piece of shell, and where to run it."""

    title: str
    text: str


@dataclass(frozen=True)
class RecipeOutcome:
    request: RecipeRequest
    model: str
    hardware: str  # the hardware in words
    serving: ServingPlan | None  # the vLLM plan
    llama: LlamaServerRecipe | None  # the llama-server recipe
    command: tuple[str, ...] | None  # None: it does not fit, so there is no command
    blocks: tuple[CommandBlock, ...]
    notes: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return self.command is not None

    @property
    def reasons(self) -> tuple[Reason, ...]:
        if self.serving is not None:
            return self.serving.reasons
        assert self.llama is not None
        local = tuple(r for r in self.llama.plan.reasons if r.setting != "recipe")
        return self.llama.reasons + local

    @property
    def advice(self) -> tuple[str, ...]:
        if self.serving is not None:
            return self.serving.advice
        assert self.llama is not None
        return self.llama.advice

    @property
    def checkpoint_is_placeholder(self) -> bool:
        return self.serving is not None and self.serving.fits and not self.serving.checkpoint_known


def compute_recipe(request: RecipeRequest, cluster: ClusterSpec) -> RecipeOutcome:
    """Resolve the model and plan how to serve it on `cluster`; blocking."""
    spec = resolve_spec(request.ref)
    if request.engine == "vllm":
        return _vllm_outcome(request, spec, cluster)
    return _llama_server_outcome(request, spec, cluster)


def _vllm_outcome(request: RecipeRequest, spec: ModelSpec, cluster: ClusterSpec) -> RecipeOutcome:
    serving = plan_vllm(spec, cluster, checkpoint=request.checkpoint, max_model_len=request.n_ctx)
    command = tuple(vllm_command(serving)) if serving.fits else None
    blocks: tuple[CommandBlock, ...] = ()
    notes: tuple[str, ...] = ()
    if command is not None:
        blocks = vllm_blocks(command, serving.cluster)
        notes = serving.cluster.notes if serving.cluster else ()
    return RecipeOutcome(
        request, serving.model, serving.hardware, serving, None, command, blocks, notes
    )


def _llama_server_outcome(
    request: RecipeRequest, spec: ModelSpec, cluster: ClusterSpec
) -> RecipeOutcome:
    recipe = llama_server_recipe(spec, cluster, n_ctx=request.n_ctx)
    usable = recipe.plan.fits or recipe.plan.streams_from_disk
    command = (
        tuple(llama_server_command(recipe.plan, model_args=recipe.model_args)) if usable else None
    )
    title = "On the server" if cluster.nodes == 1 else "On one node"
    blocks = (CommandBlock(title, shell_text(command)),) if command else ()
    return RecipeOutcome(
        request, recipe.plan.model, recipe.hardware, None, recipe, command, blocks, ()
    )


def vllm_blocks(command: Sequence[str], setup: ClusterSetup | None) -> tuple[CommandBlock, ...]:
    """One block for one node; for several: the exports, the head's commands, the workers'."""
    serve = shell_text(command)
    if setup is None:
        return (CommandBlock("On the server", serve),)
    exports = "\n".join(
        shell_comment(variable.why) + f"\nexport {variable.name}={variable.value}"
        for variable in setup.environment
    )
    head = "\n".join(shlex.join(line) for line in setup.head_commands)
    head += "\n# once ray status lists every GPU:\n" + serve
    workers = "\n".join(shlex.join(line) for line in setup.worker_commands)
    return (
        CommandBlock("On every node (fill in the placeholders)", exports),
        CommandBlock("On the head node", head),
        CommandBlock("On each worker node (HEAD_IP: the head node's address)", workers),
    )


def shell_comment(text: str) -> str:
    """`text` as shell comment lines short enough to read without scrolling."""
    return "\n".join("# " + line for line in textwrap.wrap(text, COMMENT_WIDTH))


def shell_text(argv: Sequence[str]) -> str:
    """The command shell-quoted, one flag and its value per line, ready to paste."""
    return " \\\n  ".join(shell_groups(argv))


def recipe_verdict(outcome: RecipeOutcome) -> tuple[str, str]:
    """(kind, sentence) as `verdict`: "fits" or "no"."""
    if outcome.serving is not None:
        serving = outcome.serving
        if not serving.fits:
            return "no", "Doesn't fit — see the advice"
        nodes = f" on {serving.nodes} nodes" if serving.nodes > 1 else ""
        return "fits", (
            f"Fits — tensor parallel {serving.tensor_parallel_size} × pipeline parallel "
            f"{serving.pipeline_parallel_size}{nodes}, context {serving.max_model_len:,} tokens"
        )
    assert outcome.llama is not None
    return verdict(outcome.llama.plan)


def reason_name(setting: str) -> str:
    """A recipe reason's setting, as the flag or word a person knows it by."""
    return SERVING_SETTING_NAMES.get(setting, SETTING_NAMES.get(setting, setting))


SERVING_SETTING_NAMES: dict[str, str] = {
    "checkpoint": "Checkpoint",
    "tensor_parallel_size": "Tensor parallel",
    "pipeline_parallel_size": "Pipeline parallel",
    "kv_cache_dtype": "KV cache dtype",
    "max_model_len": "Max model length",
    "gpu_memory_utilization": "GPU memory use",
    "enable_expert_parallel": "Expert parallel",
    "speculative_config": "Speculative decoding",
    "model": "Model file",
    "tensor_split": "Tensor split",
    "split_mode": "Split mode",
}
