"""Rewrite the probe goldens (`tests/fixtures/probe/gpu/*/golden.json`) from the parsers.

Run by hand after a deliberate change to what a probe reports, then read the diff before
committing it: `python -m tests.update_goldens` (from the repository root). A test run never
writes a golden; a golden that rewrote itself would pass whatever the parser did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from hearthside.core.probe.profile import HardwareProfile
from tests.core.probe import test_amd, test_apple, test_nvidia

FIXTURES = Path(__file__).parent / "fixtures" / "probe" / "gpu"


def _sources() -> Iterable[tuple[str, Callable[[str], HardwareProfile]]]:
    for module in (test_amd, test_apple, test_nvidia):
        for name in module.GOLDEN_FIXTURES:
            yield name, module.golden_profile


def main() -> None:
    for name, golden_profile in _sources():
        golden = FIXTURES / name / "golden.json"
        text = golden_profile(name).to_json() + "\n"
        changed = not golden.exists() or golden.read_text() != text
        if changed:
            golden.write_text(text)
        print(f"{'rewritten' if changed else 'unchanged'}: {golden}")


if __name__ == "__main__":
    main()
