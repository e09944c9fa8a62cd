"""Pretrain a ``tones`` model from scratch, resumably, and measure how well it follows prompts.

The shapes world's recipe on audio: flow matching (``z_t = (1 - t) x0 + t eps``, target ``v = eps -
x0``, MSE) on (prompt, synthesised clip) pairs drawn fresh every step from the world's *train* split,
clips encoded to the codec's spectrogram latents; transformer and text encoder learn jointly; warm-up
then cosine learning rate; the saved model is an EMA of the weights. The pieces that are the same loop
as ``pretrain-shapes`` are its own functions, imported from ``vgrpo_adapters.shapes.pretrain``
(``PretrainConfig``, ``flow_matching_loss``, ``lr_factor``, ``ema_with_warmup``, ``averaged``,
``save_model``); what differs here is the data, the model and the evaluation, and that a run resumes.

Resumable: every ``checkpoint_every`` steps, and when the wall-clock cap stops it, the run saves its
whole state (weights, EMA, optimiser, schedule, every random generator) in ``<out>_resume/``; the same
command run again continues from there, and the result equals an uninterrupted run's. The cap stops one
invocation, not the run: a stopped run still writes its model and a report that says it is incomplete.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from vgrpo_adapters.shapes.pretrain import (
    EVAL_SAMPLER,
    REPORT_FILE,
    PretrainConfig,
    averaged,
    ema_with_warmup,
    flow_matching_loss,
    lr_factor,
    save_model,
)
from vgrpo_rewards.tones import Config as TonesRewardConfig
from vgrpo_rewards.tones.detect import CRITERIA, applicable
from vgrpo_rewards.tones.impl import TonesReward
from vgrpo_rewards.tones.world import NUMBERS, heldout_prompts, parse_prompt, synthesise, train_prompts

from vgrpo_platform.errors import CheckpointError
from vgrpo_platform.protocols import SamplerSpec

from .build import ModelSize, build_tones_model
from .codec import SpectrogramCodec
from .impl import TonesAdapter

TONES_CONFIG = PretrainConfig(steps=10000, batch_size=32, lr=1e-3, warmup_steps=200)
"""The settings ``vgrpo pretrain-tones`` runs by default (proposed; no tones model ships yet)."""
SOLVED = 0.6
"""Held-out ``correct`` at or above which the report says the base model already solves the held-out
compositions (then RL has little to teach: stop pretraining earlier)."""
STATE_FILE = "state.pt"


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
    """``{"heldout": ..., "train": ...}``: ``evaluate`` on every held-out prompt and on as many train
    prompts (every k-th, so both templates are represented)."""
    held, train = heldout_prompts(), train_prompts()
    step = max(1, len(train) // len(held))
    return {
        "heldout": evaluate(adapter, held, seeds),
        "train": evaluate(adapter, train[::step][: len(held)], seeds),
    }


# --------------------------------------------------------------------------------------- training
def resume_dir(out: Path) -> Path:
    """Where a run keeps the state it resumes from: beside ``out``, which is replaced at the end."""
    return out.with_name(f"{out.name}_resume")


def pretrain(
    out: str | Path,
    config: PretrainConfig = TONES_CONFIG,
    size: ModelSize = ModelSize(),
    eval_seeds: Sequence[int] = (0, 1),
    log: Callable[[str], None] = print,
    checkpoint_every: int = 250,
) -> dict:
    """Train (or resume) a tones model, write the folder ``out`` (``save_pretrained``) and its report.

    Returns the report: settings, steps done, whether the run is complete, seconds over all its
    invocations, final loss, and ``evaluate_splits`` (empty ``eval_seeds`` skips it) with
    ``heldout_solved`` (held-out ``correct`` >= ``SOLVED``).
    """
    out = Path(out)
    state_path = resume_dir(out) / STATE_FILE
    # what a resumed run must share with the state it resumes (the wall-clock cap may change)
    settings = {"config": {**asdict(config), "max_minutes": None}, "size": asdict(size)}
    with tempfile.TemporaryDirectory(prefix="vgrpo_tones_init_") as tmp:
        init = build_tones_model(Path(tmp) / "init", size, seed=config.seed, words=tuple(world_words()))
        adapter = TonesAdapter.load(init, shift=config.train_shift)
    adapter.denoiser.train()
    adapter.text_encoder.requires_grad_(True).train()
    modules = torch.nn.ModuleList([adapter.denoiser, adapter.text_encoder])
    params = list(modules.parameters())
    ema = torch.optim.swa_utils.AveragedModel(modules, avg_fn=ema_with_warmup(config.ema_decay))
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, config))
    rng = np.random.default_rng(config.seed)
    gen = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)
    step, loss_ema, seconds_before = 0, math.nan, 0.0
    if state_path.is_file():
        state = torch.load(state_path, weights_only=True)
        if state["settings"] != settings:
            raise CheckpointError(
                f"{state_path.parent} holds a run with other settings than these; rerun with its settings "
                "to continue it, or delete that folder to start afresh"
            )
        modules.load_state_dict(state["model"])
        ema.load_state_dict(state["ema"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        rng.bit_generator.state = state["numpy_rng"]
        gen.set_state(state["torch_gen"])
        torch.set_rng_state(state["torch_rng"])
        step, loss_ema, seconds_before = state["step"], state["loss_ema"], state["seconds"]
        log(f"resuming from step {step} ({state_path})")
    prompts = train_prompts()
    codec = SpectrogramCodec()
    t0 = time.perf_counter()

    def save_state() -> None:
        state = {
            "settings": settings,
            "step": step,
            "loss_ema": loss_ema,
            "seconds": seconds_before + time.perf_counter() - t0,
            "model": modules.state_dict(),
            "ema": ema.state_dict(),
            "opt": opt.state_dict(),
            "sched": sched.state_dict(),
            "numpy_rng": rng.bit_generator.state,
            "torch_gen": gen.get_state(),
            "torch_rng": torch.get_rng_state(),
        }
        state_path.parent.mkdir(parents=True, exist_ok=True)
        partial = state_path.with_suffix(".partial")
        torch.save(state, partial)
        os.replace(partial, state_path)  # a crash mid-write keeps the previous state

    while step < config.steps:
        step += 1
        batch = [prompts[i] for i in rng.integers(len(prompts), size=config.batch_size)]
        x0 = synth_batch(batch, rng, codec)
        loss = flow_matching_loss(adapter, x0, batch, gen)  # the shapes loop's, duck-typed
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
        opt.step()
        sched.step()
        ema.update_parameters(modules)
        loss_ema = loss.item() if math.isnan(loss_ema) else 0.98 * loss_ema + 0.02 * loss.item()
        elapsed = time.perf_counter() - t0
        if step % 100 == 0 or step == config.steps:
            log(f"step {step}/{config.steps}  loss {loss_ema:.4f}  {elapsed / 60:.1f} min")
        capped = config.max_minutes is not None and elapsed > 60 * config.max_minutes
        if capped or (checkpoint_every and step % checkpoint_every == 0 and step < config.steps):
            save_state()
        if capped:
            log(f"stopping at step {step}: {config.max_minutes} min cap reached; run again to continue")
            break
    seconds = seconds_before + time.perf_counter() - t0
    with averaged(adapter, ema):
        save_model(adapter, out)
    complete = step >= config.steps
    report: dict = {
        "steps": step,
        "complete": complete,
        "seconds": seconds,
        "loss_ema": loss_ema,
        "threads": torch.get_num_threads(),
        "config": asdict(config),
        "size": asdict(size),
    }
    if eval_seeds:
        loaded = TonesAdapter.load(out, shift=config.shift)  # evaluate what was written, as users load it
        report["eval"] = evaluate_splits(loaded, eval_seeds)
        report["eval_seeds"] = list(eval_seeds)
        report["heldout_solved"] = report["eval"]["heldout"]["correct"] >= SOLVED
        for split, scores in report["eval"].items():
            log(f"{split:8s} " + "  ".join(f"{k} {v:.3f}" for k, v in scores.items()))
    (out / REPORT_FILE).write_text(json.dumps(report, indent=2, sort_keys=True))
    if complete and resume_dir(out).exists():
        shutil.rmtree(resume_dir(out))
    return report
