"""Entry module of the ``diversity`` reward: options and registration only, no torch at import time.

A group reward (``groups = True``) in the spirit of DiverseGRPO (Liu et al. 2025, "DiverseGRPO:
Mitigating Mode Collapse in Image Generation via Diversity-Aware GRPO"): the samples of one prompt are
clustered and each sample earns a bonus that shrinks with the size of its cluster, so a group that
collapsed onto one layout scores low and the sample that found a new mode scores high. A reward that
sees one sample at a time cannot express this; the core hands this one whole prompt groups.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component, PluginConfig


class Config(PluginConfig):
    """Options of the ``diversity`` reward."""

    side: int = Field(
        8,
        ge=1,
        le=64,
        description="Embedding: each image (each video frame) average-pooled to side x side pixels, "
        "flattened: a coarse view that sees layout and colour, not texture.",
    )
    clip_model: str | None = Field(
        None,
        description="Embedding instead: a local folder of a transformers CLIP model (unit image embeddings, "
        "scaled so that distances are chord lengths sqrt(2 - 2 cos), in [0, 2]; images only; never "
        "downloaded); a relative path is resolved against the recipe's folder. null = pooled pixels.",
    )
    threshold: float = Field(
        0.15,
        gt=0.0,
        description="Clustering: samples closer than this root-mean-square embedding difference (pixel "
        "units, [0, 1]; with clip_model the chord length) join one cluster (agglomerative, `linkage`); "
        "ignored when `clusters` is set.",
    )
    clusters: int | None = Field(
        None,
        ge=1,
        description="Cut each group into at most this many clusters instead of using `threshold`.",
    )
    linkage: Literal["average", "complete", "single"] = Field(
        "average", description="How the distance between two clusters is measured (scipy's linkage)."
    )
    bonus: Literal["inverse", "share"] = Field(
        "inverse",
        description="A sample's score from its cluster's size n in a group of G: inverse = 1 / n "
        "(DiverseGRPO: inversely proportional to the cluster size), share = 1 - n / G.",
    )


def build(config: Config, context: Any = None) -> Any:
    from .impl import DiversityReward

    return DiversityReward(config, context)


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "reward",
            "diversity",
            build,
            Config,
            summary="Group reward: a bonus for samples in small clusters of their prompt's group "
            "(DiverseGRPO).",
        ),
    ]
