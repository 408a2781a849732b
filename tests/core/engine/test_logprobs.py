"""Token logprobs from the engine: what the ledger keeps, single-sequence and batched replies
on the real SmolLM2 135M model, and entries streamed in step with the text."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hearthside.core.engine.config import EngineConfig, SamplingParams
from hearthside.core.engine.engine import ChatMessage, Engine, GenerationResult
from hearthside.core.engine.logprobs import LogprobLedger, TokenLogprob

pytestmark = pytest.mark.beside

QUESTION = [ChatMessage("user", "Write one sentence about the sea.")]
GREEDY_LOGPROBS = SamplingParams(temperature=0.0, max_tokens=16, logprobs=3)


def entry(text: str) -> TokenLogprob:
    return TokenLogprob(token=0, piece=text.encode(), logprob=-1.0, top=())


def texts(entries: tuple[TokenLogprob, ...] | None) -> list[str]:
    return [item.text for item in entries or ()]


# ---- the ledger alone ------------------------------------------------------------------------


def test_an_entry_comes_out_once_all_of_its_text_is_shown() -> None:
    ledger = LogprobLedger()
    ledger.add(entry("Hel"), 0, 3)
    ledger.add(entry("lo"), 3, 5)
    assert texts(ledger.release(shown=4, lead=0)) == ["Hel"]  # "lo" is half shown
    assert texts(ledger.release(shown=5, lead=0)) == ["lo"]
    assert [(e.text_offset, e.text_end) for e in ledger.kept] == [(0, 3), (3, 5)]


def test_at_a_stop_tokens_with_text_before_the_cut_stay_and_later_ones_go() -> None:
    ledger = LogprobLedger()
    for start, text in ((0, "One"), (3, " two."), (8, "\n"), (9, "Three")):
        ledger.add(entry(text), start, start + len(text))
    assert texts(ledger.release(shown=3, lead=0)) == ["One"]
    # stop "." cut the text at 7: " two." showed " two", the rest never shows
    assert texts(ledger.finish(shown=7, lead=0, stopped=True)) == [" two."]
    assert texts(ledger.kept) == ["One", " two."]


def test_stripped_leading_whitespace_drops_its_tokens_and_shifts_offsets() -> None:
    ledger = LogprobLedger()
    ledger.add(entry("\n"), 0, 1)
    ledger.add(entry(" Hi"), 1, 4)
    assert texts(ledger.release(shown=4, lead=2)) == [" Hi"]
    (kept,) = ledger.kept
    assert (kept.text_offset, kept.text_end) == (0, 2)


def test_a_token_ending_inside_a_character_comes_out_with_the_one_completing_it() -> None:
    ledger = LogprobLedger()
    # "é" is two bytes, one per token: the first shows nothing, and ends with the character
    ledger.add(TokenLogprob(1, b"\xc3", -0.5, ()), 0, 1)
    assert ledger.release(shown=0, lead=0) == ()
    ledger.add(TokenLogprob(2, b"\xa9", -0.1, ()), 0, 1)
    assert [e.token for e in ledger.release(shown=1, lead=0)] == [1, 2]


def test_without_a_stop_every_held_token_comes_out_at_the_end() -> None:
    ledger = LogprobLedger()
    ledger.add(TokenLogprob(1, b"\xe2\x80", -0.5, ()), 0, 1)  # the reply ended mid-character
    assert [e.token for e in ledger.finish(shown=1, lead=0, stopped=False)] == [1]


# ---- the real model --------------------------------------------------------------------------


def exact_config(model: Path, n_parallel: int = 1) -> EngineConfig:
    # Flash attention makes llama.cpp's CPU attention batch-invariant (see test_batch.py).
    return EngineConfig(
        model_path=str(model),
        n_ctx=512,
        n_parallel=n_parallel,
        flash_attn=True,
        n_threads=1,
        n_threads_batch=1,
    )


@pytest.fixture(scope="module")
def single(chat_model_file: Path) -> Iterator[Engine]:
    engine = Engine(exact_config(chat_model_file))
    yield engine
    engine.close()


def fresh_reply(engine: Engine, sampling: SamplingParams, **callbacks: object) -> GenerationResult:
    engine.clear_cache()  # re-evaluating a cached prefix rounds differently (test_batch.py)
    return engine.chat(QUESTION, sampling, **callbacks)  # type: ignore[arg-type]


def test_greedy_logprobs_cover_the_reply_and_rank_the_chosen_token_first(single: Engine) -> None:
    result = fresh_reply(single, GREEDY_LOGPROBS)
    assert result.logprobs is not None
    assert "".join(texts(result.logprobs)) == result.text
    for item in result.logprobs:
        assert item.logprob <= 0
        assert len(item.top) == 3
        assert [t.logprob for t in item.top] == sorted((t.logprob for t in item.top), reverse=True)
        assert item.top[0].token == item.token and item.top[0].logprob == item.logprob
        assert sum(math.exp(t.logprob) for t in item.top) <= 1 + 1e-9
    assert single.chat(QUESTION, SamplingParams(temperature=0, max_tokens=4)).logprobs is None


def test_streamed_entries_never_run_ahead_of_the_text(single: Engine) -> None:
    shown: list[str] = []
    received: list[TokenLogprob] = []
    ahead: list[str] = []

    def on_text(piece: str) -> None:
        shown.append(piece)
        if not "".join(shown).startswith("".join(texts(tuple(received)))):
            ahead.append(piece)

    result = fresh_reply(single, GREEDY_LOGPROBS, on_text=on_text, on_logprobs=received.extend)
    assert ahead == []
    assert tuple(received) == result.logprobs


def test_a_stop_inside_a_token_keeps_that_token_and_drops_the_rest(single: Engine) -> None:
    whole = fresh_reply(single, GREEDY_LOGPROBS).logprobs
    assert whole is not None
    # a word of the reply, in the middle, found nowhere earlier: the stop cuts after its space
    index, word = next(
        (i, item.text[1:])
        for i, item in enumerate(whole)
        if i >= 3
        and item.text.startswith(" ")
        and len(item.text) > 3
        and "".join(texts(whole)).find(item.text[1:]) == item.text_offset + 1
    )
    received: list[TokenLogprob] = []
    stopped = fresh_reply(
        single,
        SamplingParams(temperature=0, max_tokens=16, logprobs=3, stop=(word,)),
        on_logprobs=received.extend,
    )
    assert stopped.metrics.stop_reason == "stop"
    assert stopped.text == "".join(texts(whole))[: whole[index].text_offset + 1]
    assert stopped.logprobs == whole[: index + 1]
    assert tuple(received) == stopped.logprobs


def test_batched_greedy_logprobs_equal_single_sequence_ones(
    single: Engine, chat_model_file: Path
) -> None:
    alone = fresh_reply(single, GREEDY_LOGPROBS)
    batched = Engine(exact_config(chat_model_file, n_parallel=2))
    try:
        neighbour: list[GenerationResult] = []
        other = threading.Thread(
            target=lambda: neighbour.append(
                batched.chat([ChatMessage("user", "Count to five.")], GREEDY_LOGPROBS)
            )
        )
        other.start()
        beside = batched.chat(QUESTION, GREEDY_LOGPROBS)
        other.join(60)
    finally:
        batched.close()
    assert neighbour and neighbour[0].logprobs
    assert alone.logprobs is not None and beside.logprobs is not None
    assert [e.token for e in beside.logprobs] == [e.token for e in alone.logprobs]
    for lone, batch in zip(alone.logprobs, beside.logprobs, strict=True):
        assert batch.logprob == pytest.approx(lone.logprob, abs=1e-3)
        assert [t.token for t in batch.top] == [t.token for t in lone.top]
