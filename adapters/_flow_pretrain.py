"""Flow-matching pretraining of a small text-conditioned model from scratch: what the embedded worlds share.

The ``shapes`` (image) and ``moving_shapes`` (video) worlds pretrain their models the same way: rectified
flow (``z_t = (1 - t) x0 + t eps``, target ``v = eps - x0``, MSE) on (prompt, rendered sample) pairs drawn
fresh every step, ``t = warp(u)``, ``u ~ U(0, 1)`` under ``train_shift``; transformer and text encoder learn
jointly; AdamW with a linear warm-up and a cosine decay; an EMA of the weights is what gets saved; a
wall-clock cap. Each world says how a batch is drawn (``draw_batch``) and which model it builds; the loop
(``train_flow_model``), the loss, the schedule, the EMA, the saving and the report (``write_pretrained``) are
here once.

``train_flow_model`` can also stop and go on: with ``state_file`` it writes everything a resume needs (the
weights, the EMA, AdamW, the schedule, the data and noise generators' states) when the cap stops it and
every ``checkpoint_every`` steps (``resume_state_file``), and the same call again continues from that
file, drawing what an uninterrupted run would have drawn.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from vgrpo_platform.errors import RecipeError
from vgrpo_platform.protocols import Conditioning, SamplerSpec, Samples
from vgrpo_platform.training.iteration.optimizer import lr_factor as schedule_factor


class PretrainableAdapter(Protocol):
    """What the loop needs of a world's adapter (``ToyAdapter``, ``MovingShapesAdapter``)."""

    denoiser: Any
    text_encoder: Any
    tokenizer: Any
    schedule: Any
    device: Any

    def predict(self, z_t: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor: ...
    def encode_with_grad(self, prompts: Sequence[str]) -> Conditioning: ...
    def encode_prompts(self, prompts: Sequence[str]) -> Conditioning: ...
    def latent_shape(self) -> tuple[int, ...]: ...
    def sample(self, noise: torch.Tensor, cond: Conditioning, sampler: SamplerSpec) -> torch.Tensor: ...
    def decode(self, latents: torch.Tensor) -> Samples: ...


REPORT_FILE = "pretrain_report.json"
EVAL_SAMPLER = SamplerSpec("dpmsolver++", 8)  # the quickstarts' rollout and evaluation sampler

DrawBatch = Callable[[np.random.Generator], tuple[list[str], torch.Tensor]]
"""A world's data: ``batch_size`` prompts and their rendered samples in model space, from the generator."""


def draw_uniformly(
    prompts: Sequence[str],
    batch_size: int,
    render: Callable[[list[str], np.random.Generator], torch.Tensor],
) -> DrawBatch:
    """The worlds' draw: ``batch_size`` prompts uniformly with replacement, then ``render(batch, rng)``
    from the same generator (so a resumed run, restoring it, draws what an uninterrupted one would)."""

    def draw(rng: np.random.Generator) -> tuple[list[str], torch.Tensor]:
        batch = [prompts[i] for i in rng.integers(len(prompts), size=batch_size)]
        return batch, render(batch, rng)

    return draw


@dataclass(frozen=True)
class PretrainConfig:
    steps: int = 14000
    batch_size: int = 32
    lr: float = 2e-3
    lr_final_ratio: float = 0.05  # cosine decay from lr to lr * this over the steps
    warmup_steps: int = 200
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    ema_decay: float = 0.999  # the saved model is this EMA of the weights
    shift: float = 3.0  # the adapter's sampling shift, used by the evaluations
    train_shift: float = 1.0  # timestep shift of the training draws (1 = uniform t)
    seed: int = 0
    max_minutes: float | None = None  # wall-clock cap; None = run all steps


@dataclass
class LoopResult:
    """Where the loop stopped: the last step done, its smoothed loss, the seconds spent (this call and the
    runs it resumed), and the EMA of the weights (``averaged`` swaps it in)."""

    step: int
    loss_ema: float
    seconds: float
    ema: torch.optim.swa_utils.AveragedModel

    def finished(self, config: PretrainConfig) -> bool:
        return self.step >= config.steps


def flow_matching_loss(
    adapter: PretrainableAdapter, x0: torch.Tensor, prompts: Sequence[str], generator: torch.Generator
) -> torch.Tensor:
    """Rectified-flow MSE ``|v_theta(z_t, t) - (eps - x0)|^2`` at ``t = warp(u)``; ``x0`` ``[B, *L]``."""
    b = x0.shape[0]
    t = adapter.schedule.warp(torch.rand(b, generator=generator))  # [B]
    eps = torch.randn(x0.shape, generator=generator)  # [B, *L]
    z_t = adapter.schedule.noise(x0, eps, t)
    v = adapter.predict(z_t, t, adapter.encode_with_grad(prompts))
    return torch.nn.functional.mse_loss(v, eps - x0)


def _modules(adapter: PretrainableAdapter) -> torch.nn.ModuleList:
    return torch.nn.ModuleList([adapter.denoiser, adapter.text_encoder])


def resume_state_file(out: Path) -> Path:
    """Where a pretraining run writing ``out`` keeps what a resume needs: ``<out>_resume/state.pt``, beside
    ``out`` (which is replaced when the model is written) and gone once the schedule is done."""
    return out.with_name(f"{out.name}_resume") / "state.pt"


def train_flow_model(
    adapter: PretrainableAdapter,
    config: PretrainConfig,
    size: Any,
    draw_batch: DrawBatch,
    rng: np.random.Generator,
    gen: torch.Generator,
    *,
    log: Callable[[str], None] = print,
    on_step: Callable[[int, torch.optim.swa_utils.AveragedModel], None] | None = None,
    state_file: Path | None = None,
    checkpoint_every: int = 0,
) -> LoopResult:
    """Train ``adapter``'s denoiser and text encoder for ``config.steps`` steps (or until the cap).

    Each step: ``draw_batch(rng)``, the flow-matching loss with ``gen``'s noise, an AdamW step with
    gradient clipping, the schedule, the EMA. ``on_step(step, ema)`` runs after each step (experiments'
    evaluations). ``state_file``: where the state a resume needs is written (at the cap, every
    ``checkpoint_every`` steps) and, when it exists, read from first: the same call again goes on where a
    cap or a kill stopped it; removed once the schedule is done, with its folder if that is left empty
    (the folder is the run's own: ``resume_state_file``). ``size`` (the world's model-size dataclass, as
    ``write_pretrained`` takes it) is saved with the state beside the settings: a resume whose size or
    settings differ (another clip length, say) is refused in one line.
    """
    settings = {k: v for k, v in asdict(config).items() if k != "max_minutes"}
    facts = {"size": asdict(size), "config": settings}
    adapter.denoiser.train()
    adapter.text_encoder.requires_grad_(True).train()
    params = [*adapter.denoiser.parameters(), *adapter.text_encoder.parameters()]
    ema = torch.optim.swa_utils.AveragedModel(_modules(adapter), avg_fn=ema_with_warmup(config.ema_decay))
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, config))
    t0 = time.perf_counter()
    loss_ema, step, done, before = math.nan, 0, 0, 0.0
    if state_file is not None and state_file.is_file():
        done, loss_ema, before = _load_state(state_file, facts, adapter, ema, opt, sched, rng, gen)
        step = done
        log(f"resuming at step {done}/{config.steps} from {state_file}")
    for step in range(done + 1, config.steps + 1):
        batch, x0 = draw_batch(rng)
        loss = flow_matching_loss(adapter, x0, batch, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
        opt.step()
        sched.step()
        ema.update_parameters(_modules(adapter))
        loss_ema = loss.item() if math.isnan(loss_ema) else 0.98 * loss_ema + 0.02 * loss.item()
        elapsed = time.perf_counter() - t0
        if step % 100 == 0 or step == config.steps:
            log(f"step {step}/{config.steps}  loss {loss_ema:.4f}  {elapsed / 60:.1f} min")
        if on_step is not None:
            on_step(step, ema)
        capped = config.max_minutes is not None and elapsed > 60 * config.max_minutes
        if state_file is not None and step < config.steps and (capped or _due(step, checkpoint_every)):
            seconds = before + time.perf_counter() - t0
            _save_state(state_file, step, loss_ema, seconds, facts, adapter, ema, opt, sched, rng, gen)
        if capped:
            log(f"stopping at step {step}: {config.max_minutes} min cap reached")
            break
    if state_file is not None and step >= config.steps:
        state_file.unlink(missing_ok=True)  # finished: nothing left to resume
        if state_file.parent.is_dir() and not any(state_file.parent.iterdir()):
            state_file.parent.rmdir()
    return LoopResult(step, loss_ema, before + time.perf_counter() - t0, ema)


def _due(step: int, every: int) -> bool:
    return every > 0 and step % every == 0


def _save_state(
    path: Path,
    step: int,
    loss_ema: float,
    seconds: float,
    facts: Mapping[str, Any],
    adapter: PretrainableAdapter,
    ema: torch.optim.swa_utils.AveragedModel,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    rng: np.random.Generator,
    gen: torch.Generator,
) -> None:
    """Everything a resume restores, written to a temporary name first (a kill mid-write keeps the old)."""
    state = {
        "step": step,
        "loss_ema": loss_ema,
        "seconds": seconds,
        "facts": json.dumps(facts, sort_keys=True),
        "modules": _modules(adapter).state_dict(),
        "ema": ema.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "rng": json.dumps(rng.bit_generator.state),
        "gen": gen.get_state(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def _load_state(
    path: Path,
    facts: Mapping[str, Any],
    adapter: PretrainableAdapter,
    ema: torch.optim.swa_utils.AveragedModel,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    rng: np.random.Generator,
    gen: torch.Generator,
) -> tuple[int, float, float]:
    """Restore ``_save_state``'s file in place; returns ``(step, loss_ema, seconds)``."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    saved, now = json.loads(state["facts"]), json.loads(json.dumps(facts))  # tuples read back as lists
    if saved != now:
        changed = sorted(k for k in {*saved, *now} if saved.get(k) != now.get(k))
        raise RecipeError(
            f"cannot resume from {path}: it was saved with other {', '.join(changed)}; resume with the "
            "same settings (only the wall-clock cap may change) or delete it to start afresh"
        )
    _modules(adapter).load_state_dict(state["modules"])
    ema.load_state_dict(state["ema"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    rng.bit_generator.state = json.loads(state["rng"])
    gen.set_state(state["gen"])
    return int(state["step"]), float(state["loss_ema"]), float(state["seconds"])


# ------------------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate_with(
    reward: Any,
    criteria: Sequence[str],
    adapter: PretrainableAdapter,
    prompts: Sequence[str],
    seeds: Sequence[int] = (0, 1),
    sampler: SamplerSpec = SamplerSpec("dpmsolver++", 8),
    batch_size: int = 64,
) -> dict[str, float]:
    """Mean per-criterion scores (``criteria`` and ``correct``) of the model's samples under ``reward``,
    one sample per prompt and seed; seed ``s`` fixes the noise of every prompt."""
    totals = {k: 0.0 for k in (*criteria, "correct")}
    n = 0
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        for start in range(0, len(prompts), batch_size):
            part = list(prompts[start : start + batch_size])
            noise = torch.randn(len(part), *adapter.latent_shape(), generator=gen).to(adapter.device)
            x0 = adapter.sample(noise, adapter.encode_prompts(part), sampler)
            scores = reward.score(adapter.decode(x0), part, [{}] * len(part))
            for k in totals:
                totals[k] += scores[k].sum().item()
            n += len(part)
    return {k: v / n for k, v in totals.items()}


def split_scores(
    evaluate: Callable[[Sequence[str]], dict[str, float]], heldout: Sequence[str], train: Sequence[str]
) -> dict[str, dict[str, float]]:
    """``{"heldout": ..., "train": ...}``: ``evaluate`` on the held-out prompts and on as many train
    prompts, every k-th (so every template of the train split is represented): the pretraining report's
    evidence that the model learned the train split and not yet the held-out compositions."""
    step = max(1, len(train) // len(heldout))
    return {"heldout": evaluate(heldout), "train": evaluate(train[::step][: len(heldout)])}


# ------------------------------------------------------------------------------- schedule and EMA
def ema_with_warmup(decay: float) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """EMA step for ``AveragedModel``: the decay ramps up as ``(1 + n) / (10 + n)`` to ``decay``, so
    the random initial weights are forgotten quickly (a plain 0.999 EMA keeps 13% of them at step 2000)."""

    def average(averaged: torch.Tensor, current: torch.Tensor, num_averaged: torch.Tensor) -> torch.Tensor:
        n = float(num_averaged)
        d = min(decay, (1.0 + n) / (10.0 + n))
        return averaged * d + current * (1.0 - d)

    return average


def lr_factor(step: int, config: PretrainConfig) -> float:
    """Linear warm-up, then a cosine from 1 to ``lr_final_ratio`` at ``config.steps``."""
    return schedule_factor(
        step,
        warmup_steps=config.warmup_steps,
        total_steps=config.steps,
        schedule="cosine",
        final_ratio=config.lr_final_ratio,
    )


@contextmanager
def averaged(adapter: PretrainableAdapter, ema: torch.optim.swa_utils.AveragedModel) -> Iterator[None]:
    """Swap the EMA weights into the adapter's modules for the block, then put the trained ones back."""
    modules = _modules(adapter)
    trained = [p.detach().clone() for p in modules.parameters()]
    with torch.no_grad():
        for p, q in zip(modules.parameters(), ema.module.parameters(), strict=True):
            p.copy_(q)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, q in zip(modules.parameters(), trained, strict=True):
                p.copy_(q)


# ------------------------------------------------------------------------------------------ saving
def write_pretrained(
    adapter: PretrainableAdapter,
    result: LoopResult,
    out: Path,
    config: PretrainConfig,
    size: Any,
    *,
    load: Callable[[Path], PretrainableAdapter],
    evaluate_splits: Callable[[PretrainableAdapter, Sequence[int]], dict[str, dict[str, float]]],
    eval_seeds: Sequence[int],
    solved: float | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Save the EMA weights to ``out``, evaluate the folder as a user loads it, write ``REPORT_FILE``.

    The report: the settings (``config``, ``size``: a dataclass), steps done and whether the schedule
    ``finished`` (a capped run writes its model and report too), seconds, final loss, threads and, unless
    ``eval_seeds`` is empty, ``evaluate_splits(load(out), eval_seeds)``; with ``solved``, also
    ``heldout_solved`` (held-out ``correct`` >= ``solved``: the base model would leave RL nothing to teach).
    """
    with averaged(adapter, result.ema):
        save_model(adapter, out)
    report: dict[str, Any] = {
        "steps": result.step,
        "finished": result.finished(config),
        "seconds": result.seconds,
        "loss_ema": result.loss_ema,
        "threads": torch.get_num_threads(),
        "config": asdict(config),
        "size": asdict(size),
    }
    if eval_seeds:
        score_into(report, evaluate_splits(load(out), eval_seeds), eval_seeds, solved=solved, log=log)
    (out / REPORT_FILE).write_text(json.dumps(report, indent=2, sort_keys=True))
    return report


def score_into(
    report: dict[str, Any],
    scores: dict[str, dict[str, float]],
    seeds: Sequence[int],
    *,
    solved: float | None,
    log: Callable[[str], None],
) -> None:
    """Put a model folder's per-split ``scores`` into ``report``, log them, and judge ``heldout_solved``.

    Why one function: a written and a rescored report must say the same things by the same rule.
    """
    report["eval"] = scores
    report["eval_seeds"] = list(seeds)
    for split, per_criterion in scores.items():
        log(f"{split:8s} " + "  ".join(f"{k} {v:.3f}" for k, v in per_criterion.items()))
    if solved is not None:
        report["heldout_solved"] = scores["heldout"]["correct"] >= solved
        if report["heldout_solved"]:
            log(f"the base model already solves the held-out prompts (correct >= {solved}): train less")


def rescore_report(
    out: Path,
    *,
    load: Callable[[Path], PretrainableAdapter],
    evaluate_splits: Callable[[PretrainableAdapter, Sequence[int]], dict[str, dict[str, float]]],
    why: str,
    solved: float | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Evaluate the model folder ``out`` again and rewrite its report's accuracy; trains nothing.

    Why: a judge whose test changes moves a base model's figures with no training. The figures it
    replaces stay in the report, beside the new ones, under ``rescored`` (with ``why`` and the date).
    """
    path = out / REPORT_FILE
    if not path.is_file():
        raise RecipeError(f"{out} has no {REPORT_FILE}: rescore a folder that a pretraining run wrote")
    report = json.loads(path.read_text())
    seeds = report.get("eval_seeds") or [0, 1]
    before = {k: report[k] for k in ("eval", "heldout_solved") if k in report}
    score_into(report, evaluate_splits(load(out), seeds), seeds, solved=solved, log=log)
    report.setdefault("rescored", []).append({"why": why, "on": time.strftime("%Y-%m-%d"), "before": before})
    path.write_text(json.dumps(report, indent=2, sort_keys=True))
    return report


def save_model(adapter: PretrainableAdapter, out: Path) -> None:
    """``save_pretrained`` of the three parts into a fresh ``out`` (fp32 safetensors)."""
    if out.exists():
        shutil.rmtree(out)
    adapter.denoiser.save_pretrained(out / "transformer")
    adapter.text_encoder.save_pretrained(out / "text_encoder")
    adapter.tokenizer.save_pretrained(out / "tokenizer")
    for config in sorted(out.glob("*/*.json")):
        drop_load_path(config)


LOAD_PATH_KEYS = ("_name_or_path", "name_or_path")
"""Where a model was loaded from, which ``save_pretrained`` copies into its config: a folder of the machine
that wrote it (stage 2 loads stage 1's output; the shipped weights once named the developer's work tree)."""


def drop_load_path(config: Path) -> None:
    """Remove ``LOAD_PATH_KEYS`` from a saved JSON config, in diffusers' layout (sorted keys, indent 2)."""
    data = json.loads(config.read_text())
    if isinstance(data, dict) and any(key in data for key in LOAD_PATH_KEYS):
        kept = {k: v for k, v in data.items() if k not in LOAD_PATH_KEYS}
        config.write_text(json.dumps(kept, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
