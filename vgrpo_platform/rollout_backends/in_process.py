"""``in_process``: the trainer's own sampler on its own weights, chunk by chunk (the default; exact)."""

from __future__ import annotations

import time

import torch

from vgrpo_platform.protocols import SamplerSpec
from vgrpo_platform.rollout_backends.contract import RolloutBackend, RolloutRequest, RolloutResult


class InProcessBackend(RolloutBackend):
    exact = True
    name = "in_process"

    def sample_chunk(self, noise: torch.Tensor, cond: dict, sampler: SamplerSpec) -> torch.Tensor:
        return self.adapter.sample(noise, cond, sampler)

    def generate(self, request: RolloutRequest) -> RolloutResult:
        t0 = time.perf_counter()
        parts = []
        for start in range(0, len(request.prompts), request.chunk_size):
            rows = slice(start, start + request.chunk_size)
            cond = {k: v[rows] for k, v in request.cond.items()}
            parts.append(self.sample_chunk(request.noise[rows], cond, request.sampler))
        return RolloutResult(torch.cat(parts), request.weights_version, seconds=time.perf_counter() - t0)
