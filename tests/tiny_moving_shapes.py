"""A tiny moving-shapes model (``vgrpo_adapters.moving_shapes.build``) for fast tests: one Wan block of
width 24, a one-layer UMT5, clips of 4 frames at the world's 32 px in 8 px patches (16 tokens a frame)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vgrpo_adapters.moving_shapes.build import ModelSize, build_moving_shapes_model

TINY = ModelSize(
    resolution=32,
    num_frames=4,
    patch_size=(1, 8, 8),
    num_layers=1,
    num_heads=2,
    head_dim=12,
    ffn_dim=32,
    text_dim=16,
    text_layers=1,
    text_heads=2,
)


def build_tiny_moving_shapes(folder: Path, seed: int = 0) -> dict[str, Any]:
    """Write the tiny model to ``folder``; the adapter's options that load it."""
    build_moving_shapes_model(folder, TINY, seed=seed)
    return {"model_path": str(folder), "resolution": TINY.resolution, "num_frames": TINY.num_frames}
