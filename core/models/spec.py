"""`ModelSpec`: what the planner needs to know about a model, from a GGUF file or a descriptor.

A spec holds the architecture numbers (layers, heads, KV heads, head dims, experts, sliding
window, context, vocabulary) and the parameters and bytes of every tensor group, per layer:
attention, dense FFN, routed experts, shared experts, norms and the rest (the router, ...),
plus the embeddings, the output layer and its norm. Units: `params` are weights, `bytes` are
bytes; anything that could not be determined is None and its field name is in `unknown`.

From a GGUF file (`spec_from_gguf`) the numbers come from the metadata and the tensor table
that `validate_gguf` has already checked, so no native code and no `gguf.GGUFReader` runs.
`total_params` and `size_bytes` are the sums over every tensor in the file, which is how
llama.cpp counts `llama_model_n_params` and `llama_model_size`.

The KV-cache arithmetic follows llama.cpp (src/llama-kv-cache.cpp, llama-kv-cache-iswa.cpp,
llama-context.cpp): the context is padded to a multiple of 256 cells; each layer stores one K
row of `n_head_kv * head_dim_k` values and one V row of `n_head_kv * head_dim_v` values per
cell, in the cache type's ggml blocks (f16: 2 bytes a value, q8_0: 34 bytes per 32 values,
q4_0: 18 per 32); a sliding-window layer gets min(context, window + n_ubatch) cells padded to
256, unless `swa_full`; an MLA model (DeepSeek-V2/V3) caches the compressed latent as K only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Final

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from hearthside.core.errors import ModelFileError
from hearthside.core.models.gguf_validator import GGUFArraySummary, GGUFInfo, validate_gguf
from hearthside.core.serialize import from_jsonable, to_jsonable

__all__ = [
    "KNOWN_ARCHITECTURES",
    "SOURCE_CATALOG",
    "SOURCE_DESCRIPTOR",
    "SOURCE_GGUF",
    "SPEC_SCHEMA",
    "LayerSpec",
    "ModelSpec",
    "ModelSpecError",
    "SwaRule",
    "TensorGroup",
    "active_params_of",
    "human_params",
    "kv_row_bytes",
    "layer_group_of",
    "padded_context",
    "spec_from_gguf",
    "spec_from_gguf_info",
    "swa_layer_flags",
    "swa_rule",
    "unknown_fields",
]

SPEC_SCHEMA: Final = 1
SOURCE_GGUF: Final = "gguf"
SOURCE_CATALOG: Final = "catalog"
SOURCE_DESCRIPTOR: Final = "descriptor"

# llama.cpp rounds the context up to this many cells (llama-context.cpp, GGML_PAD(n_ctx, 256)),
# and pads the sliding-window cache the same way (llama-kv-cache-iswa.cpp).
KV_CELL_PADDING: Final = 256
DEFAULT_UBATCH: Final = 512


class ModelSpecError(ModelFileError):
    """A model spec cannot be built or used as asked (bad JSON, unknown cache type...)."""


# --- data ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorGroup:
    """Some tensors taken together: how many weights, how many bytes, in which ggml types."""

    params: int = 0  # number of weights
    bytes: int = 0  # bytes on disk / in memory
    quant_types: tuple[str, ...] = ()  # ggml type names, e.g. ("Q4_K", "Q6_K"), sorted unique

    def __add__(self, other: TensorGroup) -> TensorGroup:
        return TensorGroup(
            params=self.params + other.params,
            bytes=self.bytes + other.bytes,
            quant_types=tuple(sorted(set(self.quant_types) | set(other.quant_types))),
        )

    @staticmethod
    def sum(groups: Iterable[TensorGroup]) -> TensorGroup:
        total = TensorGroup()
        for group in groups:
            total = total + group
        return total


@dataclass(frozen=True)
class LayerSpec:
    """One transformer block (`blk.N.*` in GGUF)."""

    index: int
    attention: TensorGroup  # attn_q/k/v/output (+ MLA q_a/q_b/kv_a/kv_b, fused qkv, sinks, biases)
    ffn: TensorGroup  # dense FFN: ffn_gate/up/down (non-expert)
    experts: TensorGroup  # routed experts, all of them (ffn_*_exps)
    shared_experts: TensorGroup  # ffn_*_shexp
    norms: TensorGroup  # *_norm tensors
    other: TensorGroup  # router (ffn_gate_inp), anything unrecognised
    sliding_window: bool  # this layer's attention uses the sliding window
    n_head_kv: int | None  # per layer (some models vary)

    @property
    def groups(self) -> tuple[TensorGroup, ...]:
        return (
            self.attention,
            self.ffn,
            self.experts,
            self.shared_experts,
            self.norms,
            self.other,
        )

    @property
    def total(self) -> TensorGroup:
        return TensorGroup.sum(self.groups)


@dataclass(frozen=True)
class ModelSpec:
    """Everything the planner reasons about for one model. See the module docstring."""

    name: str
    architecture: str  # GGUF general.architecture, e.g. "llama", "qwen3moe", "gemma3"
    source: str  # "gguf" | "catalog" | "descriptor"
    total_params: int | None
    active_params: int | None  # per token: total minus the unused experts' share
    n_layers: int | None
    n_embd: int | None
    n_ff: int | None
    n_head: int | None
    n_head_kv: int | None  # the largest over layers when they differ
    head_dim_k: int | None
    head_dim_v: int | None
    n_expert: int  # 0 for dense
    n_expert_used: int
    n_expert_shared: int
    sliding_window: int | None  # tokens, None when the model has none
    context_length: int | None  # trained context
    vocab_size: int | None
    kv_lora_rank: int | None  # MLA (deepseek2); None otherwise
    file_type: str | None  # e.g. "Q4_K_M" (from general.file_type) or the descriptor's quant
    bits_per_weight: float | None
    size_bytes: int | None  # all tensors
    embeddings: TensorGroup  # token_embd (+ per-layer embeddings if any)
    output: TensorGroup  # output.weight; zero bytes when tied to the embeddings
    output_norm: TensorGroup
    tied_embeddings: bool
    layers: tuple[LayerSpec, ...]
    chat_template: str | None
    unknown: tuple[str, ...]  # names of the fields above that could not be determined
    schema: int = SPEC_SCHEMA
    n_ff_expert: int | None = None  # FFN width of one routed expert
    n_layer_dense_lead: int = 0  # MoE models whose first blocks are dense (DeepSeek)
    n_layer_nextn: int = 0  # trailing multi-token-prediction blocks (no KV in the main context)
    mla: bool = False  # the KV cache holds the compressed latent only: K rows, no V
    other_tensors: TensorGroup = field(default_factory=TensorGroup)  # top-level, not above
    licence: str | None = None
    gguf_repo: str | None = None  # a popular GGUF conversion on the hub (catalog entries)
    ref: str | None = None  # what it was made from: a path, a catalog id, a model id

    # -- JSON --

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = to_jsonable(self)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelSpec:
        schema = data.get("schema", SPEC_SCHEMA)
        if not isinstance(schema, int) or schema > SPEC_SCHEMA:
            raise ModelSpecError(
                f"This model spec has schema {schema!r}; this Hearthside reads up to "
                f"{SPEC_SCHEMA}.",
                hint="Update Hearthside, or make the spec again with this version.",
            )
        try:
            return from_jsonable(cls, dict(data))
        except (TypeError, KeyError, AttributeError) as exc:
            raise ModelSpecError(
                f"This is not a complete model spec ({exc}).",
                hint="Make it with `hearthside models show REF --json`.",
            ) from exc

    # -- sums the planner uses --

    @property
    def layer_bytes(self) -> int:
        """Bytes of every tensor inside the blocks (all groups, all layers)."""
        return sum(layer.total.bytes for layer in self.layers)

    @property
    def layer_params(self) -> int:
        return sum(layer.total.params for layer in self.layers)

    @property
    def routed_expert_params(self) -> int:
        return sum(layer.experts.params for layer in self.layers)

    @property
    def routed_expert_bytes(self) -> int:
        return sum(layer.experts.bytes for layer in self.layers)

    @property
    def swa_layers(self) -> tuple[int, ...]:
        return tuple(layer.index for layer in self.layers if layer.sliding_window)

    # -- the KV cache --

    def kv_cache_bytes(
        self,
        n_ctx: int,
        type_k: str = "f16",
        type_v: str = "f16",
        swa_full: bool = False,
        *,
        n_ubatch: int = DEFAULT_UBATCH,
        flash_attn: bool = False,
    ) -> int:
        """Bytes llama.cpp allocates for the KV cache of one sequence with a context of `n_ctx`.

        `n_ubatch` is the physical batch the context really uses (llama-cpp-python makes it
        min(n_ctx, n_batch, n_ubatch)); it sizes the sliding-window cache. `flash_attn` matters
        only when the V width varies between layers: without it V rows are padded to the widest.
        """
        layers = self.kv_bytes_by_layer(
            n_ctx, type_k, type_v, swa_full, n_ubatch=n_ubatch, flash_attn=flash_attn
        )
        return sum(layers.values())

    def kv_bytes_by_layer(
        self,
        n_ctx: int,
        type_k: str = "f16",
        type_v: str = "f16",
        swa_full: bool = False,
        *,
        n_ubatch: int = DEFAULT_UBATCH,
        flash_attn: bool = False,
    ) -> dict[int, int]:
        """`kv_cache_bytes` per layer index: each layer's cache lives on that layer's device."""
        full_cells, swa_cells = self.kv_cells(n_ctx, swa_full=swa_full, n_ubatch=n_ubatch)
        by_layer = {}
        for layer, (k_bytes, v_bytes) in self._kv_row_bytes(type_k, type_v, flash_attn):
            cells = swa_cells if layer.sliding_window else full_cells
            by_layer[layer.index] = cells * (k_bytes + v_bytes)
        return by_layer

    def kv_cells(
        self, n_ctx: int, *, swa_full: bool = False, n_ubatch: int = DEFAULT_UBATCH
    ) -> tuple[int, int]:
        """(cells of a full-context layer, cells of a sliding-window layer) for `n_ctx`."""
        if n_ctx <= 0:
            raise ValueError(f"n_ctx must be positive, not {n_ctx}")
        full_cells = padded_context(n_ctx)
        if swa_full or self.sliding_window is None:
            return full_cells, full_cells
        window_cells = padded_context(min(full_cells, self.sliding_window + n_ubatch))
        return full_cells, window_cells

    def kv_bytes_per_token(
        self, type_k: str = "f16", type_v: str = "f16", n_ctx: int | None = None
    ) -> int:
        """K+V bytes one token of context costs.

        Without `n_ctx`: over the layers that keep the full context (sliding-window layers hold
        a fixed window, not one entry per token of context). With `n_ctx`: the average over
        that context, where each sliding-window layer holds min(window, n_ctx) tokens. For the
        exact allocation (llama.cpp's padding, the window's extra batch, `swa_full`) use
        `kv_cache_bytes`.
        """
        full_bytes = 0
        window_bytes = 0
        for layer, (k_bytes, v_bytes) in self._kv_row_bytes(type_k, type_v, flash_attn=True):
            if layer.sliding_window:
                window_bytes += k_bytes + v_bytes
            else:
                full_bytes += k_bytes + v_bytes
        if n_ctx is None or self.sliding_window is None:
            return full_bytes + (0 if n_ctx is None else window_bytes)
        held = min(self.sliding_window, n_ctx)
        return full_bytes + round(window_bytes * held / n_ctx)

    def _kv_layers(self) -> tuple[LayerSpec, ...]:
        if self.n_layers is None:
            return self.layers
        trunk = self.n_layers - self.n_layer_nextn
        return tuple(layer for layer in self.layers if layer.index < trunk)

    def _kv_row_bytes(
        self, type_k: str, type_v: str, flash_attn: bool
    ) -> list[tuple[LayerSpec, tuple[int, int]]]:
        """Per layer: bytes of one cell's K row and V row."""
        if self.head_dim_k is None or self.head_dim_v is None:
            raise ModelSpecError(
                f"The head sizes of {self.name} are unknown, so its KV cache cannot be sized.",
                hint="Describe the model with a descriptor that gives head_dim.",
            )
        layers = self._kv_layers()
        widths = [(self._kv_heads(layer), layer) for layer in layers]
        widest_v = max((heads * self.head_dim_v for heads, _ in widths), default=0)
        rows: list[tuple[LayerSpec, tuple[int, int]]] = []
        for heads, layer in widths:
            k_width = heads * self.head_dim_k
            v_width = 0 if self.mla else (heads * self.head_dim_v if flash_attn else widest_v)
            rows.append((layer, (kv_row_bytes(type_k, k_width), kv_row_bytes(type_v, v_width))))
        return rows

    def _kv_heads(self, layer: LayerSpec) -> int:
        heads = layer.n_head_kv if layer.n_head_kv is not None else self.n_head_kv
        if heads is None:
            raise ModelSpecError(
                f"The number of KV heads of {self.name} is unknown, so its KV cache cannot be "
                "sized.",
                hint="Describe the model with a descriptor that gives kv_heads.",
            )
        return heads


# --- ggml sizes ------------------------------------------------------------------------------


def padded_context(n_ctx: int) -> int:
    """The cells llama.cpp really allocates for a requested context (a multiple of 256)."""
    return -(-n_ctx // KV_CELL_PADDING) * KV_CELL_PADDING


def _ggml_type(type_name: str) -> GGMLQuantizationType:
    try:
        return GGMLQuantizationType[type_name.upper()]
    except KeyError:
        known = ", ".join(sorted(t.name.lower() for t in GGML_QUANT_SIZES))
        raise ModelSpecError(
            f"'{type_name}' is not a ggml tensor type.", hint=f"Use one of: {known}."
        ) from None


def kv_row_bytes(type_name: str, n_values: int) -> int:
    """Bytes of `n_values` values stored as ggml type `type_name` (whole blocks only)."""
    block_size, block_bytes = GGML_QUANT_SIZES[_ggml_type(type_name)]
    if n_values % block_size:
        raise ModelSpecError(
            f"A {type_name} cache stores blocks of {block_size} values, but a row here has "
            f"{n_values}.",
            hint="Use an f16 KV cache for this model.",
        )
    return n_values // block_size * block_bytes


# --- sliding-window layers -------------------------------------------------------------------


@dataclass(frozen=True)
class SwaRule:
    """Which layers of an architecture use the sliding window (llama.cpp's set_swa_pattern).

    With `pattern` n, layer i is global when i % n == n - 1 (or i % n == 0 if `dense_first`);
    pattern 0 makes every layer sliding. `default_window` is the window llama.cpp assumes when
    the GGUF has no `<arch>.attention.sliding_window` key; None means no window without it.
    """

    pattern: int
    dense_first: bool = False
    default_window: int | None = None


# From each architecture's load_arch_hparams in llama.cpp's src/models/*.cpp (load_swa_pattern).
_SWA_RULES: Final[Mapping[str, SwaRule]] = MappingProxyType(
    {
        "gemma2": SwaRule(pattern=2, default_window=4096),
        "gemma3": SwaRule(pattern=6),
        "gemma3n": SwaRule(pattern=5),
        "gemma-embedding": SwaRule(pattern=6),
        "gpt-oss": SwaRule(pattern=2),
        "cohere2": SwaRule(pattern=4),
        "olmo2": SwaRule(pattern=4),
        "exaone4": SwaRule(pattern=4),
        "llama4": SwaRule(pattern=4, default_window=8192),  # chunked attention, same cache rule
        "smallthinker": SwaRule(pattern=4, dense_first=True),
        "afmoe": SwaRule(pattern=4),
    }
)

# Architectures whose metadata conventions this module was checked against, so a missing
# sliding-window key there means "no window", not "unknown".
KNOWN_ARCHITECTURES: Final = frozenset(
    {
        "llama",
        "mistral3",
        "qwen2",
        "qwen3",
        "qwen2moe",
        "qwen3moe",
        "olmoe",
        "deepseek2",
        "phi3",
        "gemma",
        "granite",
        "starcoder2",
        *_SWA_RULES,
    }
)


def swa_rule(architecture: str) -> SwaRule | None:
    return _SWA_RULES.get(architecture)


def swa_layer_flags(n_layers: int, pattern: int, *, dense_first: bool = False) -> tuple[bool, ...]:
    """Which layers slide, for llama.cpp's `sliding_window_pattern` convention."""
    if pattern == 0:
        return (True,) * n_layers
    if dense_first:
        return tuple(index % pattern != 0 for index in range(n_layers))
    return tuple(index % pattern < pattern - 1 for index in range(n_layers))


# --- reading a GGUF ----------------------------------------------------------------------------

_BLOCK_TENSOR = re.compile(r"blk\.(\d+)\.(.+)")
_EMBEDDING_TENSORS = ("token_embd", "per_layer_token_embd", "token_types", "position_embd")

# Fields whose None means "could not be determined" (others may legitimately be None).
_MUST_KNOW = (
    "total_params",
    "active_params",
    "n_layers",
    "n_embd",
    "n_head",
    "n_head_kv",
    "head_dim_k",
    "head_dim_v",
    "context_length",
    "vocab_size",
    "file_type",
    "bits_per_weight",
    "size_bytes",
)


def layer_group_of(tensor_base: str) -> str:
    """The LayerSpec group of a block tensor, from its name after `blk.N.` without `.weight`."""
    if "norm" in tensor_base:
        return "norms"
    if "_exps" in tensor_base:
        return "experts"
    if "_shexp" in tensor_base:
        return "shared_experts"
    if tensor_base.startswith(("ffn_gate_inp", "exp_probs")):
        return "other"  # the router and its bias
    if tensor_base.startswith("attn_"):
        return "attention"
    if tensor_base.startswith("ffn_"):
        return "ffn"
    return "other"


def spec_from_gguf(path: str | os.PathLike[str]) -> ModelSpec:
    """The spec of a GGUF file, after the bounded validator has checked it."""
    info = validate_gguf(path)
    return spec_from_gguf_info(info)


def spec_from_gguf_info(info: GGUFInfo) -> ModelSpec:
    """The spec of an already validated GGUF file."""
    architecture = info.architecture or "unknown"
    meta = _Metadata(info.metadata, architecture)
    tensors = _TensorSums.of(info)
    n_layers = meta.integer("block_count") or tensors.layer_count()
    n_embd = meta.integer("embedding_length") or tensors.dim("token_embd.weight", 0)
    n_head = meta.largest("attention.head_count")
    window, slides, window_known = _sliding_window(meta, architecture, n_layers or 0)
    n_expert, expert_count_known = _expert_count(meta, info, tensors)
    size_bytes = sum(tensor.n_bytes for tensor in info.tensors)
    spec = ModelSpec(
        name=info.model_name or info.path.stem,
        architecture=architecture,
        source=SOURCE_GGUF,
        total_params=info.parameter_count,
        active_params=None,
        n_layers=n_layers,
        n_embd=n_embd,
        n_ff=meta.largest("feed_forward_length"),
        n_head=n_head,
        n_head_kv=meta.largest("attention.head_count_kv"),
        head_dim_k=meta.integer("attention.key_length") or _divide(n_embd, n_head),
        head_dim_v=meta.integer("attention.value_length") or _divide(n_embd, n_head),
        n_expert=n_expert,
        n_expert_used=meta.integer("expert_used_count") or 0,
        n_expert_shared=meta.integer("expert_shared_count") or 0,
        sliding_window=window,
        context_length=meta.integer("context_length"),
        vocab_size=_vocab_size(meta, info, tensors),
        kv_lora_rank=meta.integer("attention.kv_lora_rank"),
        file_type=info.quant_name,
        bits_per_weight=size_bytes * 8 / info.parameter_count if info.parameter_count else None,
        size_bytes=size_bytes,
        embeddings=tensors.top.get("embeddings", TensorGroup()),
        output=tensors.top.get("output", TensorGroup()),
        output_norm=tensors.top.get("output_norm", TensorGroup()),
        tied_embeddings="output.weight" not in tensors.names,
        layers=_layer_specs(tensors, slides, meta),
        chat_template=info.chat_template,
        unknown=(),
        n_ff_expert=meta.largest("expert_feed_forward_length"),
        n_layer_dense_lead=meta.integer("leading_dense_block_count") or 0,
        n_layer_nextn=meta.integer("nextn_predict_layers") or 0,
        mla=meta.integer("attention.key_length_mla") is not None
        and meta.integer("attention.kv_lora_rank") is not None,
        other_tensors=tensors.top.get("other", TensorGroup()),
        ref=str(info.path),
    )
    spec = replace(spec, active_params=active_params_of(spec))
    also_unknown = [
        *([] if window_known else ["sliding_window"]),
        *([] if expert_count_known else ["n_expert"]),
    ]
    return replace(spec, unknown=unknown_fields(spec, also_unknown))


def active_params_of(spec: ModelSpec) -> int | None:
    """Weights one token touches: all of them, less the share of routed experts not chosen."""
    if spec.total_params is None:
        return None
    if spec.n_expert == 0:
        return spec.total_params
    if spec.n_expert_used <= 0:
        return None
    unused = spec.routed_expert_params * (spec.n_expert - spec.n_expert_used) / spec.n_expert
    return spec.total_params - round(unused)


def unknown_fields(spec: ModelSpec, also: Iterable[str] = ()) -> tuple[str, ...]:
    """The names of the fields of `spec` that could not be determined, in field order."""
    names = [name for name in _MUST_KNOW if getattr(spec, name) is None] + list(also)
    # A MoE model without dense FFN blocks has no dense width to know.
    if spec.n_ff is None and spec.n_ff_expert is None:
        names.append("n_ff")
    return tuple(name for name in (f.name for f in fields(spec)) if name in names)


def _divide(numerator: int | None, denominator: int | None) -> int | None:
    if numerator is None or not denominator:
        return None
    return numerator // denominator


def _vocab_size(meta: _Metadata, info: GGUFInfo, tensors: _TensorSums) -> int | None:
    explicit = meta.integer("vocab_size")
    if explicit is not None:
        return explicit
    token_list = info.metadata.get("tokenizer.ggml.tokens")
    if isinstance(token_list, GGUFArraySummary):
        return token_list.length
    return tensors.dim("token_embd.weight", 1)


def _expert_count(meta: _Metadata, info: GGUFInfo, tensors: _TensorSums) -> tuple[int, bool]:
    """(routed experts, whether the file says so) - counted from the tensors if it doesn't."""
    stated = meta.integer("expert_count")
    if stated is not None:
        return stated, True
    if not any("experts" in groups for groups in tensors.layers.values()):
        return 0, True
    for tensor in info.tensors:
        if "_exps" in tensor.name and len(tensor.shape) == 3:
            return tensor.shape[2], False  # ggml order: (row, column, expert)
    return 0, False


def _sliding_window(
    meta: _Metadata, architecture: str, n_layers: int
) -> tuple[int | None, tuple[bool, ...], bool]:
    """(window tokens or None, which layers slide, whether that is known)."""
    rule = swa_rule(architecture)
    window = meta.integer("attention.sliding_window")
    if rule is not None and window is None:
        window = rule.default_window
    if not window:
        # Without a rule the window key alone cannot say which layers slide.
        known = architecture in KNOWN_ARCHITECTURES or window == 0
        return None, (False,) * n_layers, known
    explicit = meta.flags("attention.sliding_window_pattern", n_layers)
    if explicit is not None:
        return window, explicit, True
    pattern = meta.integer("attention.sliding_window_pattern")
    if pattern is None and rule is None:
        return window, (False,) * n_layers, False
    if pattern is None and rule is not None:
        pattern = rule.pattern
    dense_first = rule.dense_first if rule is not None else False
    return window, swa_layer_flags(n_layers, pattern or 0, dense_first=dense_first), True


def _layer_specs(
    tensors: _TensorSums, slides: tuple[bool, ...], meta: _Metadata
) -> tuple[LayerSpec, ...]:
    count = max(len(slides), tensors.layer_count() or 0)
    heads_kv = meta.per_layer("attention.head_count_kv", count)
    return tuple(
        _layer_spec(index, tensors.layers.get(index, {}), slides, heads_kv)
        for index in range(count)
    )


def _layer_spec(
    index: int,
    groups: Mapping[str, TensorGroup],
    slides: tuple[bool, ...],
    heads_kv: tuple[int | None, ...],
) -> LayerSpec:
    return LayerSpec(
        index=index,
        attention=groups.get("attention", TensorGroup()),
        ffn=groups.get("ffn", TensorGroup()),
        experts=groups.get("experts", TensorGroup()),
        shared_experts=groups.get("shared_experts", TensorGroup()),
        norms=groups.get("norms", TensorGroup()),
        other=groups.get("other", TensorGroup()),
        sliding_window=slides[index] if index < len(slides) else False,
        n_head_kv=heads_kv[index] if index < len(heads_kv) else None,
    )


@dataclass
class _TensorSums:
    """The file's tensors summed per layer and group, and per top-level group."""

    layers: dict[int, dict[str, TensorGroup]]
    top: dict[str, TensorGroup]
    names: frozenset[str]
    shapes: Mapping[str, tuple[int, ...]]

    @classmethod
    def of(cls, info: GGUFInfo) -> _TensorSums:
        sums = cls(layers={}, top={}, names=frozenset(t.name for t in info.tensors), shapes={})
        sums.shapes = {tensor.name: tensor.shape for tensor in info.tensors}
        for tensor in info.tensors:
            group = TensorGroup(tensor.n_elements, tensor.n_bytes, (tensor.type_name,))
            match = _BLOCK_TENSOR.fullmatch(tensor.name)
            if match is None:
                bucket, key = sums.top, _top_group_of(tensor.name)
            else:
                bucket = sums.layers.setdefault(int(match[1]), {})
                key = layer_group_of(match[2].rsplit(".", 1)[0])
            bucket[key] = bucket.get(key, TensorGroup()) + group
        return sums

    def layer_count(self) -> int | None:
        """Blocks as the tensor names count them (`blk.0` ... `blk.N`)."""
        return max(self.layers) + 1 if self.layers else None

    def dim(self, name: str, axis: int) -> int | None:
        shape = self.shapes.get(name)
        return shape[axis] if shape is not None and len(shape) > axis else None


def _top_group_of(name: str) -> str:
    base = name.rsplit(".", 1)[0]
    if base == "output":
        return "output"
    if base == "output_norm":
        return "output_norm"
    if base.startswith(_EMBEDDING_TENSORS):
        return "embeddings"
    return "other"


class _Metadata:
    """Typed reads of `<arch>.*` metadata; anything absent or of the wrong type is None."""

    def __init__(self, metadata: Mapping[str, object], architecture: str) -> None:
        self._metadata = metadata
        self._prefix = architecture + "."

    def _raw(self, key: str) -> object:
        return self._metadata.get(self._prefix + key)

    def integer(self, key: str) -> int | None:
        value = self._raw(key)
        if isinstance(value, bool) or not isinstance(value, int):
            return None
        return value

    def _integers(self, key: str) -> tuple[int, ...] | None:
        value = self._raw(key)
        if not isinstance(value, GGUFArraySummary) or value.values is None:
            return None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value.values):
            return None
        return tuple(int(v) for v in value.values)

    def largest(self, key: str) -> int | None:
        """A scalar, or the largest of a per-layer array."""
        scalar = self.integer(key)
        if scalar is not None:
            return scalar
        values = self._integers(key)
        return max(values) if values else None

    def per_layer(self, key: str, n_layers: int) -> tuple[int | None, ...]:
        scalar = self.integer(key)
        if scalar is not None:
            return (scalar,) * n_layers
        values = self._integers(key)
        if values is not None and len(values) >= n_layers:
            return values[:n_layers]
        return (None,) * n_layers

    def flags(self, key: str, n_layers: int) -> tuple[bool, ...] | None:
        value = self._raw(key)
        if not isinstance(value, GGUFArraySummary) or value.values is None:
            return None
        if len(value.values) < n_layers:
            return None
        return tuple(bool(v) for v in value.values[:n_layers])


def human_params(count: int | None) -> str:
    """12.3B, 270M, 5.2K; "?" when unknown."""
    if count is None:
        return "?"
    for threshold, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if count >= threshold:
            return f"{count / threshold:.{1 if count < 100 * threshold else 0}f}{suffix}"
    return str(count)
