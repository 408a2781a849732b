"""Small pieces every `hearthside` subcommand module shares."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Sequence

from hearthside.core.errors import HearthsideError

EXIT_ERROR = 2
Handler = Callable[[argparse.Namespace], int]


def reports_errors(handler: Handler) -> Handler:
    """Print a HearthsideError as `error: message` + hint on stderr and exit with 2."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except HearthsideError as exc:
            print(f"error: {exc.user_text()}", file=sys.stderr)
            return EXIT_ERROR

    return run


def text_table(rows: Sequence[Sequence[str]]) -> str:
    """Rows as left-aligned columns, the first row being the header."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)
