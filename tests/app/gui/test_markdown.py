"""Markdown for the chat view: highlighted code with copy links, and untrusted text kept inert."""

from __future__ import annotations

import pytest

from hearthside.app.gui.markdown import (
    DARK_CODE_THEME,
    LIGHT_CODE_THEME,
    MarkdownRenderer,
    highlight_code,
)

pytestmark = pytest.mark.beside


def test_fenced_code_is_highlighted_and_numbered_from_the_given_index() -> None:
    text = "Here:\n\n```python\ndef add(a, b):\n    return a + b\n```\n\nand\n\n```\nplain\n```\n"
    rendered = MarkdownRenderer().render(text, first_code_index=3)
    assert rendered.code_blocks == ("def add(a, b):\n    return a + b\n", "plain\n")
    assert '<a href="copy:3">Copy</a>' in rendered.html
    assert '<a href="copy:4">Copy</a>' in rendered.html
    assert "<span style=" in rendered.html  # pygments colours, inline
    assert ">python<" in rendered.html  # the language label


def test_an_unclosed_fence_while_streaming_is_still_a_code_block() -> None:
    rendered = MarkdownRenderer().render("Start:\n```js\nconst x = 1;")
    assert rendered.code_blocks == ("const x = 1;",)


def test_raw_html_from_the_model_is_escaped() -> None:
    html = MarkdownRenderer().render('<img src="x" onerror="alert(1)"> <b>bold?</b>').html
    assert "<img" not in html and "<b>" not in html
    assert "&lt;b&gt;bold?&lt;/b&gt;" in html


def test_only_web_links_survive_and_cannot_forge_view_anchors() -> None:
    html = (
        MarkdownRenderer()
        .render(
            "[web](https://example.org) [mail](mailto:a@b.c) [js](javascript:alert(1)) "
            "[copy](copy:0) [edit](edit:5) [file](file:///etc/passwd)"
        )
        .html
    )
    assert '<a href="https://example.org">web</a>' in html
    assert '<a href="mailto:a@b.c">mail</a>' in html
    for forged in ("javascript:", "copy:", "edit:", "file:"):
        assert f'href="{forged}' not in html
    assert html.count("<a ") == 2


def test_images_become_links_and_local_paths_are_not_loaded() -> None:
    html = (
        MarkdownRenderer().render("![cat](https://e.org/cat.png) ![secret](/home/me/key.png)").html
    )
    assert '<a href="https://e.org/cat.png">[image: cat]</a>' in html
    assert "<img" not in html
    assert "/home/me/key.png" in html and 'href="/home' not in html


def test_single_newlines_are_line_breaks() -> None:
    assert "one<br />\ntwo" in MarkdownRenderer().render("one\ntwo").html


def test_themes_use_their_own_colours_and_unknown_languages_fall_back_to_plain() -> None:
    code = "x = 1\n"
    light = highlight_code(code, "python", LIGHT_CODE_THEME.pygments_style)
    dark = highlight_code(code, "python", DARK_CODE_THEME.pygments_style)
    assert light != dark
    assert highlight_code("<x>", "no-such-language", "friendly") == "&lt;x&gt;"
    assert (
        LIGHT_CODE_THEME.background in MarkdownRenderer(LIGHT_CODE_THEME).render("```\nx\n```").html
    )
