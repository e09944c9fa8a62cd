"""Pretrain the shipped ``shapes`` model from scratch, and measure how well a model follows prompts.

Flow matching (rectified flow, ``z_t = (1 - t) x0 + t eps``, target ``v = eps - x0``, MSE) on
(prompt, rendered image) pairs drawn fresh every step from the world's *train* split, with
``t = warp(u)``, ``u ~ U(0, 1)`` under ``train_shift`` (1 = uniform ``t``: the low-noise steps that
draw a shape's corners get as much training as the high-noise ones that place it; sampling and the
RL surrogate use the adapter's shift 3). The transformer and the (randomly initialised) text encoder
learn jointly; in RL the text encoder is frozen. The learning rate warms up, then decays on a cosine
to ``lr_final_ratio``; the shipped weights are an exponential moving average of the trained ones
(``ema_decay``), which samples cleaner than the last iterate. Training stops after a fixed number of
steps (or a wall-clock cap): stopping early is what leaves the model imperfect, most of all on the
held-out compositions, so that RL has something to teach.

Reproducible: one seed drives the initial weights, the prompts, the layouts, the noise and the
timesteps; the same ``--steps`` and ``--seed`` give the same model up to float summation order
(thread count).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from vgrpo_adapters._flow_pretrain import EVAL_SAMPLER as EVAL_SAMPLER
from vgrpo_adapters._flow_pretrain import (  # the shared loop; names re-exported for this module's users
    LOAD_PATH_KEYS as LOAD_PATH_KEYS,
)
from vgrpo_adapters._flow_pretrain import REPORT_FILE as REPORT_FILE
from vgrpo_adapters._flow_pretrain import PretrainConfig as PretrainConfig
from vgrpo_adapters._flow_pretrain import averaged as averaged
from vgrpo_adapters._flow_pretrain import (
    draw_uniformly,
    evaluate_with,
    split_scores,
    train_flow_model,
    write_pretrained,
)
from vgrpo_adapters._flow_pretrain import drop_load_path as drop_load_path
from vgrpo_adapters._flow_pretrain import ema_with_warmup as ema_with_warmup
from vgrpo_adapters._flow_pretrain import flow_matching_loss as flow_matching_loss
from vgrpo_adapters._flow_pretrain import lr_factor as lr_factor
from vgrpo_adapters._flow_pretrain import save_model as save_model
from vgrpo_adapters.toy.build import build_toy_model
from vgrpo_adapters.toy.impl import ToyAdapter
from vgrpo_rewards.shapes import Config as ShapesRewardConfig
from vgrpo_rewards.shapes.detect import CRITERIA
from vgrpo_rewards.shapes.impl import ShapesReward
from vgrpo_rewards.shapes.world import (
    COLORS,
    NUMBERS,
    RELATIONS,
    SHAPES,
    heldout_prompts,
    render,
    train_prompts,
)

from vgrpo_platform.protocols import SamplerSpec


def world_words() -> list[str]:
    """Every word the world's prompts use: each becomes one token of the tokenizer."""
    words = {"an", "one", "and", *NUMBERS.values(), *COLORS}
    words |= {s for shape in SHAPES for s in (shape, shape + "s")}
    words |= {w for phrase in RELATIONS.values() for w in phrase.split()}
    return sorted(words)


@dataclass(frozen=True)
class ModelSize:
    """Architecture of the shipped model (the ``build_toy_model`` knobs)."""

    resolution: int = 32
    patch_size: int = 4  # 8 x 8 image tokens at 32 px: 4x fewer than patch 2, what makes CPU RL fast
    num_layers: int = 4
    num_heads: int = 4
    head_dim: int = 32
    text_dim: int = 64
    text_layers: int = 2
    text_heads: int = 2
    max_prompt_tokens: int = 16  # the longest prompt is 11 words + BOS + EOS


STAGE_1 = PretrainConfig()
"""From random weights: one cosine cycle (what shipped until the model got a second stage)."""
STAGE_2 = PretrainConfig(steps=8000, lr=4e-4, warmup_steps=200, seed=1)
"""A warm restart from stage 1's saved model: fresh AdamW, a lower peak rate, a second cosine. Measured
(189 held-out prompts x 2 seeds): peak 4e-4 gives 41.3% correct, shape 0.79; peak 1e-3 gave 68.5%, too
close to solving the held-out compositions to leave RL room."""
SHIPPED_STAGES: tuple[PretrainConfig, ...] = (STAGE_1, STAGE_2)
"""The stages ``vgrpo pretrain-shapes`` runs by default: the recipe of the shipped weights."""


# ------------------------------------------------------------------------------------------- data
def render_batch(prompts: Sequence[str], rng: np.random.Generator, size: int) -> torch.Tensor:
    """Rendered scenes in model space: ``[B, 3, size, size]`` in ``[-1, 1]``."""
    imgs = np.stack([np.asarray(render(p, rng, size)) for p in prompts])  # [B, H, W, 3] uint8
    return torch.from_numpy(imgs).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)


# ------------------------------------------------------------------------------------- evaluation
def evaluate(
    adapter: ToyAdapter,
    prompts: Sequence[str],
    seeds: Sequence[int] = (0, 1),
    sampler: SamplerSpec = EVAL_SAMPLER,
    batch_size: int = 64,
) -> dict[str, float]:
    """Mean per-criterion scores (``color``, ``shape``, ``count``, ``position``, ``correct``) of the
    model's samples, one sample per prompt and seed; seed ``s`` fixes the noise of every prompt."""
    reward = ShapesReward(ShapesRewardConfig())
    return evaluate_with(reward, CRITERIA, adapter, prompts, seeds, sampler, batch_size)


def evaluate_splits(
    adapter: ToyAdapter, seeds: Sequence[int] = (0, 1), sampler: SamplerSpec = EVAL_SAMPLER
) -> dict[str, dict[str, float]]:
    """``evaluate`` on every held-out prompt and on as many train prompts (``split_scores``)."""
    return split_scores(
        lambda prompts: evaluate(adapter, prompts, seeds, sampler), heldout_prompts(), train_prompts()
    )


# --------------------------------------------------------------------------------------- training
def build_initial(folder: Path, size: ModelSize, seed: int) -> Path:
    """The random initial model, in the diffusers folder layout."""
    return build_toy_model(folder, seed=seed, words=world_words(), **asdict(size))


def pretrain(
    out: str | Path,
    config: PretrainConfig = PretrainConfig(),
    size: ModelSize = ModelSize(),
    eval_seeds: Sequence[int] = (0, 1),
    log: Callable[[str], None] = print,
    eval_every: int = 0,
    snapshot_dir: str | Path | None = None,
    init: str | Path | None = None,
) -> dict:
    """Train from scratch, write the model folder ``out`` (``save_pretrained``) and its report.

    Returns the report: the settings, steps done, seconds, final loss and ``evaluate_splits``
    (empty ``eval_seeds`` skips the evaluation). Experiments: ``eval_every`` logs a quick held-out
    evaluation every that many steps and, with ``snapshot_dir``, saves the model there as
    ``step_<n>`` (mid-cosine, so a snapshot is not a shorter run). ``init`` starts from a saved model
    folder (a warm restart: the weights only, with a fresh optimiser, schedule and EMA) instead of
    random weights.
    """
    out = Path(out)
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    gen = torch.Generator().manual_seed(config.seed)
    prompts = train_prompts()
    if init is not None:
        adapter = ToyAdapter.load(Path(init), shift=config.train_shift)
    else:
        with tempfile.TemporaryDirectory(prefix="vgrpo_shapes_init_") as tmp:
            adapter = ToyAdapter.load(
                build_initial(Path(tmp) / "init", size, config.seed), shift=config.train_shift
            )

    draw = draw_uniformly(
        prompts, config.batch_size, lambda batch, rng: render_batch(batch, rng, size.resolution)
    )

    def on_step(step: int, ema: torch.optim.swa_utils.AveragedModel) -> None:
        if eval_every and step % eval_every == 0:
            with averaged(adapter, ema):
                _eval_log(adapter, log, step, config.shift)
                if snapshot_dir is not None:
                    save_model(adapter, Path(snapshot_dir) / f"step_{step}")

    result = train_flow_model(adapter, config, size, draw, rng, gen, log=log, on_step=on_step)
    return write_pretrained(
        adapter,
        result,
        out,
        config,
        size,
        load=lambda folder: ToyAdapter.load(folder, shift=config.shift),
        evaluate_splits=evaluate_splits,
        eval_seeds=eval_seeds,
        log=log,
    )


def pretrain_stages(
    out: str | Path,
    stages: Sequence[PretrainConfig] = SHIPPED_STAGES,
    size: ModelSize = ModelSize(),
    eval_seeds: Sequence[int] = (0, 1),
    log: Callable[[str], None] = print,
    init: str | Path | None = None,
) -> dict:
    """Run ``stages`` in turn, each from the model the one before saved; ``out`` gets the last one.

    ``init`` is a model folder that stands for the first stage's output (e.g. the stage-1 model of an
    earlier run): then only the later stages run. Each earlier stage's model is kept beside ``out`` as
    ``<out>_stage<k>`` (an hour of CPU: a failed later stage restarts from it with ``init``). The
    report of the last stage lists every stage's settings.
    """
    out = Path(out)
    stages = list(stages)
    first = 1 if init is not None else 0
    reports: list[dict] = []
    previous = Path(init) if init is not None else None
    for k in range(first, len(stages)):
        last = k == len(stages) - 1
        target = out if last else out.with_name(f"{out.name}_stage{k + 1}")
        origin = f"from {previous}" if previous is not None else "from random weights"
        log(f"stage {k + 1}/{len(stages)}: {stages[k].steps} steps at lr {stages[k].lr:g}, {origin}")
        report = pretrain(
            target, stages[k], size, eval_seeds=eval_seeds if last else (), log=log, init=previous
        )
        reports.append(report)
        previous = target
    final = reports[-1]
    final["stages"] = [asdict(c) for c in stages]
    final["stages_run"] = [r["steps"] for r in reports]
    final["seconds_all_stages_run"] = sum(r["seconds"] for r in reports)
    final["started_from"] = "random weights" if init is None else f"stage-1 model {Path(init).name}"
    (out / REPORT_FILE).write_text(json.dumps(final, indent=2, sort_keys=True))
    return final


def _eval_log(adapter: ToyAdapter, log: Callable[[str], None], step: int, shift: float) -> None:
    adapter.denoiser.eval()
    sampling = ToyAdapter(adapter.denoiser, adapter.text_encoder, adapter.tokenizer, shift=shift)
    scores = evaluate(sampling, heldout_prompts()[::2], seeds=(0,))
    adapter.denoiser.train()
    adapter.text_encoder.requires_grad_(True).train()  # the sampling view froze it
    log(f"eval @{step}: " + "  ".join(f"{k} {v:.3f}" for k, v in scores.items()))
