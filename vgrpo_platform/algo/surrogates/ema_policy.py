"""An EMA copy of the trainable weights, swapped in while it is evaluated: DiffusionNFT's old policy and
AWM's penalty anchor, in a module of its own so neither surrogate imports the other."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from vgrpo_platform.finetune import values_swapped_in


class EMAPolicy:
    """An EMA copy of a module's trainable parameters, and a context in which the module uses it."""

    def __init__(self) -> None:
        self.state: dict[str, torch.Tensor] | None = None

    @staticmethod
    def _trainable(module: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
        return {n: p for n, p in module.named_parameters() if p.requires_grad}

    def initialise(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """Start the old policy at the current weights (once); returns its state."""
        if self.state is None:
            self.state = {n: p.detach().clone() for n, p in self._trainable(module).items()}
        return self.state

    @torch.no_grad()
    def update(self, module: torch.nn.Module, decay: float) -> None:
        """``old <- decay old + (1 - decay) current``."""
        state = self.initialise(module)
        for n, p in self._trainable(module).items():
            state[n].mul_(decay).add_(p.detach(), alpha=1.0 - decay)

    @contextmanager
    def applied(self, module: torch.nn.Module) -> Iterator[None]:
        """Inside: the trainable parameters hold the EMA values (use under ``torch.no_grad``)."""
        with values_swapped_in(self._trainable(module), self.initialise(module)):
            yield
