"""Backing off when what was asked for does not fit: pure steps and sentences, then the real
Gemma 3 270M file planned for a machine whose process may use only a few hundred MiB."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hearthside.autotune import backoff
from hearthside.autotune.load_settings import LoadSettings, choose_load_settings
from hearthside.autotune.planner import DEFAULT_FREE_MARGIN_BYTES, evaluate_config
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.engine.config import EngineConfig
from hearthside.core.models.spec import spec_from_gguf
from hearthside.core.probe.profile import HardwareProfile, MemoryInfo
from hearthside.core.probe.spec import expand_spec

pytestmark = pytest.mark.beside

MIB = 1 << 20
GIB = 1 << 30
AVX2 = ["avx", "avx2", "fma", "f16c", "sse4_2"]


def cpu_machine(memory: MemoryInfo) -> HardwareProfile:
    """A CPU-only what-if machine (no GPU to take the KV cache) with `memory`."""
    spec: dict[str, Any] = {"schema": 1, "cpu": {"cores": 4, "threads": 8, "flags": AVX2}}
    return replace(expand_spec({**spec, "memory_gb": 16}), memory=memory)


def limited(limit_mib: int, in_use_mib: int = 100) -> HardwareProfile:
    """16 GiB of RAM, but a cgroup limit of `limit_mib` with `in_use_mib` already used."""
    limit = limit_mib * MIB
    return cpu_machine(
        MemoryInfo(
            total_bytes=16 * GIB,
            available_bytes=limit - in_use_mib * MIB,
            cgroup_limit_bytes=limit,
        )
    )


@pytest.fixture
def wisdom(tmp_path: Path) -> WisdomDB:
    with WisdomDB(tmp_path / "wisdom.db") as db:
        yield db


def choose(model: Path, profile: HardwareProfile, wisdom: WisdomDB, n_ctx: int) -> LoadSettings:
    return choose_load_settings(model, profile, wisdom, n_ctx=n_ctx)


def fits(model: Path, profile: HardwareProfile, config: EngineConfig) -> bool:
    margin = backoff.free_margin(profile.memory)
    return evaluate_config(spec_from_gguf(model), profile, config, free_margin_bytes=margin).fits


def test_steps_halve_the_context_down_to_512_each_with_small_batches_second() -> None:
    steps = backoff.backoff_steps(32768)
    assert steps[:3] == [(32768, None), (32768, 128), (16384, None)]
    assert steps[-1] == (512, 128) and len(steps) == 2 * 7
    assert backoff.backoff_steps(300) == [(300, None), (300, 128)]  # already below the floor


def test_a_context_longer_than_the_trained_one_is_capped(default_model_file: Path) -> None:
    spec = spec_from_gguf(default_model_file)
    assert spec.context_length == 32768
    assert backoff.trained_context(spec, 131072) == 32768
    assert backoff.trained_context(spec, 4096) == 4096
    assert backoff.trained_context(replace(spec, context_length=None), 131072) == 131072


def test_the_margin_under_a_limit_is_what_is_in_use_plus_an_eighth() -> None:
    whole_machine = MemoryInfo(total_bytes=16 * GIB, available_bytes=12 * GIB)
    assert backoff.free_margin(whole_machine) == DEFAULT_FREE_MARGIN_BYTES
    assert backoff.free_margin(limited(800, in_use_mib=120).memory) == 120 * MIB + 100 * MIB
    big = MemoryInfo(total_bytes=64 * GIB, available_bytes=30 * GIB, cgroup_limit_bytes=32 * GIB)
    assert backoff.free_margin(big) == 2 * GIB + 2 * GIB  # the cushion is 2 GiB at most


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (
            EngineConfig("m", n_ctx=8192, type_k="q8_0", type_v="q8_0", flash_attn=True),
            "8192 tokens and a q8_0 KV cache",
        ),
        (EngineConfig("m", n_ctx=32768, n_ubatch=128), "128-token batches"),
        (
            EngineConfig(
                "m", n_ctx=8192, type_k="q4_0", type_v="q4_0", flash_attn=True, n_ubatch=128
            ),
            "8192 tokens, a q4_0 KV cache and 128-token batches",
        ),
    ],
)
def test_the_changes_are_said_in_words(config: EngineConfig, words: str) -> None:
    assert backoff.describe_changes(32768, config) == words


def test_the_room_names_the_limit_or_the_ram() -> None:
    under_limit = backoff.describe_room(limited(700).memory, 200 * MIB)
    assert under_limit == "the 500 MiB this process may still use under its 700 MiB memory limit"
    machine = MemoryInfo(total_bytes=16 * GIB)
    assert backoff.describe_room(machine, 2 * GIB) == (
        "the 14.0 GiB of RAM left after keeping 2.0 GiB free for other programs"
    )


def test_under_a_small_limit_a_long_context_backs_off_to_one_that_fits(
    default_model_file: Path, wisdom: WisdomDB
) -> None:
    profile = limited(600)
    chosen = choose(default_model_file, profile, wisdom, 131072)
    assert chosen.source == "planned" and chosen.backed_off
    assert 512 <= chosen.config.n_ctx < 32768
    assert fits(default_model_file, profile, chosen.config)
    assert chosen.why.startswith("The model was trained on 32768 tokens, so the context is 32768")
    assert "A 32768-token context does not fit in the " in chosen.why
    assert "under its 600 MiB memory limit; loading with " in chosen.why
    assert f"{chosen.config.n_ctx} tokens" in chosen.why
    # the largest that fits: twice the chosen context does not, with any KV cache or batch
    twice = chosen.config.with_changes(n_ctx=chosen.config.n_ctx * 2)
    assert not any(
        fits(
            default_model_file,
            profile,
            twice.with_changes(type_k=kv, type_v=kv, n_ubatch=ubatch),
        )
        for kv in ("f16", "q8_0", "q4_0")
        for ubatch in (512, 128)
    )


def test_more_room_backs_off_less(default_model_file: Path, wisdom: WisdomDB) -> None:
    contexts = [
        choose(default_model_file, limited(limit), wisdom, 32768).config.n_ctx
        for limit in (500, 600, 800, 1200)
    ]
    assert contexts == sorted(contexts) and contexts[0] < contexts[-1]


def test_a_context_that_fits_is_not_backed_off(default_model_file: Path, wisdom: WisdomDB) -> None:
    roomy = cpu_machine(MemoryInfo(total_bytes=16 * GIB, available_bytes=14 * GIB))
    chosen = choose(default_model_file, roomy, wisdom, 4096)
    assert not chosen.backed_off and chosen.config.n_ctx == 4096
    assert chosen.why.startswith("Planned for this machine")


def test_only_the_cap_applies_where_the_trained_context_fits(
    default_model_file: Path, wisdom: WisdomDB
) -> None:
    roomy = cpu_machine(MemoryInfo(total_bytes=16 * GIB, available_bytes=14 * GIB))
    chosen = choose(default_model_file, roomy, wisdom, 131072)
    assert chosen.backed_off and chosen.config.n_ctx == 32768
    assert chosen.why.startswith("The model was trained on 32768 tokens")
    assert "does not fit" not in chosen.why


def test_when_even_the_smallest_does_not_fit_the_smallest_is_tried(
    default_model_file: Path, wisdom: WisdomDB
) -> None:
    chosen = choose(default_model_file, limited(300), wisdom, 8192)
    assert chosen.backed_off and chosen.config.n_ctx == 512 and chosen.config.n_ubatch == 128
    assert chosen.why.startswith("Even 512 tokens with ")
    assert "under its 300 MiB memory limit; trying those anyway." in chosen.why


# --- parallel requests: slots go first -----------------------------------------------------------


def test_slots_are_halved_down_to_two_before_one() -> None:
    assert backoff.slot_steps(8) == [8, 4, 2]
    assert backoff.slot_steps(3) == [3]
    assert backoff.slot_steps(1) == []


def test_the_ladder_drops_slots_before_the_context(default_model_file: Path) -> None:
    spec, profile = spec_from_gguf(default_model_file), limited(300)  # nothing fits: every step
    margin = backoff.free_margin(profile.memory)
    plans = list(backoff.plans_backing_off(spec, profile, {}, 8192, margin, n_parallel=4))
    steps = [(p.config.n_parallel, p.config.n_ctx, p.config.n_ubatch) for p in plans]
    assert steps[:5] == [
        (4, 8192, 512),
        (2, 8192, 512),
        (1, 8192, 512),
        (1, 8192, 128),
        (1, 4096, 512),
    ]
    assert {slots for slots, _ctx, _ubatch in steps[3:]} == {1}  # a shorter context: one slot
    assert steps[-1] == (1, 512, 128)


def test_slots_asked_for_give_way_before_the_context_or_the_kv_cache(
    default_model_file: Path, wisdom: WisdomDB
) -> None:
    profile = limited(1100)
    chosen = choose_load_settings(default_model_file, profile, wisdom, n_ctx=8192, n_parallel=4)
    assert chosen.source == "planned" and chosen.backed_off
    assert chosen.config.n_ctx == 8192 and chosen.config.n_parallel < 4  # the context stays
    assert fits(default_model_file, profile, chosen.config)
    assert chosen.why.startswith("4 parallel requests of 8192 tokens each do not fit in the ")
    one_more = chosen.config.with_changes(n_parallel=chosen.config.n_parallel * 2)
    assert not fits(default_model_file, profile, one_more)  # with the same KV cache
    single = choose_load_settings(default_model_file, profile, wisdom, n_ctx=8192, n_parallel=1)
    assert chosen.config == single.config  # no coarser KV cache than one slot gets


def test_slots_asked_for_keep_the_kv_cache_one_slot_would_have(
    default_model_file: Path, wisdom: WisdomDB
) -> None:
    profile = limited(2300)  # room for one f16 cache of 32768 tokens, two, not four
    single = choose_load_settings(default_model_file, profile, wisdom, n_ctx=32768, n_parallel=1)
    chosen = choose_load_settings(default_model_file, profile, wisdom, n_ctx=32768, n_parallel=4)
    assert not single.backed_off and single.config.n_parallel == 1
    assert chosen.config.n_ctx == 32768 and 1 < chosen.config.n_parallel < 4
    kv_order = ("f16", "q8_0", "q4_0")
    assert kv_order.index(chosen.config.type_k) <= kv_order.index(single.config.type_k)
    assert "loading with 2 parallel requests" in chosen.why


def test_slots_that_fit_are_not_backed_off(default_model_file: Path, wisdom: WisdomDB) -> None:
    roomy = cpu_machine(MemoryInfo(total_bytes=16 * GIB, available_bytes=14 * GIB))
    chosen = choose_load_settings(default_model_file, roomy, wisdom, n_ctx=4096, n_parallel=8)
    assert not chosen.backed_off and chosen.config.n_parallel == 8
    auto = choose(default_model_file, roomy, wisdom, 4096)
    assert auto.config.n_parallel == 4 and not auto.backed_off  # the planner's default


def test_fewer_slots_are_said_in_words() -> None:
    config = EngineConfig("m", n_ctx=8192, n_parallel=2)
    assert backoff.describe_changes(8192, config, 4) == "2 parallel requests"
    one = EngineConfig("m", n_ctx=4096, type_k="q8_0", type_v="q8_0", flash_attn=True)
    assert backoff.describe_changes(8192, one, 4) == (
        "1 request at a time, 4096 tokens and a q8_0 KV cache"
    )
    room = MemoryInfo(total_bytes=16 * GIB)
    assert backoff.describe_backoff(8192, config, room, 2 * GIB, 4) == (
        "4 parallel requests of 8192 tokens each do not fit in the 14.0 GiB of RAM left after "
        "keeping 2.0 GiB free for other programs; loading with 2 parallel requests."
    )
