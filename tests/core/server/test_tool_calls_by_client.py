"""Tool calls through every client library issue 34 names, each unchanged, against a real
server on loopback serving the real default chat model (SmolLM2 135M Instruct, greedy): the
`openai` SDK, Anthropic's SDK (/v1/messages), langchain-openai's `ChatOpenAI` and LiteLLM.
For each: a call of a function named in `tool_choice`, two calls in one reply, and a tool
result sent back and answered. Every call runs under the client's own 30 s timeout (what the
issue allows on the 2-core CI machine), so a slow call fails here rather than waits.

Nothing here may reach the network: LiteLLM uses its bundled cost map, LangSmith stays off.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import anthropic
import openai
import pytest

from tests.core.server.test_api import KEY, Running, serving

pytestmark = [
    pytest.mark.filterwarnings("ignore:Item .* `ReadOnly` qualifier:UserWarning"),
    pytest.mark.beside,
]
CALL_TIMEOUT_S = 30.0
OFFLINE_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LANGSMITH_TRACING": "false"}
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
FUNCTIONS = {
    "get_weather": "The current weather in a city.",
    "get_time": "The current time in a city.",
}
QUESTION = "What is the weather in Paris?"
RESULT = "18 degrees and sunny"
# An earlier turn with two calls: with it SmolLM2 answers a two-city question with two calls
# (without, with one); tests/core/server/test_parallel_tools.py shows the same for chat.
EARLIER = (("call_1", "Rome", "Sunny"), ("call_2", "Oslo", "Rain"))
EARLIER_QUESTION = "What is the weather in Rome and in Oslo?"
EARLIER_ANSWER = "Rome is sunny and Oslo is rainy."
TWO_CITIES = "What is the weather in Paris and in Tokyo?"

Call = tuple[str, dict[str, Any]]  # a function's name and its arguments


@dataclass(frozen=True)
class Answer:
    """The reply to a tool's result: text, or (a small model often asks again) calls."""

    text: str
    calls: list[Call]
    prompt_tokens: int


class ToolClient(Protocol):
    """One client library's way of making the three kinds of request."""

    def named_call(self, name: str) -> Call: ...
    def two_calls(self) -> list[Call]: ...
    def first_call(self) -> tuple[Call, str, int]: ...  # the call, its id, the prompt's tokens
    def answer_with(self, call: Call, call_id: str, result: str) -> Answer: ...


@pytest.fixture(scope="module", autouse=True)
def offline_env() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in OFFLINE_ENV.items():
            patch.setenv(name, value)
        yield


@pytest.fixture(scope="module")
def server(chat_model_file: Path) -> Iterator[Running]:
    with serving(chat_model_file, max_queue=8) as running:
        yield running


def openai_tools() -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": n, "description": d, "parameters": CITY}}
        for n, d in FUNCTIONS.items()
    ]


def openai_call(call_id: str, name: str, city: str) -> dict[str, Any]:
    function = {"name": name, "arguments": json.dumps({"city": city})}
    return {"id": call_id, "type": "function", "function": function}


def openai_history() -> list[dict[str, Any]]:
    """The earlier two-call turn, then the two-city question, as chat messages."""
    calls = [openai_call(call_id, "get_weather", city) for call_id, city, _ in EARLIER]
    results = [{"role": "tool", "tool_call_id": i, "content": r} for i, _, r in EARLIER]
    return [
        {"role": "user", "content": EARLIER_QUESTION},
        {"role": "assistant", "content": None, "tool_calls": calls},
        *results,
        {"role": "assistant", "content": EARLIER_ANSWER},
        {"role": "user", "content": TWO_CITIES},
    ]


def round_trip_messages(call: Call, call_id: str, result: str) -> list[dict[str, Any]]:
    name, arguments = call
    return [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": name, "arguments": json.dumps(arguments)}}]},
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]  # fmt: skip


def named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


# ---- the openai SDK --------------------------------------------------------------------------


class OpenAIClient:
    def __init__(self, server: Running) -> None:
        self.client = openai.OpenAI(
            base_url=server.base, api_key=KEY, max_retries=0, timeout=CALL_TIMEOUT_S
        )
        self.model = self.client.models.list().data[0].id

    def _create(self, messages: list[dict[str, Any]], **request: Any) -> Any:
        return self.client.chat.completions.create(
            model=self.model, messages=messages, temperature=0, max_tokens=64, **request
        )

    def _calls(self, reply: Any) -> list[Call]:
        assert reply.choices[0].finish_reason == "tool_calls", reply.choices[0].message
        calls = reply.choices[0].message.tool_calls or []
        return [(c.function.name, json.loads(c.function.arguments)) for c in calls]

    def named_call(self, name: str) -> Call:
        user = {"role": "user", "content": QUESTION}
        (call,) = self._calls(self._create([user], tools=openai_tools(), tool_choice=named(name)))
        return call

    def two_calls(self) -> list[Call]:
        reply = self._create(openai_history(), tools=openai_tools(), tool_choice="required")
        assert len({call.id for call in reply.choices[0].message.tool_calls or []}) == 2
        return self._calls(reply)

    def first_call(self) -> tuple[Call, str, int]:
        user = {"role": "user", "content": QUESTION}
        reply = self._create([user], tools=openai_tools(), tool_choice=named("get_weather"))
        (call,) = reply.choices[0].message.tool_calls
        arguments = json.loads(call.function.arguments)
        return (call.function.name, arguments), call.id, reply.usage.prompt_tokens

    def answer_with(self, call: Call, call_id: str, result: str) -> Answer:
        reply = self._create(round_trip_messages(call, call_id, result), tools=openai_tools())
        calls = self._calls(reply) if reply.choices[0].message.tool_calls else []
        text = reply.choices[0].message.content or ""
        return Answer(text, calls, reply.usage.prompt_tokens)


# ---- Anthropic's SDK -------------------------------------------------------------------------


def anthropic_tools() -> list[Any]:
    return [{"name": n, "description": d, "input_schema": CITY} for n, d in FUNCTIONS.items()]


class AnthropicClient:
    def __init__(self, server: Running) -> None:
        root = server.base.removesuffix("/v1")
        self.client = anthropic.Anthropic(
            base_url=root, api_key=KEY, max_retries=0, timeout=CALL_TIMEOUT_S
        )
        self.model = openai.OpenAI(base_url=server.base, api_key=KEY).models.list().data[0].id

    def _create(self, messages: list[Any], **request: Any) -> Any:
        return self.client.messages.create(
            model=self.model,
            max_tokens=64,
            messages=messages,
            tools=anthropic_tools(),
            extra_body={"temperature": 0},  # the SDK no longer takes it; the server reads it
            **request,
        )

    def _calls(self, reply: Any) -> list[Call]:
        assert reply.stop_reason == "tool_use", reply.content
        return [(block.name, block.input) for block in reply.content if block.type == "tool_use"]

    def named_call(self, name: str) -> Call:
        user = {"role": "user", "content": QUESTION}
        (call,) = self._calls(self._create([user], tool_choice={"type": "tool", "name": name}))
        return call

    def two_calls(self) -> list[Call]:
        uses = [
            {"type": "tool_use", "id": f"toolu_{i}", "name": "get_weather", "input": {"city": c}}
            for i, c, _ in EARLIER
        ]
        results = [
            {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": r}
            for i, _, r in EARLIER
        ]
        messages = [
            {"role": "user", "content": EARLIER_QUESTION},
            {"role": "assistant", "content": uses},
            {"role": "user", "content": results},
            {"role": "assistant", "content": EARLIER_ANSWER},
            {"role": "user", "content": TWO_CITIES},
        ]
        reply = self._create(messages, tool_choice={"type": "any"})
        ids = {block.id for block in reply.content if block.type == "tool_use"}
        assert len(ids) == 2
        return self._calls(reply)

    def first_call(self) -> tuple[Call, str, int]:
        user = {"role": "user", "content": QUESTION}
        reply = self._create([user], tool_choice={"type": "tool", "name": "get_weather"})
        (block,) = reply.content
        return (block.name, block.input), block.id, reply.usage.input_tokens

    def answer_with(self, call: Call, call_id: str, result: str) -> Answer:
        name, arguments = call
        use = {"type": "tool_use", "id": call_id, "name": name, "input": arguments}
        answer = {"type": "tool_result", "tool_use_id": call_id, "content": result}
        messages = [
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [answer]},
        ]
        reply = self._create(messages)
        calls = self._calls(reply) if reply.stop_reason == "tool_use" else []
        text = "".join(block.text for block in reply.content if block.type == "text")
        return Answer(text, calls, reply.usage.input_tokens)


# ---- langchain-openai ------------------------------------------------------------------------


class LangChainClient:
    def __init__(self, server: Running) -> None:
        from langchain_openai import ChatOpenAI

        model = openai.OpenAI(base_url=server.base, api_key=KEY).models.list().data[0].id
        self.llm = ChatOpenAI(
            model=model,
            base_url=server.base,
            api_key=KEY,  # type: ignore[arg-type]
            temperature=0,
            max_tokens=64,
            max_retries=0,
            timeout=CALL_TIMEOUT_S,
        )

    def _calls(self, reply: Any) -> list[Call]:
        assert reply.response_metadata["finish_reason"] == "tool_calls", reply
        return [(call["name"], call["args"]) for call in reply.tool_calls]

    def named_call(self, name: str) -> Call:
        bound = self.llm.bind_tools(openai_tools(), tool_choice=name)
        (call,) = self._calls(bound.invoke(QUESTION))
        return call

    def two_calls(self) -> list[Call]:
        from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

        earlier_calls = [
            {"name": "get_weather", "args": {"city": city}, "id": call_id}
            for call_id, city, _ in EARLIER
        ]
        messages = [
            HumanMessage(EARLIER_QUESTION),
            AIMessage("", tool_calls=earlier_calls),
            *(ToolMessage(result, tool_call_id=call_id) for call_id, _, result in EARLIER),
            AIMessage(EARLIER_ANSWER),
            HumanMessage(TWO_CITIES),
        ]
        reply = self.llm.bind_tools(openai_tools(), tool_choice="any").invoke(messages)
        assert len({call["id"] for call in reply.tool_calls}) == 2
        return self._calls(reply)

    def first_call(self) -> tuple[Call, str, int]:
        reply = self.llm.bind_tools(openai_tools(), tool_choice="get_weather").invoke(QUESTION)
        (call,) = reply.tool_calls
        return (call["name"], call["args"]), call["id"], reply.usage_metadata["input_tokens"]

    def answer_with(self, call: Call, call_id: str, result: str) -> Answer:
        from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

        name, arguments = call
        messages = [
            HumanMessage(QUESTION),
            AIMessage("", tool_calls=[{"name": name, "args": arguments, "id": call_id}]),
            ToolMessage(result, tool_call_id=call_id),
        ]
        reply = self.llm.bind_tools(openai_tools()).invoke(messages)
        calls = self._calls(reply) if reply.tool_calls else []
        return Answer(str(reply.content), calls, reply.usage_metadata["input_tokens"])


# ---- LiteLLM ---------------------------------------------------------------------------------


class LiteLLMClient:
    def __init__(self, server: Running) -> None:
        self.litellm: ModuleType = importlib.import_module("litellm")
        self.litellm.suppress_debug_info = True
        self.server = server
        model = openai.OpenAI(base_url=server.base, api_key=KEY).models.list().data[0].id
        self.model = f"openai/{model}"

    def _create(self, messages: list[dict[str, Any]], **request: Any) -> Any:
        return self.litellm.completion(
            model=self.model,
            api_base=self.server.base,
            api_key=KEY,
            messages=messages,
            tools=openai_tools(),
            temperature=0,
            max_tokens=64,
            num_retries=0,
            timeout=CALL_TIMEOUT_S,
            **request,
        )

    def _calls(self, reply: Any) -> list[Call]:
        assert reply.choices[0].finish_reason == "tool_calls", reply.choices[0].message
        calls = reply.choices[0].message.tool_calls or []
        return [(c.function.name, json.loads(c.function.arguments)) for c in calls]

    def named_call(self, name: str) -> Call:
        user = {"role": "user", "content": QUESTION}
        (call,) = self._calls(self._create([user], tool_choice=named(name)))
        return call

    def two_calls(self) -> list[Call]:
        reply = self._create(openai_history(), tool_choice="required")
        assert len({call.id for call in reply.choices[0].message.tool_calls or []}) == 2
        return self._calls(reply)

    def first_call(self) -> tuple[Call, str, int]:
        user = {"role": "user", "content": QUESTION}
        reply = self._create([user], tool_choice=named("get_weather"))
        (call,) = reply.choices[0].message.tool_calls
        arguments = json.loads(call.function.arguments)
        return (call.function.name, arguments), call.id, reply.usage.prompt_tokens

    def answer_with(self, call: Call, call_id: str, result: str) -> Answer:
        reply = self._create(round_trip_messages(call, call_id, result))
        calls = self._calls(reply) if reply.choices[0].message.tool_calls else []
        text = reply.choices[0].message.content or ""
        return Answer(text, calls, reply.usage.prompt_tokens)


CLIENTS = {
    "openai": OpenAIClient,
    "anthropic": AnthropicClient,
    "langchain": LangChainClient,
    "litellm": LiteLLMClient,
}


@pytest.fixture(scope="module", params=list(CLIENTS))
def client(request: pytest.FixtureRequest, server: Running) -> ToolClient:
    made: ToolClient = CLIENTS[request.param](server)
    return made


def test_a_function_named_in_tool_choice_is_the_one_called(client: ToolClient) -> None:
    name, arguments = client.named_call("get_time")  # the second of the two tools offered
    assert name == "get_time"
    assert isinstance(arguments["city"], str) and arguments["city"]


def test_two_cities_get_two_calls_in_one_reply(client: ToolClient) -> None:
    calls = client.two_calls()
    assert [name for name, _ in calls] == ["get_weather", "get_weather"]
    assert [arguments["city"] for _, arguments in calls] == ["Paris", "Tokyo"]


def test_a_tool_result_sent_back_is_answered(client: ToolClient) -> None:
    call, call_id, first_prompt_tokens = client.first_call()
    assert call[0] == "get_weather" and call_id
    answer = client.answer_with(call, call_id, RESULT)
    # an answer in words, or calls parsed as calls: never call syntax as the answer's text
    assert answer.calls or answer.text.strip()
    assert '"arguments"' not in answer.text
    assert all(name in FUNCTIONS for name, _ in answer.calls)
    # the call and its result went into the prompt the answer was written from
    assert answer.prompt_tokens > first_prompt_tokens
    longer = client.answer_with(call, call_id, RESULT + ", with a light breeze from the west")
    assert longer.prompt_tokens > answer.prompt_tokens
