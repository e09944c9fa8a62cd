"""Tree rollouts (TreeGRPO, BranchGRPO) as pure tensor functions: the tree's layout and its node advantages.

docs/method.md section 8. A prompt group is one tree: its root is the group's shared initial noise, and
at each branching step every current node takes ``k`` independent SDE draws from the same step mean, so
after ``m`` branching steps the tree has ``G = k^m`` leaves, the group's rows, in depth-first order
(leaf ``i``'s branch choices are the base-``k`` digits of ``i``, the first branch most significant).

Each denoising step ``j`` of leaf ``i`` lies on the edge into one node: the node that the ``c(j)``
branchings at or before step ``j`` have made, numbered ``i // k^(m - c(j))`` within the tree. Rows that
share a node share the edge (its latents, its noise, its log-prob): ``node_ids`` says which.

Node advantages, from the leaves' advantages ``A_i`` (the loop's group-normalised ones, the tree's
leaves being the group):

- ``"leaf_mean"`` (TreeGRPO): a node's advantage is the mean of ``A_i`` over the leaves below it;
- ``"depth_norm"`` (BranchGRPO): a node's value is that mean, and the values of the tree's nodes at the
  same step are z-scored among themselves (sample std, ``+ 1e-8``); a step with a single node, or
  whose values are all equal (std below ``1e-6``), gets zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

TreeAdvantage = Literal["leaf_mean", "depth_norm"]
DEPTH_NORM_EPS = 1e-8  # BranchGRPO's (rewards - mean) / (std + 1e-8)
DEPTH_NORM_MIN_STD = 1e-6  # ... and its zero advantage where std < 1e-6


def leaf_count(branching: int, branch_steps: Sequence[int]) -> int:
    """``k^m``: the leaves of one tree, which must be the recipe's ``rollout.group_size``."""
    return branching ** len(branch_steps)


def branchings_so_far(steps: int, branch_steps: Sequence[int]) -> torch.Tensor:
    """``[T]`` long: ``c(j)``, how many branching steps lie at or before step ``j``."""
    marks = torch.zeros(steps, dtype=torch.long)
    for b in branch_steps:
        marks[b] = 1
    return marks.cumsum(0)


def node_ids(steps: int, branch_steps: Sequence[int], branching: int) -> torch.Tensor:
    """``[G, T]`` long: the node (within its tree) whose incoming edge holds step ``j`` of leaf ``i``."""
    depth = len(branch_steps)
    below = branching ** (depth - branchings_so_far(steps, branch_steps))  # [T], leaves under each node
    leaves = torch.arange(branching**depth)[:, None]  # [G, 1]
    return leaves // below[None, :]


def _keys(group_ids: torch.Tensor, nodes: torch.Tensor) -> tuple[int, torch.Tensor]:
    """One dense index per (group, step, node): ``(count, [B, T])``."""
    b, t = nodes.shape
    step = torch.arange(t, device=nodes.device).expand(b, t)
    triples = torch.stack([group_ids[:, None].expand(b, t).to(nodes.device), step, nodes], dim=-1)
    unique, inverse = torch.unique(triples.reshape(-1, 3), dim=0, return_inverse=True)
    return int(unique.shape[0]), inverse.reshape(b, t)


def node_mean(values: torch.Tensor, group_ids: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """``[B, T]``: the mean of ``values [B]`` over the rows sharing each row's node at each step."""
    n, key = _keys(group_ids, nodes)
    v = values.to(torch.promote_types(values.dtype, torch.float32))
    expanded = v[:, None].expand_as(key)
    sums = torch.zeros(n, dtype=v.dtype, device=v.device).index_add_(0, key.flatten(), expanded.flatten())
    counts = torch.zeros(n, dtype=v.dtype, device=v.device).index_add_(
        0, key.flatten(), torch.ones_like(expanded.flatten())
    )
    return (sums / counts)[key]


def first_of_node(group_ids: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool: the row that stands for its node at each step (the first row holding it)."""
    n, key = _keys(group_ids, nodes)
    rows = torch.arange(key.shape[0], device=key.device)[:, None].expand_as(key)
    first = torch.full((n,), key.shape[0], dtype=torch.long, device=key.device)
    first = first.scatter_reduce(0, key.flatten(), rows.flatten(), reduce="amin")
    return first[key] == rows


def node_advantages(
    advantages: torch.Tensor, group_ids: torch.Tensor, nodes: torch.Tensor, mode: TreeAdvantage
) -> torch.Tensor:
    """``[B, T]``: each row's advantage at each step, its node's (module docstring)."""
    means = node_mean(advantages, group_ids, nodes)  # [B, T]
    if mode == "leaf_mean":
        return means
    if mode != "depth_norm":
        raise ValueError(f"unknown tree advantage {mode!r}; expected 'leaf_mean' or 'depth_norm'")
    out = torch.zeros_like(means)
    first = first_of_node(group_ids, nodes)  # one value per node, however many leaves it has
    for g in torch.unique(group_ids).tolist():
        rows = group_ids == g
        for j in range(means.shape[1]):
            values = means[rows, j][first[rows, j]]  # the tree's nodes at step j
            if values.numel() < 2:
                continue
            std = values.std(correction=1)
            if std < DEPTH_NORM_MIN_STD:
                continue
            out[rows, j] = (means[rows, j] - values.mean()) / (std + DEPTH_NORM_EPS)
    return out
