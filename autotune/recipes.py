"""Curated priors (`assets/recipes.json`): hardware and model-family facts the planner applies,
each with its reason. They shape the candidates; measurements on the machine outrank them
(the tuner's winner becomes the model's default whatever a recipe said). The tuner puts them
into the autotune DB too (`wisdom.sync_recipes`)."""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from hearthside.autotune.records import Recipe
from hearthside.core.models.spec import ModelSpec
from hearthside.core.probe.profile import HardwareProfile


@functools.cache
def shipped_recipes() -> tuple[Recipe, ...]:
    text = resources.files("hearthside.assets").joinpath("recipes.json").read_text("utf-8")
    return tuple(
        Recipe(
            id=item["id"],
            applies_to=item["applies_to"],
            settings=item["settings"],
            rationale=item["rationale"],
        )
        for item in json.loads(text)["recipes"]
    )


def matching(spec: ModelSpec, profile: HardwareProfile) -> list[Recipe]:
    return [recipe for recipe in shipped_recipes() if applies(recipe, spec, profile)]


def applies(recipe: Recipe, spec: ModelSpec, profile: HardwareProfile) -> bool:
    return all(_condition(key, wanted, spec, profile) for key, wanted in recipe.applies_to.items())


def _condition(key: str, wanted: Any, spec: ModelSpec, profile: HardwareProfile) -> bool:
    if key == "architecture":
        return spec.architecture in wanted
    if key == "moe":
        return bool(spec.n_expert) == wanted
    if key == "gpu_arch":
        return any(gpu.arch in wanted for gpu in profile.gpus)
    if key == "gpu_vendor":
        return any(gpu.vendor in wanted for gpu in profile.gpus)
    if key == "bigger_than_ram":
        ram = profile.memory.available_bytes or profile.memory.total_bytes
        return (spec.size_bytes is not None and ram is not None and spec.size_bytes > ram) == wanted
    if key == "numa_nodes_at_least":
        return (profile.cpu.numa_nodes or 1) >= wanted
    raise ValueError(f"recipe condition {key!r} is not known")
