"""Chat templates render in a capped sandbox: hostile templates fail fast and cleanly."""

from __future__ import annotations

import sys
import time

import pytest

from hearthside.core.engine.templates import ChatTemplate
from hearthside.core.errors import TemplateError

GEMMA_LIKE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
HELLO = [{"role": "user", "content": "Hello"}]


def test_renders_messages_with_the_generation_prompt() -> None:
    template = ChatTemplate(GEMMA_LIKE, bos_token="<bos>")
    text = template.render([*HELLO, {"role": "assistant", "content": "Hi!"}])
    assert text == (
        "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi!<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_missing_template_means_a_question_and_answer_transcript() -> None:
    template = ChatTemplate(None)
    assert template.is_transcript
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello "},
        {"role": "assistant", "content": " Hi!"},
        {"role": "user", "content": "Name a colour."},
    ]
    assert template.render(conversation) == (
        "Be brief.\n\nQuestion: Hello\nAnswer: Hi!\n\nQuestion: Name a colour.\nAnswer:"
    )
    assert template.stop_sequences == ("\nQuestion:",)


def test_runaway_loop_is_stopped_by_the_time_cap() -> None:
    looping = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    template = ChatTemplate(looping, time_limit_s=0.2)
    start = time.monotonic()
    with pytest.raises(TemplateError, match="ran longer than"):
        template.render(HELLO)
    assert time.monotonic() - start < 1.0
    assert sys.gettrace() is None or "deadline" not in repr(sys.gettrace())


@pytest.mark.parametrize(
    "source",
    [
        "{{ 'x' * 100000000 }}",
        "{{ [1] * 100000000 }}",
        "{{ 10 ** 100000000 }}",
        "{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}",
    ],
)
def test_oversized_output_is_refused_quickly(source: str) -> None:
    start = time.monotonic()
    with pytest.raises(TemplateError):
        ChatTemplate(source).render(HELLO)
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.append({'role': 'x'}) }}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    ],
)
def test_sandbox_escapes_are_refused(source: str) -> None:
    with pytest.raises(TemplateError):
        ChatTemplate(source).render(HELLO)


def test_raise_exception_in_a_template_becomes_a_template_error() -> None:
    template = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(TemplateError, match="roles must alternate"):
        template.render(HELLO)


def test_invalid_jinja_is_reported_when_loading() -> None:
    with pytest.raises(TemplateError, match="not valid Jinja"):
        ChatTemplate("{% for %}")
