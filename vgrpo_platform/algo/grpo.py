"""Group-relative advantages (GRPO) as pure tensor functions.

docs/method.md section 4. Groups are the ``G`` samples of one prompt, named by ``group_ids [B]`` (any
integer labels, not necessarily contiguous or sorted). Standard deviations are population ones
(divide by ``n``): a group of two rewards ``{a, b}`` gives advantages ``+-1 * |a - b| / (|a - b| + 2 eps)``.

Multi-reward aggregation (``reward_terms`` with weights):

* ``"weighted_sum"``: ``R = sum_k w_k R_k``, then group-normalise ``R`` (Flow-GRPO's way). The
  normalisation divides the weights' scale out, and a reward with a large raw spread dominates.
* ``"normalize_then_sum"`` (the paper's, default): normalise each ``R_k`` in its group, then
  ``A = sum_k w_k A_k``. No re-normalisation after the sum: each reward contributes on the same
  scale and the weights keep their meaning (``w = 0.5`` halves a term's push). With one reward
  it equals ``w * weighted_sum``.

Constant groups (all rewards equal) get exactly zero advantage in every mode; ``zero_std_fraction``
reports how many such groups a batch holds (they carry no learning signal).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from functools import reduce
from typing import Literal

import torch

StdMode = Literal["group", "global", "none"]
Aggregation = Literal["normalize_then_sum", "weighted_sum"]


def _group_index(group_ids: torch.Tensor) -> tuple[int, torch.Tensor]:
    unique, inverse = torch.unique(group_ids, return_inverse=True)
    return int(unique.numel()), inverse  # n_groups, [B] in 0..n_groups-1


def _group_reduce(values: torch.Tensor, inverse: torch.Tensor, n_groups: int, reduce: str) -> torch.Tensor:
    """Per-group ``reduce`` ("mean", "amax", "amin") of ``values [B]``, gathered back to ``[B]``."""
    out = torch.zeros(n_groups, dtype=values.dtype, device=values.device)
    out = out.scatter_reduce(0, inverse, values, reduce=reduce, include_self=False)
    return out[inverse]


def constant_group_mask(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """``[B]`` bool: the sample's group has all values equal (zero spread, no signal)."""
    group_ids = group_ids.to(values.device)
    n_groups, inverse = _group_index(group_ids)
    hi = _group_reduce(values, inverse, n_groups, "amax")
    lo = _group_reduce(values, inverse, n_groups, "amin")
    return hi == lo


def zero_std_fraction(rewards: torch.Tensor, group_ids: torch.Tensor) -> float:
    """Fraction of groups whose rewards are all equal."""
    group_ids = group_ids.to(rewards.device)
    n_groups, inverse = _group_index(group_ids)
    const = constant_group_mask(rewards, group_ids).to(torch.float64)  # [B], constant within a group
    per_group = torch.zeros(n_groups, dtype=torch.float64, device=rewards.device)
    per_group = per_group.scatter_reduce(0, inverse, const, reduce="amax", include_self=False)
    return float(per_group.mean())


def group_normalize(
    values: torch.Tensor, group_ids: torch.Tensor, *, std: StdMode = "group", eps: float = 1e-4
) -> torch.Tensor:
    """``(v - mean_G v) / (s + eps)`` ``[B]``, ``s`` the group's or the batch's population std, or 1
    (and no ``eps``) for ``std="none"``. Constant groups give exact zeros."""
    values = values.to(torch.promote_types(values.dtype, torch.float32))
    group_ids = group_ids.to(values.device)
    n_groups, inverse = _group_index(group_ids)
    centred = values - _group_reduce(values, inverse, n_groups, "mean")  # [B]
    if std == "group":
        scale = _group_reduce(centred.square(), inverse, n_groups, "mean").sqrt() + eps
    elif std == "global":
        scale = values.std(correction=0) + eps
    elif std == "none":
        scale = torch.ones_like(values)
    else:
        raise ValueError(f"unknown std mode {std!r}; expected 'group', 'global' or 'none'")
    adv = centred / scale
    return torch.where(constant_group_mask(values, group_ids), torch.zeros_like(adv), adv)


def soft_clip(advantages: torch.Tensor, eta: float | None) -> torch.Tensor:
    """``eta * tanh(A / eta)``: slope 1 at 0, bounded by ``eta`` (used fully on-policy, where the
    ratio clip is inactive). ``eta=None`` is the identity."""
    if eta is None:
        return advantages
    if eta <= 0:
        raise ValueError(f"soft-clip eta must be > 0, got {eta}")
    return eta * torch.tanh(advantages / eta)


def compute_advantages(
    reward_terms: Mapping[str, torch.Tensor],
    weights: Mapping[str, float],
    group_ids: torch.Tensor,
    *,
    std: StdMode = "group",
    eps: float = 1e-4,
    aggregation: Aggregation = "normalize_then_sum",
    soft_clip_eta: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages [B], aggregated_rewards [B])`` from raw reward terms ``name -> [B]``.

    ``aggregated_rewards`` is always the weighted sum ``sum_k w_k R_k`` (what gets logged as the
    reward); ``advantages`` follow ``aggregation`` (module docstring), then the optional soft-clip.
    """
    if not reward_terms:
        raise ValueError("compute_advantages needs at least one reward term")
    missing = set(reward_terms) - set(weights)
    if missing:
        raise KeyError(f"no weight for reward term(s) {sorted(missing)}")
    names = list(reward_terms)
    terms = [reward_terms[n].to(torch.promote_types(reward_terms[n].dtype, torch.float32)) for n in names]
    # reduce, not sum(): the same additions, left to right, without sum()'s integer start
    aggregated = reduce(operator.add, [float(weights[n]) * r for n, r in zip(names, terms, strict=True)])
    if aggregation == "weighted_sum":
        adv = group_normalize(aggregated, group_ids, std=std, eps=eps)
    elif aggregation == "normalize_then_sum":
        adv = reduce(
            operator.add,
            [
                float(weights[n]) * group_normalize(r, group_ids, std=std, eps=eps)
                for n, r in zip(names, terms, strict=True)
            ],
        )
    else:
        raise ValueError(
            f"unknown aggregation {aggregation!r}; expected 'normalize_then_sum' or 'weighted_sum'"
        )
    return soft_clip(adv, soft_clip_eta), aggregated
