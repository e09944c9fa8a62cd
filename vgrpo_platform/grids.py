"""Sample grids as PNG: what a person looks at to judge a run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vgrpo_platform.protocols import Samples


def frames_for_grid(samples: Samples) -> torch.Tensor | None:
    """``[B, 3, H, W]`` in [0, 1] for images, the middle frame for video; None for other modalities."""
    if samples.modality == "image":
        return samples.data
    if samples.modality == "video":
        return samples.data[:, samples.data.shape[1] // 2]
    return None


def save_grid(samples: Samples, path: Path, *, columns: int, scale: int = 1) -> Path | None:
    """Tile the samples row-major into one PNG; each row is typically one prompt's samples."""
    images = frames_for_grid(samples)
    if images is None:
        return None
    x = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()  # [B, 3, H, W]
    b, _, h, w = x.shape
    rows = -(-b // columns)
    canvas = np.zeros((rows * (h + 2), columns * (w + 2), 3), dtype=np.uint8)
    for i in range(b):
        r, c = divmod(i, columns)
        canvas[r * (h + 2) + 1 : r * (h + 2) + 1 + h, c * (w + 2) + 1 : c * (w + 2) + 1 + w] = x[i].transpose(
            1, 2, 0
        )
    image = Image.fromarray(canvas)
    if scale > 1:
        image = image.resize((image.width * scale, image.height * scale), Image.NEAREST)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path
