"""The ``tones`` reward: a programmatic judge of the procedural tones world (audio).

Prompts follow the grammar of ``vgrpo_rewards.tones.world`` ("a high beep then two short clicks");
the reward hears the events of each generated clip (torchaudio: energy envelope and spectral peak
track, ``detect.py``) and scores event count, kind, pitch, sweep direction and order against the
parsed prompt. Cheap to import: torch and torchaudio load in the factory.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component, PluginConfig


class Weights(PluginConfig):
    """Weights of the per-criterion scores in ``objective = "partial"`` (a weighted mean over the
    criteria that apply: ``pitch`` needs a beep in the prompt, ``direction`` a sweep, ``order`` a
    sequence) and exponents in ``objective = "product"``."""

    count: float = Field(1.0, ge=0)
    kind: float = Field(1.0, ge=0)
    pitch: float = Field(1.0, ge=0)
    direction: float = Field(1.0, ge=0)
    order: float = Field(1.0, ge=0)


class Config(PluginConfig):
    """Options of the ``tones`` reward (the judge's thresholds: ``detect.DetectorParams``)."""

    modalities: ClassVar[frozenset[str]] = frozenset({"audio"})

    objective: Literal["partial", "correct", "product"] = Field(
        "partial",
        description="partial: weighted mean of the applicable criteria; correct: 1 when all are right; "
        "product: their weighted product (dense, but high only when all are right).",
    )
    weights: Weights = Field(default_factory=Weights, description="Weight (or exponent) of each criterion.")
    rel_db: float = Field(25.0, gt=0, description="An active frame is within this many dB of the loudest.")
    floor_db: float = Field(-20.0, description="... and louder than this (dB of its summed power spectrum).")
    click_max_s: float = Field(0.06, gt=0, description="Events shorter than this (seconds) are clicks.")
    sweep_octaves: float = Field(
        0.8, gt=0, description="Pitch change, first quarter to last, that makes a tone a sweep (octaves)."
    )
    tonal_share: float = Field(
        0.85,
        gt=0,
        lt=1,
        description="Median share of a frame's power at its peak bin (+-1) that makes a tone.",
    )
    max_tone_s: float = Field(
        0.4, gt=0, description="Longer events are sounds of no atom (the world's last 0.24 s at most)."
    )
    max_events: int = Field(6, ge=1, le=8, description="The loudest events matched to the prompt's.")


def build(config: Config, context: Any) -> Any:
    from .impl import TonesReward

    return TonesReward(config)


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "reward",
            "tones",
            build,
            Config,
            summary="Event count/kind/pitch/direction/order judge of the tones world (audio, torchaudio)",
        ),
    ]
