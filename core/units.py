"""The one place byte units are defined and byte counts (and waits) become words.

Hearthside counts memory and file sizes in binary units and labels them as such (KiB, MiB,
GiB): that is how RAM and VRAM come (a "16 GB" module holds 16 GiB), how llama.cpp and the
planner count buffers, and the Hardware page, the plan and the CLI then agree on one figure
for the same memory. Speeds stay in decimal GB/s (`GB`), as memory bandwidth and disk speed
are quoted everywhere. `tests/test_units.py` fails when a module defines these constants or
a byte formatter of its own.
"""

from __future__ import annotations

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
GB = 1_000_000_000  # for speeds: bytes per second / GB → "GB/s"

UNKNOWN = "unknown"


def format_bytes(size_bytes: float | None, unknown: str = UNKNOWN) -> str:
    """A size in binary units: "241 MiB", "23.5 GiB", "512 KiB", "12 bytes"; `unknown` for
    None. Negative sizes (a shortfall) keep their sign."""
    if size_bytes is None:
        return unknown
    sign = "-" if size_bytes < 0 else ""
    size = abs(size_bytes)
    if size >= GIB:
        return f"{sign}{size / GIB:.1f} GiB"
    if size >= MIB:
        return f"{sign}{size / MIB:.0f} MiB"
    if size >= KIB:
        return f"{sign}{size / KIB:.0f} KiB"
    return f"{sign}{size:.0f} bytes"


def format_duration(seconds: float) -> str:
    """A wait in words a person reads: "45 s", "1 min 30 s", "10 min", "1 h 5 min"."""
    total = max(0, round(seconds))
    minutes, rest = divmod(total, 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    if not minutes:
        return f"{rest} s"
    return f"{minutes} min {rest} s" if rest else f"{minutes} min"
