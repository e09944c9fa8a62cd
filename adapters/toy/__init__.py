"""Entry module of the ``toy`` adapter: its options and registration only, no torch at import time.

A tiny text-to-image rectified-flow model (diffusers ``SD3Transformer2DModel`` in pixel space and a
tiny CLIP text encoder) for CPU runs, tests and the quickstart recipe. Without ``model_path`` it is
built from configs with a fixed seed, saved, and loaded back through ``from_pretrained``.
"""

from __future__ import annotations

from pydantic import Field
from vgrpo_adapters._weights import PickleWeightsOption

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component


class ToyAdapterConfig(PickleWeightsOption):
    """Options of ``[adapter.options]`` for ``name = "toy"``."""

    model_path: str | None = Field(
        None,
        description="Folder with transformer/, text_encoder/ and tokenizer/ subfolders (relative paths are "
        "resolved against the recipe's folder); null = build the tiny model from the knobs below and "
        "cache it in <run_dir>/toy_model.",
    )
    resolution: int = Field(
        16, ge=2, multiple_of=2, description="Image side in pixels (the model works in pixel space)."
    )
    num_layers: int = Field(1, ge=1, description="MMDiT blocks of a built model (ignored with model_path).")
    num_heads: int = Field(
        2, ge=1, description="Attention heads of a built model, 16 channels each (ignored with model_path)."
    )
    init_seed: int = Field(
        0,
        description="Seed of a built model's random weights, independent of the run seed (ignored with "
        "model_path).",
    )
    shift: float = Field(
        1.0, gt=0, description="Timestep shift s of t -> s t / (1 + (s - 1) t), for sampling and training."
    )


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "adapter",
            "toy",
            "vgrpo_adapters.toy.impl:ToyAdapter.from_config",
            ToyAdapterConfig,
            "Tiny pixel-space text-to-image flow model (SD3 MMDiT + CLIP text encoder) for CPU runs.",
        ),
    ]
