"""Sample grids as PNG: what a person looks at to judge a run.

An evaluation grid shows each prompt's samples as one labelled tile (the prompt above, its
samples side by side: an image as itself, a video as a filmstrip, a sound as its spectrogram:
``pictures.py``), and wraps the tiles into a near-square page at most ``PAGE_WIDTH`` pixels wide, so
hundreds of held-out samples stay readable: ``vgrpo report`` shows grids at their own size (never
shrunk, so the labels stay legible), and a page that fits the report needs no scrolling. A prompt
with more samples than fit in one line wraps them onto several. Where the rewards give a
per-sample verdict (a 0/1 detail named ``correct``, e.g. ``shapes/correct``), each frame gets a
green (right) or red (wrong) border. A conditioned prompt (an edit, image-to-video) shows its source
image first, in a black border, before its results.
Beside every grid a small JSON file records each tile's prompt, frame boxes, verdicts and rewards:
the before/after picture is cut from two grids with it, and the report lists the prompts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image, ImageDraw, ImageFont

from vgrpo_platform.protocols import Samples
from vgrpo_platform.training.observe.pictures import sample_pictures, to_pictures

RIGHT, WRONG, UNJUDGED = (40, 170, 60), (215, 40, 40), (90, 90, 90)
BACKGROUND, INK = (255, 255, 255), (20, 20, 20)
BORDER, GAP, FONT_PX = 2, 6, 11
PAGE_WIDTH = 1360  # pixels: what vgrpo report's page shows at 1:1
LEGEND = "border: green = correct, red = not ({key})"


def frames_for_grid(samples: Samples) -> torch.Tensor | None:
    """``[B, 3, H, W]`` in [0, 1] for images, the middle frame for video; None for other modalities."""
    if samples.modality == "image":
        return samples.data
    if samples.modality == "video":
        return samples.data[:, samples.data.shape[1] // 2]
    return None


def verdict_key(details: dict[str, Sequence[float]]) -> str | None:
    """The detail that says right/wrong per sample: the first (sorted) named ``correct`` or ``*/correct``."""
    found = sorted(k for k in details if k == "correct" or k.endswith("/correct"))
    return found[0] if found else None


@dataclass(frozen=True)
class GridSpec:
    """How a grid is laid out: frames of ``frame_side`` pixels, at most ``max_tiles`` prompts."""

    frame_side: int = 64  # small frames are enlarged (nearest neighbour), large ones shrunk
    strip_frames: int = 4  # a video's filmstrip: evenly spaced frames, the first and the last included
    max_tiles: int = 48  # prompts shown; the rest are counted in the header
    label_chars: int = 48  # longer prompts are cut with an ellipsis


def _font() -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    try:
        return ImageFont.load_default(size=FONT_PX)
    except TypeError:  # Pillow without FreeType: the fixed bitmap font
        return ImageFont.load_default()


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"


def _fit(text: str, font: ImageFont.ImageFont | ImageFont.FreeTypeFont, width: int) -> str:
    """``text`` cut with an ellipsis to at most ``width`` pixels, so a label never runs into the next tile."""
    while len(text) > 1 and font.getlength(text) > width:
        text = _cut(text, len(text) - 1)
    return text


def _per_line(frame_w: int, count: int, width: int) -> int:
    """How many frames of ``frame_w`` pixels (2 apart) fit side by side in ``width`` (at least one)."""
    return max(1, min(count, (width + 2) // (frame_w + 2)))


def _frame_at(k: int, per_line: int, fw: int, fh: int) -> tuple[int, int]:
    """Offset of frame ``k`` in its tile, lines of ``per_line`` frames 2 pixels apart."""
    line, col = divmod(k, per_line)
    return col * (fw + 2), line * (fh + 2)


def _mark(verdict: float | None) -> tuple[int, int, int]:
    if verdict is None or not math.isfinite(verdict):
        return UNJUDGED
    return RIGHT if verdict >= 0.5 else WRONG


def save_grid(
    samples: Samples,
    path: Path,
    *,
    group_size: int,
    prompts: Sequence[str] | None = None,
    details: dict[str, Sequence[float]] | None = None,
    rewards: Sequence[float] | None = None,
    spec: GridSpec = GridSpec(),
    title: str = "",
    sources: Sequence[torch.Tensor | None] | None = None,
) -> Path | None:
    """Tile the samples (``group_size`` consecutive samples per prompt) into one labelled PNG.

    ``prompts`` has one entry per prompt (``B / group_size``); ``details`` and ``rewards`` one value per
    sample; ``sources`` one condition image ``[3, H, W]`` (or None) per prompt, drawn first in its tile
    with a black border, so an edit's source and results sit side by side. Writes ``path`` and
    ``path.with_suffix(".json")`` (the layout); None for samples with no picture (``pictures.py``).
    A frame box holds one sample's picture: an image, a video's filmstrip, a sound's spectrogram.
    """
    n_groups = -(-len(samples) // group_size)
    shown = min(n_groups, spec.max_tiles)
    frames = sample_pictures(samples.select(slice(0, shown * group_size)), spec.frame_side, spec.strip_frames)
    if frames is None:
        return None
    originals = list(sources or [])[:shown]
    source_frames = [None if s is None else to_pictures(s[None], spec.frame_side)[0] for s in originals]
    seen = frames + [f for f in source_frames if f is not None]
    fw = max(f.width for f in seen) + 2 * BORDER
    fh = max(f.height for f in seen) + 2 * BORDER
    key = verdict_key(details or {})
    verdicts = list((details or {}).get(key, [])) if key else []
    font = _font()
    label_h = FONT_PX + 4
    lead = 1 if any(f is not None for f in source_frames) else 0  # a source column before the samples
    per_line = _per_line(fw, group_size + lead, PAGE_WIDTH - 2 * GAP)
    frame_lines = -(-(group_size + lead) // per_line)
    tile_w = max(per_line * fw + (per_line - 1) * 2, 8 * FONT_PX)
    tile_h = label_h + frame_lines * (fh + 2) - 2
    # near-square page: columns ~ sqrt(n * tile_h / tile_w), as many as fit in PAGE_WIDTH
    fit = max(1, (PAGE_WIDTH - GAP) // (tile_w + GAP))
    columns = max(1, min(shown, round(math.sqrt(shown * tile_h / tile_w)), fit))
    lines = -(-shown // columns)
    header = [title] if title else []
    if key:
        header.append(LEGEND.format(key=key))
    if n_groups > shown:
        header.append(f"first {shown} of {n_groups} prompts")
    head_h = len(header) * (FONT_PX + 3) + (GAP if header else 0)
    width = columns * tile_w + (columns + 1) * GAP
    height = head_h + lines * (tile_h + GAP) + GAP
    canvas = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    for i, line in enumerate(header):
        draw.text((GAP, GAP // 2 + i * (FONT_PX + 3)), line, fill=INK, font=font)
    tiles = []
    for g in range(shown):
        row, col = divmod(g, columns)
        x0, y0 = GAP + col * (tile_w + GAP), head_h + GAP + row * (tile_h + GAP)
        prompt = prompts[g] if prompts is not None and g < len(prompts) else ""
        draw.text((x0, y0), _fit(_cut(prompt, spec.label_chars), font, tile_w), fill=INK, font=font)
        boxes, marks, scores = [], [], []
        source_box = None
        if lead and g < len(source_frames) and (src := source_frames[g]) is not None:
            fx, fy = x0, y0 + label_h
            draw.rectangle((fx, fy, fx + fw - 1, fy + fh - 1), fill=INK)
            canvas.paste(src, (fx + BORDER, fy + BORDER))
            source_box = [fx, fy, fw, fh]
        for k in range(group_size):
            i = g * group_size + k
            if i >= len(frames):
                break
            dx, dy = _frame_at(k + lead, per_line, fw, fh)
            fx, fy = x0 + dx, y0 + label_h + dy
            verdict = float(verdicts[i]) if i < len(verdicts) else None
            draw.rectangle((fx, fy, fx + fw - 1, fy + fh - 1), fill=_mark(verdict) if key else BACKGROUND)
            canvas.paste(frames[i], (fx + BORDER, fy + BORDER))
            boxes.append([fx, fy, fw, fh])
            marks.append(verdict)
            scores.append(float(rewards[i]) if rewards is not None and i < len(rewards) else None)
        tile = {"prompt": prompt, "frames": boxes, "verdicts": marks, "rewards": scores}
        if source_box is not None:
            tile["source"] = source_box
        tiles.append(tile)
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(path)
    layout = {"group_size": group_size, "prompts_total": n_groups, "verdict_key": key, "tiles": tiles}
    path.with_suffix(".json").write_text(json.dumps(layout, indent=1))
    return path


def read_layout(grid: Path) -> dict | None:
    """The JSON written beside a grid by ``save_grid``; None when absent or unreadable."""
    try:
        return json.loads(grid.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return None


def save_before_after(
    before: Path,
    after: Path,
    out: Path,
    *,
    keep: int = 16,
    labels: tuple[str, str] = ("before", "after"),
) -> Path | None:
    """Each of the first ``keep`` prompts of two evaluation grids: its prompt, then its samples before
    and after, with the reward's verdict on each frame (``save_side_by_side`` of the two).

    Evaluations use fixed seeds, so the two grids hold the same prompts and the same noise: any
    difference is the training. None when a grid or its layout is missing, or the two grids show
    different prompts.
    """
    return save_side_by_side([before, after], out, keep=keep, labels=labels)


def save_side_by_side(
    grids: Sequence[Path], out: Path, *, keep: int = 16, labels: Sequence[str] | None = None
) -> Path | None:
    """Each of the first ``keep`` prompts of several evaluation grids of the same prompts and seeds (a run
    before and after, or several runs' last evaluations): its prompt with each grid's correct count, then
    each grid's samples in a panel, left to right, with the reward's verdict on each frame.

    The rows are stacked in two columns when there are many and two fit the page. None when a grid or
    its layout is missing, or the grids show different prompts.
    """
    paths = list(grids)
    names = list(labels) if labels is not None else [p.stem for p in paths]
    layouts = [read_layout(p) for p in paths]
    if len(paths) < 2 or not all(p.is_file() for p in paths) or any(lay is None for lay in layouts):
        return None
    lays: list[dict] = [lay for lay in layouts if lay is not None]
    n = min(min(len(lay["tiles"]) for lay in lays), keep)
    shown = [[t["prompt"] for t in lay["tiles"][:n]] for lay in lays]
    if n == 0 or any(prompts != shown[0] for prompts in shown):
        return None
    images = [Image.open(p).convert("RGB") for p in paths]
    font = _font()
    panels = len(paths)

    def strip(grid: Image.Image, tile: dict) -> Image.Image:
        """The tile's frames in lines that fit one panel's share of the page."""
        boxes = ([tile["source"]] if tile.get("source") else []) + tile["frames"]  # an edit's source first
        fw, fh = max(b[2] for b in boxes), max(b[3] for b in boxes)
        per_line = _per_line(fw, len(boxes), (PAGE_WIDTH - (2 * panels) * GAP) // panels)
        lines = -(-len(boxes) // per_line)
        row = Image.new("RGB", (per_line * (fw + 2) - 2, lines * (fh + 2) - 2), BACKGROUND)
        for k, (x, y, w, h) in enumerate(boxes):
            row.paste(grid.crop((x, y, x + w, y + h)), _frame_at(k, per_line, fw, fh))
        return row

    rows = [[strip(images[g], lays[g]["tiles"][i]) for g in range(panels)] for i in range(n)]
    label_h = FONT_PX + 4
    panel_w = max(strip_.width for row in rows for strip_ in row)
    cell_w = max(panels * panel_w + (2 * panels - 1) * GAP, 26 * FONT_PX)
    cell_h = label_h + max(strip_.height for row in rows for strip_ in row) + GAP
    columns = 2 if n > 8 and 2 * (cell_w + GAP) + GAP <= PAGE_WIDTH else 1
    lines = -(-n // columns)
    key = lays[0].get("verdict_key")
    header = " | ".join(names) + " (same prompts, same seeds)"
    if key:
        header += "; " + LEGEND.format(key=key)
    head_h = FONT_PX + 3 + GAP
    canvas = Image.new("RGB", (columns * (cell_w + GAP) + GAP, head_h + lines * cell_h + GAP), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    draw.text((GAP, GAP // 2), header, fill=INK, font=font)
    for i, row in enumerate(rows):
        line, col = divmod(i, columns)
        x0, y0 = GAP + col * (cell_w + GAP), head_h + line * cell_h
        label = lays[0]["tiles"][i]["prompt"]
        if key:
            counts = []
            for lay in lays:
                v = [x for x in lay["tiles"][i]["verdicts"] if x is not None]
                counts.append(f"{sum(x >= 0.5 for x in v)}/{len(v)}" if v else "-")
            label += f"   ({' -> '.join(counts)} correct)"
        draw.text((x0, y0), _fit(_cut(label, 84), font, cell_w), fill=INK, font=font)
        for g, strip_ in enumerate(row):
            px = x0 + g * (panel_w + 2 * GAP)
            canvas.paste(strip_, (px, y0 + label_h))
            if g:
                sep_x = px - GAP
                draw.line((sep_x, y0 + label_h, sep_x, y0 + label_h + strip_.height), fill=INK, width=1)
    out.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(out)
    return out
