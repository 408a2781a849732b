"""Speculative decoding on the real default model: same tokens as without it, fewer steps.

llama.cpp's CPU kernels are not batch-invariant: on this model a token's logits differ by up
to ~0.9 between evaluating it alone and inside a batch (measured; logits have a spread of
~4.7). A verify step evaluates k + 1 tokens in one batch, so where the target's top two
logits are that close, greedy decoding may pick either — as it does without speculation
between a cached and an uncached prompt. The exactness tests therefore run the target with
`n_ubatch=1`: llama.cpp then evaluates every token of every batch on its own, with the
kernels of a plain decode step, and the speculative protocol (drafting, batch verification,
acceptance, rolling back both KV caches) must give exactly the plain tokens. The fast path
(default batches) is checked too, allowing a divergence only between the target's top two.
"""

from __future__ import annotations

import collections
import ctypes
from collections.abc import Iterator, Sequence
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from hearthside.core.engine.bench import compare_speculation
from hearthside.core.engine.config import (
    EngineConfig,
    EngineConfigError,
    SamplingParams,
    SpeculativeConfig,
)
from hearthside.core.engine.engine import ChatMessage, Engine, GenerationMetrics
from hearthside.core.engine.speculative import (
    ModelDraft,
    SpeculationCounter,
    SpeculationStats,
    merge_stats,
)
from hearthside.core.models.vocab import VocabularyError
from tests.gguf_samples import write_tiny_gguf

pytestmark = pytest.mark.beside

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
BATCH_ROUNDING_LOGITS = 1.0  # the batch-vs-single logit difference measured above, rounded up
LOOKUP = SpeculativeConfig(mode="prompt_lookup", draft_tokens=6, ngram_size=3)
CODE = '''def total_by_customer(orders):
    """What each customer spent."""
    totals = {}
    for order in orders:
        amount = order.quantity * order.unit_price
        totals[order.customer] = totals.get(order.customer, 0.0) + amount
    return totals
'''
CODE_EDIT = (
    f"A Python file from our repository:\n\n```python\n{CODE}```\n\n"
    "The same file after the review, unchanged:\n\n```python\ndef total_by_customer(orders):\n"
)
# chi-square critical values at significance 0.01, by degrees of freedom (standard tables)
CHI2_CRITICAL_001 = dict(
    enumerate((6.635, 9.210, 11.345, 13.277, 15.086, 16.812, 18.475, 20.090, 21.666), start=1)
)


@pytest.fixture(scope="session")
def q4_0_draft(default_model_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model re-quantized to Q4_0: a real lower-bit variant to draft with."""
    target = tmp_path_factory.mktemp("draft") / "gemma-3-270m-q4_0.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = 2  # LLAMA_FTYPE_MOSTLY_Q4_0
    params.allow_requantize = True
    params.nthread = 2
    returned = llama_cpp.llama_model_quantize(
        str(default_model_file).encode(), str(target).encode(), ctypes.byref(params)
    )
    assert returned == 0
    return target


@pytest.fixture(scope="module")
def engine(default_model_file: Path) -> Iterator[Engine]:
    loaded = Engine(EngineConfig(model_path=str(default_model_file), n_ctx=1024))
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def exact(default_model_file: Path) -> Iterator[Engine]:
    """The target evaluating one token per ubatch: a plain decode step's numerics everywhere."""
    loaded = Engine(EngineConfig(model_path=str(default_model_file), n_ctx=512, n_ubatch=1))
    yield loaded
    loaded.close()


@pytest.fixture(autouse=True)
def speculation_off_after(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    for name in ("engine", "exact"):
        if name in request.fixturenames:
            request.getfixturevalue(name).set_speculative(SpeculativeConfig())


def fresh_run(
    engine: Engine, prompt: Sequence[int], speculative: SpeculativeConfig
) -> tuple[tuple[int, ...], GenerationMetrics]:
    engine.set_speculative(speculative)
    engine.clear_cache()
    result = engine.generate(prompt, GREEDY)
    return result.tokens, result.metrics


def assert_same_tokens(
    engine: Engine, prompt: Sequence[int], plain: Sequence[int], drafted: Sequence[int]
) -> None:
    """Identical, or diverging first between the target's top two tokens, whose logits are
    closer than batch rounding can move them."""
    if tuple(plain) == tuple(drafted):
        return
    first = next(i for i, (a, b) in enumerate(zip(plain, drafted, strict=False)) if a != b)
    engine.set_speculative(SpeculativeConfig())
    llama = engine.llama
    llama.reset()
    llama.evaluate([*prompt, *plain[:first]], logits_for_last=1)
    pointer = llama_cpp.llama_get_logits_ith(llama.ctx, -1)
    logits = np.ctypeslib.as_array(pointer, shape=(engine.n_vocab,))
    top_two = [int(token) for token in np.argsort(logits)[-2:]]
    gap = float(abs(logits[top_two[0]] - logits[top_two[1]]))
    assert {plain[first], drafted[first]} == set(top_two) and gap < BATCH_ROUNDING_LOGITS, (
        f"diverged at token {first}: {plain[first]} vs {drafted[first]}, "
        f"top two {top_two}, gap {gap:.4f}"
    )


# ---- prompt lookup ---------------------------------------------------------------------------


def test_prompt_lookup_gives_exactly_the_plain_greedy_tokens(exact: Engine) -> None:
    prompt = exact.tokenize(CODE_EDIT, add_bos=True)
    comparison = compare_speculation(exact, [prompt], LOOKUP, GREEDY, repetitions=1)
    assert comparison.identical
    assert exact.config.speculative.mode == "off"  # compare_speculation restored it
    stats = comparison.stats
    assert stats is not None and stats.mode == "prompt_lookup"
    # The reply repeats the function: most drafts are accepted, several tokens per step.
    assert stats.accepted >= 10 and stats.acceptance_rate > 0.5, stats
    assert stats.mean_accepted_length > 1.5 and stats.steps < GREEDY.max_tokens, stats


def test_prompt_lookup_in_a_two_turn_chat_reuses_the_cached_prefix(exact: Engine) -> None:
    first_turn = [ChatMessage("user", f"Repeat this code exactly:\n{CODE}")]
    replies = {}
    for label, speculative in (("plain", SpeculativeConfig()), ("lookup", LOOKUP)):
        exact.set_speculative(speculative)
        exact.clear_cache()
        answer = exact.chat(first_turn, GREEDY)
        second_turn = [
            *first_turn,
            ChatMessage("assistant", answer.text),
            ChatMessage("user", "Now repeat only its first line."),
        ]
        again = exact.chat(second_turn, GREEDY)
        assert again.metrics.prompt_tokens_evaluated < again.metrics.prompt_tokens / 2
        replies[label] = (answer.tokens, again.tokens, again.metrics.speculative)
    assert replies["plain"][:2] == replies["lookup"][:2]
    assert replies["lookup"][2] is not None and replies["plain"][2] is None


def test_with_batched_verification_replies_differ_at_most_by_rounding(engine: Engine) -> None:
    prompt = engine.tokenize(CODE_EDIT, add_bos=True)
    plain, _ = fresh_run(engine, prompt, SpeculativeConfig())
    drafted, metrics = fresh_run(engine, prompt, LOOKUP)
    assert metrics.speculative.accepted >= 10
    assert_same_tokens(engine, prompt, plain, drafted)


def test_logits_are_computed_only_where_a_draft_is_verified(engine: Engine) -> None:
    # llama-cpp-python would turn logits_all on: 262k logits per prompt token (FIELD_NOTES).
    engine.set_speculative(SpeculativeConfig(mode="prompt_lookup", draft_tokens=3))
    llama = engine.llama
    llama.reset()
    llama.eval(engine.tokenize(CODE, add_bos=True))
    assert llama_cpp.llama_get_logits_ith(llama.ctx, -4)  # the last k + 1 positions
    assert not llama_cpp.llama_get_logits_ith(llama.ctx, -5)
    engine.set_speculative(SpeculativeConfig())
    llama.reset()
    llama.eval(engine.tokenize(CODE, add_bos=True))
    assert not llama_cpp.llama_get_logits_ith(llama.ctx, -2)


# ---- draft models ----------------------------------------------------------------------------


def test_a_requantized_draft_gives_exactly_the_plain_greedy_tokens(
    exact: Engine, q4_0_draft: Path
) -> None:
    prompt = exact.tokenize(CODE_EDIT, add_bos=True)
    speculative = SpeculativeConfig(
        mode="draft_model", draft_tokens=4, draft_model_path=str(q4_0_draft)
    )
    plain, _ = fresh_run(exact, prompt, SpeculativeConfig())
    drafted, metrics = fresh_run(exact, prompt, speculative)
    assert drafted == plain
    stats = metrics.speculative
    assert stats is not None and stats.mode == "draft_model" and stats.accepted > 10, stats
    draft = exact.draft
    assert isinstance(draft, ModelDraft)
    # The draft's cache follows the target: the prompt once, then per step only the newly
    # accepted tokens and its own drafts; re-evaluating the context would cost len(prompt)
    # per step.
    assert draft.evaluated_tokens <= len(prompt) + stats.steps * (speculative.draft_tokens + 2)


def test_the_model_drafting_for_itself_is_always_accepted(
    exact: Engine, default_model_file: Path
) -> None:
    prompt = exact.tokenize("Question: Why is the sky blue?\nAnswer:", add_bos=True)
    speculative = SpeculativeConfig(
        mode="draft_model", draft_tokens=4, draft_model_path=str(default_model_file)
    )
    plain, _ = fresh_run(exact, prompt, SpeculativeConfig())
    drafted, metrics = fresh_run(exact, prompt, speculative)
    assert drafted == plain
    stats = metrics.speculative
    # Same weights, same single-token numerics: every drafted token is the target's choice.
    assert stats.acceptance_rate == 1.0 and stats.mean_accepted_length > 3, stats


def test_a_draft_with_another_vocabulary_is_refused(engine: Engine, tmp_path: Path) -> None:
    stranger = write_tiny_gguf(tmp_path / "stranger.gguf", loadable=True)
    with pytest.raises(VocabularyError) as raised:
        engine.set_speculative(
            SpeculativeConfig(mode="draft_model", draft_model_path=str(stranger))
        )
    assert "cannot draft" in raised.value.message and raised.value.hint
    assert engine.config.speculative.mode == "off" and engine.draft is None


# ---- temperature > 0 -------------------------------------------------------------------------


def test_sampled_replies_follow_the_target_distribution(exact: Engine) -> None:
    """With temperature > 0 the verifier samples the target at every position and keeps a
    drafted token only if it equals that sample, so each emitted token is one draw from the
    target, in the same order as without drafts. Shown two ways on a prompt where lookup
    drafts are often wrong: (1) the same seed gives the same reply with and without drafts;
    (2) replies under disjoint seed sets are indistinguishable by a chi-square test at 1%."""
    prompt = exact.tokenize("red green blue, red green blue, red green", add_bos=True)
    lookup = SpeculativeConfig(mode="prompt_lookup", draft_tokens=4, ngram_size=2)
    runs = 30
    stats: list[SpeculationStats | None] = []

    def replies(speculative: SpeculativeConfig, seeds: range) -> list[tuple[int, ...]]:
        exact.set_speculative(speculative)
        out = []
        for seed in seeds:
            sampling = SamplingParams(temperature=2.0, top_k=2, top_p=1.0, min_p=0.0,
                                      max_tokens=3, seed=seed)  # fmt: skip
            result = exact.generate(prompt, sampling)
            out.append(result.tokens[:3])
            stats.append(result.metrics.speculative)
        return out

    plain = replies(SpeculativeConfig(), range(runs))
    same_seeds = replies(lookup, range(8))
    other_seeds = replies(lookup, range(runs, 2 * runs))
    drafted = merge_stats([s for s in stats if s is not None])
    assert drafted is not None and drafted.accepted > 0 and drafted.rejections > 5, drafted
    assert same_seeds == plain[:8]
    statistic, freedom = chi_square_two_samples(plain, other_seeds)
    assert freedom >= 2, "too few distinct replies for the test to mean anything"
    assert statistic < CHI2_CRITICAL_001[freedom], (statistic, freedom)


def chi_square_two_samples(first: list, second: list) -> tuple[float, int]:
    """Pearson's chi-square for homogeneity; categories under 5 expected are pooled."""
    counts = collections.Counter(first + second)
    common = {value for value, count in counts.items() if count / 2 >= 5}
    rows = [
        collections.Counter(item if item in common else "other" for item in sample)
        for sample in (first, second)
    ]
    categories = sorted({*rows[0], *rows[1]}, key=str)
    total = len(first) + len(second)
    statistic = 0.0
    for category in categories:
        column = rows[0][category] + rows[1][category]
        for row, size in zip(rows, (len(first), len(second)), strict=True):
            expected = column * size / total
            statistic += (row[category] - expected) ** 2 / expected
    return statistic, len(categories) - 1


# ---- bookkeeping and settings ---------------------------------------------------------------


def ids(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.intc)


def test_the_counter_reads_acceptance_from_the_next_input_ids() -> None:
    counter = SpeculationCounter()
    counter.observe(ids(1, 2, 3))
    counter.record(3, ids(4, 5, 6))  # drafted 4 5 6 after position 3
    counter.observe(ids(1, 2, 3, 4, 5, 9))  # the target kept 4 5, then sampled 9
    counter.record(6, ids())  # no draft this step
    counter.observe(ids(1, 2, 3, 4, 5, 9, 7))
    counter.record(7, ids(8, 8))
    counter.finish(ids(1, 2, 3, 4, 5, 9, 7, 8, 8, 2))  # both accepted, then EOS
    stats = counter.stats("prompt_lookup", 3)
    assert (stats.drafted, stats.accepted, stats.steps, stats.draft_steps) == (5, 4, 3, 2)
    assert stats.rejections == 1 and stats.acceptance_rate == 0.8
    assert stats.mean_accepted_length == 2.0


def test_a_draft_past_the_end_of_the_generation_is_not_counted() -> None:
    counter = SpeculationCounter()
    counter.record(3, ids(4, 5, 6, 7))
    counter.finish(ids(1, 2, 3, 4, 5))  # max_tokens reached after two tokens
    stats = counter.stats("draft_model", 4)
    assert (stats.drafted, stats.accepted, stats.rejections) == (2, 2, 0)


def test_speculative_settings_validate_and_round_trip() -> None:
    config = EngineConfig(
        "m.gguf",
        speculative=SpeculativeConfig(
            mode="draft_model", draft_tokens=5, draft_model_path="d.gguf", draft_threads=1
        ),
    )
    assert EngineConfig.from_dict(config.to_dict()) == config
    with pytest.raises(EngineConfigError, match="needs a draft model"):
        SpeculativeConfig(mode="draft_model")
    with pytest.raises(EngineConfigError, match="only apply"):
        SpeculativeConfig(mode="prompt_lookup", draft_model_path="d.gguf")
    with pytest.raises(EngineConfigError):
        SpeculativeConfig(mode="draft_model", draft_model_path="d.gguf", draft_n_ctx=8)
