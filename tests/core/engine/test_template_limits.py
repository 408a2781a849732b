"""Hostile chat templates: every call that can grow a value is refused inside the call.

Each attack is a real template rendered by the real sandbox. Without the bounds, most of these
allocate gigabytes in one call (`'a'|center(8000000000)` was killed at 6 GB with no message);
now each ends in a clear TemplateError, quickly and with bounded memory.
"""

from __future__ import annotations

import time
import tracemalloc

import pytest

from hearthside.core.engine.templates import ChatTemplate
from hearthside.core.errors import TemplateError

HELLO = [{"role": "user", "content": "Hello"}]
TOO_LONG = "The chat template tried to build a string longer than the 4 MiB limit."
TOO_MANY_ITEMS = "The chat template tried to build a list of more than 4,194,304 items."
TOO_MUCH_WORK = "The chat template built more than 64 MiB of text while rendering one prompt"
TOO_BIG_A_NUMBER = "The chat template computed an oversized number."
# A list of 4 million references to one 4-million-character string: cheap to make, 16 TB to print.
HUGE_REFS = "(['x' * 4000000] * 4000000)"
MAX_PEAK_BYTES = 200 * 1024 * 1024

ATTACKS = {
    "center": ("{{ 'a'|center(8000000000)|length }}", TOO_LONG),
    "replace-filter": ("{{ ('a' * 4000000)|replace('a', 'bbbbbbbbbbbb') }}", TOO_LONG),
    "replace-empty-old": ("{{ ('a' * 3000000)|replace('', 'xx')|length }}", TOO_LONG),
    "concat-doubling": (
        "{% set ns = namespace(s='x' * 1000) %}{% for i in range(40) %}"
        "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
        TOO_LONG,
    ),
    "plus-doubling-strings": (
        "{% set ns = namespace(s='x' * 1000) %}{% for i in range(40) %}"
        "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
        TOO_LONG,
    ),
    "plus-doubling-lists": (
        "{% set ns = namespace(s=[1] * 1000) %}{% for i in range(40) %}"
        "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
        TOO_MANY_ITEMS,
    ),
    "join-filter": (f"{{{{ {HUGE_REFS}|join|length }}}}", TOO_LONG),
    "str-join-method": (f"{{{{ ''.join({HUGE_REFS})|length }}}}", TOO_LONG),
    "print-a-list": (f"{{{{ {HUGE_REFS} }}}}", TOO_LONG),
    "concat-a-list": (f"{{{{ {HUGE_REFS} ~ '' }}}}", TOO_LONG),
    "string-filter-on-a-list": (f"{{{{ {HUGE_REFS}|string|length }}}}", TOO_LONG),
    "print-a-namespace": (f"{{% set ns = namespace(x={HUGE_REFS}) %}}{{{{ ns }}}}", TOO_LONG),
    "print-dict-items": (f"{{{{ {{'a': {HUGE_REFS}}}.items() }}}}", TOO_LONG),
    "xmlattr": (f"{{{{ {{'a': {HUGE_REFS}}}|xmlattr }}}}", TOO_LONG),
    "format-filter": ("{{ '%8000000000s'|format('a')|length }}", TOO_LONG),
    "percent-width": ("{{ ('%8000000000d' % 1)|length }}", TOO_LONG),
    "percent-star-width": ("{{ ('%*d' % (8000000000, 1))|length }}", TOO_LONG),
    "percent-mapping-repeats": (
        "{{ (('%(a)s' * 100000) % {'a': 'x' * 4000000})|length }}",
        TOO_LONG,
    ),
    "str-format-width": ("{{ '{:>8000000000}'.format('a')|length }}", TOO_LONG),
    "str-format-nested-width": ("{{ '{:>{w}}'.format('a', w=8000000000)|length }}", TOO_LONG),
    "str-format-many-fields": ("{{ ('{0}' * 1000000).format('x' * 4000000)|length }}", TOO_LONG),
    "format-map": ("{{ '{a:>8000000000}'.format_map({'a': 1})|length }}", TOO_LONG),
    "indent": ("{{ ('\n' * 4000000)|indent(1000, true, true)|length }}", TOO_LONG),
    "wordwrap": ("{{ ('ab ' * 1300000)|wordwrap(2, wrapstring='x' * 1000)|length }}", TOO_LONG),
    "ljust": ("{{ 'a'.ljust(8000000000)|length }}", TOO_LONG),
    "rjust": ("{{ 'a'.rjust(8000000000)|length }}", TOO_LONG),
    "zfill": ("{{ 'a'.zfill(8000000000)|length }}", TOO_LONG),
    "expandtabs": ("{{ ('\t' * 100000).expandtabs(100000)|length }}", TOO_LONG),
    "str-replace-method": ("{{ ('a' * 4000000).replace('a', 'bbbbbbbbbbbb')|length }}", TOO_LONG),
    "translate": ("{{ ('a' * 4000000).translate({97: 'x' * 1000})|length }}", TOO_LONG),
    "batch-fill": ("{{ [1]|batch(8000000000, 0)|list|length }}", TOO_MANY_ITEMS),
    "slice-count": ("{{ [1]|slice(8000000000)|list|length }}", TOO_MANY_ITEMS),
    "sum-of-lists": ("{{ ([[1] * 4000000] * 1000)|sum(start=[])|length }}", TOO_MANY_ITEMS),
    "tojson-of-a-list": (f"{{{{ {HUGE_REFS}|tojson|length }}}}", TOO_LONG),
    "tojson-deep-indent": (
        "{% set ns = namespace(x=[1]) %}{% for i in range(600) %}{% set ns.x = [ns.x] %}"
        "{% endfor %}{{ ns.x|tojson(indent=100)|length }}",
        TOO_LONG,
    ),
    "pprint": (f"{{{{ {HUGE_REFS}|pprint|length }}}}", TOO_LONG),
    "lipsum": ("{{ lipsum(100000000)|length }}", TOO_LONG),
    "urlize-target": ("{{ ('http://a.b ' * 100000)|urlize(target='x' * 100000) }}", TOO_LONG),
    "repeated-squaring": (
        "{% set ns = namespace(n=10 ** 64) %}{% for i in range(40) %}"
        "{% set ns.n = ns.n * ns.n %}{% endfor %}{{ ns.n > 1 }}",
        TOO_BIG_A_NUMBER,
    ),
    "power-of-a-power": ("{{ (((10 ** 64) ** 64) ** 64) > 1 }}", TOO_BIG_A_NUMBER),
    "map-keeps-copies": (
        "{{ (['x' * 1000000] * 100)|map('upper')|list|length }}",
        TOO_MUCH_WORK,
    ),
    "list-of-fresh-strings": (
        "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
        "{% set ns.l = ns.l + [('x' * 4000000) ~ i] %}{% endfor %}{{ ns.l|length }}",
        TOO_MUCH_WORK,
    ),
    "set-block": (
        "{% set x %}{% for i in range(100000) %}{{ 'x' * 4000000 }}{% endfor %}{% endset %}"
        "{{ x|length }}",
        TOO_MUCH_WORK,
    ),
    "macro-body": (
        "{% macro m() %}{% for i in range(100000) %}{{ 'x' * 4000000 }}{% endfor %}"
        "{% endmacro %}{{ m()|length }}",
        TOO_MUCH_WORK,
    ),
    "filter-block": (
        "{% filter upper %}{% for i in range(100000) %}{{ 'x' * 4000000 }}{% endfor %}"
        "{% endfilter %}",
        TOO_MUCH_WORK,
    ),
}


@pytest.mark.parametrize(("source", "message"), ATTACKS.values(), ids=ATTACKS.keys())
def test_growing_call_is_refused_quickly_with_bounded_memory(source: str, message: str) -> None:
    template = ChatTemplate(source)
    tracemalloc.start()
    start = time.monotonic()
    try:
        with pytest.raises(TemplateError) as caught:
            template.render(HELLO)
        elapsed = time.monotonic() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert caught.value.message.startswith(message)
    assert caught.value.hint and "another copy of this model" in caught.value.hint
    assert elapsed < 1.0
    assert peak < MAX_PEAK_BYTES


def test_center_attack_from_the_issue_gives_the_promised_message() -> None:
    with pytest.raises(TemplateError) as caught:
        ChatTemplate("{{ 'a'|center(8000000000)|length }}").render(HELLO)
    assert caught.value.message == TOO_LONG


@pytest.mark.parametrize(
    "source",
    [
        "{{ ('ab ' * 1000000)|wordwrap(50)|length }}",
        "{{ ('a<b>' * 1000000)|striptags|length }}",
        "{{ (range(100000)|list * 40)|map('string')|join|length }}",
    ],
    ids=["wordwrap", "striptags", "map-join"],
)
def test_one_long_call_does_not_outlive_the_deadline(source: str) -> None:
    """Stopped within a second of a 0.2 s limit, the best of three tries: a step in C (the
    regular expression that splits 3 MB for `wordwrap`) cannot be interrupted, and on a
    2-core CI machine running the suite one try took 1.03 s."""
    template = ChatTemplate(source, time_limit_s=0.2)
    tries = []
    for _ in range(3):
        start = time.monotonic()
        with pytest.raises(TemplateError, match="ran longer than 0.2 s"):
            template.render(HELLO)
        tries.append(time.monotonic() - start)
        if tries[-1] < 1.0:
            break
    assert min(tries) < 1.0, tries


def test_a_smaller_cap_is_named_in_characters() -> None:
    with pytest.raises(TemplateError) as caught:
        ChatTemplate("{{ 'a'|center(2000) }}", max_chars=1000).render(HELLO)
    assert caught.value.message == (
        "The chat template tried to build a string longer than the 1,000-character limit."
    )


TOOLS_TEMPLATE = (
    "{% set tools = {'name': 'f', 'args': [1]} %}{% set ns = namespace(system='') %}"
    "{% macro turn(role, text) %}<|{{ role }}|>{{ text|trim }}{% endmacro %}"
    "{% for m in messages %}{% if m.role == 'system' %}{% set ns.system = ns.system + m.content %}"
    "{% endif %}{% endfor %}"
    "{{ ns.system|center(ns.system|length + 2) }}|{{ tools|tojson }}|{{ tools|tojson(indent=2) }}|"
    "{{ [1, 2, 3]|join(', ') }}|{{ '%s-%03d'|format('n', 7) }}|{{ '%s!' % 'hi' }}|"
    "{{ '{}:{:>4}'.format('k', 5) }}|{{ 'a\tb'.expandtabs(2) }}|{{ 'x'.ljust(3, '.') }}|"
    "{{ 'one two'|wordwrap(3) }}|{{ 'l1\nl2'|indent(2) }}|{{ [[1], [2]]|sum(start=[]) }}|"
    "{{ [1, 2]|sum }}|{% set block %}{{ 'set' ~ ' block' }}{% endset %}{{ block }}|"
    "{% for m in messages if m.role != 'system' %}{{ turn(m.role, m.content) }}{% endfor %}"
)


def test_ordinary_uses_of_the_bounded_calls_render_as_before() -> None:
    template = ChatTemplate(TOOLS_TEMPLATE)
    messages = [
        {"role": "system", "content": "Sys"},
        {"role": "user", "content": " Hello "},
    ]
    assert template.render(messages) == (
        ' Sys |{"args": [1], "name": "f"}|{\n  "args": [\n    1\n  ],\n  "name": "f"\n}|'
        "1, 2, 3|n-007|hi!|k:   5|a b|x..|one\ntwo|l1\n  l2|[1, 2]|3|set block|<|user|>Hello"
    )
