"""What llama.cpp's CPU kernels cost on this machine: the linear model the calibration fits
(`autotune/calibration.py`) and the planner predicts with.

One token on the CPU — a decode step, or one prompt token of a prefill batch — takes

    seconds = sum over weight types of (units x per_unit + rows x per_row)
              + layers x per_layer (+ per_token, decode only)

where units are the bytes of weights read (decode) or the weights multiplied (prefill), rows
the matrix rows those weights form (each row is one dot product, ended by a reduction and a
store, so narrow matrices cost more per byte), per_layer the fixed cost of a layer's graph
(norms, attention, thread barriers), larger for some architectures than others, and
per_token the cost of one llama_decode call (building the graph, the Python binding): 0.7 ms
here, a seventh of a 60 MB model's token, nothing next to a 1.5B model's.
Routed experts are a weight "type" of their own, "<type>+experts" (`experts_key`): llama.cpp
multiplies them with another kernel (mul_mat_id, a gather per expert), measured 1.8x slower
per weight in a prompt batch than the same type's dense matrices on this EPYC.
Measured on a 2-core EPYC, the model fits llama-shaped probes from 256 to 2560 wide within
3% for Q8_0, Q4_0, Q4_K and Q6_K, where bytes over bandwidth alone missed by up to 50%.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from hearthside.kernels.engine_run import base_type, is_experts_key, type_bits


@dataclass(frozen=True)
class KernelCosts:
    """Seconds per unit and per row, by weight type, for one kind of work. A type no probe
    measured costs what the nearest measured type costs (and the plan says so, `source`):
    one of the same family (the legacy Q4_0/Q5_0/Q8_0 kind, K-quants, I-quants, ternary,
    floats: each family shares its kernels' design), then one of the same block size (32
    or 256 weights: the activations it dots against are quantized alike), then one repacked
    alike (AVX2 and NEON repack some types into faster layouts), then the closest bits per
    weight."""

    per_unit: Mapping[str, float]
    per_row: Mapping[str, float] = field(default_factory=dict)
    repacked: frozenset[str] = frozenset()

    def nearest(self, type_name: str) -> str | None:
        if type_name in self.per_unit:
            return type_name
        if is_experts_key(type_name):  # routed experts unmeasured: their type's dense cost
            return self.nearest(base_type(type_name))
        candidates = [t for t in self.per_unit if not is_experts_key(t)]
        for alike in (
            lambda t: family(t) == family(type_name),
            # 32-value blocks dot against Q8_0 activations, 256-value ones against Q8_K
            lambda t: block_values(t) == block_values(type_name),
            lambda t: (t in self.repacked) == (type_name in self.repacked),
        ):
            candidates = [t for t in candidates if alike(t)] or candidates
        if not candidates:
            return None
        bits = bits_per_weight(type_name)
        return min(candidates, key=lambda known: (abs(bits_per_weight(known) - bits), known))

    def source(self, type_name: str) -> str | None:
        """Where `type_name`'s cost comes from: "measured", "estimated from <type>", or None
        when nothing was measured."""
        known = self.nearest(type_name)
        if known is None:
            return None
        return MEASURED if known == type_name else f"estimated from {known}"

    def seconds(self, units: Mapping[str, float], rows: Mapping[str, float]) -> float:
        """The weights' share of a token: every type at its nearest measured type's costs."""
        total = 0.0
        for type_name, amount in units.items():
            known = self.nearest(type_name)
            if known is None:
                raise ValueError("no measured weight type to cost against")
            total += amount * self.per_unit[known]
            total += rows.get(type_name, 0) * self.per_row.get(known, 0.0)
        return total


MEASURED = "measured"


def describe_key(key: str) -> str:
    """A cost key as the plan shows it: "Q8_0 (routed experts)"."""
    return f"{base_type(key)} (routed experts)" if is_experts_key(key) else key


def family(type_name: str) -> str:
    """ "k" for K-quants, "i" for I-quants, "ternary" for TQ1_0/TQ2_0, "mx" for MXFP4,
    "float" for F16/BF16/F32, "legacy" otherwise (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)."""
    type_name = base_type(type_name)
    if type_name.endswith("_K"):
        return "k"
    if type_name.startswith("IQ"):
        return "i"
    if type_name.startswith("TQ"):
        return "ternary"
    if type_name.startswith("MX"):
        return "mx"
    if type_name.startswith(("F", "BF")):
        return "float"
    return "legacy"


def block_values(type_name: str) -> int:
    """Weights per quant block: 32 for Q4_0 and IQ4_NL, 256 for K-quants and IQ4_XS, 1 for
    floats; 0 for a type this gguf package does not know."""
    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType[base_type(type_name)]][0]
    except KeyError:
        return 0


def bits_per_weight(type_name: str) -> float:
    try:
        return type_bits(base_type(type_name))
    except KeyError:  # a type this gguf package does not know: assume 8-bit
        return 8.0


def kernel_costs(
    figures: Mapping[str, float], kind: str, ideal_per_unit: float, repacked: frozenset[str]
) -> KernelCosts:
    """The costs fitted figures hold for `kind` ("decode" or "prefill"): per type, the ideal
    seconds per unit over its "<kind>_efficiency:<type>", and its "<kind>_row_s:<type>"."""
    per_unit, per_row = {}, {}
    for key, value in figures.items():
        if key.startswith(f"{kind}_efficiency:") and value > 0:
            per_unit[key.split(":", 1)[1]] = ideal_per_unit / value
        elif key.startswith(f"{kind}_row_s:"):
            per_row[key.split(":", 1)[1]] = value
    return KernelCosts(per_unit, per_row, repacked)


def last_token_seconds(
    decode: KernelCosts,
    figures: Mapping[str, float],
    units: Mapping[str, float],
    rows: Mapping[str, float],
) -> float:
    """What a prompt batch costs once, whatever its length: the matrices llama.cpp runs for
    its last token only (the output layer, the last block's FFN; `units` bytes of them, in
    `rows` rows), read at decode's costs, and the llama_decode call. For Gemma 3 270M, whose
    output layer is most of its bytes, that is ~12 of a 42-token batch's 84 ms here: its
    prompt tok/s grows from 500 at 42 tokens to 640 at 128."""
    weights = decode.seconds(units, rows) if units and decode.per_unit else 0.0
    return weights + figures.get("decode_overhead_s_per_token", 0.0)


def layer_seconds(figures: Mapping[str, float], kind: str, architecture: str) -> float:
    """The fixed cost per layer and token of `kind` ("decode" or "prefill"): measured for the
    architecture when the calibration ran a model of it, else the llama-shaped probe's."""
    general = figures.get(f"{kind}_overhead_s_per_layer", 0.0)
    return figures.get(f"{kind}_overhead_s_per_layer:{architecture}", general)


def cache_time_share(figures: Mapping[str, float], touched_bytes: float) -> float:
    """The share of its calibrated time decode's weights take when a token reads from
    `touched_bytes` of them: 1 / "decode_cache_speedup" at or below the half-size cache
    probe's bytes ("decode_cache_bytes"), all of it at or above the full probes'
    ("decode_probe_bytes"), in proportion between. On the 2-core Sapphire Rapids VM, whose
    cache holds about 100 MB, SmolLM2 135M (96 MB) decodes at 1.4x the costs of its type's
    128 MiB probes."""
    speedup = figures.get("decode_cache_speedup", 1.0)
    small = figures.get("decode_cache_bytes", 0.0)
    full = figures.get("decode_probe_bytes", 0.0)
    if speedup <= 1 or not 0 < small < full or touched_bytes >= full:
        return 1.0
    fast = 1 / speedup
    if touched_bytes <= small:
        return fast
    return fast + (touched_bytes - small) / (full - small) * (1 - fast)
