"""Which prompts each iteration trains on: epochs over a seeded permutation, resumable from a tiny state."""

from __future__ import annotations

import random
from collections.abc import Sequence


class PromptSampler:
    """Draws ``n`` prompts per call, walking a fresh seeded permutation every epoch.

    Its whole state is ``(epoch, position)``, so a resumed run draws exactly what an uninterrupted
    one would have drawn.
    """

    def __init__(self, prompts: Sequence[str], *, seed: int, shuffle: bool = True) -> None:
        if not prompts:
            raise ValueError("no prompts to sample from")
        self.prompts = list(prompts)
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.prompts)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next(self, n: int) -> list[str]:
        out: list[str] = []
        while len(out) < n:
            order = self._order(self.epoch)
            take = min(n - len(out), len(order) - self.position)
            out += [self.prompts[i] for i in order[self.position : self.position + take]]
            self.position += take
            if self.position == len(order):
                self.epoch, self.position = self.epoch + 1, 0
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
