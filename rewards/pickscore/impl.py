"""PickScore as its reference code computes it: ``logit_scale.exp() * <text_emb, image_emb>`` on unit
embeddings (github.com/yuvalkirstain/PickScore, README "Inference with PickScore")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from vgrpo_platform.protocols import Samples

from .._clip_common import check_images, load_clip

if TYPE_CHECKING:
    from . import Config

FIX = (
    "download it with `huggingface-cli download yuvalkirstain/PickScore_v1 --local-dir DIR` (and "
    "`laion/CLIP-ViT-H-14-laion2B-s32B-b79K` for the processor) and set the reward's options.model "
    "(options.processor) to that folder"
)


class PickScoreReward:
    modalities = frozenset({"image"})

    def __init__(self, config: Config, context: Any) -> None:
        self.divisor = config.divisor
        self.clip = load_clip(
            config.model, config.processor, config.dtype, config.batch_size, context, "PickScore", FIX
        )

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        images = check_images(samples, prompts, "pickscore")  # [B, 3, H, W]
        img, txt = self.clip.embed(images, prompts)  # [B, D] each, unit norm
        scale = self.clip.model.logit_scale.exp().float()
        return scale * (img * txt).sum(-1) / self.divisor  # [B]
