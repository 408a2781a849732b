"""Measured quality: how far a candidate — a weights file and a KV-cache type — moves a model's
next-token distribution away from its reference's, over a fixed evaluation text.

The method is llama-perplexity's `--kl-divergence` (tools/perplexity/perplexity.cpp in the
vendored llama.cpp), re-implemented so the figures agree with it: the text is tokenized once
(BOS when the vocabulary adds one), cut into whole chunks of `n_ctx` tokens (the rest is
dropped), each chunk evaluated from an empty cache with its first token replaced by BOS; the
first half of a chunk is context only, and the positions from `n_ctx / 2` to `n_ctx - 2` are
scored, each predicting the next token. Per scored position:
- KL divergence of the candidate's distribution from the reference's,
- whether both put the same token first (top-1 agreement),
- the candidate's and the reference's log-probability of the true next token (perplexity).

The reference is the most precise original file of the model on this machine with an f16 KV
cache (`choose_reference`); a variant re-quantized from it can only lose information, so it
is a candidate, never the reference. Its distributions are computed once per (reference
fingerprint, text hash, context) and cached on disk — as `--kl-divergence-base` does, but not
whole rows (n_vocab floats per position: 262144 for Gemma): per position its `TOP_K` most
likely tokens, `TAIL_SAMPLES` tokens drawn from the rest in proportion to their probability,
and the rest's mass. The KLD's share of the top tokens is then exact and the rest's is
estimated without bias from the draws (one "everything else" bucket instead came out 13%
low on SmolLM2, whose top 64 tokens hold only ~90% of the mass). The figures agree with
llama-perplexity's within 5% (`benchmarks/quality_agreement.py`).

The engine work runs inside the engine worker (`WorkerEngine.run`, like the context audit):
the worker returns per-position statistics and kept tokens, never full vocabulary rows.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import llama_cpp
import numpy as np

from hearthside.autotune.fingerprint import model_fingerprint
from hearthside.autotune.wisdom import QualityRecord, WisdomDB
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.worker_engine import EngineLoader, WorkerEngine
from hearthside.core.errors import HearthsideError
from hearthside.core.models.descriptor import QUANT_PROFILES
from hearthside.core.models.gguf_validator import validate_gguf
from hearthside.core.models.store import SOURCE_QUANTIZED_PREFIX, ModelRecord
from hearthside.core.paths import data_dir, ensure_private_dir

if TYPE_CHECKING:
    from hearthside.core.engine.engine import Engine

EVAL_ASSET = "eval/quality-eval.txt"
DEFAULT_EVAL_CTX = 1024  # a short chat's context; the tuner may pass the one it chats with
TOP_K = 64  # the reference's most likely tokens kept per position, exactly
TAIL_SAMPLES = 64  # and tokens drawn from the rest, which estimate its share of the KLD
REFERENCE_KV = "f16"
ROWS_PER_BLOCK = 32  # rows scored at a time (Gemma: 32 MiB of logits, 64 MiB for the draws)
MIN_TAIL = 1e-12  # a candidate's tail mass never counts as exactly 0 (an infinite KLD)
ProgressCallback = Callable[[str, int, int], None]  # (pass name, chunks done, chunks in all)


class QualityError(HearthsideError):
    """Quality cannot be measured as asked."""


# --- the evaluation text -------------------------------------------------------------------


@dataclass(frozen=True)
class EvalText:
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def head(self, n_chars: int) -> EvalText:
        """The first `n_chars` characters: a shorter text (its own hash), for quick checks."""
        return EvalText(self.text[:n_chars])


def load_eval_text() -> EvalText:
    """The shipped evaluation text (`assets/eval/SOURCES.md` says where each part is from).
    One final newline is dropped, as llama-perplexity's `-f` does."""
    text = resources.files("hearthside.assets").joinpath(EVAL_ASSET).read_text("utf-8")
    return EvalText(text.removesuffix("\n"))


# --- choosing the reference ---------------------------------------------------------------


def choose_reference(family: Sequence[ModelRecord]) -> ModelRecord:
    """The most precise original in a model's family (bits per weight over the whole file);
    a re-quantized variant is never the reference, whatever its bits."""
    originals = [record for record in family if not is_requantized(record)]
    if not originals:
        names = ", ".join(record.id for record in family) or "none"
        raise QualityError(
            f"Every file of this model ({names}) was re-quantized from one that is gone, so "
            "none can stand as the reference.",
            hint="Add the original GGUF again (`hearthside models add FILE`).",
        )
    return max(originals, key=lambda record: (bits_per_weight(record), record.size_bytes))


def is_requantized(record: ModelRecord) -> bool:
    """Made from another file here (`hearthside models quantize`): never a reference."""
    return record.variant_of is not None or record.source.startswith(SOURCE_QUANTIZED_PREFIX)


def bits_per_weight(record: ModelRecord) -> float:
    if record.parameter_count:
        return record.size_bytes * 8 / record.parameter_count
    profile = QUANT_PROFILES.get((record.quant or "").upper())
    return profile.bits if profile else 16.0


# --- candidates and results -----------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """A weights file and the KV-cache type (K and V alike) to load it with."""

    path: Path
    label: str  # the file's quant, e.g. "Q4_0"
    kv_type: str = REFERENCE_KV

    @property
    def name(self) -> str:
        return f"{self.label} + {self.kv_type} KV"


@dataclass(frozen=True)
class QualityResult:
    candidate: Candidate
    record: QualityRecord
    reused: bool  # read from the autotune DB, not measured now


@dataclass(frozen=True)
class QualityReport:
    reference: Candidate
    results: tuple[QualityResult, ...]
    reference_computed: bool  # False: the reference's distributions came from the cache (or
    # were not needed at all)

    def to_dict(self) -> dict[str, object]:
        return {
            "reference": {"path": str(self.reference.path), "label": self.reference.label},
            "reference_computed": self.reference_computed,
            "results": [
                {"name": result.candidate.name, "reused": result.reused, **vars(result.record)}
                for result in self.results
            ],
        }


# --- the figures ---------------------------------------------------------------------------


def kl_divergence(
    reference: np.ndarray, candidate: np.ndarray, tail_mass: np.ndarray, head: int = TOP_K
) -> np.ndarray:
    """Per position, KL(reference || candidate) from the reference's kept tokens: log-
    probabilities, shape (positions, head + samples), both at the same tokens — the
    reference's `head` most likely, exactly, then tokens drawn from the rest of its
    distribution (whose mass is `tail_mass`), which estimate the rest's share without bias:
    tail_mass x the mean log-ratio over the draws."""
    log_ratio = reference.astype(np.float64) - candidate.astype(np.float64)
    exact = (np.exp(reference[:, :head].astype(np.float64)) * log_ratio[:, :head]).sum(axis=1)
    if reference.shape[1] == head:
        return np.asarray(exact)
    return np.asarray(exact + tail_mass * log_ratio[:, head:].mean(axis=1))


def perplexity(target_logprobs: np.ndarray) -> float:
    return math.exp(-float(np.mean(target_logprobs, dtype=np.float64)))


# --- the engine side: runs in the worker -----------------------------------------------------


@dataclass(frozen=True)
class ChunkScores:
    """What one scored chunk leaves: per position the log-probability of the true next token
    and the most likely token; for a reference pass the kept tokens (`kept_tokens`) with
    their log-probabilities and the tail's mass; for a candidate pass its log-probabilities
    at the reference's kept tokens (`probe`)."""

    target_logprobs: np.ndarray  # (n,) float32
    argmax: np.ndarray  # (n,) int32
    kept_ids: np.ndarray | None = None  # (n, TOP_K + TAIL_SAMPLES) int32, most likely first
    kept_logprobs: np.ndarray | None = None  # (n, TOP_K + TAIL_SAMPLES) float32
    tail_mass: np.ndarray | None = None  # (n,) float64: what the TOP_K leave
    probe_logprobs: np.ndarray | None = None  # (n, TOP_K + TAIL_SAMPLES) float32


def eval_tokens(engine: Engine, text: str) -> tuple[list[int], int | None, int]:
    """`text` tokenized as llama-perplexity does (BOS if the vocabulary adds one, special
    tokens as plain text); the BOS token (or None) and the vocabulary size."""
    llama = engine.llama
    add_bos = bool(llama._model.add_bos_token())
    tokens = llama.tokenize(text.encode("utf-8"), add_bos=add_bos, special=False)
    return list(tokens), int(llama.token_bos()) if add_bos else None, engine.n_vocab


def score_chunk(
    engine: Engine, chunk: Sequence[int], probe: np.ndarray | None = None, seed: int = 0
) -> ChunkScores:
    """Evaluate `chunk` from an empty cache in one batch, logits for its second half; score
    positions n/2 .. n-2 against the next token. Without `probe` it is the reference's pass:
    it keeps tokens per position (tail draws seeded by `seed`)."""
    llama = engine.llama
    first = len(chunk) // 2
    n_outputs = len(chunk) - first
    llama.reset()
    llama.evaluate(list(chunk), logits_for_last=n_outputs)
    pointer = llama_cpp.llama_get_logits(llama.ctx)
    logits = np.ctypeslib.as_array(pointer, shape=(n_outputs, engine.n_vocab))
    targets = np.asarray(chunk[first + 1 :], dtype=np.int64)
    rng = np.random.default_rng(seed)
    parts = []
    for start in range(0, len(targets), ROWS_PER_BLOCK):
        rows = slice(start, min(start + ROWS_PER_BLOCK, len(targets)))
        logprobs = log_softmax(logits[rows])
        probed = None if probe is None else probe[rows]
        parts.append(score_rows(logprobs, targets[rows], probed, rng))
    llama.reset()
    return joined(parts)


def score_rows(
    logprobs: np.ndarray, targets: np.ndarray, probe: np.ndarray | None, rng: np.random.Generator
) -> ChunkScores:
    """The scores of some positions from their log-softmax rows."""
    scores = ChunkScores(
        target_logprobs=logprobs[np.arange(len(targets)), targets],
        argmax=np.argmax(logprobs, axis=1).astype(np.int32),
    )
    if probe is not None:
        return replace(scores, probe_logprobs=np.take_along_axis(logprobs, probe, axis=1))
    ids, tail_mass = kept_tokens(logprobs, rng)
    return replace(
        scores,
        kept_ids=ids,
        kept_logprobs=np.take_along_axis(logprobs, ids, axis=1),
        tail_mass=tail_mass,
    )


def kept_tokens(logprobs: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Per row the TOP_K most likely tokens, most likely first, then TAIL_SAMPLES tokens
    drawn from the rest in proportion to their probability; and the rest's mass."""
    unsorted = np.argpartition(logprobs, -TOP_K, axis=1)[:, -TOP_K:]
    order = np.argsort(-np.take_along_axis(logprobs, unsorted, axis=1), axis=1)
    head = np.take_along_axis(unsorted, order, axis=1)
    tail = np.exp(logprobs.astype(np.float64))
    np.put_along_axis(tail, head, 0.0, axis=1)
    cumulative = np.cumsum(tail, axis=1)
    tail_mass = cumulative[:, -1]
    draws = rng.random((len(logprobs), TAIL_SAMPLES)) * tail_mass[:, None]
    drawn = np.stack([np.searchsorted(row, u) for row, u in zip(cumulative, draws, strict=True)])
    drawn = np.minimum(drawn, logprobs.shape[1] - 1)
    return np.concatenate([head, drawn], axis=1).astype(np.int32), tail_mass


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_total = np.log(np.exp(shifted).sum(axis=1, dtype=np.float64, keepdims=True))
    return (shifted - log_total).astype(np.float32)


def joined(parts: Sequence[ChunkScores]) -> ChunkScores:
    """Scores of consecutive positions as one."""

    def stacked(name: str) -> np.ndarray | None:
        pieces = [getattr(part, name) for part in parts]
        return None if pieces[0] is None else np.concatenate(pieces)

    values = {name: stacked(name) for name in ChunkScores.__dataclass_fields__}
    return ChunkScores(**values)  # type: ignore[arg-type]


# --- the reference's distributions, cached -----------------------------------------------------


@dataclass(frozen=True)
class ReferenceLogits:
    """The reference's scored positions over every chunk, in order."""

    chunks: np.ndarray  # (n_chunks, n_ctx) int32: the evaluated tokens, BOS already in place
    kept_ids: np.ndarray  # (positions, TOP_K + TAIL_SAMPLES) int32
    kept_logprobs: np.ndarray  # (positions, TOP_K + TAIL_SAMPLES) float32
    tail_mass: np.ndarray  # (positions,) float64
    target_logprobs: np.ndarray  # (positions,) float32
    n_vocab: int

    @property
    def per_chunk(self) -> int:
        return self.chunks.shape[1] - 1 - self.chunks.shape[1] // 2

    def rows_of(self, chunk: int) -> slice:
        return slice(chunk * self.per_chunk, (chunk + 1) * self.per_chunk)

    def save(self, path: Path) -> None:
        partial = path.with_name(path.name + ".part.npz")
        np.savez(partial, **vars(self))
        partial.replace(path)

    @classmethod
    def load(cls, path: Path) -> ReferenceLogits:
        with np.load(path) as stored:
            arrays = {name: stored[name] for name in cls.__dataclass_fields__}
        return cls(**{**arrays, "n_vocab": int(arrays["n_vocab"])})


def default_cache_dir() -> Path:
    return ensure_private_dir(data_dir() / "quality")


def reference_cache_path(cache_dir: Path, reference_model: str, text: EvalText, n_ctx: int) -> Path:
    return (
        cache_dir
        / f"{reference_model}-{text.sha256[:16]}-ctx{n_ctx}-top{TOP_K}-tail{TAIL_SAMPLES}.npz"
    )


def chunked(tokens: Sequence[int], n_ctx: int, bos: int | None) -> np.ndarray:
    """Whole chunks of `n_ctx` tokens (the rest dropped), each starting with BOS when the
    vocabulary adds one — llama-perplexity's chunking."""
    n_chunks = len(tokens) // n_ctx
    if n_chunks < 1:
        raise QualityError(
            f"The evaluation text has {len(tokens)} tokens, fewer than one chunk of {n_ctx}.",
            hint="Use a smaller context (--ctx).",
        )
    chunks = np.asarray(tokens[: n_chunks * n_ctx], dtype=np.int32).reshape(n_chunks, n_ctx)
    if bos is not None:
        chunks[:, 0] = bos
    return chunks


# --- passes --------------------------------------------------------------------------------


def eval_config(candidate: Candidate, n_ctx: int, n_gpu_layers: int = 0) -> EngineConfig:
    """One chunk per batch (every logit of a chunk in one decode) and flash attention on for
    every pass, so a KV-cache type is the only difference between two passes of one file."""
    return EngineConfig(
        str(candidate.path),
        n_ctx=n_ctx,
        n_batch=n_ctx,
        n_ubatch=min(512, n_ctx),
        n_gpu_layers=n_gpu_layers,
        type_k=candidate.kv_type,
        type_v=candidate.kv_type,
        flash_attn=True,
    )


def compute_reference(
    reference: Candidate,
    text: EvalText,
    n_ctx: int,
    *,
    n_gpu_layers: int = 0,
    progress: ProgressCallback | None = None,
    load: EngineLoader = WorkerEngine,
) -> ReferenceLogits:
    """One pass of the reference: its top-K per scored position."""
    engine = load(eval_config(reference, n_ctx, n_gpu_layers))
    try:
        tokens, bos, n_vocab = engine.run(eval_tokens, text.text)
        chunks = chunked(tokens, n_ctx, bos)
        scores = []
        for index, chunk in enumerate(chunks):
            scores.append(engine.run(score_chunk, chunk.tolist(), None, index))
            _report(progress, f"reference {reference.name}", index + 1, len(chunks))
    finally:
        engine.close()
    whole = joined(scores)
    assert whole.kept_ids is not None and whole.kept_logprobs is not None
    assert whole.tail_mass is not None
    return ReferenceLogits(
        chunks,
        whole.kept_ids,
        whole.kept_logprobs,
        whole.tail_mass,
        whole.target_logprobs,
        n_vocab,
    )


def score_candidate(
    candidate: Candidate,
    reference: ReferenceLogits,
    *,
    n_gpu_layers: int = 0,
    progress: ProgressCallback | None = None,
    load: EngineLoader = WorkerEngine,
) -> ChunkScores:
    """One pass of `candidate` over the reference's chunks, probed at its kept tokens."""
    n_ctx = reference.chunks.shape[1]
    engine = load(eval_config(candidate, n_ctx, n_gpu_layers))
    try:
        if engine.n_vocab != reference.n_vocab:
            raise QualityError(
                f"{candidate.path.name} has a vocabulary of {engine.n_vocab} tokens, the "
                f"reference {reference.n_vocab}: they are not the same model.",
            )
        scores = []
        for index, chunk in enumerate(reference.chunks):
            probe = reference.kept_ids[reference.rows_of(index)]
            scores.append(engine.run(score_chunk, chunk.tolist(), probe))
            _report(progress, candidate.name, index + 1, len(reference.chunks))
    finally:
        engine.close()
    return joined(scores)


def _report(progress: ProgressCallback | None, what: str, done: int, total: int) -> None:
    if progress is not None:
        progress(what, done, total)


def summarize(
    candidate: Candidate,
    reference: Candidate,
    logits: ReferenceLogits,
    scores: ChunkScores,
    *,
    fingerprints: tuple[str, str],
    text: EvalText,
    architecture: str = "",
) -> QualityRecord:
    """The candidate's figures against the reference (`fingerprints`: reference, candidate;
    `architecture`: the reference's, its model family)."""
    assert scores.probe_logprobs is not None
    kld = kl_divergence(logits.kept_logprobs, scores.probe_logprobs, logits.tail_mass)
    return QualityRecord(
        reference_model=fingerprints[0],
        candidate_model=fingerprints[1],
        kv_type=candidate.kv_type,
        text_hash=text.sha256,
        n_ctx=int(logits.chunks.shape[1]),
        candidate=candidate.label,
        reference=reference.path.name,
        n_tokens=len(kld),
        mean_kld=float(np.mean(kld)),
        kld_p99=float(np.percentile(kld, 99)),
        top1_agreement=float(np.mean(scores.argmax == logits.kept_ids[:, 0])),
        perplexity=perplexity(scores.target_logprobs),
        reference_perplexity=perplexity(logits.target_logprobs),
        architecture=architecture,
    )


# --- the whole measurement -------------------------------------------------------------------


def measure_quality(
    reference: Candidate,
    candidates: Sequence[Candidate],
    db: WisdomDB,
    *,
    text: EvalText | None = None,
    n_ctx: int = DEFAULT_EVAL_CTX,
    cache_dir: Path | None = None,
    n_gpu_layers: int = 0,
    progress: ProgressCallback | None = None,
    load: EngineLoader = WorkerEngine,
) -> QualityReport:
    """Each candidate's quality against `reference` (loaded with an f16 KV cache): from the
    autotune DB when it holds them for this text and context, else measured — one pass per
    candidate, plus one of the reference when its distributions are not cached yet."""
    text = text or load_eval_text()
    reference = Candidate(reference.path, reference.label, REFERENCE_KV)
    reference_model = model_fingerprint(reference.path)
    architecture = validate_gguf(reference.path).architecture or ""
    db.note_quality_architecture(reference_model, architecture)  # rows from before schema 6
    cache = reference_cache_path(cache_dir or default_cache_dir(), reference_model, text, n_ctx)
    logits: ReferenceLogits | None = None
    computed = False
    results = []
    for candidate in candidates:
        fingerprints = (reference_model, model_fingerprint(candidate.path))
        stored = db.quality(*fingerprints, candidate.kv_type, text.sha256, n_ctx)
        if stored is not None:
            results.append(QualityResult(candidate, stored, reused=True))
            continue
        if logits is None:
            logits, computed = _reference_logits(
                cache, reference, text, n_ctx, n_gpu_layers, progress, load
            )
        scores = score_candidate(
            candidate, logits, n_gpu_layers=n_gpu_layers, progress=progress, load=load
        )
        record = summarize(
            candidate,
            reference,
            logits,
            scores,
            fingerprints=fingerprints,
            text=text,
            architecture=architecture,
        )
        results.append(QualityResult(candidate, db.save_quality(record), reused=False))
    return QualityReport(reference, tuple(results), reference_computed=computed)


def _reference_logits(
    cache: Path,
    reference: Candidate,
    text: EvalText,
    n_ctx: int,
    n_gpu_layers: int,
    progress: ProgressCallback | None,
    load: EngineLoader,
) -> tuple[ReferenceLogits, bool]:
    """The cached distributions, or one pass that computes and caches them (True)."""
    if cache.exists():
        return ReferenceLogits.load(cache), False
    logits = compute_reference(
        reference, text, n_ctx, n_gpu_layers=n_gpu_layers, progress=progress, load=load
    )
    logits.save(cache)
    return logits, True
