"""Entry module of the ``moving_shapes`` adapter: options, registration and ``pretrain-moving-shapes``.

The video sibling of ``shapes``: a tiny text-to-video flow model (a ``WanTransformer3DModel`` in pixel
space and a UMT5 text encoder, ``build.py``) pretrained on the procedural moving-shapes world
(``vgrpo_rewards.moving_shapes.world``) by ``vgrpo pretrain-moving-shapes``, loaded with
``from_pretrained`` from ``model_path`` or, by default, from the model shipped in ``weights/``. No torch
here: the heavy modules load in the factory and in the command's body.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field
from vgrpo_adapters._weights import PickleWeightsOption

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
"""The shipped model: ``transformer/``, ``text_encoder/``, ``tokenizer/`` and ``pretrain_report.json``
(``pretrain-moving-shapes`` with its defaults, seed 0: its first 5750 steps ran under an experiment script
with the same loop and settings, whose resume state the command took up and ran to the end)."""


class Config(PickleWeightsOption):
    """Options of ``[adapter.options]`` for ``name = "moving_shapes"``."""

    model_path: str | None = Field(
        None,
        description="Folder with transformer/, text_encoder/ and tokenizer/ written by "
        "`vgrpo pretrain-moving-shapes` (relative paths are resolved against the recipe's folder); "
        "null = the model shipped with the package.",
    )
    resolution: int = Field(
        32, ge=4, multiple_of=4, description="Frame side in pixels (the world's default size)."
    )
    num_frames: int = Field(4, ge=2, description="Frames per clip (the world's default length).")
    fps: float = Field(8.0, gt=0, description="Frame rate written into the clips' files and grids.")
    shift: float = Field(
        3.0,
        gt=0,
        description="Timestep shift of sampling and training; pretrain-moving-shapes evaluates with 3.0.",
    )


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "adapter",
            "moving_shapes",
            "vgrpo_adapters.moving_shapes.impl:load_moving_shapes_adapter",
            Config,
            "Tiny pixel-space text-to-video flow model (Wan 3D DiT + UMT5) of the moving-shapes world (CPU).",
        ),
    ]


@hookimpl
def register_commands(app: Any) -> None:  # app: the root typer.Typer
    import typer

    @app.command("pretrain-moving-shapes")
    def pretrain_moving_shapes(
        out: Path = typer.Option(..., "--out", help="Folder to write the model to (replaced if it exists)."),
        steps: int | None = typer.Option(
            None, "--steps", min=1, help="Optimiser steps (the cosine's length); default: the proposed run's."
        ),
        minutes: float | None = typer.Option(
            None,
            "--minutes",
            min=0,
            help="Wall-clock cap in minutes: stops early, writes the model and the state to resume from.",
        ),
        seed: int = typer.Option(0, "--seed", help="Seed of the weights, prompts, layouts and noise."),
        eval_seeds: int = typer.Option(
            2, "--eval-seeds", min=0, help="Samples per prompt of the final evaluation (0 = skip it)."
        ),
        frames_per_token: int = typer.Option(
            1,
            "--frames-per-token",
            min=1,
            help="Frames one token spans (the transformer's temporal patch); must divide the clip's frames.",
        ),
    ) -> None:
        """Pretrain the moving-shapes video model from scratch (flow matching) and report its accuracy.

        Writes the model folder and pretrain_report.json (train and held-out accuracy per criterion).
        With --minutes the run stops at the cap, still writes both, and keeps its state in OUT_resume/ so
        that the same command run again finishes the schedule.
        """
        import dataclasses

        from .build import ModelSize
        from .pretrain import PROPOSED
        from .pretrain import pretrain_moving_shapes as run

        config = dataclasses.replace(PROPOSED, seed=seed, max_minutes=minutes)
        if steps is not None:
            config = dataclasses.replace(config, steps=steps)
        default = ModelSize()
        _, height, width = default.patch_size
        try:
            size = ModelSize(patch_size=(frames_per_token, height, width))
        except ValueError:  # the only knob this command exposes is the frames per token
            raise typer.BadParameter(
                f"{frames_per_token} does not divide the clip's {default.num_frames} frames: pass a divisor",
                param_hint="--frames-per-token",
            ) from None
        run(out, config, size, eval_seeds=tuple(range(eval_seeds)), log=typer.echo)
