"""The optimiser side of a run: AdamW, its learning-rate schedule, the weights' moving average, and
each iteration's gradient steps over the rollout batch.

An iteration's batch is split into ``train.gradient_steps_per_iteration`` mini-batches, one optimiser
step each; each mini-batch is accumulated over micro-batches weighted by their size, so the gradient
equals the full mini-batch's whatever ``micro_batch_size`` is. Gradients are averaged over ranks once
per optimiser step, on its last micro-batch.

With ``[train.data_anchor]`` each optimiser step also runs one forward and backward of the data anchor's
flow-matching loss (``data_anchor.py``) on its own batch, weighted by ``weight`` and added to the
step's gradient before the surrogate's micro-batches (whose last one averages it over ranks with
theirs). It is not split or scaled by the micro-batching.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from vgrpo_platform import finetune
from vgrpo_platform.network import denoiser_call_of
from vgrpo_platform.parallel import context_parallel
from vgrpo_platform.parallel import data_parallel as dp
from vgrpo_platform.protocols import RolloutBatch
from vgrpo_platform.training.iteration.data_anchor import METRIC as ANCHOR_METRIC
from vgrpo_platform.training.iteration.data_anchor import DataAnchor
from vgrpo_platform.training.iteration.ema import WeightAverage
from vgrpo_platform.training.iteration.optimizer import build_lr_schedule, build_optimizer
from vgrpo_platform.training.observe.metrics import accumulate
from vgrpo_platform.training.recovery.faults import agree_on_fault, non_finite_loss

if TYPE_CHECKING:
    from vgrpo_platform.config.schema import TrainSection
    from vgrpo_platform.parallel.data_parallel import Shard
    from vgrpo_platform.training.session import Session


class PolicyUpdate:
    """Builds the optimiser around the session's trainable weights (made data-parallel by accelerate);
    calling it runs one iteration's optimiser steps.

    ``stepped`` and ``half_step`` tell the fault policy what a failing iteration has already done
    (``fault_policy.FaultPolicy``); the loop clears them with ``begin_iteration``.
    """

    def __init__(
        self,
        session: Session,
        train: TrainSection,
        accelerator: Any,
        shuffle_rng: torch.Generator,
        shard: Shard | None = None,
    ) -> None:
        self.session = session
        self.train = train
        self.accelerator = accelerator
        self.shuffle_rng = shuffle_rng
        denoiser = session.adapter.denoiser
        optimizer = build_optimizer(session.trainable.values(), train)
        call = denoiser_call_of(session.adapter)  # the core's one call of the denoiser, where DDP goes
        self.routed, self.optimizer = dp.prepare_for_data_parallel(accelerator, call, optimizer)
        # context parallelism: a process's backward reaches only its tokens' share of each gradient
        self.gradient_scale = context_parallel.gradient_scale(denoiser)
        # FSDP2 swapped the parameters for sharded ones under the same names
        session.trainable = finetune.trainable_named_parameters(denoiser)
        self.params = list(session.trainable.values())
        # after sharding, so the average mirrors each rank's slice
        self.average = WeightAverage(session.trainable, train.ema_decay) if train.ema_decay else None
        self.lr_schedule = build_lr_schedule(self.optimizer, train)
        session.surrogate.plan_updates(train.gradient_steps_per_iteration)
        anchor = train.data_anchor
        self.anchor = DataAnchor(anchor, session.adapter, shard) if anchor.weight > 0 else None
        self.begin_iteration()

    def begin_iteration(self) -> None:
        self.stepped = False  # an optimiser step of this iteration happened: replaying it is no longer exact
        self.half_step = False  # a DeepSpeed engine holds reduced gradients of an unfinished step

    def __call__(self, batch: RolloutBatch, iteration: int = 0) -> dict[str, float]:
        """``gradient_steps_per_iteration`` optimiser steps over the batch, micro-batched; their metrics."""
        t = self.train
        surrogate, adapter = self.session.surrogate, self.session.adapter
        n = len(batch)
        steps = min(t.gradient_steps_per_iteration, n)
        order = torch.randperm(n, generator=self.shuffle_rng) if steps > 1 else torch.arange(n)
        sums: dict[str, float] = {}
        extremes: dict[str, float] = {}
        grad_norms = []
        for minibatch in order.tensor_split(steps):
            self.optimizer.zero_grad(set_to_none=True)
            if self.anchor is not None:
                anchor_loss = self._anchor_backward(batch.latents, iteration)
                accumulate(sums, extremes, {ANCHOR_METRIC: anchor_loss}, 1 / steps)
            micros = minibatch.split(t.micro_batch_size)
            for m, micro in enumerate(micros):
                part = batch.select(micro.to(batch.latents.device))
                with dp.maybe_no_sync(self.routed, self.accelerator, skip=m < len(micros) - 1):
                    with self.accelerator.autocast():
                        loss, metrics = surrogate.loss(part, adapter)
                    bad = None
                    if not torch.isfinite(loss):
                        bad = non_finite_loss(loss.item(), iteration, part.prompts[0])
                    agree_on_fault(self.accelerator, bad)
                    self.accelerator.backward(loss * (self.gradient_scale * len(micro) / len(minibatch)))
                # a DeepSpeed engine keeps reduced gradients between micro-batches where zero_grad can't reach
                self.half_step = isinstance(self.routed, dp.RoutedEngine) and m < len(micros) - 1
                accumulate(sums, extremes, {"loss": loss.item(), **metrics}, len(micro) / n)
            clip = t.grad_clip if t.grad_clip is not None else math.inf
            grad_norms.append(float(self.accelerator.clip_grad_norm_(self.params, clip)))
            self.optimizer.step()
            self.stepped = True
            self.lr_schedule.step()
            if self.average is not None:
                self.average.update(self.session.trainable)
            surrogate.after_step(adapter)  # e.g. an EMA old policy
        reduced = dp.reduce_metrics(self.accelerator, {**sums, **extremes})
        return {**reduced, "grad_norm": sum(grad_norms) / len(grad_norms), "gradient_steps": steps}

    def _anchor_backward(self, like: torch.Tensor, iteration: int) -> float:
        """Backward of ``weight * L_fm`` on this optimiser step's anchor batch, gradients kept local (the
        surrogate's last micro-batch averages them over ranks); the unweighted loss."""
        assert self.anchor is not None
        step = int(self.lr_schedule.last_epoch)  # optimiser steps so far: checkpointed, so resumes match
        with dp.maybe_no_sync(self.routed, self.accelerator, skip=True):
            with self.accelerator.autocast():
                loss = self.anchor.loss(self.session.adapter, step, like.device, like.dtype)
            bad = None if torch.isfinite(loss) else non_finite_loss(loss.item(), iteration, "data anchor")
            agree_on_fault(self.accelerator, bad)
            weight = self.train.data_anchor.weight
            self.accelerator.backward(loss * (self.gradient_scale * weight))
        self.half_step = isinstance(self.routed, dp.RoutedEngine)
        return float(loss.item())
