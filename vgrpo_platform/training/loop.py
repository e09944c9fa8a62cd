"""The V-GRPO training loop, top to bottom: rollout, score, advantages, surrogate, update, log, checkpoint.

``Trainer.run`` is the run (evaluate, iterate, checkpoint, export); ``Trainer.iterate`` is one iteration,
whose steps are the methods after it in the order it calls them, each built on ``training/iteration/``.

How it departs from textbook GRPO (see docs/concepts.md):
- The whole denoising chain is one action. Rollouts use any ODE sampler and record no per-step
  log-probs; the policy likelihood is the surrogate's business (``-L_hat`` for V-GRPO), computed on
  the final clean samples with ``(t, eps)`` pairs drawn once per iteration at rollout time.
- The old policy is never copied: its surrogate values (and, for the KL, its predictions) are stored
  with the rollout, before the first gradient step of the iteration.
- An iteration's batch is split into ``train.gradient_steps_per_iteration`` mini-batches, one
  optimiser step each; with one step the update is fully on-policy (ratio exactly 1).
- Each mini-batch is accumulated over micro-batches weighted by their size, so the gradient equals
  the full mini-batch's whatever ``micro_batch_size`` is (``iteration/update.py``).
- Ctrl-C or SIGTERM finish the current iteration, save a checkpoint and exit; ``--resume`` continues
  from the newest complete checkpoint with the same RNG and prompt-sampler state.
- With ``train.ema_decay`` a moving average of the weights is what evaluations, grids and the
  exported model see; the optimiser, rollouts and the surrogate keep the raw weights (``iteration/ema.py``).
- Evaluations (``observe/evaluation.py``, shared with ``vgrpo eval``) also score the ``[[eval.rewards]]`` and
  each prompt's sample diversity; ``[eval.monitor]`` stops the run with a checkpoint when the reward
  rises while one of them falls (``observe/monitor.py``). ``log.trackers`` mirror ``metrics.jsonl`` and the
  grids to TensorBoard / W&B / MLflow through accelerate (``observe/tracking.py``).
- A fault (``recovery/faults.py``) follows ``train.on_fault``, in an iteration or in an evaluation:
  "stop" saves an exact checkpoint (``recovery/run_state.py``) and raises a one-line error, "skip" logs
  the skip and goes on.
- Under ``accelerate launch`` / ``torchrun`` each process rolls out a contiguous block of whole prompt
  groups; rewards are gathered, so advantages and metrics see the global batch, and the random draws
  are made for the global batch on every rank (``parallel/data_parallel.py``): N processes equal one process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from vgrpo_platform.algo.grpo import compute_advantages
from vgrpo_platform.config.recipe import ResolvedRecipe, save_resolved
from vgrpo_platform.config.schema import Recipe
from vgrpo_platform.errors import RecipeError, RewardError, VgrpoError
from vgrpo_platform.lora_files import FINAL
from vgrpo_platform.network import denoiser_call_of
from vgrpo_platform.parallel import context_parallel, sharded_state
from vgrpo_platform.parallel import data_parallel as dp
from vgrpo_platform.protocols import BatchState, BuildContext, RolloutBatch, SamplerSpec
from vgrpo_platform.rollout_backends.in_process import InProcessBackend
from vgrpo_platform.training.export import export_policy
from vgrpo_platform.training.iteration.clock import StageClock
from vgrpo_platform.training.iteration.ema import served
from vgrpo_platform.training.iteration.prompts import PromptSampler
from vgrpo_platform.training.iteration.reward_workers import GroupFeeder, build_scorer
from vgrpo_platform.training.iteration.rollout import RolloutPlan, plan_rollout, roll_out, surrogate_sampler
from vgrpo_platform.training.iteration.rollout_source import RolloutSource
from vgrpo_platform.training.iteration.update import PolicyUpdate
from vgrpo_platform.training.observe.evaluation import Protocol, evaluate
from vgrpo_platform.training.observe.metrics import (
    EVAL_STATS,
    MetricsWriter,
    Progress,
    read_metrics,
    reward_metrics,
    stats_record,
)
from vgrpo_platform.training.observe.monitor import Watch
from vgrpo_platform.training.observe.summary import summarise
from vgrpo_platform.training.observe.tracking import Tracking, require
from vgrpo_platform.training.recovery import faults
from vgrpo_platform.training.recovery.fault_policy import FaultPolicy
from vgrpo_platform.training.recovery.interrupts import Interrupted, StopFlag
from vgrpo_platform.training.recovery.run_lock import RunLock
from vgrpo_platform.training.recovery.run_state import LoopState, RunState, check_run_dir
from vgrpo_platform.training.session import Session, build_session, fingerprint, resolve_device, run_dir_of


@dataclass
class _Draw:
    """The iteration's prompts and this rank's share of them."""

    prompts: list[str]  # the whole batch's, the same on every rank
    block: slice  # this rank's prompt groups
    flat_prompts: list[str]  # this rank's prompts, one per rollout row
    rows: slice  # this rank's rows in the whole batch
    pending: Any  # an overlapped rollout requested during the last update, or None


@dataclass
class _Rollout:
    plan: RolloutPlan
    latents: torch.Tensor
    samples: Any
    state: BatchState | dict[str, torch.Tensor] | None  # a surrogate's own sampler's (a dict: deprecated)
    info: dict[str, float]  # the backend's metrics (rollout_*)
    generating: dict[str, torch.Tensor] | None  # the weights that generated it, when not the current ones


@dataclass
class _Scores:
    terms: dict[str, torch.Tensor]  # per reward, the whole batch
    details: dict[str, torch.Tensor]
    total_reward: torch.Tensor
    advantages: torch.Tensor  # [N], the whole batch
    group_ids: torch.Tensor  # [N], each row's prompt group in the whole batch


class Trainer:
    """Holds one run's state; ``run()`` is the loop."""

    def __init__(self, resolved: ResolvedRecipe, *, resume: bool = False) -> None:
        self.resolved = resolved
        self.recipe = recipe = resolved.recipe
        t = recipe.train
        self.run_dir = run_dir_of(recipe)
        require(recipe.log.trackers)  # a missing tracker package stops here, before any model loads
        device = resolve_device(recipe.run.device)
        trackers = Tracking.accelerator_kwargs(recipe.log.trackers, self.run_dir)
        self.accelerator = dp.build_accelerator(
            device, recipe.run.mixed_precision, collective_timeout_s=t.collective_timeout_s, **trackers
        )
        self.tracking = Tracking(self.accelerator, recipe.log.trackers, recipe.log.project, self.run_dir)
        self.device = self.accelerator.device
        # train.offload_rewards: reward models visit the device only while they score
        self.reward_device = self.device if t.offload_rewards else None
        self.shard = dp.shard_of(self.accelerator, recipe.parallel.context)  # a context group is one rank
        self.shard.prompt_block(recipe.rollout.prompts_per_iteration)  # fail early on an uneven split
        # before any model is built (a contradicting DeepSpeed config stops here)
        dp.configure_launch(self.accelerator, grad_clip=t.grad_clip, micro_batch_size=t.micro_batch_size)
        # one live run per directory (run_lock.py): the main process holds the lock until run() ends
        main = self.accelerator.is_main_process
        resume = check_run_dir(self.run_dir, resume, probe_lock=main)  # False: --resume starts over
        self.lock = RunLock.acquire(self.run_dir) if main else None
        try:
            self._build(resolved, resume)
        except BaseException:
            self.release()
            raise

    def _build(self, resolved: ResolvedRecipe, resume: bool) -> None:
        """Everything after the run directory is ours: the session, the scorer, the loop's state."""
        recipe, t = self.recipe, self.recipe.train
        self.run_dir.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(recipe.run.seed)
        context = BuildContext(
            device=self.device, seed=recipe.run.seed, run_dir=self.run_dir, recipe_dir=resolved.recipe_dir
        )
        with self.accelerator.main_process_first():  # downloads and model builds happen once
            self.session: Session = build_session(
                resolved, context, rewards_here=recipe.scoring.isolation == "inline"
            )
        if recipe.parallel.context > 1:  # a collective of every process: outside main_process_first
            self.session.speed.append(self._split_context(recipe))
        self.notices: list[str] = []  # reward-worker restarts, reported by run() after the iteration
        self.scorer = build_scorer(
            recipe.scoring,
            self.session,
            (resolved.rewards, resolved.eval_rewards),
            replace(context, device=torch.device(recipe.scoring.device or self.device)),
            offload_device=self.reward_device,
            on_restart=self.notices.append,
        )
        self.sampler = SamplerSpec(recipe.rollout.sampler, recipe.rollout.steps)  # every training rollout's
        self.protocol = Protocol.of(resolved)  # the held-out prompts, seeds and sampler of every evaluation
        prompts = PromptSampler(resolved.train_prompts, seed=recipe.run.seed, shuffle=recipe.prompts.shuffle)
        self.loop = LoopState.seeded(prompts, recipe.run.seed)
        self.update = PolicyUpdate(self.session, t, self.accelerator, self.loop.shuffle_rng, self.shard)
        self.optimizer, self.average = self.update.optimizer, self.update.average
        self.source = self._rollout_source(resolved, context)
        self.state = RunState(
            self.run_dir,
            fingerprint(recipe),
            recipe.log.keep_last,
            self.accelerator,
            self.session,
            self.update,
            self.loop,
            total_iterations=t.iterations,
        )
        self.on_fault = FaultPolicy(t, self.state, self._write)
        self.t_start = 0.0  # set by run(): perf_counter() of a training start with no time behind it
        self.diagnostics_seconds = 0.0  # spent on log.diagnostics_every in this process, not in wall_seconds
        self.resumed = resume
        self._restore_or_start(resume)

    def _split_context(self, recipe: Recipe) -> str:
        """``[parallel] context``: each sample's tokens shared by a group of processes (before the
        data-parallel wrapper, which then averages the groups' gradients)."""
        if dp.describe(self.accelerator).startswith("DeepSpeed"):
            raise RecipeError(
                "parallel.context > 1 is not supported under DeepSpeed; launch with a DDP or FSDP2 config "
                "(recipes/accelerate/) or set parallel.context = 1"
            )
        denoiser = denoiser_call_of(self.session.adapter).module
        return context_parallel.enable(
            denoiser, recipe.parallel.context, recipe.parallel.context_split, recipe.adapter.name
        )

    def _restore_or_start(self, resume: bool) -> None:
        """Where the run starts (a checkpoint under ``--resume``), and its metrics file and monitor
        history (the evaluations before a checkpoint count for ``[eval.monitor]``'s patience)."""
        self.start_iteration = 0
        self.elapsed = 0.0  # seconds of training before this process (resumed runs)
        # set by --resume from a checkpoint whose evaluation failed (fault_policy.py): {"wall_seconds": ...}
        self.eval_pending: dict | None = None
        if resume:
            resumed = self.state.restore()
            self.start_iteration, self.elapsed = resumed.iteration, resumed.elapsed
            self.eval_pending = resumed.eval_pending
        self.metrics = None  # only the main process writes
        self.eval_stats = None
        history: list[dict] = []  # the evaluation records the monitor judges (main process)
        if self.accelerator.is_main_process:
            save_resolved(self.resolved, self.run_dir)
            self.metrics = MetricsWriter(
                self.run_dir / "metrics.jsonl", resume_after=self.start_iteration if resume else None
            )
            self.eval_stats = MetricsWriter(
                self.run_dir / EVAL_STATS, resume_after=self.start_iteration if resume else None
            )
            if resume:
                history = [r for r in read_metrics(self.metrics.path) if r.get("kind") == "eval"]
        evaluation_only = [r.key for r in self.session.eval_rewards]
        self.watch = Watch(self.recipe.eval.monitor, self.accelerator, history, evaluation_only)

    def _rollout_source(self, resolved: ResolvedRecipe, context: BuildContext) -> RolloutSource:
        """``[rollout] backend``: built here, started on the session's adapter and trainable weights."""
        rollout, ref = self.recipe.rollout, resolved.rollout_backend
        backend = (
            InProcessBackend()
            if ref is None
            else ref.spec.factory(ref.config, replace(context, extra={"resolved": resolved}))
        )
        if (rollout.overlap or not isinstance(backend, InProcessBackend)) and self.shard.world > 1:
            raise RecipeError(
                f"rollout.backend = '{rollout.backend}'{' with overlap' if rollout.overlap else ''} runs in "
                "one training process for now; launch one process, or use rollout.backend = 'in_process'"
            )
        if self.session.surrogate.needs_exact_rollouts and (rollout.overlap or not backend.exact):
            raise RecipeError(
                f"surrogate '{self.recipe.surrogate.name}' needs the exact in-process sampler; set "
                "rollout.backend = 'in_process' and rollout.overlap = false"
            )
        every = rollout.mismatch_every if rollout.mismatch_every is not None else 10
        return RolloutSource(
            backend,
            self.session.adapter,
            self.session.trainable,
            overlap=rollout.overlap,
            seed=self.recipe.run.seed,
            mismatch_every=every,
            mismatch_samples=rollout.mismatch_samples,
        )

    def release(self) -> None:
        """Free the run directory's lock (``run()`` does when it ends, however it ends)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    # ----------------------------------------------------------------------------------------- loop
    def run(self) -> Path:
        """The run from its first evaluation to its export; the run directory stays locked till it ends."""
        try:
            return self._run()
        finally:
            self.release()

    def _run(self) -> Path:
        recipe = self.recipe
        total = recipe.train.iterations
        progress = Progress(
            recipe.log.progress if self.accelerator.is_main_process else "none",
            total,
            start=self.start_iteration,
            label=recipe.surrogate.name,
        )
        stop = StopFlag()
        self.t_start = time.perf_counter() - self.elapsed  # see _elapsed()
        if self.accelerator.num_processes > 1:
            processes = self.accelerator.num_processes
            progress.message(f"data parallel: {processes} processes, {dp.describe(self.accelerator)}")
        for line in self.session.speed:  # train.attention_backend / compile, parallel.context
            progress.message(line)
        self.tracking.start(
            run_name=recipe.run.name,
            config=recipe.model_dump(mode="json"),
            resumed_at=self.start_iteration if self.resumed else None,
        )
        try:
            with stop.installed():
                first = self._evaluate_before(progress)
                for iteration in range(first, total + 1):
                    record = self._iteration(iteration, progress)
                    last = iteration == total
                    alarm = None
                    if recipe.eval.every and iteration % recipe.eval.every == 0 or last:
                        alarm = self._evaluation(iteration, record["wall_seconds"], progress)
                    every = recipe.log.checkpoint_every
                    stop.requested = dp.any_rank(self.accelerator, stop.requested)  # all ranks stop together
                    if last or stop.requested or alarm or (every and iteration % every == 0):
                        self.state.save(iteration, self._elapsed())
                    if stop.requested:
                        progress.message(
                            f"{stop.signal_name}: saved iteration {iteration}; continue with --resume"
                        )
                        raise Interrupted(stop.signal_name)
                    if alarm:
                        self._stopped_by_monitor(alarm, iteration, progress)
                        break
        finally:
            self.source.close()
            self.scorer.close()
            progress.close()
            self.tracking.finish()
        self._export()
        if self.accelerator.is_main_process:
            summarise(self.run_dir, progress)
        return self.run_dir

    def _evaluate_before(self, progress: Progress) -> int:
        """The evaluation before training, or the one a stopped run left to do (``--resume``); returns
        the first iteration to train."""
        pending, at = self.eval_pending, self.start_iteration
        if at > 0 and pending is None:
            return at + 1
        alarm = self._evaluation(at, pending["wall_seconds"] if pending else 0.0, progress)
        if pending is not None:  # its checkpoint becomes the one an uninterrupted run saves
            self.state.save(at, self._elapsed())
            self.eval_pending = None
            if alarm and at > 0:  # the uninterrupted run stopped here
                self._stopped_by_monitor(alarm, at, progress)
                return self.recipe.train.iterations + 1
        return at + 1

    def _iteration(self, iteration: int, progress: Progress) -> dict:
        """``iterate`` under ``train.on_fault``; logs and returns its record (or the skip's)."""
        before_iteration = self.loop.resumable()  # with rollout.overlap: before this rollout's draws
        self.update.begin_iteration()
        try:
            record = self.iterate(iteration)
            self.on_fault.iteration_done()
        except faults.FAULTS as fault:
            self.source.drop_pending()  # an overlapped next rollout is drawn again
            self.loop.ahead = None
            record = self.on_fault.iteration_failed(fault, iteration, before_iteration, self._elapsed())
            progress.message(f"skipped iteration {iteration}: {fault}")
        # wall-clock of the method: the optional diagnostics' seconds are left out
        record["wall_seconds"] = self._elapsed()
        for notice in self.notices:
            self._write({"kind": "reward_worker_restarted", "iteration": iteration, "reason": notice})
            progress.message(notice)
        self.notices.clear()
        self._write(record)
        progress.update(iteration, _headline(record))
        return record

    def _evaluation(self, iteration: int, wall: float, progress: Progress) -> str | None:
        """The evaluation at ``iteration`` under ``train.on_fault``; why the monitor stops the run or None."""
        evaluated = self.on_fault.evaluation(
            lambda: self.evaluate(iteration, wall=wall), iteration, wall, self._elapsed, progress
        )
        if evaluated is None:
            return None
        alarm = self.watch(evaluated)
        warning = self.watch.warning()  # a guard past the margin, whether or not the rule is on
        if warning is not None:
            progress.message(warning)
        return alarm

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

    def _export(self) -> None:
        """``RUN/final``: the served weights, gathered, in the model family's format, with the export note
        and the model card (``export.py``); one process writes."""
        if self.update.routed is not None:
            self.update.routed.restore()
        with (
            served(self.average, self.session.trainable),
            sharded_state.unsharded(self.session.adapter.denoiser),
        ):
            if self.accelerator.is_main_process:
                export_policy(self.session.adapter, self.run_dir / FINAL, self.run_dir, self.recipe)

    def iterate(self, iteration: int) -> dict[str, float]:
        """One V-GRPO iteration, its steps in order; returns its metrics record."""
        clock = StageClock()
        draw = self._draw_prompts()
        self.session.surrogate.begin_iteration(iteration)
        rollout, scored = self._roll_out_and_score(draw, iteration, clock)
        scores = self._advantages(draw, scored)
        clock.lap("reward")
        if self.source.due(iteration):  # a lossy backend's gap to the exact sampler, measured
            rewards = scores.total_reward[draw.rows]
            rollout.info.update(self._mismatch(rollout.plan, rollout.latents, rollout.generating, rewards))
            clock.add_aside(rollout.info.get("time_mismatch", 0.0))
        self._prefetch_next(draw, iteration)
        batch = self._batch(draw, rollout, scores)
        self._score_steps(batch)
        self._prepare_surrogate(batch, rollout.generating)
        with clock.aside():  # not part of the method's training cost
            diagnostics = self.diagnose(batch, iteration)
        update = self.update(batch, iteration)
        self.source.updated()
        clock.lap("train")
        self.diagnostics_seconds += clock.set_aside
        record: dict[str, Any] = {"kind": "train", "iteration": iteration, "epoch": self.loop.prompts.epoch}
        record.update(
            reward_metrics(
                scores.total_reward, scores.terms, scores.details, scores.advantages, scores.group_ids
            )
        )
        record.update(update)
        record.update(diagnostics)
        record.update(rollout.info)
        record["lr"] = self.optimizer.param_groups[0]["lr"]
        # time_scoring: the rewards' own seconds, which [scoring] overlap hides behind the rollout
        record.update(clock.record(), time_scoring=self.scorer.busy_seconds())
        return record

    # ------------------------------------------------------------------------------- iteration steps
    def _draw_prompts(self) -> _Draw:
        """The iteration's prompts (the same list on every rank; drawn during the last update under
        ``rollout.overlap``) and the whole prompt groups this rank rolls out."""
        pending = self.source.take_pending()
        per_iteration = self.recipe.rollout.prompts_per_iteration
        prompts = pending.prompts if pending else self.loop.prompts.next(per_iteration)
        block = self.shard.prompt_block(len(prompts))
        group_size = self.recipe.rollout.group_size
        flat = [p for p in prompts[block] for _ in range(group_size)]  # row order of the rollout
        first_row = block.start * group_size
        return _Draw(prompts, block, flat, slice(first_row, first_row + len(flat)), pending)

    def _roll_out_and_score(
        self, draw: _Draw, iteration: int, clock: StageClock
    ) -> tuple[_Rollout, tuple[dict, dict]]:
        """This rank's samples and their reward terms; a fault on any rank stops every rank here."""
        self.scorer.busy_seconds()  # only this iteration's scoring counts in time_scoring
        feeder = (  # [scoring] overlap: each chunk of whole groups is scored while the next is generated
            GroupFeeder(self.scorer, draw.flat_prompts, self.recipe.rollout.group_size, step=iteration)
            if self.scorer.overlap
            else None
        )
        fault: VgrpoError | None = None
        rollout = scored = None
        try:
            rollout = self._roll_out(draw, iteration, feeder)
            clock.lap("rollout")
            if feeder is not None:
                scored = self.scorer.collect(feeder.finish())
            else:
                scored = self.scorer.score(
                    rollout.samples,
                    draw.flat_prompts,
                    step=iteration,
                    group_size=self.recipe.rollout.group_size,
                )
        except RewardError as exc:
            fault = exc
        except Exception as exc:
            if not faults.is_out_of_memory(exc):
                raise
            fault = faults.out_of_memory(iteration, draw.prompts[draw.block][0])
        faults.agree_on_fault(self.accelerator, fault)
        assert rollout is not None and scored is not None  # agree_on_fault raised otherwise
        return rollout, scored

    def _roll_out(self, draw: _Draw, iteration: int, feeder: GroupFeeder | None) -> _Rollout:
        """The rank's rollout from the run's backend (or the surrogate's own sampler), chunk by chunk."""
        plan = draw.pending.plan if draw.pending else self._plan(draw.prompts, draw.block, draw.rows.start)
        block = self.session.surrogate.rollout_block  # a tree rollout needs its whole group in one call
        chunk = -(-self.recipe.train.micro_batch_size // block) * block
        sample_chunk, info, generating = self.source.sampler_for(
            plan, self.sampler, iteration, chunk, draw.pending
        )
        with sharded_state.gathered_while_generating(self.session.adapter.denoiser):  # FSDP2: gather once
            latents, samples, state = roll_out(
                self.session.adapter,
                plan,
                sampler=self.sampler,
                generator=self.loop.rollout_rng,
                chunk_size=chunk,
                rollout_fn=surrogate_sampler(self.session.surrogate, self.accelerator.autocast),
                sample_chunk=sample_chunk,
                on_chunk=feeder,
            )
        return _Rollout(plan, latents, samples, state, info, generating)

    def _advantages(self, draw: _Draw, scored: tuple[dict, dict]) -> _Scores:
        """The whole batch's scores on every rank (advantages and metrics see full groups), and the
        group-relative advantages of ``[grpo]``."""
        local_terms, local_details = scored
        context = self.shard.context
        terms = {k: dp.gather_rows(self.accelerator, v, context) for k, v in sorted(local_terms.items())}
        details = {k: dp.gather_rows(self.accelerator, v, context) for k, v in sorted(local_details.items())}
        group_ids = torch.arange(len(draw.prompts)).repeat_interleave(self.recipe.rollout.group_size)  # [N]
        g = self.recipe.grpo
        advantages, total_reward = compute_advantages(
            terms,
            {r.key: r.weight for r in self.session.rewards},
            group_ids,
            std=g.std,
            eps=g.eps,
            aggregation=g.reward_aggregation,
            soft_clip_eta=g.soft_clip_eta,
        )
        return _Scores(terms, details, total_reward, advantages, group_ids)

    def _prefetch_next(self, draw: _Draw, iteration: int) -> None:
        """``rollout.overlap``: the next iteration's prompts and noise, handed to the backend now."""
        if not self.source.overlap or iteration >= self.recipe.train.iterations:
            self.loop.ahead = None
            return
        self.loop.draws_ahead()  # a checkpoint of this iteration leaves the next one's draws undone
        upcoming = self.loop.prompts.next(self.recipe.rollout.prompts_per_iteration)
        plan = self._plan(upcoming, draw.block, draw.rows.start)
        self.source.prefetch(upcoming, plan, self.sampler, iteration + 1, self.recipe.train.micro_batch_size)

    def _batch(self, draw: _Draw, rollout: _Rollout, scores: _Scores) -> RolloutBatch:
        """This rank's rows of the iteration, on the training device."""
        mine = draw.rows
        return RolloutBatch(
            prompts=draw.flat_prompts,
            group_ids=(rollout.plan.group_ids + draw.block.start).to(self.device),  # ids in the global batch
            cond=rollout.plan.cond,
            latents=rollout.latents,
            rewards=scores.total_reward[mine].to(self.device),
            reward_terms={k: v[mine].to(self.device) for k, v in scores.terms.items()},
            advantages=scores.advantages[mine].to(self.device),
            extras=rollout.state if isinstance(rollout.state, dict) else {},  # deprecated dict rollouts
            rows=dp.RowsOf(scores.group_ids.to(self.device), mine.start) if self.shard.world > 1 else None,
            state=rollout.state if isinstance(rollout.state, BatchState) else None,
        )

    def _score_steps(self, batch: RolloutBatch) -> None:
        """The surrogate's rewards of intermediate steps (DenseGRPO's ``step_rewards``), scored like the
        batch: decoded, every training reward, the recipe's weights (``sum_k w_k R_k``, the logged reward)."""
        weights = {r.key: r.weight for r in self.session.rewards}
        adapter, group_size = self.session.adapter, self.recipe.rollout.group_size

        def score(latents: torch.Tensor) -> torch.Tensor:
            terms, _ = self.scorer.score(
                adapter.decode(latents), batch.prompts, step=None, group_size=group_size
            )
            return sum(weights[k] * v.float().to(self.device) for k, v in sorted(terms.items()))  # type: ignore[return-value]

        with (
            self.accelerator.autocast(),
            denoiser_call_of(adapter).rows_at_most(self.recipe.train.micro_batch_size),
        ):
            self.session.surrogate.score_steps(batch, adapter, score)

    def _prepare_surrogate(self, batch: RolloutBatch, generating: dict[str, torch.Tensor] | None) -> None:
        """The surrogate's pairs and the old policy's values, from the weights that generated the batch,
        a micro-batch at a time."""
        surrogate = self.session.surrogate
        surrogate.samples_on_policy = generating is None
        with (
            self.accelerator.autocast(),
            denoiser_call_of(self.session.adapter).rows_at_most(self.recipe.train.micro_batch_size),
            self.source.generating_policy(generating),
        ):
            surrogate.prepare(batch, self.session.adapter, self.loop.surrogate_rng)

    def _plan(self, prompts: list[str], block: slice, first_row: int) -> RolloutPlan:
        """This rank's rollout inputs for the iteration's ``prompts``: conditioning and initial noise."""
        group_size = self.recipe.rollout.group_size
        return plan_rollout(
            self.session.adapter,
            prompts[block],
            group_size=group_size,
            generator=self.loop.rollout_rng,
            device=self.device,
            noise_window=(first_row, len(prompts) * group_size),
            noise_scope=self.session.surrogate.initial_noise,  # DanceGRPO: one noise per group
        )

    def _mismatch(
        self,
        plan: RolloutPlan,
        latents: torch.Tensor,
        generating: dict[str, torch.Tensor] | None,
        rewards: torch.Tensor,
    ) -> dict[str, float]:
        """``rollout_mismatch_*``: the exact sampler on a few rows, scored like the batch."""
        weights = {r.key: r.weight for r in self.session.rewards}

        def score(exact: torch.Tensor, rows: slice) -> torch.Tensor:
            samples = self.session.adapter.decode(exact)
            terms, _ = self.scorer.score(samples, plan.prompts[rows], step=None)
            return sum(weights[k] * v.float() for k, v in terms.items())  # type: ignore[return-value]

        with self.accelerator.autocast():
            return self.source.mismatch(plan, latents, self.sampler, generating, score, rewards)

    def diagnose(self, batch: RolloutBatch, iteration: int) -> dict[str, float]:
        """The surrogate diagnostics every ``log.diagnostics_every`` iterations, before the update.

        A generator of their own (seeded by the iteration) keeps the training RNG streams, and so
        resumed runs, unchanged; surrogates without a per-sample ELBO surrogate give ``{}``. Their
        time is left out of ``time_train`` and ``wall_seconds``, so methods compare on their own cost.
        """
        every = self.recipe.log.diagnostics_every
        if not every or iteration % every:
            return {}
        from vgrpo_platform.algo.diagnostics import measure_surrogate

        generator = torch.Generator().manual_seed(self.recipe.run.seed + 3 + iteration)
        with (
            dp.bypassed(self.update.routed),
            self.accelerator.autocast(),
        ):  # per-rank gradients, never averaged
            found = measure_surrogate(self.session.surrogate, batch, self.session.adapter, generator)
        return dp.reduce_metrics(self.accelerator, found)  # each rank measured its own rows

    # ------------------------------------------------------------------------------------- evaluation
    def evaluate(self, iteration: int, *, wall: float) -> dict[str, float]:
        """Held-out prompts, fixed seeds: the same noise every time, so curves compare like with like.

        Returns the evaluation's record (as written to ``metrics.jsonl``); writes its grid.
        """
        with served(self.average, self.session.trainable):
            return self._evaluate(iteration, wall=wall)

    @torch.no_grad()
    def _evaluate(self, iteration: int, *, wall: float) -> dict[str, float]:
        grids = self.recipe.log.save_grids
        result = evaluate(
            self.session,
            self.protocol,
            accelerator=self.accelerator,
            scorer=self.scorer,
            step=iteration,
            keep_samples=grids,
        )
        record: dict = {"kind": "eval", "iteration": iteration, "wall_seconds": wall, **result.means()}
        if self.accelerator.is_main_process:
            self._write(record)
            if self.eval_stats is not None:  # standard errors and counts, for `vgrpo report`
                self.eval_stats.write(stats_record(iteration, result.summary()))
            if grids:  # ranks hold consecutive blocks of the prompts, so the gathered order is theirs
                per_prompt = self.protocol.samples_per_prompt
                grid = result.save_grid(
                    self.run_dir / "samples" / f"eval_{iteration:06d}.png",
                    title=f"held-out prompts at iteration {iteration}, {per_prompt} fixed seeds each",
                )
                self.tracking.log_samples(
                    iteration,
                    grid,
                    result.samples,
                    per_prompt,
                    prompts=self.protocol.prompts,
                    rewards=result.total.tolist(),
                )
        return record


def _headline(record: dict[str, float]) -> dict[str, float]:
    keys = ("reward", "loss", "kl", "ratio_mean", "time_iteration")
    return {k: record[k] for k in keys if k in record}


def run(resolved: ResolvedRecipe, *, resume: bool = False) -> Path:
    """Train the recipe to completion (or until interrupted); returns the run directory."""
    trainer = Trainer(resolved, resume=resume)
    run_dir = trainer.run()
    dp.shut_down(trainer.accelerator)
    return run_dir
