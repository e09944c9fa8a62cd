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
    before: Path,
    after: Path,
    out: Path,
    *,
    rows: int,
    keep_rows: int = 16,
    pair_columns: int = 4,
    min_height: int = 512,
) -> Path | None:
    """The first ``keep_rows`` prompt rows of two evaluation grids, each prompt's before beside its after.

    Evaluations use fixed seeds, so the two grids hold the same prompts and the same noise: any
    difference is the training. ``rows`` is the number of prompt rows in each grid. The
    (before | after) pairs are tiled ``pair_columns`` across under a "before | after" label; small
    frames are enlarged (nearest neighbour) to at least ``min_height`` pixels so they can be judged.
    """
    if not (before.is_file() and after.is_file()) or rows < 1:
        return None
    grids = [Image.open(path).convert("RGB") for path in (before, after)]
    row_height = min(g.height for g in grids) // rows
    n = min(rows, keep_rows)
    gap, header = 4, 12
    pair_width = grids[0].width + gap + grids[1].width
    columns = max(1, min(pair_columns, n))
    lines = -(-n // columns)
    canvas = Image.new(
        "RGB", (columns * pair_width + (columns - 1) * 3 * gap, header + lines * row_height), (255, 255, 255)
    )
    from PIL import ImageDraw

    draw = ImageDraw.Draw(canvas)
    for c in range(columns):
        x = c * (pair_width + 3 * gap)
        draw.text((x + 1, 0), "before", fill=(0, 0, 0))
        draw.text((x + grids[0].width + gap + 1, 0), "after", fill=(0, 0, 0))
    for i in range(n):
        line, c = divmod(i, columns)
        x, y = c * (pair_width + 3 * gap), header + line * row_height
        box = (0, i * row_height, 0, (i + 1) * row_height)
        canvas.paste(grids[0].crop((0, box[1], grids[0].width, box[3])), (x, y))
        canvas.paste(grids[1].crop((0, box[1], grids[1].width, box[3])), (x + grids[0].width + gap, y))
    scale = max(1, -(-min_height // canvas.height))
    if scale > 1:
        canvas = canvas.resize((canvas.width * scale, canvas.height * scale), Image.NEAREST)
    out.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(out)
    return out
