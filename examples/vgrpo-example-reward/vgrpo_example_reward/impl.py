"""The colourfulness metric of Hasler and Suesstrunk (2003), batched in torch.

With opponent channels ``rg = R - G`` and ``yb = (R + G) / 2 - B`` over an image's pixels,
``M = sqrt(std(rg)^2 + std(yb)^2) + 0.3 sqrt(mean(rg)^2 + mean(yb)^2)``: 0 for any grey image,
larger for vivid and varied colour.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from vgrpo_platform.protocols import Samples


class Colorfulness:
    """Scores ``image`` ``[B, 3, H, W]`` and ``video`` ``[B, F, 3, H, W]`` samples (mean over frames)."""

    modalities = frozenset({"image", "video"})

    def __init__(self, mean_weight: float = 0.3, scale: float = 1.0) -> None:
        self.mean_weight = mean_weight
        self.scale = scale

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> dict[str, torch.Tensor]:
        x = samples.data.float()  # [B, 3, H, W] or [B, F, 3, H, W], in [0, 1]
        if samples.modality == "video":
            x = x.flatten(0, 1)  # [B * F, 3, H, W]: score every frame
        r, g, b = x.unbind(dim=-3)  # [N, H, W] each
        rg = (r - g).flatten(1)  # [N, H * W]
        yb = ((r + g) / 2 - b).flatten(1)
        spread = (rg.var(dim=1, unbiased=False) + yb.var(dim=1, unbiased=False)).sqrt()  # [N]
        mean = (rg.mean(dim=1).square() + yb.mean(dim=1).square()).sqrt()  # [N]
        batch = samples.data.shape[0]
        spread, mean = spread.reshape(batch, -1).mean(1), mean.reshape(batch, -1).mean(1)  # [B]
        score = self.scale * (spread + self.mean_weight * mean)
        # diagnostics beside "score" are logged as detail/colorfulness/<name>, not optimised
        return {"score": score, "spread": self.scale * spread, "mean": self.scale * mean}
