"""Speculative decoding with several slots: a sequence generating alone speculates, one with
company does not, and greedy tokens are the plain ones either way.

The engine evaluates one token per ubatch (`n_ubatch=1`), as the exactness tests in
test_speculative.py do: llama.cpp's CPU kernels round a token differently inside a batch
(a verify step, a prompt chunk, a neighbour's token) than alone, so only then must drafting,
verifying and rolling back the rejected cells give exactly the plain tokens. The real default
model (SmolLM2 135M) on one thread, as in test_batch.py. The prompts stay cached in the
slots from test to test (with one token per ubatch a cached prompt's cells are the ones a
fresh evaluation would write), so each is evaluated once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hearthside.core.engine.config import EngineConfig, SamplingParams, SpeculativeConfig
from hearthside.core.engine.engine import ChatMessage, Engine, GenerationResult
from hearthside.core.engine.metrics import SpeculationStats

pytestmark = pytest.mark.beside

LOOKUP = SpeculativeConfig(mode="prompt_lookup", draft_tokens=4, ngram_size=3)
REPEAT = (
    "Repeat exactly: the cat sat on the mat, the dog sat on the log, the bird sat on the "
    "wall, the fish swam in the pond, the fox ran in the wood, the cow stood in the field."
)
QUESTION = "Name a colour."


@pytest.fixture(scope="module")
def engine(chat_model_file: Path) -> Iterator[Engine]:
    """Two slots, speculating from the config it was loaded with."""
    loaded = Engine(
        EngineConfig(
            model_path=str(chat_model_file),
            n_ctx=512,
            n_parallel=2,
            n_ubatch=1,
            n_threads=1,
            n_threads_batch=1,
            speculative=LOOKUP,
        )
    )
    yield loaded
    loaded.close()


@pytest.fixture(autouse=True)
def lookup_again_after(engine: Engine) -> Iterator[None]:
    yield
    engine.set_speculative(LOOKUP)


def ask(text: str) -> list[ChatMessage]:
    return [ChatMessage("user", text)]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens)


def plain_steps(result: GenerationResult) -> int:
    """Steps that sampled one token without a draft call. Every token after the first comes
    from a step: a draft call (a verify, or a plain step when it found nothing) gives one
    sample plus the accepted drafts; a batched step beside others gives one sample."""
    stats = result.metrics.speculative
    assert stats is not None
    return len(result.tokens) - 1 - stats.steps - stats.accepted


def test_a_lone_sequence_speculates_and_gives_the_plain_greedy_tokens(engine: Engine) -> None:
    drafted = engine.chat(ask(REPEAT), greedy(24))
    with engine.speculation_paused():
        plain = engine.chat(ask(REPEAT), greedy(24))
    assert drafted.tokens == plain.tokens, (drafted.text, plain.text)
    stats = drafted.metrics.speculative
    assert stats is not None and stats.mode == "prompt_lookup" and plain.metrics.speculative is None
    assert stats.accepted >= 8 and stats.steps < drafted.metrics.completion_tokens / 2, stats
    assert plain_steps(drafted) <= 0  # alone, every step drafted (see plain_steps)


def test_a_second_request_pauses_speculation_until_it_is_done(engine: Engine) -> None:
    solo_first = engine.chat(ask(REPEAT), greedy(48))
    solo_second = engine.chat(ask(QUESTION), greedy(4))
    first_live: list[SpeculationStats | None] = []
    drafting = threading.Event()
    second_done: list[SpeculationStats | None] = []

    def on_first_text(_piece: str) -> None:
        live = engine.live_speculation()  # on its own thread: its own counts
        first_live.append(live)
        if live is not None and live.accepted > 0:
            drafting.set()

    def second() -> GenerationResult:
        assert drafting.wait(60)
        result = engine.chat(ask(QUESTION), greedy(4))
        second_done.append(engine.live_speculation())  # the first's, the one that drafts
        return result

    first_call = lambda: engine.chat(ask(REPEAT), greedy(48), on_text=on_first_text)  # noqa: E731
    first, beside = run_together([first_call, second])
    assert first.tokens == solo_first.tokens and beside.tokens == solo_second.tokens
    stats, at_second_end = first.metrics.speculative, second_done[0]
    assert stats is not None and at_second_end is not None and stats.accepted > 0
    # Every step the second was in a slot, the first took one plain sample beside it...
    assert plain_steps(first) >= len(beside.tokens) - 1, (stats, beside.tokens)
    assert beside.metrics.speculative is not None and beside.metrics.speculative.steps == 0
    # ...and once it was done, the first drafted again.
    assert stats.steps > at_second_end.steps, (stats, at_second_end)
    assert all(live is not None and live.mode == "prompt_lookup" for live in first_live)


def test_a_draft_model_speculates_for_a_lone_sequence(
    engine: Engine, chat_model_file: Path
) -> None:
    engine.set_speculative(
        SpeculativeConfig(mode="draft_model", draft_tokens=4, draft_model_path=str(chat_model_file))
    )
    drafted = engine.chat(ask(QUESTION), greedy(16))
    with engine.speculation_paused():
        plain = engine.chat(ask(QUESTION), greedy(16))
    assert drafted.tokens == plain.tokens
    stats = drafted.metrics.speculative
    # The model drafting for itself: its guesses are the target's own greedy choices.
    assert stats is not None and stats.mode == "draft_model", stats
    assert stats.acceptance_rate is not None and stats.acceptance_rate > 0.9, stats


def run_together(calls: list[Callable[[], GenerationResult]]) -> list[GenerationResult]:
    outcomes: list[GenerationResult | BaseException | None] = [None] * len(calls)

    def work(index: int) -> None:
        try:
            outcomes[index] = calls[index]()
        except BaseException as exc:
            outcomes[index] = exc

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads), "a request never returned"
    done = []
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is not None
        done.append(outcome)
    return done
