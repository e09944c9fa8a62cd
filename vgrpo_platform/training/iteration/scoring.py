"""Calling reward plugins: one contract, checked by the host so a bad reward fails loudly and clearly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

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
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Score ``samples`` with every reward.

    Returns ``(terms, details)``: ``terms[key]`` is each reward's ``[B]`` score (what is optimised),
    ``details["key/criterion"]`` the ``[B]`` diagnostics a reward reported beside its score.
    With ``offload_device`` (``train.offload_rewards``) each reward's models are moved there for its
    own call and back where they were after it (host memory once ``offload.park``-ed), so one reward
    at a time holds accelerator memory.
    """
    batch = len(samples)
    metadata = list(metadata) if metadata is not None else [{} for _ in range(batch)]
    terms: dict[str, torch.Tensor] = {}
    details: dict[str, torch.Tensor] = {}
    where = f" at iteration {step}" if step is not None else ""
    for item in rewards:
        if samples.modality not in item.reward.modalities:
            raise RewardError(
                f"reward '{item.key}' scores {sorted(item.reward.modalities)} but the adapter makes "
                f"{samples.modality}; choose a reward for {samples.modality}"
            )
        try:
            with on_device(item.reward, offload_device):
                out = item.reward.score(samples, prompts, metadata)
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
