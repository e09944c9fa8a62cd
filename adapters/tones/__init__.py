"""Entry module of the ``tones`` adapter: options, registration and the ``pretrain-tones`` command.

A tiny text-to-audio flow model of the tones world (``vgrpo_rewards.tones.world``): a
``LongCatAudioDiTTransformer`` at toy size over log-magnitude spectrograms, decoded with Griffin-Lim,
and a tiny CLIP text encoder. ``vgrpo pretrain-tones`` writes one; the one it writes with its defaults
ships in ``weights/`` and is the default ``model_path``. No torch here: the heavy modules load in the
factory and the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field
from vgrpo_adapters._weights import PickleWeightsOption

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
"""The shipped model: ``transformer/``, ``text_encoder/``, ``tokenizer/`` and ``pretrain_report.json``
(written by ``pretrain-tones`` with its defaults)."""


class Config(PickleWeightsOption):
    """Options of ``[adapter.options]`` for ``name = "tones"``."""

    modality: ClassVar[str] = "audio"

    model_path: str | None = Field(
        None,
        description="Folder with transformer/, text_encoder/ and tokenizer/ written by "
        "`vgrpo pretrain-tones` (relative paths are resolved against the recipe's folder); "
        "null = the model shipped with the package.",
    )
    shift: float = Field(
        3.0,
        gt=0,
        description="Timestep shift of sampling and training; `vgrpo pretrain-tones` evaluates with 3.0 "
        "(keep them equal).",
    )


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "adapter",
            "tones",
            "vgrpo_adapters.tones.impl:load_tones_adapter",
            Config,
            "Tiny text-to-audio flow model of the tones world (LongCat-AudioDiT DiT on spectrograms, CPU).",
        ),
    ]


@hookimpl
def register_commands(app: Any) -> None:  # app: the root typer.Typer
    import typer

    @app.command("pretrain-tones")
    def pretrain_tones(
        out: Path = typer.Option(..., "--out", help="Folder to write the model to (replaced if it exists)."),
        steps: int | None = typer.Option(
            None, "--steps", min=1, help="Optimiser steps; default: the proposed recipe's (10000)."
        ),
        minutes: float | None = typer.Option(
            None, "--minutes", min=0, help="Wall-clock cap of this invocation in minutes; run again to go on."
        ),
        seed: int = typer.Option(0, "--seed", help="Seed of the weights, prompts, clips and noise."),
        eval_seeds: int = typer.Option(
            2, "--eval-seeds", min=0, help="Samples per prompt of the final evaluation (0 = skip it)."
        ),
        rescore: bool = typer.Option(
            False,
            "--rescore",
            help="Train nothing: evaluate the model in OUT again under the judge's current defaults and "
            "rewrite its report (the old figures are kept beside the new).",
        ),
    ) -> None:
        """Pretrain a tones-world model from scratch (flow matching), resumably, and report its accuracy.

        Writes OUT (transformer/, text_encoder/, tokenizer/, pretrain_report.json with train and
        held-out accuracy per criterion). Its state is kept in OUT_resume/ until the run completes:
        the same command run again continues where --minutes stopped it.
        """
        import dataclasses

        from . import pretrain as pretraining

        if rescore:
            pretraining.rescore(out, log=typer.echo)
            return
        config = dataclasses.replace(pretraining.TONES_CONFIG, seed=seed, max_minutes=minutes)
        if steps is not None:
            config = dataclasses.replace(config, steps=steps)
        pretraining.pretrain(out, config, eval_seeds=tuple(range(eval_seeds)), log=typer.echo)
