"""The engine on the real default model (Gemma 3 270M Q4_K_M) on this machine's CPU."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from llama_cpp.llama_grammar import json_schema_to_gbnf

from hearthside.core.engine.config import EngineConfig, SamplingParams
from hearthside.core.engine.engine import ChatMessage, Engine
from hearthside.core.errors import (
    ContextOverflowError,
    EngineError,
    EngineLoadError,
    ModelFileError,
)
from tests.gguf_samples import write_tiny_gguf
from tests.timing import Try, best_of, cancel_bound_s, decode_step_s

GREEDY = SamplingParams(temperature=0.0, max_tokens=48)
COLOURS = ("red", "blue", "green", "yellow", "purple", "orange", "black", "white", "pink")


@pytest.fixture(scope="module")
def engine(default_model_file: Path) -> Iterator[Engine]:
    loaded = Engine(EngineConfig(model_path=str(default_model_file), n_ctx=4096))
    yield loaded
    loaded.close()


def ask(text: str) -> list[ChatMessage]:
    return [ChatMessage("user", text)]


def test_answers_a_simple_question_sensibly(engine: Engine) -> None:
    result = engine.chat(ask("Name a colour."), GREEDY)
    assert any(colour in result.text.lower() for colour in COLOURS), result.text
    assert result.text == result.text.strip()
    assert result.metrics.stop_reason in ("eos", "stop", "length")


def test_greedy_output_is_deterministic(engine: Engine) -> None:
    first = engine.chat(ask("Write one sentence about the sea."), GREEDY)
    engine.chat(ask("Something else entirely, to change the cache."), GREEDY)
    second = engine.chat(ask("Write one sentence about the sea."), GREEDY)
    assert first.text and first.text == second.text


def test_a_seed_applies_to_its_own_request_only(engine: Engine) -> None:
    """After one seeded request, unseeded ones are random again (a seed used to stick)."""
    question = ask("Write one sentence about the sea.")

    def reply(seed: int | None) -> str:
        return engine.chat(question, SamplingParams(temperature=1.0, max_tokens=24, seed=seed)).text

    seeded = reply(42)
    assert reply(42) == seeded  # a seed still reproduces its reply
    unseeded = [reply(None) for _ in range(4)]
    assert len(set(unseeded)) > 1, unseeded
    assert unseeded.count(seeded) <= 1, unseeded


def test_streamed_pieces_add_up_to_the_reply(engine: Engine) -> None:
    pieces: list[str] = []
    result = engine.chat(ask("Count from one to five."), GREEDY, on_text=pieces.append)
    assert len(pieces) > 3
    assert "".join(pieces) == result.text


def test_metrics_describe_the_generation(engine: Engine) -> None:
    result = engine.chat(
        ask("Write one sentence about the sea."), SamplingParams(temperature=0, max_tokens=20)
    )
    metrics = result.metrics
    assert metrics.completion_tokens == 20 and metrics.stop_reason == "length"
    assert metrics.prompt_tokens > 5
    assert metrics.ttft_s is not None and 0 < metrics.ttft_s < 10
    assert metrics.decode_tok_s is not None and metrics.decode_tok_s > 1
    assert metrics.prompt_tok_s is not None and metrics.prompt_tok_s > 1


def test_stop_sequence_ends_the_reply_before_it(engine: Engine) -> None:
    question = ask("Write one sentence about the sea.")
    free = engine.chat(question, GREEDY).text
    words = [word for word in free.split() if len(word) > 3]
    assert len(words) >= 2, free
    stop = words[1]
    stopped = engine.chat(question, SamplingParams(temperature=0, max_tokens=48, stop=(stop,)))
    assert stopped.metrics.stop_reason == "stop"
    assert stop not in stopped.text
    assert free.startswith(stopped.text)
    assert stopped.text == free[: free.index(stop)]


def test_turn_two_evaluates_only_the_new_tokens(engine: Engine) -> None:
    history = ask("My name is Ada. Say hello to me.")
    first = engine.chat(history, GREEDY)
    history += [ChatMessage("assistant", first.text), ChatMessage("user", "What is my name?")]
    turn_two_tokens = engine.tokenize_prompt(engine.render_chat(history))
    second = engine.chat(history, GREEDY)
    new_tokens = len(turn_two_tokens) - first.metrics.prompt_tokens
    assert second.metrics.prompt_tokens == len(turn_two_tokens)
    # Nothing of turn one's prompt is evaluated again; at most its reply's last token and the
    # new turn are.
    assert second.metrics.prompt_tokens_evaluated <= new_tokens
    assert second.metrics.prompt_tokens_evaluated < second.metrics.prompt_tokens / 2


def measured_decode_step_s(engine: Engine) -> float:
    """The baseline for the cancel bounds: one decode step of this model on this machine now."""
    sampling = SamplingParams(temperature=0, max_tokens=8)  # 7 steps: enough for a rate
    result = engine.chat(ask("Write one sentence about the sea."), sampling)
    return decode_step_s(result.metrics.decode_tok_s)


def test_cancel_during_decode_stops_within_250_ms(engine: Engine) -> None:
    bound_s = cancel_bound_s(measured_decode_step_s(engine))

    def stop_after_the_first_piece() -> Try:
        cancel = threading.Event()
        cancelled_at: list[float] = []

        def on_text(_piece: str) -> None:
            if not cancel.is_set():
                cancel.set()
                cancelled_at.append(time.perf_counter())

        result = engine.chat(
            ask("Write a very long story about a lighthouse."),
            SamplingParams(temperature=0, max_tokens=1000),
            on_text=on_text,
            cancel=cancel,
        )
        assert result.metrics.stop_reason == "cancelled"
        assert result.metrics.completion_tokens < 5
        return Try(time.perf_counter() - cancelled_at[0], bound_s)

    taken = best_of(stop_after_the_first_piece)
    assert any(t.within for t in taken), taken


def test_cancel_during_a_long_prompt_stops_within_250_ms(engine: Engine) -> None:
    long_prompt = "Summarise this. " + " ".join(f"Line {i} says something." for i in range(500))
    bound_s = cancel_bound_s(measured_decode_step_s(engine))

    def stop_while_reading() -> Try:
        engine.clear_cache()  # each try reads the whole prompt again
        cancel = threading.Event()
        timer = threading.Timer(0.3, cancel.set)
        timer.start()
        result = engine.chat(ask(long_prompt), GREEDY, cancel=cancel)
        assert result.metrics.stop_reason == "cancelled"
        assert result.metrics.completion_tokens == 0
        return Try(result.metrics.total_s - 0.3, bound_s)

    taken = best_of(stop_while_reading)
    assert any(t.within for t in taken), taken
    # The engine is still usable afterwards.
    assert engine.chat(ask("Name a colour."), GREEDY).text


def test_over_long_prompt_is_a_typed_error(default_model_file: Path) -> None:
    small = Engine(EngineConfig(model_path=str(default_model_file), n_ctx=128))
    try:
        with pytest.raises(ContextOverflowError) as error:
            small.chat(ask("word " * 400), GREEDY)
        assert f"context of {small.n_ctx} tokens" in error.value.message
        assert error.value.hint
    finally:
        small.close()


def test_reply_stops_when_the_context_is_full(default_model_file: Path) -> None:
    small = Engine(EngineConfig(model_path=str(default_model_file), n_ctx=256))
    try:
        filler = "The lighthouse stands by the sea. " * 28
        result = small.chat(ask(filler + "Continue this text."), SamplingParams(temperature=0))
        assert result.metrics.stop_reason == "context_full", result.text
        assert result.metrics.prompt_tokens + result.metrics.completion_tokens == small.n_ctx
    finally:
        small.close()


def test_corrupt_file_is_refused_before_native_load(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    with pytest.raises(ModelFileError):
        Engine(EngineConfig(model_path=str(corrupt)))


def test_missing_file_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError):
        Engine(EngineConfig(model_path=str(tmp_path / "nowhere.gguf")))


def test_an_engine_older_than_the_floor_is_refused(
    monkeypatch: pytest.MonkeyPatch, default_model_file: Path
) -> None:
    import llama_cpp

    monkeypatch.setattr(llama_cpp, "__version__", "0.3.35")
    with pytest.raises(EngineLoadError, match="older than 0.3.36") as error:
        Engine(EngineConfig(model_path=str(default_model_file)))
    assert "setup command" in (error.value.hint or "")


def test_a_file_llama_cpp_refuses_is_a_typed_load_error(tmp_path: Path) -> None:
    # Structurally valid (the validator passes it) but without the model's hyperparameters.
    refused = write_tiny_gguf(tmp_path / "no-hparams.gguf")
    with pytest.raises(EngineLoadError) as error:
        Engine(EngineConfig(model_path=str(refused)))
    assert "could not load no-hparams.gguf" in error.value.message
    assert error.value.hint


def test_out_of_memory_at_load_says_what_failed(default_model_file: Path) -> None:
    # Ten million tokens of KV cache is ~180 GB for this model: the allocation must fail.
    with pytest.raises(EngineLoadError) as error:
        Engine(EngineConfig(model_path=str(default_model_file), n_ctx=10_000_000))
    assert "allocate" in error.value.message
    assert "smaller context" in (error.value.hint or "")


def test_a_grammar_makes_the_reply_valid_json(engine: Engine) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string"}, "count": {"type": "integer"}},
        "required": ["colour", "count"],
    }
    grammar = json_schema_to_gbnf(json.dumps(schema))
    result = engine.chat(
        ask("Name a colour and a number."),
        SamplingParams(temperature=0, max_tokens=60, grammar=grammar),
    )
    reply = json.loads(result.text)
    assert isinstance(reply["colour"], str) and isinstance(reply["count"], int)


def test_an_invalid_grammar_is_refused_without_crashing(engine: Engine) -> None:
    with pytest.raises(EngineError, match="could not be turned into a grammar"):
        engine.chat(ask("hi"), SamplingParams(temperature=0, max_tokens=4, grammar="root ::= (("))
    assert engine.chat(ask("Name a colour."), GREEDY).text
