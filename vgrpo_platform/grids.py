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


def save_before_after(
    before: Path, after: Path, out: Path, *, rows: int, keep_rows: int = 16, min_height: int = 512
) -> Path | None:
    """The first ``keep_rows`` rows (prompts) of two evaluation grids side by side, labelled.

    Evaluations use fixed seeds, so the two grids hold the same prompts and the same noise: any
    difference is the training. ``rows`` is the number of prompt rows in each grid; small frames
    are enlarged (nearest neighbour) to at least ``min_height`` pixels so they can be judged.
    """
    if not (before.is_file() and after.is_file()) or rows < 1:
        return None
    panels = []
    for path in (before, after):
        image = Image.open(path).convert("RGB")
        row_height = image.height // rows
        panels.append(image.crop((0, 0, image.width, row_height * min(rows, keep_rows))))
    gap, header = 8, 14
    width = sum(p.width for p in panels) + gap
    height = max(p.height for p in panels)
    canvas = Image.new("RGB", (width, height + header), (255, 255, 255))
    from PIL import ImageDraw

    draw = ImageDraw.Draw(canvas)
    x = 0
    for label, panel in zip(("before", "after"), panels, strict=True):
        canvas.paste(panel, (x, header))
        draw.text((x + 2, 1), label, fill=(0, 0, 0))
        x += panel.width + gap
    scale = max(1, -(-min_height // canvas.height))
    if scale > 1:
        canvas = canvas.resize((canvas.width * scale, canvas.height * scale), Image.NEAREST)
    out.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(out)
    return out
