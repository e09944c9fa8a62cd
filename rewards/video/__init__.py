"""Entry module of the video rewards: options and registration only, no torch at import time.

- ``framewise``: any image reward plugin (by name, with its options) applied to frames sampled evenly from
  each clip, aggregated over frames: image quality/alignment rewards carry over to video unchanged.
- ``temporal_consistency``: mean cosine similarity of consecutive frames' pooled pixels (1 = identical).
- ``motion``: mean absolute change between consecutive pooled frames, or minus its distance to a target,
  so a recipe can reward quality without rewarding frozen clips.
- ``reference_similarity``: closeness to a reference clip (an mp4 read with decord), frame by frame.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component, PluginConfig

VIDEO = frozenset({"video"})


class FramewiseConfig(PluginConfig):
    """Options of the ``framewise`` reward."""

    modalities: ClassVar[frozenset[str]] = VIDEO

    reward: str = Field(description="Name of the image reward plugin to apply per frame (e.g. 'pickscore').")
    options: dict[str, Any] = Field(
        default_factory=dict, description="That reward's own options (validated when the reward is built)."
    )
    frames: int = Field(
        4, ge=0, description="Frames scored per clip, evenly spaced (first and last included); 0 = all."
    )
    aggregate: Literal["mean", "min"] = Field(
        "mean", description="How the per-frame scores become the clip's: their mean, or the worst frame."
    )


class PooledFramesConfig(PluginConfig):
    """Options shared by the pixel-level temporal rewards."""

    modalities: ClassVar[frozenset[str]] = VIDEO

    pool: int = Field(
        32, ge=1, description="Frames are average-pooled to pool x pool before comparison (ignores noise)."
    )


class TemporalConsistencyConfig(PooledFramesConfig):
    """Options of the ``temporal_consistency`` reward."""


class MotionConfig(PooledFramesConfig):
    """Options of the ``motion`` reward."""

    target: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Desired mean absolute frame-to-frame change in [0, 1]: the score is -|motion - target|; "
        "null = the motion itself (more is better).",
    )


class ReferenceSimilarityConfig(PooledFramesConfig):
    """Options of the ``reference_similarity`` reward."""

    path: str = Field(
        description="The reference clip (mp4 or any format decord reads); relative paths are "
        "resolved against the recipe's folder."
    )


def build_temporal_consistency(config: TemporalConsistencyConfig, context: Any = None) -> Any:
    from .impl import TemporalConsistencyReward

    return TemporalConsistencyReward(pool=config.pool)


def build_motion(config: MotionConfig, context: Any = None) -> Any:
    from .impl import MotionReward

    return MotionReward(pool=config.pool, target=config.target)


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "reward",
            "framewise",
            "vgrpo_rewards.video.impl:FramewiseReward.from_config",
            FramewiseConfig,
            summary="Any image reward on evenly sampled frames of each clip, averaged (or the worst frame).",
        ),
        Component(
            "reward",
            "temporal_consistency",
            build_temporal_consistency,
            TemporalConsistencyConfig,
            summary="Mean cosine similarity of consecutive pooled frames: 1 for a clip of identical frames.",
        ),
        Component(
            "reward",
            "motion",
            build_motion,
            MotionConfig,
            summary="Mean absolute change between consecutive pooled frames (or minus its distance to a "
            "target).",
        ),
        Component(
            "reward",
            "reference_similarity",
            "vgrpo_rewards.video.impl:ReferenceSimilarityReward.from_config",
            ReferenceSimilarityConfig,
            summary="Mean cosine similarity of pooled frames to a reference clip read with decord.",
        ),
    ]
