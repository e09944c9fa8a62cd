"""Dense step rewards (DenseGRPO) as pure tensor functions: reward gains per step and their advantages.

docs/method.md section 9. A trajectory ``z_0 (noise) .. z_T (the sample)`` is scored at its latents: the
latent ``z_i`` becomes a clean sample ``c(z_i)`` (its deterministic ODE completion, or its one-step
x-prediction) and the rewards score it, ``R_i = R(c(z_i))``; ``c(z_T)`` is the sample itself. Step ``j``
moves ``z_j`` to ``z_{j+1}``, so its reward is the change it made in the completed reward,

    r_j = R_{j+1} - R_j,

and its advantage compares that gain with the gains the other samples of the prompt group made at the
same step: ``A_j = (r_j - mean_G r_j) / (std_G r_j + eps)`` (``grpo.group_normalize``, per step).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vgrpo_platform.algo.grpo import group_normalize


def latent_indices(steps: Sequence[int]) -> list[int]:
    """The latents a set of scored steps needs, ``{j, j + 1}`` for each, in order."""
    return sorted({i for j in steps for i in (j, j + 1)})


def reward_gains(
    rewards: torch.Tensor, indices: Sequence[int], steps: Sequence[int], total: int
) -> torch.Tensor:
    """``[B, total]``: ``R_{j+1} - R_j`` at each scored step ``j`` (0 elsewhere), from ``rewards [B, I]``
    of the completions at latent ``indices`` (``latent_indices(steps)``)."""
    column = {i: n for n, i in enumerate(indices)}
    gains = torch.zeros(rewards.shape[0], total, dtype=rewards.dtype, device=rewards.device)
    for j in steps:
        gains[:, j] = rewards[:, column[j + 1]] - rewards[:, column[j]]
    return gains


def step_advantages(
    gains: torch.Tensor, scored: torch.Tensor, group_ids: torch.Tensor, *, eps: float = 1e-4
) -> torch.Tensor:
    """``[B, T]``: each scored step's gain normalised within its prompt group at that step; 0 elsewhere.
    ``scored`` ``[T]`` bool says which steps were scored."""
    out = torch.zeros_like(gains, dtype=torch.promote_types(gains.dtype, torch.float32))
    for j in torch.nonzero(scored).flatten().tolist():
        out[:, j] = group_normalize(gains[:, j], group_ids, std="group", eps=eps)
    return out
