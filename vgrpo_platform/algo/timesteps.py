"""Monte-Carlo ``(t, eps)`` pairs for the ELBO surrogate, and who shares them.

Two of V-GRPO's three variance-reduction techniques live here (docs/method.md section 3):
stratified timesteps (one draw in each of ``K`` equal strata of ``u``) and pairs shared by every
sample of a prompt group, so that the within-group comparison of surrogates that drives the
advantage-weighted update is not swamped by Monte-Carlo noise.

Timesteps are drawn as ``u`` in ``[0, 1]`` (stratified or i.i.d.), mapped through the schedule's
``warp`` (so strata of ``u`` become strata of the model's shifted grid, the warp being monotone) and
then clamped into ``[t_min, t_max]``. The clamp keeps ``t`` off the end points where the x-space
loss degenerates: at ``t = 0`` ``x_hat == x0`` exactly and the self-normalised loss is ``0 / 0``;
at ``t = 1`` a diffusion schedule's ``x0`` prediction divides by ``a(1) = 0``. ``1e-3`` is below the
finest step of a 1000-step training grid, so the clamp changes almost nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

import torch

if TYPE_CHECKING:
    from vgrpo_platform.parallel.data_parallel import RowsOf

PairScope = Literal["group", "batch", "sample"]

DEFAULT_T_MIN = 1e-3
DEFAULT_T_MAX = 1.0 - 1e-3


def _generator_device(generator: torch.Generator | None) -> torch.device:
    return torch.device("cpu") if generator is None else generator.device


def stratified_uniform(
    n_sets: int,
    k: int,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``[n_sets, k]``: column ``j`` is uniform in the stratum ``[j / k, (j + 1) / k)``.

    Each row is a stratified sample of ``U(0, 1)``; a uniformly chosen entry of a row is exactly
    ``U(0, 1)``, so means over the row stay unbiased with lower variance than i.i.d. draws.
    """
    offsets = iid_uniform(n_sets, k, generator, dtype=dtype)  # [n_sets, k] on the generator's device
    strata = torch.arange(k, device=offsets.device, dtype=dtype)  # [k]
    u = (strata + offsets) / k  # [n_sets, k]
    return u.to(device) if device is not None else u


def iid_uniform(
    n_sets: int,
    k: int,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``[n_sets, k]`` independent ``U(0, 1)`` draws (the no-stratification ablation)."""
    u = torch.rand(n_sets, k, generator=generator, device=_generator_device(generator), dtype=dtype)
    return u.to(device) if device is not None else u


def pair_set_index(group_ids: torch.Tensor, scope: PairScope) -> tuple[int, torch.Tensor]:
    """How many pair sets to draw and which set each sample uses: ``(n_sets, index [B])``.

    ``group``: one set per distinct group id; ``batch``: one set for all; ``sample``: one each.
    """
    n = int(group_ids.shape[0])
    if scope == "group":
        unique, inverse = torch.unique(group_ids, return_inverse=True)
        return int(unique.numel()), inverse
    if scope == "batch":
        return 1, torch.zeros(n, dtype=torch.long, device=group_ids.device)
    if scope == "sample":
        return n, torch.arange(n, device=group_ids.device)
    raise ValueError(f"unknown pair scope {scope!r}; expected 'group', 'batch' or 'sample'")


def draw_pairs(
    group_ids: torch.Tensor,
    n_mc: int,
    latent_shape: Sequence[int],
    *,
    generator: torch.Generator | None = None,
    scope: PairScope = "group",
    stratified: bool = True,
    warp: Callable[[torch.Tensor], torch.Tensor] | None = None,
    t_min: float = DEFAULT_T_MIN,
    t_max: float = DEFAULT_T_MAX,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    rows: RowsOf | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Monte-Carlo pairs of one batch: ``(t [B, K], eps [B, K, *L])``.

    Draws happen on ``generator``'s device (so a seed reproduces the same pairs wherever the model
    runs) and are moved to ``device`` (default: ``group_ids``' device). Samples that share a set
    (see ``pair_set_index``) get bit-identical ``t`` and ``eps``. With ``rows`` (a data-parallel
    rank's share, ``RolloutBatch.rows``) the sets are drawn for the whole global batch and the
    local rows kept, so every rank's generator stays in step and sees what one process would.
    """
    if n_mc < 1:
        raise ValueError(f"n_mc must be >= 1, got {n_mc}")
    if not 0.0 <= t_min < t_max <= 1.0:
        raise ValueError(f"need 0 <= t_min < t_max <= 1, got t_min={t_min}, t_max={t_max}")
    device = group_ids.device if device is None else torch.device(device)
    n_local = int(group_ids.shape[0])
    n_sets, index = pair_set_index(group_ids if rows is None else rows.global_group_ids, scope)
    if rows is not None:
        index = rows.local(index, n_local)
    sampler = stratified_uniform if stratified else iid_uniform
    u = sampler(n_sets, n_mc, generator, dtype=dtype)  # [S, K] on the generator's device
    t = warp(u) if warp is not None else u
    t = t.clamp(t_min, t_max)
    eps = torch.randn(
        (n_sets, n_mc, *latent_shape), generator=generator, device=_generator_device(generator), dtype=dtype
    )  # [S, K, *L]
    index = index.to(t.device)
    return t[index].to(device), eps[index].to(device)  # [B, K], [B, K, *L]
