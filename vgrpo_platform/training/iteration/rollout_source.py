"""The loop's side of a rollout backend: which weights made a batch, the overlapped next rollout, and
the measured gap of a lossy backend.

- ``in_process`` (exact) samples chunk by chunk through the adapter, as the loop always did, so its
  metrics are the same to the bit; ``cached`` does the same under its cache.
- A backend in another engine (``worker``) receives the trainable weights when they changed and
  returns the whole rollout; the loop decodes and scores it chunk by chunk as before.
- ``rollout.overlap``: the next iteration's prompts and noise are drawn, and its rollout requested,
  before this iteration's update; the weights that will generate it are kept (a CPU copy), and the
  next iteration's ``prepare`` runs under them, so the surrogate's old policy is the one that
  generated the samples (``staleness`` = updates between those weights and the current ones).
- ``rollout.mismatch_every``: for a backend that is not exact, the first ``mismatch_samples`` rows
  are generated again by the exact in-process sampler from the same noise and weights; the relative
  RMS distance of the final latents and the reward gap are logged as ``rollout_mismatch_*``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from vgrpo_platform.finetune import values_swapped_in
from vgrpo_platform.protocols import Conditioning, SamplerSpec
from vgrpo_platform.rollout_backends.contract import RolloutBackend, RolloutRequest, RolloutResult
from vgrpo_platform.rollout_backends.in_process import InProcessBackend
from vgrpo_platform.training.iteration.rollout import ChunkSampler, RolloutPlan

Weights = dict[str, torch.Tensor]


@dataclass
class Pending:
    """A rollout requested ahead (``rollout.overlap``): its prompts, plan, the weights that make it."""

    prompts: list[str]
    plan: RolloutPlan
    future: Future[RolloutResult]
    weights: Weights  # CPU copy of the trainable weights at request time
    version: int


def row_seeds(seed: int, iteration: int, rows: int) -> list[int]:
    """A seed per row for engines that draw their own noise: fixed by (run seed, iteration, row), and
    drawn from no generator, so passing them changes no other draw."""
    return [(seed * 1_000_003 + iteration) * 100_003 + row for row in range(rows)]


class RolloutSource:
    """Holds the backend for a run; ``sampler_for`` gives the loop its per-chunk sampler."""

    def __init__(
        self,
        backend: RolloutBackend,
        adapter: Any,
        trainable: Mapping[str, torch.Tensor],
        *,
        overlap: bool,
        seed: int,
        mismatch_every: int,
        mismatch_samples: int,
    ) -> None:
        self.backend = backend
        self.adapter = adapter
        self.trainable = trainable
        self.overlap = overlap
        self.seed = seed
        self.mismatch_every = 0 if backend.exact and not overlap else mismatch_every
        self.mismatch_samples = mismatch_samples
        self.version = 0  # iterations whose update has run
        self.pending: Pending | None = None
        backend.start(adapter, trainable)

    @property
    def in_process(self) -> bool:
        """Chunks are sampled here, through the adapter (``in_process``, ``cached``)."""
        return isinstance(self.backend, InProcessBackend)

    def updated(self) -> None:
        """After an iteration's update: the weights moved on by one version."""
        self.version += 1

    # ------------------------------------------------------------------------------------ requesting
    def _request(self, plan: RolloutPlan, sampler: SamplerSpec, iteration: int, chunk: int) -> RolloutRequest:
        return RolloutRequest(
            prompts=plan.prompts,
            cond=plan.cond,
            noise=plan.noise,
            seeds=row_seeds(self.seed, iteration, len(plan.prompts)),
            sampler=sampler,
            weights_version=self.version,
            chunk_size=chunk,
        )

    def prefetch(
        self, prompts: list[str], plan: RolloutPlan, sampler: SamplerSpec, iteration: int, chunk: int
    ) -> None:
        """Ask for ``iteration``'s rollout (its prompt list ``prompts``) now, with the current weights."""
        self.backend.push_weights(self.trainable, self.version)
        weights = {n: p.detach().to("cpu", copy=True) for n, p in self.trainable.items()}
        future = self.backend.submit(self._request(plan, sampler, iteration, chunk))
        self.pending = Pending(prompts, plan, future, weights, self.version)

    def take_pending(self) -> Pending | None:
        pending, self.pending = self.pending, None
        return pending

    def drop_pending(self) -> None:
        """A failed iteration: its overlapped successor is discarded (the next iteration draws afresh)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.future.cancel()

    # ---------------------------------------------------------------------------------- generating
    def sampler_for(
        self,
        plan: RolloutPlan,
        sampler: SamplerSpec,
        iteration: int,
        chunk: int,
        pending: Pending | None,
    ) -> tuple[ChunkSampler | None, dict[str, float], Weights | None]:
        """``(per-chunk sampler or None for the adapter's own, metrics, weights that made the batch or
        None for the current ones)``; waits for a background rollout here."""
        if pending is not None:
            result = _noise_used(plan, pending.future.result())
            generating = pending.weights if self.version != result.weights_version else None
            return _rows_of(result.latents), self._engine_metrics(result), generating
        if self.in_process:
            if type(self.backend) is InProcessBackend:
                return None, {}, None  # the adapter's own sample: the loop's path, unchanged
            backend = self.backend
            return (lambda noise, cond, rows: backend.sample_chunk(noise, cond, sampler)), {}, None  # type: ignore[attr-defined]
        self.backend.push_weights(self.trainable, self.version)
        result = _noise_used(plan, self.backend.generate(self._request(plan, sampler, iteration, chunk)))
        return _rows_of(result.latents), self._engine_metrics(result), None

    def _engine_metrics(self, result: RolloutResult) -> dict[str, float]:
        """What ``metrics.jsonl`` records of a rollout made elsewhere: its lag and the engine's seconds."""
        return {
            "rollout_staleness": float(self.version - result.weights_version),
            "rollout_engine_seconds": result.seconds,
        }

    @contextmanager
    def generating_policy(self, weights: Weights | None) -> Iterator[None]:
        """Inside, the trainable weights are those that generated the batch (when not the current ones)."""
        with values_swapped_in(self.trainable, weights) if weights is not None else nullcontext():
            yield

    # ------------------------------------------------------------------------------------ mismatch
    def due(self, iteration: int) -> bool:
        return bool(self.mismatch_every) and iteration % self.mismatch_every == 0

    @torch.no_grad()
    def mismatch(
        self,
        plan: RolloutPlan,
        latents: torch.Tensor,
        sampler: SamplerSpec,
        weights: Weights | None,
        score: Callable[[torch.Tensor, slice], torch.Tensor],
        lossy_rewards: torch.Tensor,
    ) -> dict[str, float]:
        """The exact sampler on the first rows, same noise and weights; the gap to the backend's latents.

        ``score(latents, rows)``: the total reward of decoded latents for those rows; ``lossy_rewards``
        the backend's rows' totals as already scored.
        """
        t0 = time.perf_counter()
        rows = slice(0, min(self.mismatch_samples, len(latents)))
        cond: Conditioning = {k: v[rows] for k, v in plan.cond.items()}
        with self.generating_policy(weights):
            exact = self.adapter.sample(plan.noise[rows], cond, sampler)
        lossy = latents[rows].to(exact.device, exact.dtype)
        rms = exact.float().pow(2).mean().sqrt().clamp_min(1e-12)
        distance = (lossy - exact).float().pow(2).mean().sqrt() / rms
        exact_rewards = score(exact, rows)
        gap = lossy_rewards[rows].float().mean() - exact_rewards.float().mean()
        return {
            "rollout_mismatch_rel_rmse": float(distance),
            "rollout_mismatch_reward_gap": float(gap),
            "rollout_mismatch_reward_exact": float(exact_rewards.float().mean()),
            "time_mismatch": time.perf_counter() - t0,
        }

    def close(self) -> None:
        self.drop_pending()
        self.backend.close()


def _noise_used(plan: RolloutPlan, result: RolloutResult) -> RolloutResult:
    """An engine that drew its own noise (from the seeds) returns it: the plan takes it, so the exact
    sampler's check regenerates from the noise the batch really came from."""
    if result.noise is not None:
        plan.noise = result.noise.to(plan.noise.device, plan.noise.dtype)
    return result


def _rows_of(latents: torch.Tensor) -> ChunkSampler:
    """A chunk sampler that hands out rows of latents generated elsewhere."""
    return lambda noise, cond, rows: latents[rows].to(noise.device, noise.dtype)
