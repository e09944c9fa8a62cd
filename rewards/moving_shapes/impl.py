"""The ``moving_shapes`` Reward object: clips to uint8 frames, per-clip scoring, weighting."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from vgrpo_rewards._criteria import objective_score, score_tensors
from vgrpo_rewards.shapes.impl import detector_params, to_uint8

from vgrpo_platform.protocols import Samples

from .track import CRITERIA, score_clip
from .world import parse_prompt

if TYPE_CHECKING:
    from . import Config


class MovingShapesReward:
    """Scores clips against moving-shapes prompts; ``score`` is the weighted mean of the criteria
    (``objective="partial"``), their weighted product (``"product"``) or ``correct``."""

    modalities = frozenset({"video"})

    def __init__(self, config: Config) -> None:
        self.config = config
        self.params = detector_params(config)
        self.weights = config.weights.model_dump()

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> Mapping[str, torch.Tensor]:
        data = samples.data  # [B, F, 3, H, W]
        if data.ndim != 5 or data.shape[2] != 3:
            raise ValueError(f"moving_shapes reward expects clips [B, F, 3, H, W], got {tuple(data.shape)}")
        if len(prompts) != data.shape[0]:
            raise ValueError(f"{len(prompts)} prompts for {data.shape[0]} clips")
        if data.shape[1] < 2:
            raise ValueError(f"moving_shapes reward needs clips of at least 2 frames, got {data.shape[1]}")
        b, f, _, h, w = data.shape
        clips = to_uint8(data.reshape(b * f, 3, h, w)).reshape(b, f, h, w, 3)
        min_travel = self.config.min_travel_frac * min(h, w)
        rows = []
        for clip, prompt in zip(clips, prompts, strict=True):
            s = score_clip(clip, parse_prompt(prompt), self.params, min_travel)
            s["score"] = objective_score(s, self.weights, CRITERIA, self.config.objective)
            rows.append(s)
        return score_tensors(rows, ("score", *CRITERIA, "correct"), data.device)
