"""What-if models: a JSON descriptor of a model that is not on disk, expanded into a ModelSpec.

A descriptor gives the published architecture numbers and a quant type (or bits per weight):

    {"schema": 1, "name": "Llama 3.1 70B", "architecture": "llama",
     "total_params": 70553706496, "layers": 80, "hidden_size": 8192, "heads": 64,
     "kv_heads": 8, "ffn_size": 28672, "context": 131072, "vocab_size": 128256,
     "quant": "Q4_K_M"}

Required: `name`, `architecture` (the GGUF name: "llama", "qwen3moe", "gemma3", ...),
`total_params`, `layers`, `hidden_size`, `heads`, `kv_heads`, `context`, and exactly one of
`quant` (a llama.cpp file type such as "Q4_K_M", "Q8_0", "MXFP4_MOE") or `bits_per_weight`.
Optional: `schema` (1), `active_params` (the published figure, kept for reference; the spec
computes its own), `head_dim` (default hidden_size / heads), `head_dim_v` (default head_dim),
`ffn_size` (dense FFN width), `experts`, `experts_used`, `shared_experts`, `expert_ffn_size`
(one routed expert's FFN width), `shared_expert_ffn_size` (default expert_ffn_size),
`leading_dense_layers` (MoE models whose first blocks are dense, which use `ffn_size`),
`sliding_window` (tokens), `sliding_window_pattern` (n: every n-th layer attends globally, as
llama.cpp counts it; or a list of one boolean per layer, true = sliding; the architecture's
own rule when left out), `vocab_size`, `tied_embeddings` (false), and for multi-head latent
attention (DeepSeek-V2/V3) `kv_lora_rank`, `q_lora_rank` and `rope_dim` (with `head_dim` the
query/key head size, nope + rope, and `head_dim_v` the value head size). Catalog entries add
`id`, `licence` and `gguf_repo`; `notes` is free text. Any other key is an error.

One width may be left out and is then solved from `total_params`: `ffn_size` for a dense
model, `expert_ffn_size` for a MoE model, or `vocab_size`. The per-layer tensor groups are
synthesised from the numbers with bytes = params x bits / 8, using the average bits per weight
of the quant type (`QUANT_PROFILES`); norms stay F32 as in real files. The numbers must add up
to within 10% of `total_params`, which catches a wrong layer count or width.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hearthside.core.models.spec import (
    SOURCE_DESCRIPTOR,
    SPEC_SCHEMA,
    LayerSpec,
    ModelSpec,
    ModelSpecError,
    TensorGroup,
    active_params_of,
    swa_layer_flags,
    swa_rule,
    unknown_fields,
)

__all__ = [
    "DESCRIPTOR_SCHEMA",
    "QUANT_PROFILES",
    "Descriptor",
    "DescriptorError",
    "QuantProfile",
    "parse_descriptor",
    "spec_from_descriptor",
]

DESCRIPTOR_SCHEMA: Final = 1
MAX_DESCRIPTOR_BYTES: Final = 1 << 20
# How far the synthesised parameter count may stray from the stated one before the
# descriptor is refused as inconsistent (the catalog's entries stay within 3%).
TOTAL_PARAMS_TOLERANCE: Final = 0.10
NORM_BITS: Final = 32.0
_FORMAT_HINT = (
    "See the descriptor format in `hearthside.core.models.descriptor` (docs/architecture.md); "
    'e.g. {"schema": 1, "name": "My 8B", "architecture": "llama", "total_params": 8.0e9, '
    '"layers": 32, "hidden_size": 4096, "heads": 32, "kv_heads": 8, "ffn_size": 14336, '
    '"context": 131072, "vocab_size": 128256, "quant": "Q4_K_M"}.'
)


class DescriptorError(ModelSpecError):
    """A model descriptor is malformed or its numbers do not add up."""


@dataclass(frozen=True)
class QuantProfile:
    """How a llama.cpp file type stores the weights of a model, on average."""

    name: str
    bits: float  # average bits per weight of the weight matrices, embeddings and output
    types: tuple[str, ...]  # the ggml types such files hold
    expert_bits: float | None = None  # routed experts, when the type treats them apart
    expert_types: tuple[str, ...] = ()


def _profile(
    name: str,
    bits: float,
    *types: str,
    expert_bits: float | None = None,
    expert_types: tuple[str, ...] = (),
) -> tuple[str, QuantProfile]:
    return name, QuantProfile(name, bits, types, expert_bits, expert_types)


# Average bits per weight over whole files (file bytes x 8 / parameters) of llama.cpp quants
# of Llama-3-class models; the block formats give the floor (Q4_0 4.5, Q8_0 8.5), the K-quant
# mixes spend more bits on attn_v, ffn_down and the output layer.
QUANT_PROFILES: Final[Mapping[str, QuantProfile]] = MappingProxyType(
    dict(
        [
            _profile("F32", 32.0, "F32"),
            _profile("F16", 16.0, "F16"),
            _profile("BF16", 16.0, "BF16"),
            _profile("Q8_0", 8.5, "Q8_0"),
            _profile("Q6_K", 6.56, "Q6_K"),
            _profile("Q5_K_M", 5.69, "Q5_K", "Q6_K"),
            _profile("Q5_K_S", 5.54, "Q5_K", "Q6_K"),
            _profile("Q5_1", 6.0, "Q5_1", "Q6_K"),
            _profile("Q5_0", 5.5, "Q5_0", "Q6_K"),
            _profile("Q4_K_M", 4.85, "Q4_K", "Q6_K"),
            _profile("Q4_K_S", 4.58, "Q4_K", "Q6_K"),
            _profile("Q4_1", 5.0, "Q4_1", "Q6_K"),
            _profile("Q4_0", 4.5, "Q4_0", "Q6_K"),
            _profile("IQ4_NL", 4.5, "IQ4_NL", "Q6_K"),
            _profile("IQ4_XS", 4.3, "IQ4_XS", "Q6_K"),
            _profile("Q3_K_L", 4.27, "Q3_K", "Q5_K", "Q6_K"),
            _profile("Q3_K_M", 3.91, "Q3_K", "Q4_K", "Q6_K"),
            _profile("Q3_K_S", 3.5, "Q3_K", "Q6_K"),
            _profile("IQ3_M", 3.66, "IQ3_S", "Q4_K", "Q6_K"),
            _profile("IQ3_S", 3.44, "IQ3_S", "Q6_K"),
            _profile("IQ3_XS", 3.3, "IQ3_XXS", "IQ3_S", "Q6_K"),
            _profile("IQ3_XXS", 3.06, "IQ3_XXS", "Q6_K"),
            _profile("Q2_K", 3.0, "Q2_K", "Q3_K", "Q6_K"),
            _profile("Q2_K_S", 2.8, "Q2_K", "Q4_K", "Q6_K"),
            _profile("IQ2_M", 2.7, "IQ2_S", "Q4_K", "Q6_K"),
            _profile("IQ2_S", 2.5, "IQ2_XS", "Q4_K", "Q6_K"),
            _profile("IQ2_XS", 2.31, "IQ2_XS", "Q4_K", "Q6_K"),
            _profile("IQ2_XXS", 2.06, "IQ2_XXS", "Q4_K", "Q6_K"),
            _profile("IQ1_M", 1.75, "IQ1_M", "Q4_K", "Q6_K"),
            _profile("IQ1_S", 1.56, "IQ1_S", "Q4_K", "Q6_K"),
            _profile("TQ2_0", 2.06, "TQ2_0", "Q4_K"),
            _profile("TQ1_0", 1.69, "TQ1_0", "Q4_K"),
            # gpt-oss as published: MXFP4 experts (4.25 bits), everything else 8-bit.
            _profile("MXFP4_MOE", 8.5, "Q8_0", expert_bits=4.25, expert_types=("MXFP4",)),
        ]
    )
)


# --- the schema -------------------------------------------------------------------------------

PositiveInt = Annotated[int, Field(gt=0)]
Count = Annotated[int, Field(ge=0)]
# Parameter counts are often written 7.6e9; whole numbers either way.
ParamCount = Annotated[float, Field(gt=0)]


class Descriptor(BaseModel):
    """The descriptor JSON, validated strictly (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)

    schema_version: Literal[1] = Field(default=1, alias="schema")
    name: Annotated[str, Field(min_length=1, max_length=200)]
    architecture: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9_.-]+$")]
    total_params: ParamCount
    active_params: ParamCount | None = None
    layers: PositiveInt
    hidden_size: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt
    head_dim: PositiveInt | None = None
    head_dim_v: PositiveInt | None = None
    ffn_size: PositiveInt | None = None
    experts: Count = 0
    experts_used: Count = 0
    shared_experts: Count = 0
    expert_ffn_size: PositiveInt | None = None
    shared_expert_ffn_size: PositiveInt | None = None
    leading_dense_layers: Count = 0
    sliding_window: PositiveInt | None = None
    sliding_window_pattern: Count | list[bool] | None = None
    context: PositiveInt
    vocab_size: PositiveInt | None = None
    quant: str | None = None
    bits_per_weight: Annotated[float, Field(gt=0, le=32)] | None = None
    tied_embeddings: bool = False
    kv_lora_rank: PositiveInt | None = None
    q_lora_rank: PositiveInt | None = None
    rope_dim: PositiveInt | None = None
    id: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")] | None = None
    licence: str | None = None
    gguf_repo: Annotated[str, Field(pattern=r"^[\w.-]+/[\w.-]+$")] | None = None
    notes: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Descriptor:
        for check in _CHECKS:
            problem = check(self)
            if problem is not None:
                raise ValueError(problem)
        return self

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def quant_profile(self) -> QuantProfile:
        if self.quant is not None:
            return QUANT_PROFILES[self.quant]
        assert self.bits_per_weight is not None  # the checks require one of the two
        return QuantProfile("custom", self.bits_per_weight, ())


def _check_quant(d: Descriptor) -> str | None:
    if (d.quant is None) == (d.bits_per_weight is None):
        return "give exactly one of quant and bits_per_weight"
    if d.quant is not None and d.quant not in QUANT_PROFILES:
        return f"quant: '{d.quant}' is not a known type; use one of {', '.join(QUANT_PROFILES)}"
    return None


def _check_experts(d: Descriptor) -> str | None:
    if not d.is_moe:
        moe_only = ("experts_used", "shared_experts", "expert_ffn_size", "leading_dense_layers")
        given = [name for name in moe_only if getattr(d, name)]
        return f"{given[0]}: needs experts > 0" if given else None
    if not 0 < d.experts_used <= d.experts:
        return f"experts_used: must be from 1 to experts ({d.experts}), not {d.experts_used}"
    if d.leading_dense_layers >= d.layers:
        return "leading_dense_layers: must be fewer than layers"
    if d.leading_dense_layers and d.ffn_size is None:
        return "ffn_size: needed for the leading dense layers"
    return None


def _check_attention(d: Descriptor) -> str | None:
    if d.is_mla:
        missing = [name for name in ("rope_dim", "head_dim") if getattr(d, name) is None]
        return f"{missing[0]}: needed with kv_lora_rank" if missing else None
    if d.q_lora_rank is not None or d.rope_dim is not None:
        return "kv_lora_rank: needed with q_lora_rank and rope_dim (latent attention)"
    if d.heads % d.kv_heads:
        return f"kv_heads: {d.kv_heads} does not divide heads ({d.heads})"
    return None


def _check_window(d: Descriptor) -> str | None:
    pattern = d.sliding_window_pattern
    if d.sliding_window is None:
        return "sliding_window_pattern: needs sliding_window" if pattern is not None else None
    if isinstance(pattern, list) and len(pattern) != d.layers:
        return f"sliding_window_pattern: has {len(pattern)} entries for {d.layers} layers"
    if pattern is None and swa_rule(d.architecture) is None:
        return (
            f"sliding_window_pattern: needed, since Hearthside does not know which layers of "
            f"'{d.architecture}' use the window"
        )
    return None


def _check_missing_widths(d: Descriptor) -> str | None:
    missing = _free_widths(d)
    if len(missing) > 1:
        return f"{missing[0]}: needed (only one of {', '.join(missing)} can be worked out)"
    return None


_CHECKS: Final[tuple[Callable[[Descriptor], str | None], ...]] = (
    _check_quant,
    _check_experts,
    _check_attention,
    _check_window,
    _check_missing_widths,
)


def _free_widths(d: Descriptor) -> list[str]:
    """The widths left out, which total_params must then determine."""
    width = "expert_ffn_size" if d.is_moe else "ffn_size"
    return [name for name in (width, "vocab_size") if getattr(d, name) is None]


# --- reading ---------------------------------------------------------------------------------


def parse_descriptor(data: Mapping[str, Any]) -> Descriptor:
    """Validate descriptor JSON; DescriptorError names the first bad field."""
    if not isinstance(data, Mapping):
        raise DescriptorError("A model descriptor must be a JSON object.", hint=_FORMAT_HINT)
    try:
        return Descriptor.model_validate(dict(data))
    except ValidationError as exc:
        raise DescriptorError(
            f"The model descriptor{_named(data)} is not valid: {_first_problem(exc)}.",
            hint=_FORMAT_HINT,
        ) from None


def _named(data: Mapping[str, Any]) -> str:
    name = data.get("id") or data.get("name")
    return f" '{name}'" if isinstance(name, str) and len(name) <= 80 else ""


def _first_problem(exc: ValidationError) -> str:
    error = exc.errors(include_url=False)[0]
    where = ".".join(str(part) for part in error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def read_descriptor_file(path: Path) -> Mapping[str, Any]:
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_DESCRIPTOR_BYTES + 1)
    except OSError as exc:
        raise DescriptorError(
            f"The descriptor file could not be read ({exc.strerror or type(exc).__name__}).",
            hint="Check the path.",
        ) from exc
    if len(raw) > MAX_DESCRIPTOR_BYTES:
        raise DescriptorError(
            "The descriptor file is larger than 1 MiB; descriptors are a few hundred bytes.",
            hint="Choose the descriptor .json file.",
        )
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DescriptorError(
            f"The descriptor is not valid JSON ({exc}).", hint=_FORMAT_HINT
        ) from None
    if not isinstance(data, dict):
        raise DescriptorError("A model descriptor must be a JSON object.", hint=_FORMAT_HINT)
    return data


# --- building the spec -----------------------------------------------------------------------


def spec_from_descriptor(
    data: Mapping[str, Any] | str | os.PathLike[str] | Descriptor,
    *,
    source: str = SOURCE_DESCRIPTOR,
) -> ModelSpec:
    """A ModelSpec synthesised from a descriptor (a mapping, a .json path, or parsed)."""
    ref: str | None = None
    if isinstance(data, str | os.PathLike):
        ref = str(data)
        data = read_descriptor_file(Path(data))
    descriptor = data if isinstance(data, Descriptor) else parse_descriptor(data)
    solved = _solve_free_width(descriptor)
    spec = _build_spec(solved, source)
    _require_close_total(solved, spec)
    return replace(spec, ref=ref or solved.id)


def _solve_free_width(d: Descriptor) -> Descriptor:
    """Fill the one width left out so the parameters add up to total_params."""
    missing = _free_widths(d)
    if not missing:
        return d
    name = missing[0]
    at_zero = _total_params(d.model_copy(update={name: 0}))
    slope = _total_params(d.model_copy(update={name: 1})) - at_zero
    width = round((d.total_params - at_zero) / slope)
    if width <= 0:
        raise DescriptorError(
            f"The model descriptor{_named(d.model_dump())} leaves out {name}, and the other "
            f"numbers already add up to more than total_params.",
            hint=f"Give {name}, or check layers, hidden_size and total_params.",
        )
    return d.model_copy(update={name: width})


def _total_params(d: Descriptor) -> int:
    spec = _build_spec(d, SOURCE_DESCRIPTOR)
    assert spec.total_params is not None
    return spec.total_params


def _require_close_total(d: Descriptor, spec: ModelSpec) -> None:
    built = spec.total_params or 0
    off = abs(built - d.total_params) / d.total_params
    if off > TOTAL_PARAMS_TOLERANCE:
        raise DescriptorError(
            f"The model descriptor{_named(d.model_dump())} does not add up: its layers and "
            f"widths make {built:,} parameters but total_params says {round(d.total_params):,} "
            f"({off:.0%} apart).",
            hint="Check layers, hidden_size, heads, kv_heads, head_dim, ffn_size, the expert "
            "numbers and vocab_size against the model's config.json.",
        )


def _build_spec(d: Descriptor, source: str) -> ModelSpec:
    profile = d.quant_profile
    shapes = _Shapes.of(d)
    slides = _layer_slides(d)
    layers = tuple(_layer(d, shapes, profile, index, slides[index]) for index in range(d.layers))
    vocab = d.vocab_size or 0
    embeddings = _weights(vocab * d.hidden_size, profile)
    output = TensorGroup() if d.tied_embeddings else _weights(vocab * d.hidden_size, profile)
    output_norm = _norms(d.hidden_size)
    everything = [embeddings, output, output_norm, *(layer.total for layer in layers)]
    total = TensorGroup.sum(everything)
    spec = ModelSpec(
        name=d.name,
        architecture=d.architecture,
        source=source,
        total_params=total.params,
        active_params=None,
        n_layers=d.layers,
        n_embd=d.hidden_size,
        n_ff=d.ffn_size,
        n_head=d.heads,
        n_head_kv=shapes.cache_heads,
        head_dim_k=shapes.cache_head_dim_k,
        head_dim_v=shapes.cache_head_dim_v,
        n_expert=d.experts,
        n_expert_used=d.experts_used,
        n_expert_shared=d.shared_experts,
        sliding_window=d.sliding_window,
        context_length=d.context,
        vocab_size=d.vocab_size,
        kv_lora_rank=d.kv_lora_rank,
        file_type=d.quant,
        bits_per_weight=total.bytes * 8 / total.params if total.params else None,
        size_bytes=total.bytes,
        embeddings=embeddings,
        output=output,
        output_norm=output_norm,
        tied_embeddings=d.tied_embeddings,
        layers=layers,
        chat_template=None,
        unknown=(),
        schema=SPEC_SCHEMA,
        n_ff_expert=d.expert_ffn_size,
        n_layer_dense_lead=d.leading_dense_layers,
        mla=d.is_mla,
        licence=d.licence,
        gguf_repo=d.gguf_repo,
    )
    spec = replace(spec, active_params=active_params_of(spec))
    return replace(spec, unknown=unknown_fields(spec))


def _layer_slides(d: Descriptor) -> tuple[bool, ...]:
    pattern = d.sliding_window_pattern
    if d.sliding_window is None:
        return (False,) * d.layers
    if isinstance(pattern, list):
        return tuple(pattern)
    rule = swa_rule(d.architecture)
    dense_first = rule.dense_first if rule is not None else False
    if pattern is None:
        assert rule is not None  # the checks require a pattern when there is no rule
        pattern = rule.pattern
    return swa_layer_flags(d.layers, pattern, dense_first=dense_first)


# Small extra tensors some architectures carry (biases, extra norms); from llama.cpp's
# load_arch_tensors for each architecture.
_EXTRAS: Final[Mapping[str, frozenset[str]]] = MappingProxyType(
    {
        "qwen2": frozenset({"qkv_bias"}),
        "qwen2moe": frozenset({"qkv_bias", "shared_expert_gate"}),
        "qwen3": frozenset({"qk_norm"}),
        "qwen3moe": frozenset({"qk_norm"}),
        "gemma2": frozenset({"sandwich_norm"}),
        "gemma3": frozenset({"qk_norm", "sandwich_norm"}),
        "gpt-oss": frozenset({"qkv_bias", "output_bias", "sinks", "expert_bias", "router_bias"}),
        "deepseek2": frozenset({"router_bias"}),
    }
)


@dataclass(frozen=True)
class _Shapes:
    """The widths a layer's tensors are built from."""

    head_dim: int
    head_dim_v: int
    cache_heads: int  # how llama.cpp sees the KV heads (1 for MLA's shared latent)
    cache_head_dim_k: int
    cache_head_dim_v: int
    extras: frozenset[str]

    @classmethod
    def of(cls, d: Descriptor) -> _Shapes:
        head_dim = d.head_dim or d.hidden_size // d.heads
        head_dim_v = d.head_dim_v or head_dim
        extras = _EXTRAS.get(d.architecture, frozenset())
        if d.kv_lora_rank is not None and d.rope_dim is not None:
            # llama.cpp's MLA cache: one "head" of latent + rope key; V is read from K.
            latent_k = d.kv_lora_rank + d.rope_dim
            return cls(head_dim, head_dim_v, 1, latent_k, d.kv_lora_rank, extras)
        return cls(head_dim, head_dim_v, d.kv_heads, head_dim, head_dim_v, extras)


def _layer(
    d: Descriptor, shapes: _Shapes, profile: QuantProfile, index: int, slides: bool
) -> LayerSpec:
    dense = not d.is_moe or index < d.leading_dense_layers
    expert_bits = profile.expert_bits or profile.bits
    expert_types = profile.expert_types or profile.types
    return LayerSpec(
        index=index,
        attention=_weights(_attention_params(d, shapes), profile),
        ffn=_weights(3 * d.hidden_size * (d.ffn_size or 0), profile) if dense else TensorGroup(),
        experts=TensorGroup() if dense else _experts(d, shapes, expert_bits, expert_types),
        shared_experts=TensorGroup() if dense else _weights(_shared_params(d, shapes), profile),
        norms=_norms(_norm_params(d, shapes)),
        other=TensorGroup() if dense else _norms(_router_params(d, shapes)),
        sliding_window=slides,
        n_head_kv=shapes.cache_heads,
    )


def _attention_params(d: Descriptor, shapes: _Shapes) -> int:
    hidden, heads = d.hidden_size, d.heads
    if d.kv_lora_rank is not None and d.rope_dim is not None:
        query_width = heads * shapes.head_dim
        query = (
            hidden * d.q_lora_rank + d.q_lora_rank * query_width
            if d.q_lora_rank is not None
            else hidden * query_width
        )
        latent = hidden * (d.kv_lora_rank + d.rope_dim)
        nope = shapes.head_dim - d.rope_dim
        up = d.kv_lora_rank * heads * (nope + shapes.head_dim_v)
        return query + latent + up + heads * shapes.head_dim_v * hidden
    q_width = heads * shapes.head_dim
    kv_width = d.kv_heads * (shapes.head_dim + shapes.head_dim_v)
    params = hidden * (q_width + kv_width) + heads * shapes.head_dim_v * hidden
    if "qkv_bias" in shapes.extras:
        params += q_width + kv_width
    if "output_bias" in shapes.extras:
        params += hidden
    if "sinks" in shapes.extras:
        params += heads
    return params


def _norm_params(d: Descriptor, shapes: _Shapes) -> int:
    params = 2 * d.hidden_size
    if "sandwich_norm" in shapes.extras:
        params += 2 * d.hidden_size
    if "qk_norm" in shapes.extras:
        params += 2 * shapes.head_dim
    if d.kv_lora_rank is not None:
        params += d.kv_lora_rank + (d.q_lora_rank or 0)
    return params


def _experts(d: Descriptor, shapes: _Shapes, bits: float, types: tuple[str, ...]) -> TensorGroup:
    width = d.expert_ffn_size or 0
    params = d.experts * 3 * d.hidden_size * width
    if "expert_bias" in shapes.extras:
        params += d.experts * (2 * width + d.hidden_size)
    return TensorGroup(params, round(params * bits / 8), types)


def _shared_params(d: Descriptor, shapes: _Shapes) -> int:
    width = (d.shared_expert_ffn_size or d.expert_ffn_size or 0) * d.shared_experts
    params = 3 * d.hidden_size * width
    if d.shared_experts and "shared_expert_gate" in shapes.extras:
        params += d.hidden_size
    return params


def _router_params(d: Descriptor, shapes: _Shapes) -> int:
    params = d.hidden_size * d.experts
    if "router_bias" in shapes.extras:
        params += d.experts
    return params


def _weights(params: int, profile: QuantProfile) -> TensorGroup:
    if params == 0:
        return TensorGroup()
    return TensorGroup(params, round(params * profile.bits / 8), profile.types)


def _norms(params: int) -> TensorGroup:
    """Norms (and the small router) stay F32 in real files."""
    if params == 0:
        return TensorGroup()
    return TensorGroup(params, round(params * NORM_BITS / 8), ("F32",))
