"""The paper's surrogate diagnostics: how noisy the Monte-Carlo surrogate is, and how it drives gradients.

- ``diag/cv``: the surrogate re-estimated with ``R`` independent draws of its pairs; per sample the
  coefficient of variation ``std_R / |mean_R|`` (sample std, ``ddof = 1``), averaged over samples.
  Monte-Carlo noise of the likelihood estimate itself (paper, FLUX: 0.230 naive -> 0.128 V-GRPO).
- ``diag/within_group_cv``: for one draw, the CV of the surrogate across the samples of a prompt
  group (``ddof = 1``), averaged over groups of two or more and over the ``R`` draws. The group
  comparison is what the advantage-weighted update acts on; sampling each member's own ``t`` makes
  it mostly timestep noise (paper: 0.170 -> 0.038).
- ``diag/grad_corr``: Pearson correlation, across samples, between the norm of the per-sample
  gradient of the surrogate and the surrogate's magnitude: without adaptive weighting, samples
  with a large loss (large ``t``) dominate the update.

The first functions are pure (tensors in, floats out); ``measure_surrogate`` runs a surrogate to get
their inputs, with its own generator so the training RNG streams are untouched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import operator
from collections.abc import Iterator
from functools import reduce

import torch

from vgrpo_platform.protocols import Adapter, RolloutBatch, SurrogateBase

DEFAULT_REPEATS = 4
DEFAULT_GRAD_SAMPLES = 8
_TINY = 1e-12


def mc_cv(values: torch.Tensor) -> float:
    """Mean over samples of ``std_R / |mean_R|`` for ``values`` ``[R, B]`` (``R >= 2``)."""
    if values.ndim != 2 or values.shape[0] < 2:
        raise ValueError(f"need values [R >= 2, B], got shape {tuple(values.shape)}")
    v = values.double()
    return float((v.std(dim=0, unbiased=True) / v.mean(dim=0).abs().clamp_min(_TINY)).mean())


def within_group_cv(values: torch.Tensor, group_ids: torch.Tensor) -> float:
    """Mean over draws and groups (size >= 2) of ``std_G / |mean_G|``; ``values`` ``[R, B]`` or ``[B]``."""
    v = values.double().reshape(-1, values.shape[-1])  # [R, B]
    cvs = []
    for g in torch.unique(group_ids):
        members = v[:, (group_ids == g).to(v.device)]  # [R, G]
        if members.shape[1] < 2:
            continue
        cvs.append(members.std(dim=1, unbiased=True) / members.mean(dim=1).abs().clamp_min(_TINY))
    if not cvs:
        return math.nan
    return float(torch.cat(cvs).mean())


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson correlation of two ``[N]`` vectors; NaN when either is constant or ``N < 2``."""
    x, y = x.double().flatten(), y.double().flatten()
    if x.numel() < 2:
        return math.nan
    xc, yc = x - x.mean(), y - y.mean()
    denom = float(xc.norm() * yc.norm())
    return float((xc * yc).sum()) / denom if denom > 0 else math.nan


def surrogate_diagnostics(
    values: torch.Tensor,
    group_ids: torch.Tensor,
    grad_norms: torch.Tensor | None = None,
    magnitudes: torch.Tensor | None = None,
) -> dict[str, float]:
    """``diag/cv``, ``diag/within_group_cv`` and (with ``grad_norms`` ``[N]``) ``diag/grad_corr``.

    ``values`` ``[R, B]``: per-sample surrogates from ``R`` independent pair draws. ``grad_norms``
    belong to the first ``N`` samples; ``magnitudes`` ``[N]`` default to ``|mean_R values|`` of them.
    """
    out = {"diag/cv": mc_cv(values), "diag/within_group_cv": within_group_cv(values, group_ids)}
    if grad_norms is not None:
        n = grad_norms.numel()
        if magnitudes is None:
            magnitudes = values.double().mean(dim=0).abs()[:n]
        out["diag/grad_corr"] = pearson(grad_norms, magnitudes)
    return out


def measure_surrogate(
    surrogate: SurrogateBase,
    batch: RolloutBatch,
    adapter: Adapter,
    generator: torch.Generator,
    *,
    repeats: int = DEFAULT_REPEATS,
    grad_samples: int = DEFAULT_GRAD_SAMPLES,
) -> dict[str, float]:
    """Re-run ``surrogate.prepare`` ``repeats`` times on copies of ``batch`` and differentiate it.

    Works for surrogates whose ``prepare`` stores the per-sample surrogate as ``batch.state.old_loss``
    (``vgrpo``, ``elbo_naive``, ``awm``); returns ``{}`` for the others. The per-sample gradient is
    that of ``surrogate.loss`` on the sample alone with advantage 1, before any update: there the
    ratio is 1 and the policy term's gradient is the surrogate's own (a KL to the old policy has zero
    gradient there; one to the frozen reference adds its own). ``batch`` is not modified.
    """
    if surrogate.owns_rollout:  # MDP surrogates (per-step log-probs): no per-sample ELBO
        return {}
    with _old_policy_stored(surrogate):
        return _measure(surrogate, batch, adapter, generator, repeats, grad_samples)


@contextlib.contextmanager
def _old_policy_stored(surrogate: SurrogateBase) -> Iterator[None]:
    """Make ``prepare`` store ``old_loss`` even where the trainer planned one step per batch."""
    planned = surrogate.gradient_steps
    surrogate.plan_updates(0)
    try:
        yield
    finally:
        surrogate.plan_updates(planned)


def _measure(
    surrogate: SurrogateBase,
    batch: RolloutBatch,
    adapter: Adapter,
    generator: torch.Generator,
    repeats: int,
    grad_samples: int,
) -> dict[str, float]:
    values = []
    first = None
    for _ in range(repeats):
        copy = dataclasses.replace(batch, extras=dict(batch.extras))  # prepare writes its own state
        surrogate.prepare(copy, adapter, generator)
        old_loss = _old_loss(copy)
        if old_loss is None:
            return {}
        values.append(old_loss.detach())
        if first is None:
            first = copy
    stacked = torch.stack(values)  # [R, B]
    assert first is not None  # the loop above ran at least once or returned
    params = [p for p in adapter.denoiser.parameters() if p.requires_grad]
    grad_norms = []
    if params and grad_samples > 0:
        for i in range(min(grad_samples, len(batch))):
            part = first.select(torch.tensor([i], device=batch.latents.device))
            part.advantages = torch.ones(1, device=batch.latents.device, dtype=torch.float32)
            loss, _ = surrogate.loss(part, adapter)
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            squares = [g.double().square().sum() for g in grads if g is not None]
            grad_norms.append(torch.sqrt(reduce(operator.add, squares)))
    norms = torch.stack(grad_norms).cpu() if grad_norms else None
    return surrogate_diagnostics(stacked.cpu(), batch.group_ids.cpu(), norms)


def _old_loss(batch: RolloutBatch) -> torch.Tensor | None:
    """The per-sample surrogate ``prepare`` stored, if the surrogate has one: a state field
    ``old_loss``, or (deprecated, a third-party surrogate not yet on ``BatchState``) ``extras``."""
    value = getattr(batch.state, "old_loss", None)
    if value is None:
        value = dict.get(batch.extras, "old_loss")  # dict's own get: the core's read does not warn
    return value if isinstance(value, torch.Tensor) else None
