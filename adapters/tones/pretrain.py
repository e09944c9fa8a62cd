"""Pretrain a ``tones`` model from scratch, resumably, and measure how well it follows prompts.

The shapes world's recipe on audio (``vgrpo_adapters._flow_pretrain``'s loop: flow matching on
(prompt, synthesised clip) pairs drawn fresh every step from the world's *train* split, transformer and
text encoder jointly, warm-up then cosine, EMA weights saved); clips are encoded to the codec's
spectrogram latents. What is this world's own is the data, the model and the evaluation.

Resumable: every ``checkpoint_every`` steps, and when the wall-clock cap stops it, the run saves its
whole state (weights, EMA, optimiser, schedule, the prompt and noise generators) in ``<out>_resume/``;
the same command run again continues from there, and the result equals an uninterrupted run's. The cap
stops one invocation, not the run: a stopped run still writes its model and a report with
``"finished": false``.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from vgrpo_adapters._flow_pretrain import (
    EVAL_SAMPLER,
    PretrainConfig,
    draw_uniformly,
    rescore_report,
    resume_state_file,
    split_scores,
    train_flow_model,
    write_pretrained,
)
from vgrpo_rewards.tones import Config as TonesRewardConfig
from vgrpo_rewards.tones.detect import CRITERIA, applicable
from vgrpo_rewards.tones.impl import TonesReward
from vgrpo_rewards.tones.world import NUMBERS, heldout_prompts, parse_prompt, synthesise, train_prompts

from vgrpo_platform.protocols import SamplerSpec

from .build import ModelSize, build_tones_model
from .codec import SpectrogramCodec
from .impl import TonesAdapter

TONES_CONFIG = PretrainConfig(steps=10000, batch_size=32, lr=1e-3, warmup_steps=200)
"""The settings ``vgrpo pretrain-tones`` runs by default (those of the shipped model)."""
SOLVED = 0.6
"""Held-out ``correct`` at or above which the report says the base model already solves the held-out
compositions (then RL has little to teach: stop pretraining earlier)."""


def world_words() -> list[str]:
    """Every word the world's prompts use: each becomes one token of the tokenizer."""
    words = {"an", "one", "then", "short", *NUMBERS.values(), "low", "mid", "high", "rising", "falling"}
    words |= {s for noun in ("beep", "click", "tone") for s in (noun, noun + "s")}
    return sorted(words)


def synth_batch(prompts: Sequence[str], rng: np.random.Generator, codec: SpectrogramCodec) -> torch.Tensor:
    """Synthesised clips of ``prompts`` as latents ``[B, BINS, FRAMES]`` in ``[-1, 1]``."""
    waves = np.stack([synthesise(p, rng) for p in prompts])  # [B, N_SAMPLES]
    return codec.encode(torch.from_numpy(waves))


# ------------------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate(
    adapter: TonesAdapter,
    prompts: Sequence[str],
    seeds: Sequence[int] = (0, 1),
    sampler: SamplerSpec = EVAL_SAMPLER,
    batch_size: int = 64,
) -> dict[str, float]:
    """Mean per-criterion scores (``count``, ``kind``, ``pitch``, ``direction``, ``order``, ``correct``)
    of the model's decoded clips, one per prompt and seed; seed ``s`` fixes the noise of every prompt.
    A criterion is averaged over the prompts that test it (``pitch`` over prompts with a beep, ...),
    not padded with the 1 the reward gives where it does not apply; NaN where no prompt tests it."""
    reward = TonesReward(TonesRewardConfig())
    totals = {k: 0.0 for k in (*CRITERIA, "correct")}
    counts = dict.fromkeys(totals, 0)
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        for start in range(0, len(prompts), batch_size):
            part = list(prompts[start : start + batch_size])
            noise = torch.randn(len(part), *adapter.latent_shape(), generator=gen).to(adapter.device)
            x0 = adapter.sample(noise, adapter.encode_prompts(part), sampler)
            scores = reward.score(adapter.decode(x0), part, [{}] * len(part))
            for row, prompt in enumerate(part):
                tested = applicable(parse_prompt(prompt)) | {"correct": True}
                for k in totals:
                    if tested[k]:
                        totals[k] += scores[k][row].item()
                        counts[k] += 1
    return {k: totals[k] / counts[k] if counts[k] else math.nan for k in totals}


def evaluate_splits(adapter: TonesAdapter, seeds: Sequence[int] = (0, 1)) -> dict[str, dict[str, float]]:
    """``evaluate`` on every held-out prompt and on as many train prompts (``split_scores``)."""
    return split_scores(lambda prompts: evaluate(adapter, prompts, seeds), heldout_prompts(), train_prompts())


# --------------------------------------------------------------------------------------- training
def pretrain(
    out: str | Path,
    config: PretrainConfig = TONES_CONFIG,
    size: ModelSize = ModelSize(),
    eval_seeds: Sequence[int] = (0, 1),
    log: Callable[[str], None] = print,
    checkpoint_every: int = 250,
) -> dict:
    """Train (or resume) a tones model, write the folder ``out`` (``save_pretrained``) and its report.

    The loop, the resume state and the report are the shared ones (``vgrpo_adapters._flow_pretrain``);
    what is the tones world's own is the data (synthesised clips as codec latents), the model and the
    evaluation. A state left in ``resume_state_file(out)`` by a capped run is picked up by the same call
    again.
    """
    out = Path(out)
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    gen = torch.Generator().manual_seed(config.seed)
    with tempfile.TemporaryDirectory(prefix="vgrpo_tones_init_") as tmp:
        init = build_tones_model(Path(tmp) / "init", size, seed=config.seed, words=tuple(world_words()))
        adapter = TonesAdapter.load(init, shift=config.train_shift)
    prompts = train_prompts()
    codec = SpectrogramCodec()

    draw = draw_uniformly(prompts, config.batch_size, lambda batch, rng: synth_batch(batch, rng, codec))

    result = train_flow_model(
        adapter,
        config,
        size,  # a resume with another size (even another clip length) is refused
        draw,
        rng,
        gen,
        log=log,
        state_file=resume_state_file(out),
        checkpoint_every=checkpoint_every,
    )
    if not result.finished(config):
        log(f"stopped at step {result.step}/{config.steps}: run the same command again to continue")
    return write_pretrained(
        adapter,
        result,
        out,
        config,
        size,
        load=lambda folder: TonesAdapter.load(folder, shift=config.shift),
        evaluate_splits=evaluate_splits,
        eval_seeds=eval_seeds,
        solved=SOLVED,
        log=log,
    )


def rescore(out: str | Path, log: Callable[[str], None] = print) -> dict:
    """Evaluate the tones model in ``out`` again under the reward's current judge (``rescore_report``)."""
    return rescore_report(
        Path(out),
        load=lambda folder: TonesAdapter.load(folder, shift=TONES_CONFIG.shift),
        evaluate_splits=evaluate_splits,
        why="re-evaluated under the tones judge's current defaults",
        solved=SOLVED,
        log=log,
    )
