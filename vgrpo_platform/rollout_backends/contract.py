"""What a rollout backend receives and returns: the contract a third-party engine implements.

A backend gets a ``RolloutRequest`` (the prompts of each row, the initial noise the trainer drew and a
seed per row for engines that draw their own, the sampler settings, and the version of the weights
it must use) and returns a ``RolloutResult`` (clean latents in the adapter's latent layout, the
version of the weights that made them, and the noise it actually used when not the request's).
The trainer then decodes, scores and trains on those latents; the surrogate's ratio is taken
against the weights named by ``weights_version``, so a backend one update behind is off-policy by
exactly one update, never wrong.

``exact = True`` promises latents bit-identical to the trainer's own sampler on the same weights
(only ``in_process`` makes it). A backend that is not exact is refused with an MDP surrogate
(Flow-GRPO and kin), whose ratio is the sampler's own per-step log-probability.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from vgrpo_platform.protocols import Adapter, Conditioning, SamplerSpec


@dataclass
class RolloutRequest:
    """One rollout: ``B`` rows, groups of one prompt contiguous."""

    prompts: list[str]  # [B] the prompt of each row
    cond: Conditioning  # [B, ...] the trainer's encoding (an in-process engine may use it)
    noise: torch.Tensor  # [B, *L] initial noise at t = 1, drawn by the trainer
    seeds: list[int]  # [B] one seed per row, for an engine that draws its own noise
    sampler: SamplerSpec
    weights_version: int  # the optimiser steps taken when these weights were sent
    chunk_size: int = 8  # rows per forward the trainer would use


@dataclass
class RolloutResult:
    latents: torch.Tensor  # [B, *L] clean latents, on the CPU or the trainer's device
    weights_version: int  # the version that generated them
    noise: torch.Tensor | None = None  # [B, *L] the noise used, when not the request's
    seconds: float = 0.0  # the engine's own generation time


class RolloutBackend:
    """The base of every backend; ``generate`` is the one method to write.

    ``start`` is called once with the adapter and its trainable weights; ``push_weights`` after each
    update with the new values and version (an engine in another process copies them); ``submit``
    may return before the latents exist (``overlaps = True``: the trainer asks for the next
    iteration's rollout before its update and collects it after).
    """

    exact: bool = False
    """True only for latents bit-identical to the trainer's own sampler on the same weights."""
    overlaps: bool = False
    """True: ``submit`` runs in the background, so ``rollout.overlap`` may use it."""
    name: str = "backend"

    def start(self, adapter: Adapter, trainable: Mapping[str, torch.Tensor]) -> None:
        self.adapter = adapter

    def push_weights(self, trainable: Mapping[str, torch.Tensor], version: int) -> None:
        """New trainable weights after an update (in-process backends share them already)."""

    def generate(self, request: RolloutRequest) -> RolloutResult:
        raise NotImplementedError(f"{type(self).__name__} must implement generate()")

    def submit(self, request: RolloutRequest) -> Future[RolloutResult]:
        """``generate`` now, as a finished future (a background backend overrides this)."""
        future: Future[RolloutResult] = Future()
        try:
            future.set_result(self.generate(request))
        except Exception as exc:  # raised by future.result(), in the loop
            future.set_exception(exc)
        return future

    def close(self) -> None:
        pass
