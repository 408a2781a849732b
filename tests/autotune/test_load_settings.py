"""A model loads with what was measured here, else what was planned — never bare defaults;
never a context longer than the model was trained on."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hearthside.autotune.fingerprint import tuning_key
from hearthside.autotune.load_settings import choose_load_settings
from hearthside.autotune.planner import DEFAULT_PARALLEL
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.engine.config import EngineConfig, SpeculativeConfig
from hearthside.core.probe.profile import CpuInfo, HardwareProfile, MemoryInfo
from hearthside.core.probe.runner import probe_hardware
from tests.fixtures.synthetic_gguf import SHAPES, write_synthetic_gguf

pytestmark = pytest.mark.beside

GIB = 1024**3
MIB = 1024**2


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("load-settings")
    return write_synthetic_gguf(folder / "tiny-dense.gguf", "tiny-dense", "Q8_0")


@pytest.fixture(scope="module")
def long_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-dense trained on 131072 tokens (the other is trained on 4096)."""
    folder = tmp_path_factory.mktemp("load-settings-long")
    shape = replace(SHAPES["tiny-dense"], context_length=131072)
    return write_synthetic_gguf(folder / "tiny-dense-long.gguf", shape, "Q8_0")


@pytest.fixture(scope="module")
def profile() -> HardwareProfile:
    return probe_hardware()


@pytest.fixture
def wisdom(tmp_path: Path) -> WisdomDB:
    with WisdomDB(tmp_path / "wisdom.db") as db:
        yield db


def test_an_untuned_model_loads_with_the_planners_settings(
    model: Path, profile: HardwareProfile, wisdom: WisdomDB
) -> None:
    chosen = choose_load_settings(model, profile, wisdom, n_ctx=1024)
    assert chosen.source == "planned"
    assert "Optimize" in chosen.why
    assert chosen.config.model_path == str(model) and chosen.config.n_ctx == 1024
    assert chosen.config.n_threads is not None  # the planner decides, not llama.cpp's guess


def test_measured_settings_win_and_keep_the_context_asked_for(
    model: Path, profile: HardwareProfile, wisdom: WisdomDB
) -> None:
    tuned = EngineConfig(
        str(model), n_ctx=2048, n_threads=1, n_ubatch=128, flash_attn=True, type_k="q8_0"
    )
    wisdom.set_default(tuning_key(profile, model), tuned.to_dict(), "fastest")
    chosen = choose_load_settings(model, profile, wisdom, n_ctx=1024)
    assert chosen.source == "tuned" and "measured on this machine" in chosen.why
    # tuning measures one slot; a tiny model gets the planner's parallel requests beside it
    assert chosen.config == tuned.with_changes(n_ctx=1024, n_parallel=DEFAULT_PARALLEL)


def test_threads_the_user_sets_override_the_measured_ones(
    model: Path, profile: HardwareProfile, wisdom: WisdomDB
) -> None:
    tuned = EngineConfig(str(model), n_threads=1, n_threads_batch=1)
    wisdom.set_default(tuning_key(profile, model), tuned.to_dict(), "fastest")
    chosen = choose_load_settings(model, profile, wisdom, n_ctx=512, n_threads=2)
    assert chosen.source == "tuned"
    assert (chosen.config.n_threads, chosen.config.n_threads_batch) == (2, 1)


def test_measured_settings_that_no_longer_fit_give_way_to_a_plan(
    long_model: Path, profile: HardwareProfile, wisdom: WisdomDB
) -> None:
    # the same machine with 200 MiB to spare: a long context's f16 KV cache no longer fits
    spare = 2 * GIB + 200 * MIB  # the planner keeps 2 GiB free for other programs
    small = replace(
        profile,
        gpus=(),
        memory=MemoryInfo(total_bytes=spare, available_bytes=spare),
    )
    model = long_model
    tuned = EngineConfig(str(model), flash_attn=True, type_k="f16", type_v="f16")
    wisdom.set_default(tuning_key(small, model), tuned.to_dict(), "fastest")
    chosen = choose_load_settings(model, small, wisdom, n_ctx=2048)
    assert chosen.source == "tuned"  # a short context still fits
    long = choose_load_settings(model, small, wisdom, n_ctx=65536)
    assert long.source == "planned" and "do not fit a 65536-token context" in long.why
    assert long.config.n_ctx == 65536 and long.config.type_k in ("q8_0", "q4_0")


def test_a_failed_probe_falls_back_to_the_engines_defaults(model: Path, wisdom: WisdomDB) -> None:
    unknown = HardwareProfile(cpu=CpuInfo(arch="x86_64"), memory=MemoryInfo(), os="linux")
    chosen = choose_load_settings(model, unknown, wisdom, n_ctx=512)
    assert chosen.source == "engine defaults" and "probe failed" in chosen.why
    assert chosen.config == EngineConfig(str(model), n_ctx=512)


def test_a_context_beyond_the_trained_one_is_capped_and_says_why(
    model: Path, profile: HardwareProfile, wisdom: WisdomDB
) -> None:
    chosen = choose_load_settings(model, profile, wisdom, n_ctx=65536)
    assert chosen.config.n_ctx == 4096 and chosen.backed_off
    assert chosen.why.startswith("The model was trained on 4096 tokens, so the context is 4096")


def test_slots_asked_for_win_over_the_planners_choice(
    model: Path, profile: HardwareProfile, wisdom: WisdomDB
) -> None:
    chosen = choose_load_settings(model, profile, wisdom, n_ctx=1024, n_parallel=2)
    assert chosen.source == "planned" and not chosen.backed_off
    assert chosen.config.n_parallel == 2 and chosen.config.n_ctx == 1024
    assert choose_load_settings(model, profile, wisdom, n_ctx=1024).config.n_parallel == 4


def test_measured_settings_get_the_slots_asked_for_and_give_them_up_first(
    long_model: Path, profile: HardwareProfile, wisdom: WisdomDB
) -> None:
    spare = 2 * GIB + 200 * MIB
    small = replace(profile, gpus=(), memory=MemoryInfo(total_bytes=spare, available_bytes=spare))
    tuned = EngineConfig(str(long_model), flash_attn=True, type_k="f16", type_v="f16")
    wisdom.set_default(tuning_key(small, long_model), tuned.to_dict(), "fastest")
    roomy = choose_load_settings(long_model, small, wisdom, n_ctx=512, n_parallel=3)
    assert roomy.source == "tuned" and roomy.config.n_parallel == 3 and not roomy.backed_off
    tight = choose_load_settings(long_model, small, wisdom, n_ctx=16384, n_parallel=64)
    assert tight.source == "tuned" and tight.backed_off
    assert tight.config.n_ctx == 16384 and tight.config.type_k == "f16"  # only slots given up
    assert 1 <= tight.config.n_parallel < 64
    assert "64 parallel requests of 16384 tokens each do not fit" in tight.why


def test_measured_speculation_keeps_speculating_with_the_slots(
    model: Path, profile: HardwareProfile, wisdom: WisdomDB
) -> None:
    """Speculation runs while one request generates alone, so a tuned config that speculates
    gets its slots by the same rule as any other and keeps its speculation."""
    lookup = SpeculativeConfig(mode="prompt_lookup", draft_tokens=4)
    tuned = EngineConfig(str(model), n_ctx=1024, speculative=lookup)
    wisdom.set_default(tuning_key(profile, model), tuned.to_dict(), "fastest")
    unasked = choose_load_settings(model, profile, wisdom, n_ctx=1024)
    assert unasked.config.n_parallel == 4 and unasked.config.speculative == lookup
    asked = choose_load_settings(model, profile, wisdom, n_ctx=1024, n_parallel=2)
    assert asked.config.n_parallel == 2 and asked.config.speculative == lookup
    assert asked.source == unasked.source == "tuned" and not asked.backed_off


def test_settings_tuned_for_the_longest_context_load_with_it(
    long_model: Path, profile: HardwareProfile, wisdom: WisdomDB
) -> None:
    tuned = EngineConfig(str(long_model), n_ctx=32768, flash_attn=True, type_k="q8_0")
    wisdom.set_default(tuning_key(profile, long_model), tuned.to_dict(), "longest-context")
    chosen = choose_load_settings(long_model, profile, wisdom, n_ctx=2048)
    assert chosen.source == "tuned" and chosen.config.n_ctx == 32768
    asked_longer = choose_load_settings(long_model, profile, wisdom, n_ctx=65536)
    assert asked_longer.config.n_ctx == 65536  # a longer context asked for still wins
