"""HPSv2.1 as ``hpsv2/img_score.py`` computes it: ``diag(image_features @ text_features.T)`` with the
open_clip model's own normalised features, the checkpoint loaded into ``create_model_and_transforms``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from vgrpo_platform.errors import RewardError

from .._clip_bases import PromptedImageReward
from .._clip_common import (
    ImageTransform,
    load_or_explain,
    pick_device,
    pick_dtype,
    resolve_file,
)

if TYPE_CHECKING:
    from . import Config

FIX = (
    "download it with `huggingface-cli download xswu/HPSv2 HPS_v2.1_compressed.pt --local-dir DIR` "
    "and set the reward's options.model to DIR/HPS_v2.1_compressed.pt"
)


def transform_of(model: Any) -> ImageTransform:
    """open_clip's eval geometry (``model.visual.preprocess_cfg``): shortest-side resize + centre crop."""
    cfg = model.visual.preprocess_cfg
    size = cfg["size"]
    size = int(size if isinstance(size, int) else size[0])
    return ImageTransform(size, size, tuple(cfg["mean"]), tuple(cfg["std"]))


class HpsV2Reward(PromptedImageReward):
    reward_name = "hpsv2"

    def __init__(self, config: Config, context: Any) -> None:
        path = resolve_file(config.model, config.filename, "HPSv2", FIX, context)
        try:
            import open_clip
        except ImportError as exc:
            raise RewardError(
                "hpsv2 reward needs open_clip: `pip install open_clip_torch` (it brings torchvision and "
                "timm; pick the torchvision built for your torch)"
            ) from exc
        self.dtype, self.batch_size = pick_dtype(config.dtype, context), config.batch_size
        model, _, self.pil_preprocess = load_or_explain(
            lambda: open_clip.create_model_and_transforms(config.arch, pretrained=path, device="cpu"),
            "HPSv2",
            path,
            FIX,
        )
        self.model = model.to(device=pick_device(context), dtype=self.dtype).eval().requires_grad_(False)
        self.tokenizer = open_clip.get_tokenizer(config.arch)
        self.transform = transform_of(model)

    def score_batch(self, pixels: torch.Tensor, prompts: list[str], device: torch.device) -> torch.Tensor:
        tokens = self.tokenizer(prompts).to(device)  # [b, context_length]
        img = self.model.encode_image(pixels, normalize=True).float()  # [b, D]
        txt = self.model.encode_text(tokens, normalize=True).float()  # [b, D]
        return (img * txt).sum(-1)  # [b]
