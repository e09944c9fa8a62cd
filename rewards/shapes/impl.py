"""The ``shapes`` Reward object: batch conversion to uint8 pixels, detection, weighting."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from vgrpo_platform.protocols import Samples

from .._criteria import objective_score, score_tensors
from .detect import CRITERIA, DetectorParams, score_image
from .world import parse_prompt

if TYPE_CHECKING:
    from . import Config


def to_uint8(data: torch.Tensor) -> np.ndarray:
    """``[B, 3, H, W]`` floats in [0, 1] -> ``[B, H, W, 3]`` uint8 on the CPU."""
    x = (data.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
    return x.permute(0, 2, 3, 1).cpu().numpy()


class ShapesReward:
    """Scores images against shapes-world prompts; ``score`` is the weighted mean of the applicable
    criteria (``objective="partial"``), their weighted product (``"product"``) or ``correct``."""

    modalities = frozenset({"image"})

    def __init__(self, config: Config) -> None:
        self.config = config
        self.params = detector_params(config)
        self.weights = config.weights.model_dump()

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> Mapping[str, torch.Tensor]:
        data = samples.data  # [B, 3, H, W]
        if data.ndim != 4 or data.shape[1] != 3:
            raise ValueError(f"shapes reward expects images [B, 3, H, W], got {tuple(data.shape)}")
        if len(prompts) != data.shape[0]:
            raise ValueError(f"{len(prompts)} prompts for {data.shape[0]} images")
        if self.config.latency_per_sample_s:  # a stand-in for a slow reward model (benchmarks only)
            time.sleep(self.config.latency_per_sample_s * len(prompts))
        rows = []
        for img, prompt in zip(to_uint8(data), prompts, strict=True):
            spec = parse_prompt(prompt)
            s = score_image(img, spec, self.params)
            applies = [c for c in CRITERIA if c != "position" or spec.relation is not None]
            s["score"] = objective_score(s, self.weights, applies, self.config.objective)
            rows.append(s)
        return score_tensors(rows, ("score", *CRITERIA, "correct"), data.device)


def detector_params(config: Any) -> DetectorParams:
    """The detector's thresholds from a reward config that declares them (``shapes``, ``moving_shapes``)."""
    return DetectorParams(
        value_threshold=config.value_threshold,
        saturation_threshold=config.saturation_threshold,
        min_area_frac=config.min_area_frac,
        max_objects=config.max_objects,
    )
