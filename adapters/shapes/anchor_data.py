"""A data set for ``[train.data_anchor]`` from the shapes world's procedural renderer.

The ``shapes`` model works in pixel space (its latents are the ``[-1, 1]`` images themselves, as in
``pretrain-shapes``), so the anchor's data are rendered scenes of the world's *train* prompts: the
distribution the shipped model was pretrained on, never the held-out compositions the evaluations test.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from vgrpo_rewards.shapes.world import train_prompts

from vgrpo_platform.training.iteration.data_anchor import write_anchor_data

from .pretrain import render_batch


def write_shapes_anchor(path: str | Path, n: int, *, seed: int = 0, resolution: int = 32) -> Path:
    """Render ``n`` (prompt, scene) pairs into ``path``: tensor ``latents`` ``[n, 3, R, R]`` and metadata
    ``prompts`` (JSON list), the format ``train.data_anchor.source`` reads."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    rng = np.random.default_rng(seed)
    pool = train_prompts()
    prompts = [pool[i] for i in rng.integers(len(pool), size=n)]
    return write_anchor_data(path, render_batch(prompts, rng, resolution), prompts)
