"""Markdown → the HTML subset QTextBrowser renders, with highlighted code and copy links.

Replies come from a model, so they are untrusted text: raw HTML is escaped, links are kept
only for http(s) and mailto (a reply must not forge the view's own `copy:`/`edit:` anchors),
and images become plain links (the view never loads files or URLs by itself).
Each code block gets a `copy:<n>` link; `n` counts code blocks across the whole view. A single
newline is a line break, as in every chat app: models write lists and verse line by line.
"""

from __future__ import annotations

import functools
import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.token import Token
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.lexers.special import TextLexer
from pygments.util import ClassNotFound

COPY_SCHEME = "copy"
SAFE_LINK_PREFIXES = ("http://", "https://", "mailto:")


@dataclass(frozen=True)
class CodeTheme:
    """Colours for code blocks; one for light and one for dark windows."""

    pygments_style: str
    background: str
    muted_text: str


LIGHT_CODE_THEME = CodeTheme(pygments_style="friendly", background="#f3f4f6", muted_text="#6b7280")
DARK_CODE_THEME = CodeTheme(pygments_style="monokai", background="#272822", muted_text="#9ca3af")


@dataclass(frozen=True)
class RenderedMarkdown:
    html: str
    code_blocks: tuple[str, ...]  # the raw text of each code block, in order


def is_safe_link(url: str) -> bool:
    return url.strip().lower().startswith(SAFE_LINK_PREFIXES)


@functools.lru_cache(maxsize=512)
def highlight_code(code: str, language: str, style: str) -> str:
    """Pygments HTML with inline colours (QTextBrowser has no stylesheet classes)."""
    try:
        lexer = get_lexer_by_name(language) if language else TextLexer()
    except ClassNotFound:
        lexer = TextLexer()
    formatter = HtmlFormatter(nowrap=True, noclasses=True, style=style)
    return str(highlight(code, lexer, formatter)).rstrip("\n")


class MarkdownRenderer:
    """Renders Markdown text for the chat view in one colour theme."""

    def __init__(self, theme: CodeTheme = LIGHT_CODE_THEME) -> None:
        self.theme = theme
        self._md = MarkdownIt("commonmark", {"html": False, "breaks": True}).enable(
            ["table", "strikethrough"]
        )
        self._md.validateLink = is_safe_link  # type: ignore[method-assign]
        # Bound methods go in directly: add_render_rule would rebind them to the renderer.
        rules = self._md.renderer.rules  # type: ignore[attr-defined]
        rules["fence"] = self._render_fence
        rules["code_block"] = self._render_fence
        self._md.add_render_rule("image", _render_image)
        self._md.add_render_rule("table_open", _render_table_open)

    def render(self, text: str, first_code_index: int = 0) -> RenderedMarkdown:
        env: dict[str, Any] = {"code_blocks": [], "first_code_index": first_code_index}
        body = self._md.render(text, env)
        return RenderedMarkdown(html=body, code_blocks=tuple(env["code_blocks"]))

    def _render_fence(
        self,
        tokens: Sequence[Token],
        idx: int,
        _options: Any,
        env: dict[str, Any],
    ) -> str:
        token = tokens[idx]
        language = token.info.strip().split(" ")[0] if token.info else ""
        code = token.content
        index = env["first_code_index"] + len(env["code_blocks"])
        env["code_blocks"].append(code)
        return self._code_block_html(code, language, index)

    def _code_block_html(self, code: str, language: str, index: int) -> str:
        theme = self.theme
        label = f'<span style="color:{theme.muted_text}">{html.escape(language)}</span>&nbsp;&nbsp;'
        copy_link = f'<a href="{COPY_SCHEME}:{index}">Copy</a>'
        highlighted = highlight_code(code, language.lower(), theme.pygments_style)
        return (
            f'<table width="100%" cellspacing="0" cellpadding="8" bgcolor="{theme.background}">'
            f'<tr><td><p align="right" style="margin:0">{label if language else ""}{copy_link}'
            f'</p><pre style="margin:0">{highlighted}</pre></td></tr></table>\n'
        )


def _render_image(
    _renderer: Any, tokens: Sequence[Token], idx: int, _options: Any, _env: dict[str, Any]
) -> str:
    token = tokens[idx]
    source = str(token.attrGet("src") or "")
    alt = token.content or source
    if not is_safe_link(source):
        return html.escape(alt)
    return f'<a href="{html.escape(source, quote=True)}">[image: {html.escape(alt)}]</a>'


def _render_table_open(
    _renderer: Any, _tokens: Sequence[Token], _idx: int, _options: Any, _env: dict[str, Any]
) -> str:
    return '<table border="1" cellspacing="0" cellpadding="4">\n'
