"""Pretrain the ``moving_shapes`` video model from scratch, and measure how well it follows prompts.

The image world's recipe (``vgrpo_adapters._flow_pretrain``: rectified flow on fresh renders of the
*train* prompts, transformer and text encoder jointly, warm-up + cosine, EMA weights saved, wall-clock cap)
on clips: each step renders ``batch_size`` train prompts as ``[3, F, R, R]`` clips. Stopping early is what
leaves the model imperfect on the held-out compositions, so that RL has something to teach; the report
says whether the base model already solves them.

Resumable: a run stopped by ``max_minutes`` (or killed) keeps its state beside the output
(``resume_state_file``) and the same call again finishes the same schedule, drawing what an uninterrupted
run would have drawn.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from vgrpo_adapters._flow_pretrain import (
    EVAL_SAMPLER,
    PretrainConfig,
    draw_uniformly,
    evaluate_with,
    resume_state_file,
    split_scores,
    train_flow_model,
    write_pretrained,
)
from vgrpo_adapters._flow_pretrain import REPORT_FILE as REPORT_FILE  # re-exported for its users
from vgrpo_rewards.moving_shapes import Config as RewardConfig
from vgrpo_rewards.moving_shapes.impl import MovingShapesReward
from vgrpo_rewards.moving_shapes.track import CRITERIA
from vgrpo_rewards.moving_shapes.world import heldout_prompts, render, train_prompts

from vgrpo_platform.protocols import SamplerSpec

from .build import ModelSize, build_moving_shapes_model
from .impl import MovingShapesAdapter

SOLVED = 0.9
"""Held-out ``correct`` at or above which the report says the base model already solves the held-out
compositions (then RL has little to teach: stop earlier)."""
PROPOSED = PretrainConfig()
"""``vgrpo pretrain-moving-shapes`` defaults, the shipped model's: the image world's schedule (14000 steps of
32 clips, lr 2e-3 cosine). 6000 steps of 16 clips (at 4 or 8 frames) left shape and motion at chance; this
schedule taught shape (as many clips as the image model saw images) but left the direction of motion near
chance, which is what RL is left to teach."""
CHECKPOINT_EVERY = 250  # steps between resume states: a killed run loses at most this much


def render_clips(prompts: Sequence[str], rng: np.random.Generator, size: int, frames: int) -> torch.Tensor:
    """Rendered clips in model space (Wan's layout): ``[B, 3, F, size, size]`` in ``[-1, 1]``."""
    clips = np.stack([render(p, rng, size, frames) for p in prompts])  # [B, F, H, W, 3] uint8
    return torch.from_numpy(clips).permute(0, 4, 1, 2, 3).float().div(127.5).sub(1.0)


def evaluate(
    adapter: MovingShapesAdapter,
    prompts: Sequence[str],
    seeds: Sequence[int] = (0, 1),
    sampler: SamplerSpec = EVAL_SAMPLER,
    batch_size: int = 32,
) -> dict[str, float]:
    """Mean per-criterion scores (``color``, ``shape``, ``count``, ``motion``, ``correct``) of the model's
    clips, one per prompt and seed."""
    reward = MovingShapesReward(RewardConfig())
    return evaluate_with(reward, CRITERIA, adapter, prompts, seeds, sampler, batch_size)


def evaluate_splits(
    adapter: MovingShapesAdapter, seeds: Sequence[int] = (0, 1), max_prompts: int | None = None
) -> dict[str, dict[str, float]]:
    """``evaluate`` on the held-out prompts (the first ``max_prompts``, default all) and on as many train
    prompts (``split_scores``)."""
    return split_scores(
        lambda prompts: evaluate(adapter, prompts, seeds), heldout_prompts()[:max_prompts], train_prompts()
    )


def pretrain_moving_shapes(
    out: str | Path,
    config: PretrainConfig = PROPOSED,
    size: ModelSize = ModelSize(),
    eval_seeds: Sequence[int] = (0, 1),
    log: Callable[[str], None] = print,
    max_eval_prompts: int | None = None,
) -> dict:
    """Train from scratch (or resume), write the model folder ``out`` and ``pretrain_report.json``.

    The report: the settings, steps done and whether the schedule finished, seconds, the final loss and,
    unless ``eval_seeds`` is empty, ``evaluate_splits`` of the written model with ``heldout_solved``
    (held-out ``correct`` >= ``SOLVED``). A capped run writes both too, from its EMA weights so far.
    """
    out = Path(out)
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    gen = torch.Generator().manual_seed(config.seed)
    prompts = train_prompts()
    with tempfile.TemporaryDirectory(prefix="vgrpo_moving_shapes_init_") as tmp:
        initial = build_moving_shapes_model(Path(tmp) / "init", size, config.seed)
        adapter = _load(initial, size, config.train_shift)

    draw = draw_uniformly(
        prompts,
        config.batch_size,
        lambda batch, rng: render_clips(batch, rng, size.resolution, size.num_frames),
    )

    result = train_flow_model(
        adapter,
        config,
        size,  # a resume with another size (even another clip length) is refused
        draw,
        rng,
        gen,
        log=log,
        state_file=resume_state_file(out),
        checkpoint_every=CHECKPOINT_EVERY,
    )
    if not result.finished(config):
        log(f"stopped at step {result.step}/{config.steps}: run the same command again to continue")
    return write_pretrained(
        adapter,
        result,
        out,
        config,
        size,
        load=lambda folder: _load(folder, size, config.shift),
        evaluate_splits=lambda model, seeds: evaluate_splits(model, seeds, max_eval_prompts),
        eval_seeds=eval_seeds,
        solved=SOLVED,
        log=log,
    )


def _load(folder: Path, size: ModelSize, shift: float) -> MovingShapesAdapter:
    return MovingShapesAdapter.load(
        folder, resolution=size.resolution, num_frames=size.num_frames, shift=shift
    )
