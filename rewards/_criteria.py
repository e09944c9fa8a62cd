"""What the embedded worlds' rewards share: one sample's score from its per-criterion scores, and rows of
scores as tensors. The image, video and audio worlds (``shapes``, ``moving_shapes``, ``tones``) judge
different things but turn their criteria into a score the same way."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch


def objective_score(
    scores: Mapping[str, float], weights: Mapping[str, float], criteria: Sequence[str], objective: str
) -> float:
    """One sample's score from its per-criterion ``scores`` over the ``criteria`` that apply: their
    weighted mean (``"partial"``; ``correct`` when no weight applies), weighted product (``"product"``,
    weights as exponents) or the 0/1 ``correct``."""
    total = sum(weights[c] for c in criteria)
    partial = sum(weights[c] * scores[c] for c in criteria) / total if total else scores["correct"]
    product = math.prod(scores[c] ** weights[c] for c in criteria)
    by_objective = {"correct": scores["correct"], "partial": partial, "product": product}
    return by_objective[objective]


def score_tensors(
    rows: Sequence[Mapping[str, float]], keys: Sequence[str], device: torch.device
) -> dict[str, torch.Tensor]:
    """Per-sample rows of scores -> one float32 tensor ``[B]`` per key, on ``device``."""
    return {k: torch.tensor([r[k] for r in rows], dtype=torch.float32, device=device) for k in keys}
