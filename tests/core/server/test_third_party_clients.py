"""Third-party OpenAI clients, unchanged, against a real server on loopback serving the real
default model: langchain-openai's `ChatOpenAI` and LiteLLM's `completion`.

Nothing here may reach the network (the test machines have none): LiteLLM fetches its model
cost map from GitHub at import unless told to use its bundled copy, and points tiktoken at the
encodings it bundles; LangSmith tracing stays off.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic import BaseModel, Field

from tests.core.server.test_api import KEY, WEATHER_TOOL, Running, serving

# LiteLLM's own types trip a pydantic warning on import; it says nothing about our API.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Item .* `ReadOnly` qualifier:UserWarning"),
    pytest.mark.beside,
]
OFFLINE_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LANGSMITH_TRACING": "false"}
QUESTION = "What is the capital of France? Answer in one word."
OVERFLOW = "word " * 2100  # the server loads the model with n_ctx 2048


@pytest.fixture(scope="module", autouse=True)
def offline_env() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in OFFLINE_ENV.items():
            patch.setenv(name, value)
        yield


@pytest.fixture(scope="module")
def server(default_model_file: Path) -> Iterator[Running]:
    with serving(default_model_file, max_queue=8) as running:
        yield running


@pytest.fixture(scope="module")
def model_id(server: Running) -> str:
    return server.client.models.list().data[0].id


@pytest.fixture(scope="module")
def litellm() -> ModuleType:
    """LiteLLM, imported with its offline settings (`offline_env`: they are read at import)."""
    module = importlib.import_module("litellm")
    module.suppress_debug_info = True  # no "Give Feedback / Get Help" banner on errors
    return module


# ---- langchain-openai ------------------------------------------------------------------------


def chat_model(server: Running, model_id: str, **extra: Any) -> Any:
    from langchain_openai import ChatOpenAI

    settings: dict[str, Any] = {"temperature": 0, "max_tokens": 16, "max_retries": 0, **extra}
    return ChatOpenAI(model=model_id, base_url=server.base, api_key=KEY, **settings)


def test_langchain_invoke_answers(server: Running, model_id: str) -> None:
    reply = chat_model(server, model_id).invoke(QUESTION)
    assert "Paris" in reply.content
    assert reply.usage_metadata["output_tokens"] > 0
    assert reply.response_metadata["finish_reason"] in ("stop", "length")


def test_langchain_stream_gives_the_same_text(server: Running, model_id: str) -> None:
    llm = chat_model(server, model_id)
    whole = llm.invoke(QUESTION).content
    pieces = [chunk.content for chunk in llm.stream(QUESTION)]
    assert len(pieces) > 1 and "".join(pieces) == whole


class Capital(BaseModel):
    """The capital city of a country."""

    country: str = Field(description="the country")
    city: str = Field(description="its capital city")


def test_langchain_structured_output_parses_into_the_model(server: Running, model_id: str) -> None:
    llm = chat_model(server, model_id, max_tokens=32)
    answer = llm.with_structured_output(Capital).invoke("What is the capital of France?")
    assert isinstance(answer, Capital) and answer.city and answer.country


class GetWeather(BaseModel):
    """Current weather in a city."""

    city: str = Field(description="the city")


def test_langchain_bound_tool_is_called(server: Running, model_id: str) -> None:
    llm = chat_model(server, model_id, max_tokens=32)
    bound = llm.bind_tools([GetWeather], tool_choice="GetWeather", parallel_tool_calls=False)
    reply = bound.invoke("What is the weather in Paris?")
    (call,) = reply.tool_calls
    assert call["name"] == "GetWeather" and isinstance(call["args"]["city"], str)
    assert call["id"]


# ---- LiteLLM ---------------------------------------------------------------------------------


def litellm_call(litellm: ModuleType, server: Running, model_id: str, **request: Any) -> Any:
    return litellm.completion(
        model=f"openai/{model_id}",
        api_base=server.base,
        api_key=KEY,
        temperature=0,
        num_retries=0,
        **{"max_tokens": 16, **request},
    )


def test_litellm_completion_answers(litellm: ModuleType, server: Running, model_id: str) -> None:
    reply = litellm_call(
        litellm, server, model_id, messages=[{"role": "user", "content": QUESTION}]
    )
    assert "Paris" in reply.choices[0].message.content
    assert reply.usage.completion_tokens > 0


def test_litellm_stream_gives_the_same_text(
    litellm: ModuleType, server: Running, model_id: str
) -> None:
    messages = [{"role": "user", "content": QUESTION}]
    whole = litellm_call(litellm, server, model_id, messages=messages).choices[0].message.content
    chunks = list(litellm_call(litellm, server, model_id, messages=messages, stream=True))
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == whole
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_litellm_tool_call_arguments_parse(
    litellm: ModuleType, server: Running, model_id: str
) -> None:
    reply = litellm_call(
        litellm,
        server,
        model_id,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=32,
    )
    assert reply.choices[0].finish_reason == "tool_calls"
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_litellm_recognises_a_context_overflow(
    litellm: ModuleType, server: Running, model_id: str, stream: bool
) -> None:
    messages = [{"role": "user", "content": OVERFLOW}]
    with pytest.raises(litellm.ContextWindowExceededError):
        reply = litellm_call(litellm, server, model_id, messages=messages, stream=stream)
        if stream:
            list(reply)
