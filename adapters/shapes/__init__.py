"""Entry module of the ``shapes`` adapter: options, registration and the ``pretrain-shapes`` command.

The embedded default model: a tiny text-to-image flow model (the ``toy`` adapter's classes) that
was pretrained on the procedural shapes world (``vgrpo_rewards.shapes.world``) and ships with the
package in ``weights/``. It is loaded with ``from_pretrained`` like any checkpoint. No torch here:
the heavy modules load in the factory and in the command's body.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field
from vgrpo_adapters._weights import PickleWeightsOption

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
"""The shipped model: ``transformer/``, ``text_encoder/``, ``tokenizer/`` (written by ``pretrain-shapes``)."""


class Config(PickleWeightsOption):
    """Options of ``[adapter.options]`` for ``name = "shapes"``."""

    model_path: str | None = Field(
        None,
        description="Folder with transformer/, text_encoder/ and tokenizer/ (e.g. written by "
        "`vgrpo pretrain-shapes`; relative paths are resolved against the recipe's folder); "
        "null = the model shipped with the package.",
    )
    resolution: int = Field(
        32, ge=4, multiple_of=4, description="Image side in pixels (the shapes world's default size)."
    )
    shift: float = Field(
        3.0,
        gt=0,
        description="Timestep shift of sampling and training; the shipped model was pretrained "
        "with 3.0 (keep them equal).",
    )


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "adapter",
            "shapes",
            "vgrpo_adapters.shapes.impl:load_shapes_adapter",
            Config,
            "Tiny text-to-image flow model pretrained on the shapes world, shipped with vgrpo (CPU).",
        ),
    ]


@hookimpl
def register_commands(app: Any) -> None:  # app: the root typer.Typer
    import typer

    @app.command("pretrain-shapes")
    def pretrain_shapes(
        out: Path = typer.Option(..., "--out", help="Folder to write the model to (replaced if it exists)."),
        steps: int | None = typer.Option(
            None, "--steps", min=1, help="Optimiser steps; default: the shipped model's."
        ),
        minutes: float | None = typer.Option(
            None, "--minutes", min=0, help="Wall-clock cap in minutes (stops early, before --steps)."
        ),
        seed: int = typer.Option(0, "--seed", help="Seed of the weights, prompts, layouts and noise."),
        eval_seeds: int = typer.Option(
            2, "--eval-seeds", min=0, help="Samples per prompt of the final evaluation (0 = skip it)."
        ),
        from_stage1: Path | None = typer.Option(
            None, "--from-stage1", help="A stage-1 model folder: skip stage 1 and run only stage 2 from it."
        ),
    ) -> None:
        """Pretrain the shapes-world model from scratch (flow matching) and report its accuracy.

        Two stages: a cosine cycle from random weights, then a warm restart from its saved model.
        With the defaults this reproduces the model shipped in vgrpo_adapters/shapes/weights;
        --steps and --minutes apply to each stage.
        """
        import dataclasses

        from .pretrain import SHIPPED_STAGES, pretrain_stages

        stages = []
        for k, stage in enumerate(SHIPPED_STAGES):
            stage = dataclasses.replace(stage, seed=seed + k, max_minutes=minutes)
            stages.append(dataclasses.replace(stage, steps=steps) if steps is not None else stage)
        if from_stage1 is not None and not (from_stage1 / "transformer").is_dir():
            raise typer.BadParameter(
                f"{from_stage1} holds no model (no transformer/ folder)", param_hint="--from-stage1"
            )
        pretrain_stages(out, stages, eval_seeds=tuple(range(eval_seeds)), log=typer.echo, init=from_stage1)

    @app.command("shapes-anchor-data")
    def shapes_anchor_data(
        out: Path = typer.Option(
            ..., "--out", help="The .safetensors file to write (replaced if it exists)."
        ),
        samples: int = typer.Option(256, "--samples", min=1, help="How many (prompt, scene) pairs."),
        seed: int = typer.Option(0, "--seed", help="Seed of the prompts and layouts."),
        resolution: int = typer.Option(
            32, "--resolution", min=4, help="Image side in pixels (the adapter's)."
        ),
    ) -> None:
        """Render a data set for [train.data_anchor] from the shapes world's train prompts."""
        from .anchor_data import write_shapes_anchor

        path = write_shapes_anchor(out, samples, seed=seed, resolution=resolution)
        typer.echo(f"wrote {samples} rendered scenes to {path}; set train.data_anchor.source to it")
