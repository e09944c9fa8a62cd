"""JPEG size of each image, encoded by PIL as DDPO's ``jpeg_incompressibility`` does."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image

from vgrpo_platform.protocols import Samples

from .._clip_common import check_images

if TYPE_CHECKING:
    from . import Config


def jpeg_kilobytes(images: torch.Tensor, quality: int) -> list[float]:
    """Sizes in kB (1000 bytes) of ``[B, 3, H, W]`` images in [0, 1] saved as JPEG (as uint8)."""
    pixels = (images.detach().float() * 255).round().clamp(0, 255).to(torch.uint8)
    pixels = pixels.permute(0, 2, 3, 1).cpu().numpy()  # [B, H, W, 3]
    sizes = []
    for array in pixels:
        buffer = io.BytesIO()
        Image.fromarray(array).save(buffer, format="JPEG", quality=quality)
        sizes.append(buffer.tell() / 1000)
    return sizes


class JpegReward:
    modalities = frozenset({"image"})

    def __init__(self, config: Config) -> None:
        self.sign = 1.0 if config.incompressibility else -1.0
        self.quality = config.quality

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        images = check_images(samples, prompts, "jpeg")  # [B, 3, H, W]
        kb = torch.tensor(jpeg_kilobytes(images, self.quality), dtype=torch.float32, device=images.device)
        return self.sign * kb  # [B]
