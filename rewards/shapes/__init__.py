"""The ``shapes`` reward: a programmatic GenEval-like judge for the procedural shapes world.

Prompts follow the grammar of ``vgrpo_rewards.shapes.world`` ("a red circle above a blue square");
the reward detects coloured shapes in the generated pixels and scores colour, shape, count and
position against the parsed prompt. Cheap to import: numpy, PIL and torch load in the factory.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component, PluginConfig


class Weights(PluginConfig):
    """Weights of the per-criterion scores in ``objective = "partial"`` (a weighted mean over the
    criteria that apply: ``position`` only counts for prompts with a relation) and exponents in
    ``objective = "product"``."""

    color: float = Field(1.0, ge=0)
    shape: float = Field(1.0, ge=0)
    count: float = Field(1.0, ge=0)
    position: float = Field(1.0, ge=0)


class Config(PluginConfig):
    # "partial": weighted mean of the criteria; "correct": the 0/1 `correct`; "product": the criteria's
    # product (weights as exponents), dense like "partial" but, like "correct", high only when all are right
    objective: Literal["partial", "correct", "product"] = "partial"
    weights: Weights = Field(default_factory=Weights)
    value_threshold: float = Field(0.4, gt=0, lt=1)  # min max(R, G, B) of a shape's pixel, in [0, 1]
    saturation_threshold: float = Field(0.35, gt=0, lt=1)  # min (max - min) / max of a shape's pixel
    min_area_frac: float = Field(0.015, ge=0, lt=1)  # smaller components (fraction of the image) are specks
    max_objects: int = Field(6, ge=1, le=8)  # largest components matched to the prompt's objects
    # seconds each scored image sleeps: stands in for a heavy reward model (the overlapped-scoring
    # benchmark, benchmarks/overlap.py); 0 in every real use
    latency_per_sample_s: float = Field(0.0, ge=0, le=60)


def build(config: Config, context: Any) -> Any:
    from .impl import ShapesReward

    return ShapesReward(config)


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "reward",
            "shapes",
            build,
            Config,
            summary="GenEval-like colour/shape/count/position judge of the shapes world",
        ),
    ]
