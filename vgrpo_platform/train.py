"""The V-GRPO training loop, top to bottom: rollout, score, advantages, surrogate, update, log, checkpoint.

How it departs from textbook GRPO (see docs/concepts.md):
- The whole denoising chain is one action. Rollouts use any ODE sampler and record no per-step
  log-probs; the policy likelihood is the surrogate's business (``-L_hat`` for V-GRPO), computed on
  the final clean samples with ``(t, eps)`` pairs drawn once per iteration at rollout time.
- The old policy is never copied: its surrogate values (and, for the KL, its predictions) are stored
  with the rollout, before the first gradient step of the iteration.
- An iteration's batch is split into ``train.gradient_steps_per_iteration`` mini-batches, one
  optimiser step each; with one step the update is fully on-policy (ratio exactly 1).
- Each mini-batch is accumulated over micro-batches weighted by their size, so the gradient equals
  the full mini-batch's whatever ``micro_batch_size`` is.
- Ctrl-C or SIGTERM finish the current iteration, save a checkpoint and exit; ``--resume`` continues
  from the newest complete checkpoint with the same RNG and prompt-sampler state.
- With ``train.ema_decay`` a moving average of the weights is what evaluations, grids and the
  exported model see; the optimiser, rollouts and the surrogate keep the raw weights (``ema.py``).
- Evaluations (``evaluation.py``, shared with ``vgrpo eval``) also score the ``[[eval.rewards]]`` and
  each prompt's sample diversity; ``[eval.monitor]`` stops the run with a checkpoint when the reward
  rises while one of them falls (``monitor.py``). ``log.trackers`` mirror ``metrics.jsonl`` and the
  grids to TensorBoard / W&B / MLflow through accelerate (``tracking.py``).
- A fault (``faults.py``) follows ``train.on_fault``, in an iteration or in an evaluation: "stop"
  saves an exact checkpoint and raises a one-line error, "skip" logs the skip and goes on.
- Under ``accelerate launch`` / ``torchrun`` each process rolls out a contiguous block of whole prompt
  groups; rewards are gathered, so advantages and metrics see the global batch, and the random draws
  are made for the global batch on every rank (``distributed.py``): N processes equal one process.
"""

from __future__ import annotations

import math
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from pathlib import Path

import torch

from vgrpo_platform import finetune, monitor, sharding
from vgrpo_platform.checkpoint import latest_valid_checkpoint, list_checkpoints, save_checkpoint
from vgrpo_platform.chunked import ChunkedPredictions
from vgrpo_platform.distributed import (
    RoutedEngine,
    RowsOf,
    bypassed,
    configure_launch,
    describe,
    gather_rows,
    maybe_no_sync,
    prepare_for_data_parallel,
    reduce_metrics,
    shard_of,
)
from vgrpo_platform.ema import WeightAverage
from vgrpo_platform.errors import CheckpointError, RecipeError, RewardError, VgrpoError
from vgrpo_platform.evaluation import Protocol, evaluate
from vgrpo_platform.faults import (
    FAULTS,
    PeerFault,
    is_out_of_memory,
    non_finite_loss,
    out_of_memory,
    with_evaluation_hint,
    with_policy_hint,
)
from vgrpo_platform.grpo import compute_advantages
from vgrpo_platform.interrupts import StopFlag
from vgrpo_platform.lr_schedule import build_lr_schedule
from vgrpo_platform.metrics import MetricsWriter, Progress, read_metrics, reward_metrics
from vgrpo_platform.prompt_sampler import PromptSampler
from vgrpo_platform.protocols import BuildContext, RolloutBatch, SamplerSpec
from vgrpo_platform.recipe import save_resolved
from vgrpo_platform.reward_workers import GroupFeeder, build_scorer
from vgrpo_platform.rollout import generate_with_extras
from vgrpo_platform.run_summary import summarise
from vgrpo_platform.session import Session, build_session, fingerprint, resolve_device, run_dir_of
from vgrpo_platform.tracking import Tracking, require


class Trainer:
    """Holds one run's state; ``run()`` is the loop."""

    def __init__(self, resolved, *, resume: bool = False) -> None:  # noqa: ANN001 - recipe.ResolvedRecipe
        from accelerate import Accelerator
        from accelerate.utils import DistributedDataParallelKwargs

        self.resolved = resolved
        self.recipe = recipe = resolved.recipe
        self.run_dir = run_dir_of(recipe)
        require(recipe.log.trackers)  # a missing tracker package stops here, before any model loads
        device = resolve_device(recipe.run.device)
        self.accelerator = Accelerator(
            cpu=device.type == "cpu",
            mixed_precision=recipe.run.mixed_precision,
            # the model's buffers never change: no broadcast, so ranks need not forward in lockstep
            kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False)],
            **Tracking.accelerator_kwargs(recipe.log.trackers, self.run_dir),
        )
        self.tracking = Tracking(self.accelerator, recipe.log.trackers, recipe.log.project, self.run_dir)
        self.device = self.accelerator.device
        # train.offload_rewards: reward models visit the device only while they score
        self.reward_device = self.device if recipe.train.offload_rewards else None
        self.shard = shard_of(self.accelerator)
        self.shard.prompt_block(recipe.rollout.prompts_per_iteration)  # fail early on an uneven split
        t = recipe.train
        # before any model is built (a contradicting DeepSpeed config stops here)
        configure_launch(self.accelerator, grad_clip=t.grad_clip, micro_batch_size=t.micro_batch_size)
        self._check_run_dir(resume)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(recipe.run.seed)
        context = BuildContext(
            device=self.device, seed=recipe.run.seed, run_dir=self.run_dir, recipe_dir=resolved.recipe_dir
        )
        scoring = recipe.scoring
        with self.accelerator.main_process_first():  # downloads and model builds happen once
            self.session: Session = build_session(
                resolved, context, rewards_here=scoring.isolation == "inline"
            )
        self.notices: list[str] = []  # reward-worker restarts, reported by run() after the iteration
        self.scorer = build_scorer(
            recipe.scoring,
            self.session,
            resolved,
            replace(context, device=torch.device(recipe.scoring.device or self.device)),
            offload_device=self.reward_device,
            on_restart=self.notices.append,
        )
        optimizer = torch.optim.AdamW(
            self.session.trainable.values(),
            lr=t.lr,
            betas=t.adam_betas,
            eps=t.adam_eps,
            weight_decay=t.weight_decay,
        )
        denoiser = self.session.adapter.denoiser
        self.routed, self.optimizer = prepare_for_data_parallel(self.accelerator, denoiser, optimizer)
        # FSDP2 swapped the parameters for sharded ones under the same names
        self.session.trainable = finetune.trainable_named_parameters(denoiser)
        self.params = list(self.session.trainable.values())
        # after sharding, so the average mirrors each rank's slice
        self.average = WeightAverage(self.session.trainable, t.ema_decay) if t.ema_decay else None
        self.lr_schedule = build_lr_schedule(self.optimizer, t)
        self.session.surrogate.plan_updates(t.gradient_steps_per_iteration)
        self.protocol = Protocol.of(resolved)  # the held-out prompts, seeds and sampler of every evaluation
        self.prompts = PromptSampler(
            resolved.train_prompts, seed=recipe.run.seed, shuffle=recipe.prompts.shuffle
        )
        seed = recipe.run.seed
        self.rollout_rng = torch.Generator().manual_seed(seed)
        self.surrogate_rng = torch.Generator().manual_seed(seed + 1)
        self.shuffle_rng = torch.Generator().manual_seed(seed + 2)
        self.start_iteration = 0
        self.stepped = self.half_step = False  # see run() and update()
        self.elapsed = 0.0  # seconds of training before this process (resumed runs)
        self.t_start = 0.0  # set by run(): perf_counter() of a training start with no time behind it
        # set by --resume from a checkpoint whose evaluation failed (faults.py): {"wall_seconds": ...}
        self.eval_pending: dict | None = None
        self.diagnostics_seconds = 0.0  # spent on log.diagnostics_every in this process, not in wall_seconds
        if resume:
            self._restore()
        if self.accelerator.is_main_process:
            save_resolved(resolved, self.run_dir)
        self.resumed = resume
        self.metrics = None  # only the main process writes
        self.eval_history: list[dict] = []  # the evaluation records the monitor judges (main process)
        if self.accelerator.is_main_process:
            self.metrics = MetricsWriter(
                self.run_dir / "metrics.jsonl", resume_after=self.start_iteration if resume else None
            )
            if resume:  # the evaluations before the checkpoint count for [eval.monitor]'s patience
                records = read_metrics(self.metrics.path)
                self.eval_history = [r for r in records if r.get("kind") == "eval"]

    def _report_notices(self, iteration: int, progress: Progress) -> None:
        for notice in self.notices:
            self._write({"kind": "reward_worker_restarted", "iteration": iteration, "reason": notice})
            progress.message(notice)
        self.notices.clear()

    # ----------------------------------------------------------------------------------------- loop
    def run(self) -> Path:
        recipe = self.recipe
        total = recipe.train.iterations
        main = self.accelerator.is_main_process
        progress = Progress(recipe.log.progress if main else "none", total, start=self.start_iteration)
        stop = StopFlag()
        self.t_start = time.perf_counter() - self.elapsed  # see _elapsed()
        if self.shard.world > 1:
            progress.message(f"data parallel: {self.shard.world} processes, {describe(self.accelerator)}")
        self.tracking.start(
            run_name=recipe.run.name,
            config=recipe.model_dump(mode="json"),
            resumed_at=self.start_iteration if self.resumed else None,
        )
        try:
            with stop.installed():
                faults_in_a_row = 0
                first = self.start_iteration + 1
                if self.start_iteration == 0 or self.eval_pending is not None:
                    # the evaluation before training, or the one a stopped run left to do (--resume)
                    pending, at = self.eval_pending, self.start_iteration
                    wall = pending["wall_seconds"] if pending else 0.0
                    evaluated, faults_in_a_row = self._evaluation(at, wall, faults_in_a_row, progress)
                    alarm = self._watch(evaluated) if evaluated is not None else None
                    if pending is not None:  # its checkpoint becomes the one an uninterrupted run saves
                        self.save(at, self._elapsed())
                        self.eval_pending = None
                        if alarm and at > 0:  # the uninterrupted run stopped here
                            self._stopped_by_monitor(alarm, at, progress)
                            first = total + 1
                iteration = self.start_iteration
                for iteration in range(first, total + 1):
                    before_iteration = self._loop_state()
                    self.stepped = self.half_step = False
                    try:
                        record = self.iterate(iteration)
                        faults_in_a_row = 0
                    except FAULTS as fault:
                        faults_in_a_row += 1
                        elapsed = self._elapsed()
                        record = self._on_fault(fault, iteration, before_iteration, faults_in_a_row, elapsed)
                        progress.message(f"skipped iteration {iteration}: {fault}")
                    # wall-clock of the method: the optional diagnostics' seconds are left out
                    record["wall_seconds"] = self._elapsed()
                    self._report_notices(iteration, progress)
                    self._write(record)
                    progress.update(iteration, _headline(record))
                    last = iteration == total
                    alarm = None
                    if recipe.eval.every and iteration % recipe.eval.every == 0 or last:
                        wall = record["wall_seconds"]
                        evaluated, faults_in_a_row = self._evaluation(
                            iteration, wall, faults_in_a_row, progress
                        )
                        alarm = self._watch(evaluated) if evaluated is not None else None
                    every = recipe.log.checkpoint_every
                    stop.requested = self._any_rank(stop.requested)  # all ranks stop at the same iteration
                    if last or stop.requested or alarm or (every and iteration % every == 0):
                        self.save(iteration, self._elapsed())
                    if stop.requested:
                        progress.message(
                            f"{stop.signal_name}: saved iteration {iteration}; continue with --resume"
                        )
                        raise KeyboardInterrupt
                    if alarm:
                        self._stopped_by_monitor(alarm, iteration, progress)
                        break
        finally:
            self.scorer.close()
            progress.close()
            self.tracking.finish()
        if self.routed is not None:
            self.routed.restore()
        export = getattr(self.session.adapter, "export_trained", None)
        if export is not None:
            with self._served(), sharding.unsharded(self.session.adapter.denoiser):  # all gather; one writes
                if self.accelerator.is_main_process:
                    export(self.run_dir / "final")
        if self.accelerator.is_main_process:
            summarise(self.run_dir, progress)
        return self.run_dir

    def _elapsed(self) -> float:
        """Seconds of training so far, resumed runs included, the optional diagnostics left out."""
        return time.perf_counter() - self.t_start - self.diagnostics_seconds

    def _stopped_by_monitor(self, alarm: str, iteration: int, progress: Progress) -> None:
        self._write({"kind": "stopped", "iteration": iteration, "reason": alarm})
        progress.message(
            f"{alarm}; stopped at iteration {iteration} with a checkpoint. --resume goes "
            "on, but earlier evaluations still count: loosen [eval.monitor] first"
        )

    def _write(self, record: dict) -> None:
        """One ``metrics.jsonl`` line, mirrored to the trackers (main process only)."""
        if self.metrics is not None:
            self.metrics.write(record)
            self.tracking.log_record(record)

    def _watch(self, record: dict[str, float]) -> str | None:
        """``[eval.monitor]`` on this evaluation: why the run must stop, or None. Every rank agrees."""
        rule = self.recipe.eval.monitor
        if not rule.stop_when_falls:
            return None
        monitor.require_keys(record, rule.stop_when_falls, rule.rising)  # the same record on every rank
        alarm = None
        if self.accelerator.is_main_process:
            self.eval_history.append(record)
            alarm = monitor.check(
                self.eval_history,
                rule.stop_when_falls,
                margin=rule.margin,
                patience=rule.patience,
                rising=rule.rising,
            )
        if not self._any_rank(alarm is not None):
            return None
        return alarm.message() if alarm is not None else "reward-hacking monitor (main process)"

    def _on_fault(
        self, fault: VgrpoError, iteration: int, before: dict, in_a_row: int, elapsed: float
    ) -> dict:
        """Apply ``train.on_fault``: the ``skipped`` record to log, or raise after saving what is exact."""
        t = self.recipe.train
        hint_policy = t.on_fault
        if self.half_step:  # DeepSpeed holds the reduced gradients of a half-accumulated step: no skip
            fault = type(fault)(f"{fault}; DeepSpeed cannot drop a half-accumulated step, so the run stops")
            hint_policy = "skip"  # so the message does not suggest switching to "skip"
        if t.on_fault == "stop" or in_a_row >= t.max_consecutive_skips or self.half_step:
            saved = None
            if not self.stepped and iteration > 1:  # the weights are still those after iteration - 1
                self._set_loop_state(before)
                self.save(iteration - 1, elapsed)
                saved = iteration - 1
            raise with_policy_hint(fault, hint_policy, saved) from fault
        self.optimizer.zero_grad(set_to_none=True)
        return {"kind": "skipped", "iteration": iteration, "reason": str(fault)}

    def _evaluation(
        self, iteration: int, wall: float, in_a_row: int, progress: Progress
    ) -> tuple[dict | None, int]:
        """The evaluation at ``iteration`` under ``train.on_fault``: its record (None when it was skipped)
        and the faults in a row so far.

        A ``RewardError`` (raised on every rank alike, see ``evaluation.evaluate``) is a fault as in an
        iteration. "skip" writes ``{"kind": "eval_skipped", "iteration", "wall_seconds", "reason"}``
        and goes on, except for the final evaluation (the run's result) and after
        ``train.max_consecutive_skips`` faults in a row. Otherwise the run stops: the checkpoint of
        ``iteration`` (whose training is done) is saved with the RNG state from before the evaluation
        and marked ``eval_pending``, so ``--resume`` re-runs exactly this evaluation, then goes on.
        """
        before = self._loop_state()
        try:
            record = self.evaluate(iteration, wall=wall)
        except RewardError as fault:
            in_a_row += 1
            t = self.recipe.train
            final = iteration == t.iterations
            if t.on_fault == "skip" and not final and in_a_row < t.max_consecutive_skips:
                reason = str(fault)
                self._write(
                    {"kind": "eval_skipped", "iteration": iteration, "wall_seconds": wall, "reason": reason}
                )
                progress.message(f"skipped the evaluation of iteration {iteration}: {fault}")
                return None, in_a_row
            self._set_loop_state(before)  # the evaluation drew nothing the checkpoint should miss
            self.save(iteration, self._elapsed(), eval_pending={"wall_seconds": wall})
            raise with_evaluation_hint(fault, iteration, policy=t.on_fault, final=final) from fault
        progress.message(f"eval @{iteration}: reward {record['reward']:.4f}")
        return record, in_a_row

    def _rng_state(self) -> dict[str, torch.Tensor]:
        """Every RNG state the loop draws from (what a checkpoint stores under ``rng``)."""
        return {
            "rollout": self.rollout_rng.get_state(),
            "surrogate": self.surrogate_rng.get_state(),
            "shuffle": self.shuffle_rng.get_state(),
            "torch": torch.get_rng_state(),
        }

    def _set_rng_state(self, rng: dict[str, torch.Tensor]) -> None:
        self.rollout_rng.set_state(rng["rollout"])
        self.surrogate_rng.set_state(rng["surrogate"])
        self.shuffle_rng.set_state(rng["shuffle"])
        torch.set_rng_state(rng["torch"])

    def _loop_state(self) -> dict:
        """What an iteration consumes besides the weights: restoring it replays the iteration."""
        return {"rng": self._rng_state(), "prompts": self.prompts.state_dict()}

    def _set_loop_state(self, state: dict) -> None:
        self._set_rng_state(state["rng"])
        self.prompts.load_state_dict(state["prompts"])

    def _agree_on_fault(self, fault: VgrpoError | None) -> None:
        """Raise ``fault`` here, or ``PeerFault`` where another rank has one: all ranks leave together."""
        if self._any_rank(fault is not None):
            raise fault if fault is not None else PeerFault("another process hit a fault in this iteration")

    def _any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` is set on any process (a signal may reach only some of them)."""
        if self.shard.world == 1:
            return flag
        return bool(gather_rows(self.accelerator, torch.tensor([float(flag)])).max() > 0)

    def iterate(self, iteration: int) -> dict[str, float]:
        """One V-GRPO iteration; returns its metrics record."""
        recipe, session = self.recipe, self.session
        adapter = session.adapter
        t0 = time.perf_counter()
        prompts = self.prompts.next(recipe.rollout.prompts_per_iteration)  # the same list on every rank
        block = self.shard.prompt_block(len(prompts))  # this rank's whole groups
        group_size = recipe.rollout.group_size
        sampler = SamplerSpec(recipe.rollout.sampler, recipe.rollout.steps)
        session.surrogate.begin_iteration(iteration)
        first_row = block.start * group_size
        fault = None
        t1 = t0
        local_prompts = [p for p in prompts[block] for _ in range(group_size)]  # row order of the rollout
        feeder = GroupFeeder(self.scorer, local_prompts, group_size, step=iteration)
        self.scorer.busy_seconds()  # only this iteration's scoring counts below
        try:
            local_ids, cond, _, latents, samples, rollout_extras = generate_with_extras(
                adapter,
                prompts[block],
                group_size=group_size,
                sampler=sampler,
                generator=self.rollout_rng,
                chunk_size=recipe.train.micro_batch_size,
                device=self.device,
                rollout_fn=self._surrogate_rollout(),  # MDP baselines sample their own SDE
                noise_window=(first_row, len(prompts) * group_size),
                noise_scope=session.surrogate.initial_noise,  # DanceGRPO: one noise per group
                on_chunk=feeder if self.scorer.overlap else None,  # [scoring] overlap: scored meanwhile
            )
            group_ids = local_ids + block.start  # ids in the global batch
            t1 = time.perf_counter()
            flat_prompts = [prompts[int(g)] for g in group_ids]
            if self.scorer.overlap:
                local_terms, local_details = self.scorer.collect(feeder.finish())
            else:
                local_terms, local_details = self.scorer.score(samples, flat_prompts, step=iteration)
        except RewardError as exc:
            fault = exc
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            fault = out_of_memory(iteration, prompts[block][0])
        self._agree_on_fault(fault)
        # the whole batch's scores on every rank: advantages and metrics see full groups
        terms = {k: gather_rows(self.accelerator, v) for k, v in sorted(local_terms.items())}
        details = {k: gather_rows(self.accelerator, v) for k, v in sorted(local_details.items())}
        all_ids = torch.arange(len(prompts)).repeat_interleave(group_size)  # [N]
        weights = {r.key: r.weight for r in session.rewards}
        g = recipe.grpo
        advantages, total_reward = compute_advantages(
            terms,
            weights,
            all_ids,
            std=g.std,
            eps=g.eps,
            aggregation=g.reward_aggregation,
            soft_clip_eta=g.soft_clip_eta,
        )
        t2 = time.perf_counter()
        mine = slice(first_row, first_row + len(group_ids))
        batch = RolloutBatch(
            prompts=flat_prompts,
            group_ids=group_ids.to(self.device),
            cond=cond,
            latents=latents,
            rewards=total_reward[mine].to(self.device),
            reward_terms={k: v[mine].to(self.device) for k, v in terms.items()},
            advantages=advantages[mine].to(self.device),
            extras=rollout_extras,
            rows=RowsOf(all_ids.to(self.device), first_row) if self.shard.world > 1 else None,
        )
        with self.accelerator.autocast():  # the old policy's forwards, at most a micro-batch at a time
            chunked = ChunkedPredictions(adapter, recipe.train.micro_batch_size)
            session.surrogate.prepare(batch, chunked, self.surrogate_rng)
        t_diag = time.perf_counter()
        diagnostics = self.diagnose(batch, iteration)
        t_diag = time.perf_counter() - t_diag  # reported apart: not part of the method's training cost
        update = self.update(batch, iteration)
        t3 = time.perf_counter()
        record: dict[str, float] = {"kind": "train", "iteration": iteration, "epoch": self.prompts.epoch}
        record.update(reward_metrics(total_reward, terms, details, advantages, all_ids))
        record.update(update)
        record.update(diagnostics)
        record["lr"] = self.optimizer.param_groups[0]["lr"]
        self.diagnostics_seconds += t_diag
        time_train = t3 - t2 - t_diag
        # time_reward: what scoring added to the iteration (the wait after the rollout); time_scoring:
        # the rewards' own seconds, which [scoring] overlap hides behind the rollout
        record.update(time_rollout=t1 - t0, time_reward=t2 - t1, time_train=time_train)
        record["time_scoring"] = self.scorer.busy_seconds()
        record["time_iteration"] = t3 - t0
        return record

    def update(self, batch: RolloutBatch, iteration: int = 0) -> dict[str, float]:
        """``gradient_steps_per_iteration`` optimiser steps over the batch, micro-batched."""
        t = self.recipe.train
        n = len(batch)
        steps = min(t.gradient_steps_per_iteration, n)
        order = torch.randperm(n, generator=self.shuffle_rng) if steps > 1 else torch.arange(n)
        sums: dict[str, float] = {}
        extremes: dict[str, float] = {}
        grad_norms = []
        for minibatch in order.tensor_split(steps):
            self.optimizer.zero_grad(set_to_none=True)
            micros = minibatch.split(t.micro_batch_size)
            for m, micro in enumerate(micros):
                part = batch.select(micro.to(batch.latents.device))
                # gradients are averaged over ranks once per optimiser step, on its last micro-batch
                with maybe_no_sync(self.routed, self.accelerator, skip=m < len(micros) - 1):
                    with self.accelerator.autocast():
                        loss, metrics = self.session.surrogate.loss(part, self.session.adapter)
                    bad = None
                    if not torch.isfinite(loss):
                        bad = non_finite_loss(loss.item(), iteration, part.prompts[0])
                    self._agree_on_fault(bad)
                    self.accelerator.backward(loss * (len(micro) / len(minibatch)))
                # a DeepSpeed engine keeps reduced gradients between micro-batches where zero_grad can't reach
                self.half_step = isinstance(self.routed, RoutedEngine) and m < len(micros) - 1
                share = len(micro) / n
                metrics = {"loss": loss.item(), **metrics}
                for key, value in metrics.items():
                    if key.endswith("_max"):
                        extremes[key] = max(extremes.get(key, -math.inf), value)
                    elif key.endswith("_min"):
                        extremes[key] = min(extremes.get(key, math.inf), value)
                    else:
                        sums[key] = sums.get(key, 0.0) + value * share
            clip = t.grad_clip if t.grad_clip is not None else math.inf
            grad_norms.append(float(self.accelerator.clip_grad_norm_(self.params, clip)))
            self.optimizer.step()
            self.stepped = True  # from here a fault can no longer be undone by replaying the iteration
            self.lr_schedule.step()
            if self.average is not None:
                self.average.update(self.session.trainable)
            self.session.surrogate.after_step(self.session.adapter)  # e.g. an EMA old policy
        metrics = reduce_metrics(self.accelerator, {**sums, **extremes})
        return {**metrics, "grad_norm": sum(grad_norms) / len(grad_norms), "gradient_steps": steps}

    def _surrogate_rollout(self):  # noqa: ANN202 - rollout.RolloutFn or None
        """The surrogate's own sampler, under the autocast of its ``loss`` (so on-policy ratios are 1)."""
        surrogate = self.session.surrogate
        if not surrogate.owns_rollout:
            return None
        rollout = surrogate.rollout

        def autocast_rollout(*args):  # noqa: ANN002, ANN202
            with self.accelerator.autocast():
                return rollout(*args)

        return autocast_rollout

    def diagnose(self, batch: RolloutBatch, iteration: int) -> dict[str, float]:
        """The surrogate diagnostics every ``log.diagnostics_every`` iterations, before the update.

        A generator of their own (seeded by the iteration) keeps the training RNG streams, and so
        resumed runs, unchanged; surrogates without a per-sample ELBO surrogate give ``{}``. Their
        time is left out of ``time_train`` and ``wall_seconds``, so methods compare on their own cost.
        """
        every = self.recipe.log.diagnostics_every
        if not every or iteration % every:
            return {}
        from vgrpo_platform.diagnostics import measure_surrogate

        generator = torch.Generator().manual_seed(self.recipe.run.seed + 3 + iteration)
        with bypassed(self.routed), self.accelerator.autocast():  # per-rank gradients, never averaged
            found = measure_surrogate(self.session.surrogate, batch, self.session.adapter, generator)
        return reduce_metrics(self.accelerator, found)  # each rank measured its own rows

    # ------------------------------------------------------------------------------------- evaluation
    def _served(self) -> AbstractContextManager[None]:
        """The weights users get (evaluations, grids, export): the moving average where there is one."""
        if self.average is None:
            return nullcontext()
        return self.average.applied(self.session.trainable)

    def evaluate(self, iteration: int, *, wall: float) -> dict[str, float]:
        """Held-out prompts, fixed seeds: the same noise every time, so curves compare like with like.

        Returns the evaluation's record (as written to ``metrics.jsonl``); writes its grid.
        """
        with self._served():
            return self._evaluate(iteration, wall=wall)

    @torch.no_grad()
    def _evaluate(self, iteration: int, *, wall: float) -> dict[str, float]:
        grids = self.recipe.log.save_grids
        result = evaluate(
            self.session,
            self.protocol,
            accelerator=self.accelerator,
            step=iteration,
            offload_device=self.reward_device,
            keep_samples=grids,
            scorer=self.scorer,
        )
        record: dict = {"kind": "eval", "iteration": iteration, "wall_seconds": wall, **result.means()}
        if self.accelerator.is_main_process:
            self._write(record)
            if grids:  # ranks hold consecutive blocks of the prompts, so the gathered order is theirs
                per_prompt = self.protocol.samples_per_prompt
                grid = result.save_grid(
                    self.run_dir / "samples" / f"eval_{iteration:06d}.png",
                    title=f"held-out prompts at iteration {iteration}, {per_prompt} fixed seeds each",
                )
                self.tracking.log_samples(iteration, grid, result.samples, per_prompt)
        return record

    # ------------------------------------------------------------------------------------ checkpoints
    def save(self, iteration: int, elapsed: float, *, eval_pending: dict | None = None) -> Path | None:
        """Every rank gathers the full state (sharded parameters); the main process writes it.

        ``eval_pending``: the evaluation of ``iteration`` failed and is still to do (``_evaluation``).
        """
        weights = sharding.full_weights(self.session.trainable)
        optimizer = sharding.gather_optimizer(self.optimizer, self.params)
        averaged = self.average.full_state() if self.average is not None else None
        path = None
        if self.accelerator.is_main_process:
            path = save_checkpoint(
                self.run_dir,
                iteration,
                weights=weights,
                optimizer={"optimizer": optimizer, "lr_schedule": self.lr_schedule.state_dict()},
                rng=self._rng_state(),
                state={
                    "fingerprint": fingerprint(self.recipe),
                    "prompt_sampler": self.prompts.state_dict(),
                    "elapsed_seconds": elapsed,
                    **({"eval_pending": eval_pending} if eval_pending is not None else {}),
                },
                keep_last=self.recipe.log.keep_last,
                averaged=averaged,
            )
        self.accelerator.wait_for_everyone()
        return path

    def _restore(self) -> None:
        ckpt = latest_valid_checkpoint(
            self.run_dir, on_skip=lambda why: print(f"warning: {why}", file=sys.stderr)
        )
        if ckpt is None:
            raise CheckpointError(
                f"--resume found no complete checkpoint in {self.run_dir / 'checkpoints'}; "
                "run without --resume"
            )
        if ckpt.state.get("fingerprint") != fingerprint(self.recipe):
            raise CheckpointError(
                f"checkpoint {ckpt.path} was written for a different model or LoRA setup than this recipe; "
                "resume with the recipe that started the run, or choose another run.name"
            )
        expected = {k: tuple(p.shape) for k, p in self.session.trainable.items()}
        found = {k: tuple(v.shape) for k, v in ckpt.weights.items()}
        if expected != found:
            raise CheckpointError(
                f"checkpoint {ckpt.path} holds weights that do not fit this recipe's model; "
                "resume with the recipe that started the run"
            )
        sharding.load_weights(self.session.trainable, ckpt.weights)
        sharding.load_optimizer(self.optimizer, self.params, ckpt.optimizer["optimizer"])
        self.lr_schedule.load_state_dict(ckpt.optimizer["lr_schedule"])
        if self.average is not None:
            if ckpt.averaged is None:  # EMA switched on for the rest of a run: it starts from here
                print(
                    f"warning: {ckpt.path} holds no moving average; it starts from the restored weights",
                    file=sys.stderr,
                )
                self.average.load_full_state(ckpt.weights)
            else:
                self.average.load_full_state(ckpt.averaged)
        self._set_rng_state(ckpt.rng)
        self.prompts.load_state_dict(ckpt.state["prompt_sampler"])
        self.start_iteration = int(ckpt.state["iteration"])
        self.elapsed = float(ckpt.state.get("elapsed_seconds", 0.0))
        self.eval_pending = ckpt.state.get("eval_pending")

    def _check_run_dir(self, resume: bool) -> None:
        if not resume and list_checkpoints(self.run_dir):
            raise RecipeError(
                f"run directory {self.run_dir} already holds checkpoints; continue it with --resume, "
                "or start a new run with --set run.name=<new name>"
            )


def _headline(record: dict[str, float]) -> dict[str, float]:
    keys = ("reward", "loss", "kl", "ratio_mean", "time_iteration")
    return {k: record[k] for k in keys if k in record}


def run(resolved, *, resume: bool = False) -> Path:  # noqa: ANN001 - recipe.ResolvedRecipe
    """Train the recipe to completion (or until interrupted); returns the run directory."""
    return Trainer(resolved, resume=resume).run()
