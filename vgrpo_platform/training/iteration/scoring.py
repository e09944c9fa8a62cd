"""Calling reward plugins: one contract, checked by the host so a bad reward fails loudly and clearly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vgrpo_platform.conditions import reward_metadata
from vgrpo_platform.errors import RewardError
from vgrpo_platform.protocols import Reward, Samples
from vgrpo_platform.training.iteration.offload import on_device


@dataclass
class WeightedReward:
    """A reward instance as the recipe configured it."""

    key: str  # unique name in logs: the plugin name, suffixed when a recipe uses it twice
    reward: Reward
    weight: float


def score_all(
    rewards: Sequence[WeightedReward],
    samples: Samples,
    prompts: Sequence[str],
    metadata: Sequence[Mapping[str, Any]] | None = None,
    *,
    step: int | None = None,
    offload_device: torch.device | str | None = None,
    group_size: int | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Score ``samples`` with every reward.

    Returns ``(terms, details)``: ``terms[key]`` is each reward's ``[B]`` score (what is optimised),
    ``details["key/criterion"]`` the ``[B]`` diagnostics a reward reported beside its score.
    With ``offload_device`` (``train.offload_rewards``) each reward's models are moved there for its
    own call and back where they were after it (host memory once ``offload.park``-ed), so one reward
    at a time holds accelerator memory.
    """
    batch = len(samples)
    metadata = list(metadata) if metadata is not None else reward_metadata(prompts)  # JSONL fields, images
    terms: dict[str, torch.Tensor] = {}
    details: dict[str, torch.Tensor] = {}
    where = f" at iteration {step}" if step is not None else ""
    for item in rewards:
        seen = samples.for_modalities(item.reward.modalities)
        if seen is None:
            made = "/".join(sorted(samples.modalities))
            raise RewardError(
                f"reward '{item.key}' scores {sorted(item.reward.modalities)} but the adapter makes "
                f"{made}; choose a reward for {made}"
            )
        try:
            with on_device(item.reward, offload_device):
                if is_group_reward(item.reward):
                    out = _score_groups(item, seen, prompts, metadata, group_size)
                else:
                    out = item.reward.score(seen, prompts, metadata)
        except RewardError:
            raise
        except Exception as exc:  # a plugin's failure, reported with where it happened
            raise RewardError(
                f"reward '{item.key}' raised {type(exc).__name__}{where}: {exc} "
                f"(first prompt: {prompts[0]!r})"
            ) from exc
        score = out["score"] if isinstance(out, Mapping) else out
        extra = {k: v for k, v in out.items() if k != "score"} if isinstance(out, Mapping) else {}
        score = _check_scores(item.key, score, batch, prompts, where)
        terms[item.key] = score
        for name, value in extra.items():
            details[f"{item.key}/{name}"] = torch.as_tensor(value).detach().float().reshape(-1).cpu()
    return terms, details


def is_group_reward(reward: Any) -> bool:
    """Whether ``reward`` declared ``groups = True``: it scores one prompt's whole group per call."""
    return getattr(reward, "groups", False) is True


def group_bounds(prompts: Sequence[str], group_size: int | None) -> list[slice]:
    """The rows of each prompt group: ``group_size`` consecutive rows (a shorter last one when the
    batch is ragged), or without ``group_size`` each run of equal consecutive prompts."""
    n = len(prompts)
    if group_size is not None:
        return [slice(i, min(i + group_size, n)) for i in range(0, n, group_size)]
    bounds, start = [], 0
    for i in range(1, n + 1):
        if i == n or prompts[i] != prompts[start]:
            bounds.append(slice(start, i))
            start = i
    return bounds


def _score_groups(
    item: WeightedReward,
    samples: Samples,
    prompts: Sequence[str],
    metadata: Sequence[Mapping[str, Any]],
    group_size: int | None,
) -> torch.Tensor | Mapping[str, torch.Tensor]:
    """A group reward called once per prompt group; its scores (and diagnostics) joined in row order."""
    parts = []
    for rows in group_bounds(prompts, group_size):
        group = samples.select(rows)
        out = item.reward.score(group, list(prompts[rows]), list(metadata[rows]))
        named = dict(out) if isinstance(out, Mapping) else {"score": out}
        flat = {k: torch.as_tensor(v).detach().float().reshape(-1).cpu() for k, v in named.items()}
        size = rows.stop - rows.start
        if "score" not in flat or flat["score"].numel() != size:
            got = flat["score"].numel() if "score" in flat else "no"
            raise RewardError(
                f"group reward '{item.key}' returned {got} scores for a group of {size} samples "
                f"(prompt {prompts[rows.start]!r}); return one score per sample of the group"
            )
        parts.append(flat)
    if not parts:
        return torch.zeros(0)
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def _check_scores(key: str, score: Any, batch: int, prompts: Sequence[str], where: str) -> torch.Tensor:
    score = torch.as_tensor(score).detach().float().cpu()
    if score.shape != (batch,):
        raise RewardError(f"reward '{key}' returned shape {tuple(score.shape)}, expected ({batch},){where}")
    bad = ~torch.isfinite(score)
    if bad.any():
        i = int(bad.nonzero()[0])
        raise RewardError(
            f"reward '{key}' returned {score[i].item()} for sample {i}{where} (prompt {prompts[i]!r}); "
            "rewards must be finite: fix the reward or drop it from the recipe"
        )
    return score
