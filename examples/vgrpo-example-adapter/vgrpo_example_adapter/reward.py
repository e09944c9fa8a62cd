"""The tone reward: how much of a signal's energy sits at the frequency the prompt asks for."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from vgrpo_platform.protocols import Samples

CYCLES = re.compile(r"(\d+)\s*cycles?")


def wanted_cycles(prompt: str, default: int) -> int:
    """``"a tone at 3 cycles"`` -> 3; prompts that name no number of cycles get ``default``."""
    match = CYCLES.search(prompt)
    return int(match.group(1)) if match else default


class ToneReward:
    """``|X[k]|^2 / sum_{j >= 1} |X[j]|^2`` for the signal's DFT ``X`` and ``k`` the prompt's cycles.

    In ``[0, 1]``: 1 for a pure sinusoid of ``k`` cycles (any phase), 0 for a constant signal.
    """

    modalities = frozenset({"signal"})

    def __init__(self, default_cycles: int = 2) -> None:
        self.default_cycles = default_cycles

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> dict[str, torch.Tensor]:
        x = samples.data.float().flatten(1)  # [B, T]
        power = torch.fft.rfft(x, dim=1).abs().square()[:, 1:]  # [B, T // 2]: without the mean (DC)
        k = torch.tensor([wanted_cycles(p, self.default_cycles) for p in prompts], device=x.device)  # [B]
        k = k.clamp(1, power.shape[1])
        at_k = power.gather(1, (k - 1)[:, None]).squeeze(1)  # [B]
        total = power.sum(dim=1)  # [B]
        score = torch.where(total > 0, at_k / total.clamp_min(1e-12), torch.zeros_like(total))
        return {"score": score, "rms": x.square().mean(dim=1).sqrt()}
