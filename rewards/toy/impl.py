"""Pixel-statistics rewards: exact, differentiable-free, and with known optima (for tests and demos)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from vgrpo_platform.protocols import Samples

from .._target import toward_target

MODALITIES = frozenset({"image", "video"})


def _pixels(samples: Samples) -> torch.Tensor:
    """The samples as float32 ``[B, ..., 3, H, W]`` (channels at dim -3 for images and videos)."""
    if samples.modality not in MODALITIES:
        raise ValueError(f"toy rewards score images or videos, got modality {samples.modality!r}")
    data = samples.data
    layout = "[B, 3, H, W]" if samples.modality == "image" else "[B, F, 3, H, W]"
    if data.ndim != layout.count(",") + 1 or data.shape[-3] != 3:
        raise ValueError(f"{samples.modality} samples must be shaped {layout}, got {tuple(data.shape)}")
    return data.float()


def _per_sample_mean(x: torch.Tensor) -> torch.Tensor:
    """Mean over everything but the batch: for video, the average over frames of per-frame means."""
    return x.flatten(1).mean(dim=1)  # [B]


class BrightnessReward:
    """Mean pixel value (``target`` None), or ``-|mean - target|``."""

    modalities = MODALITIES

    def __init__(self, target: float | None = None) -> None:
        self.target = target

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        return toward_target(_per_sample_mean(_pixels(samples)), self.target)  # [B]


class TargetColorReward:
    """``-mean_pixels ||pixel - rgb||_2 / sqrt(3)``: in ``[-1, 0]``, 0 exactly at a uniform ``rgb`` image."""

    modalities = MODALITIES

    def __init__(self, rgb: Sequence[float] = (1.0, 0.0, 0.0)) -> None:
        self.rgb = tuple(float(c) for c in rgb)

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        x = _pixels(samples)  # [B, (F,) 3, H, W]
        rgb = torch.tensor(self.rgb, dtype=x.dtype, device=x.device).reshape(3, 1, 1)
        dist = (x - rgb).norm(dim=-3) / math.sqrt(3)  # [B, (F,) H, W] in [0, 1]
        return -_per_sample_mean(dist)
