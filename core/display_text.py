"""Text from model files and requests, cut to a length a person can read.

A GGUF metadata string may be 16 MiB (`general.name`, a licence, a chat template): printed
whole it floods a terminal, a table or a window title (`models list` once printed 117 MB for
one name). Everything that shows such text shortens it here first, then escapes it for its
medium; shortening first keeps the escaping's cost bounded too.
"""

from __future__ import annotations

from typing import Final

MAX_SHOWN_CHARS: Final = 256
ELLIPSIS: Final = "…"
__all__ = ["ELLIPSIS", "MAX_SHOWN_CHARS", "shortened"]


def shortened(text: str, max_chars: int = MAX_SHOWN_CHARS) -> str:
    """`text` when it has at most `max_chars` characters, else its start ending in "…"
    (`max_chars` characters in all)."""
    if max_chars < 1:
        raise ValueError("max_chars must be at least 1")
    if len(text) <= max_chars:
        return text
    return text[: max_chars - len(ELLIPSIS)] + ELLIPSIS
