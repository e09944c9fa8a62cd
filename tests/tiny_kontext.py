"""A tiny FLUX.1 Kontext pipeline and an edit prompt set with source images, shared by the Kontext tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from diffusers import FluxKontextPipeline
from PIL import Image
from tiny_pipelines import RESOLUTION, build_tiny_flux

from vgrpo_platform.conditions import Prompt

EDITS = ("make it brighter", "make it darker", "add a red hat")


def build_tiny_flux_kontext(folder: str | Path, seed: int = 0) -> Path:
    """``FluxKontextPipeline`` at toy size: the tiny FLUX pipeline's components (Kontext's transformer is
    FLUX's, its context tokens marked by position ids), saved as a Kontext pipeline under ``folder``."""
    flux = build_tiny_flux(Path(folder).with_name(Path(folder).name + "_flux"), seed)
    FluxKontextPipeline.from_pretrained(flux).save_pretrained(folder)
    return Path(folder)


def source_image(seed: int, side: int = RESOLUTION) -> Image.Image:
    """A random RGB image (smooth enough to have structure): a source to edit."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
    return Image.fromarray(small).resize((side, side), Image.Resampling.BILINEAR)


def edit_prompt_set(folder: Path, count: int = 3, side: int = RESOLUTION) -> Path:
    """``folder/edits.jsonl``: ``count`` edit instructions, each with its own ``side``-pixel source in
    ``folder/src``."""
    (folder / "src").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(count):
        source_image(i, side).save(folder / "src" / f"{i}.png")
        lines.append({"prompt": EDITS[i % len(EDITS)], "image": f"src/{i}.png", "task": "edit"})
    path = folder / "edits.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def edit_prompts(folder: Path, count: int = 3, side: int = RESOLUTION) -> list[Prompt]:
    """The prompts of ``edit_prompt_set(folder, count, side)``, each carrying its source (as the loader)."""
    path = edit_prompt_set(folder, count, side)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [Prompt(line["prompt"], line, [folder / line["image"]]) for line in lines]
