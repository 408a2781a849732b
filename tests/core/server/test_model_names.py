"""`model` names any installed model: a real server on loopback, the real `openai` client, a
real store of installed models (the real Gemma 3 270M and two tiny llama GGUFs the engine
loads), and the real planner choosing each on-demand model's settings. The served model is a
third tiny llama, so a reply that knows Paris came from Gemma."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from pathlib import Path

import openai
import psutil
import pytest
from openai.types import Completion

from hearthside.app.api_models import LoadKnobs, PlannedModelLoader, on_demand_models
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.service import EngineService
from hearthside.core.models.store import ModelStore
from hearthside.core.probe.profile import MemoryInfo
from hearthside.core.probe.runner import probe_in_subprocess
from hearthside.core.server.app import ServerSettings
from hearthside.core.server.controller import ServerController
from hearthside.core.server.model_pool import (
    ModelPool,
    OnDemandModels,
    PoolEvent,
    installed_in_store,
)
from tests.core.server.test_api import KEY, Running, free_port
from tests.gguf_samples import write_tiny_gguf

pytestmark = pytest.mark.beside

SERVED_ID = "tiny-served"
TINY = ("tiny-a", "tiny-b")
QUESTION = "Question: What is the capital of France?\nAnswer:"


class Models(Running):
    def __init__(
        self, controller: ServerController, service: EngineService, home: Path, gemma: str
    ) -> None:
        super().__init__(controller, service)
        self.home = home
        self.gemma = gemma
        self.events: list[PoolEvent] = []
        controller.pool.add_listener(self.events.append)

    def complete(self, model: str, prompt: str = "hi", max_tokens: int = 4) -> Completion:
        return self.client.completions.create(
            model=model, prompt=prompt, max_tokens=max_tokens, temperature=0
        )

    def loaded_on_demand(self) -> dict[str, int | None]:
        return self.controller.pool.loaded_worker_pids()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, default_model_file: Path) -> Iterator[Models]:
    root = tmp_path_factory.mktemp("model-names")
    home, files = root / "home", root / "files"
    served_file = write_tiny_gguf(files / "served.gguf", seed=0, loadable=True)
    with ModelStore(home) as store:  # the files were checked by their makers: no child loads
        gemma = store.add(default_model_file, link=True, check_native=False).id
        for seed, name in enumerate(TINY, start=1):
            tiny = write_tiny_gguf(files / f"{name}.gguf", seed=seed, loadable=True)
            store.add(tiny, check_native=False)
        store.add(served_file, link=True, check_native=False)  # "served": the served file
    service = EngineService().start()
    service.load(EngineConfig(model_path=str(served_file), n_ctx=256)).result()
    settings = ServerSettings(
        port=free_port(), api_key=KEY, model_id=SERVED_ID, max_on_demand_models=1
    )
    knobs = LoadKnobs(n_ctx=512, n_parallel=1)
    controller = ServerController(settings, service, on_demand=on_demand_models(home, knobs))
    controller.start()
    yield Models(controller, service, home, gemma)
    controller.stop()
    service.stop()


def test_models_lists_the_served_model_every_installed_one_and_default(models: Models) -> None:
    cards = models.client.models.list().data
    ids = [card.id for card in cards]
    assert ids[0] == SERVED_ID and ids[-1] == "default"
    assert sorted(ids[1:-1]) == sorted([models.gemma, *TINY, "served"])
    loaded = {card.id: card.model_extra["loaded"] for card in cards}  # type: ignore[index]
    assert loaded[SERVED_ID] and loaded["default"] and loaded["served"]  # "served": same file


def test_default_and_installed_models_can_be_retrieved(models: Models) -> None:
    assert models.client.models.retrieve("default").id == "default"
    assert models.client.models.retrieve(SERVED_ID).id == SERVED_ID
    assert models.client.models.retrieve("tiny-a").id == "tiny-a"


def test_an_unknown_model_is_a_404_model_not_found(models: Models) -> None:
    with pytest.raises(openai.NotFoundError) as retrieved:
        models.client.models.retrieve("gpt-4")
    with pytest.raises(openai.NotFoundError) as asked:
        models.complete("gpt-4")
    for refusal in (retrieved.value, asked.value):
        assert refusal.code == "model_not_found"
        error = refusal.body
        assert isinstance(error, dict) and error["param"] == "model"
        assert error["type"] == "invalid_request_error"
        assert "The model `gpt-4` does not exist" in error["message"]


def test_a_request_naming_an_installed_model_is_answered_by_it(models: Models) -> None:
    served = models.complete(SERVED_ID, QUESTION)
    reply = models.complete(models.gemma, QUESTION)
    assert reply.model == models.gemma and served.model == SERVED_ID
    assert reply.choices[0].text.startswith(" Paris")  # Gemma knows; the tiny model cannot
    assert not served.choices[0].text.startswith(" Paris")
    assert models.gemma in models.loaded_on_demand()
    card = models.client.models.retrieve(models.gemma)
    assert card.model_extra["loaded"] is True  # type: ignore[index]


def test_the_served_file_under_its_store_id_loads_nothing(models: Models) -> None:
    before = models.loaded_on_demand()
    reply = models.client.chat.completions.create(
        model="served", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert reply.model == "served"
    assert models.loaded_on_demand() == before


def test_one_model_on_demand_means_the_next_unloads_the_least_recent(models: Models) -> None:
    models.complete("tiny-a")
    pid_a = models.loaded_on_demand()["tiny-a"]
    assert pid_a is not None and psutil.pid_exists(pid_a)
    models.complete("tiny-b")
    assert list(models.loaded_on_demand()) == ["tiny-b"]
    assert not psutil.pid_exists(pid_a)  # its worker ended: the memory is back
    unloaded = [e for e in models.events if e.kind == "unloaded" and e.model_id == "tiny-a"]
    assert unloaded and "at most 1" in unloaded[-1].reason


def test_two_requests_for_an_unloaded_model_load_it_once(models: Models) -> None:
    target = next(name for name in TINY if name not in models.loaded_on_demand())
    start = threading.Barrier(2)

    def ask(_n: int) -> str:
        start.wait()
        return models.complete(target).model

    seen = len(models.events)
    with ThreadPoolExecutor(2) as pool:
        answered = list(pool.map(ask, range(2)))
    assert answered == [target, target]
    loads = [e for e in models.events[seen:] if e.kind == "loaded"]
    assert [e.model_id for e in loads] == [target]


def test_memory_short_for_the_next_model_unloads_the_least_recent(models: Models) -> None:
    """A machine whose available memory, by the planner's own estimate, holds one tiny model
    beside the served one: the second loaded on demand unloads the first, though the cap
    would keep two."""
    machine = probe_in_subprocess()
    available = {"bytes": machine.memory.available_bytes or 0}

    def memory() -> MemoryInfo:
        return replace(machine.memory, available_bytes=available["bytes"])

    loader = PlannedModelLoader(LoadKnobs(n_ctx=512, n_parallel=1), lambda: machine, memory)
    tiny_b = next(m for m in installed_in_store(models.home) if m.id == "tiny-b")
    just_enough = least_memory_that_fits(loader, loader.settings_for(tiny_b), available)
    pool = ModelPool(
        models.service, SERVED_ID, OnDemandModels(partial(installed_in_store, models.home), loader)
    )

    def one_takes_what_is_left(event: PoolEvent) -> None:
        available["bytes"] = just_enough - (1 << 20) if pool.loaded_worker_pids() else just_enough

    events: list[PoolEvent] = []
    pool.add_listener(one_takes_what_is_left)
    pool.add_listener(events.append)
    available["bytes"] = just_enough
    try:
        pool.service_for("tiny-a")
        pool.service_for("tiny-b")
        assert list(pool.loaded_worker_pids()) == ["tiny-b"]
        done = [e for e in events if e.kind != "loading"]
        assert [(e.kind, e.model_id) for e in done] == [
            ("loaded", "tiny-a"),
            ("unloaded", "tiny-a"),
            ("loaded", "tiny-b"),
        ]
        assert done[1].reason == "memory for tiny-b"
    finally:
        pool.stop()


def least_memory_that_fits(
    loader: PlannedModelLoader, config: EngineConfig, available: dict[str, int]
) -> int:
    """The least available memory with which the planner says `config` fits (bisection)."""
    low, high = 0, available["bytes"]
    assert loader.fits_now(config)
    while high - low > 1 << 16:
        available["bytes"] = (low + high) // 2
        if loader.fits_now(config):
            high = available["bytes"]
        else:
            low = available["bytes"]
    return high
