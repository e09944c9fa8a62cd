"""Where rewards run (``[scoring]``): in the training process, or isolated in a worker process, and
whether an iteration's rollout chunks are scored while the next chunks are still being generated.

Why a worker process: a reward model that crashes (a segfault in a CUDA kernel, out of host memory)
or leaks takes only its worker down; the trainer reports it, starts a fresh worker and scores the
lost chunks again, and after ``scoring.max_restarts`` deaths stops the run through
``train.on_fault`` like any other ``RewardError``. A worker that stops answering (paused, deadlocked,
waiting on a server that never replies) counts as dead once one batch has waited ``scoring.timeout_s``:
it is killed and replaced the same way, so a hang never freezes the run. The worker may sit on another device
(``scoring.device``). It is a ``concurrent.futures`` process pool of one spawned process; samples
travel through ``torch.multiprocessing``'s shared-memory tensor pickling, not a byte copy.

Why overlap stays on-policy: the chunks scored during the rollout come from the weights that
generate the rest of it, and the update still waits for every score, so each iteration trains on its
own rollout, as without overlap (the first and every later one alike). Only the reward's wall time is
hidden behind the rollout's, all of it but the last chunk's scoring. Rewards always receive whole
prompt groups (a groupwise judge ranks a group in one call), so the chunks are cut on group ends.
Overlapping iteration ``i``'s scoring with iteration ``i + 1``'s rollout instead would train every
iteration after the first on samples one update old; it is deliberately not offered.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from vgrpo_platform.errors import RecipeError, RewardError
from vgrpo_platform.protocols import BuildContext, Samples
from vgrpo_platform.training.iteration.scoring import WeightedReward, score_all

Scores = tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]  # (terms, details) as score_all returns
TRAIN, EVAL = (
    "train",
    "eval",
)  # which rewards a job asks for: the training ones, or those and [[eval.rewards]]


@dataclass
class ScoreJob:
    """One submitted batch of whole prompt groups and the future of its scores."""

    which: str
    samples: Samples
    prompts: list[str]
    step: int | None
    future: Future = field(repr=False)
    group_size: int | None = None  # rows per prompt group (group rewards are called once per group)


class Scorer:
    """Scores batches with the recipe's rewards; ``submit`` may return before the scores exist."""

    overlap = False
    _busy = 0.0  # seconds scored since busy_seconds() last ran; subclasses add to it

    def submit(
        self,
        samples: Samples,
        prompts: Sequence[str],
        *,
        step: int | None,
        which: str = TRAIN,
        group_size: int | None = None,
    ) -> ScoreJob:
        raise NotImplementedError

    def collect(self, jobs: Sequence[ScoreJob]) -> Scores:
        """The jobs' scores, concatenated in submission order (a job's ``RewardError`` is raised here)."""
        return merge([job.future.result() for job in jobs])

    def score(
        self,
        samples: Samples,
        prompts: Sequence[str],
        *,
        step: int | None,
        which: str = TRAIN,
        group_size: int | None = None,
    ) -> Scores:
        """``group_size``: rows per prompt group, for group rewards (else runs of equal prompts)."""
        return self.collect([self.submit(samples, prompts, step=step, which=which, group_size=group_size)])

    def busy_seconds(self) -> float:
        """Seconds the rewards spent scoring since the last call (hidden or not): what overlap hides."""
        busy, self._busy = self._busy, 0.0
        return busy

    def close(self) -> None:
        pass


class InlineScorer(Scorer):
    """Rewards built in this process; with ``overlap`` they score in one background thread (which
    helps rewards that wait: remote servers, judges over HTTP, sleeping benchmarks)."""

    def __init__(
        self,
        train: Sequence[WeightedReward],
        eval_only: Sequence[WeightedReward] = (),
        *,
        offload_device: torch.device | None = None,
        overlap: bool = False,
    ) -> None:
        self.rewards = {TRAIN: list(train), EVAL: [*train, *eval_only]}
        self.offload_device = offload_device
        self.overlap = overlap
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="vgrpo-reward") if overlap else None

    def _run(
        self, which: str, samples: Samples, prompts: list[str], step: int | None, group_size: int | None
    ) -> Scores:
        t0 = time.perf_counter()
        try:
            return score_all(
                self.rewards[which],
                samples,
                prompts,
                step=step,
                offload_device=self.offload_device,
                group_size=group_size,
            )
        finally:
            self._busy += time.perf_counter() - t0

    def submit(
        self,
        samples: Samples,
        prompts: Sequence[str],
        *,
        step: int | None,
        which: str = TRAIN,
        group_size: int | None = None,
    ) -> ScoreJob:
        prompts = list(prompts)
        if self._thread is not None:
            future = self._thread.submit(self._run, which, samples, prompts, step, group_size)
        else:  # scored now, on this thread: exactly the loop without [scoring]
            future = Future()
            try:
                future.set_result(self._run(which, samples, prompts, step, group_size))
            except RewardError as exc:
                future.set_exception(exc)
        return ScoreJob(which, samples, prompts, step, future, group_size)

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True, cancel_futures=True)


# ----------------------------------------------------------------------------- the worker process
_WORKER: dict[str, Any] = {}  # in the worker: {"train": [...], "eval": [...]} or {"error": "..."}


def _start_worker(train_refs: list, eval_refs: list, context: BuildContext, threads: int | None) -> None:
    """Pool initializer: build the rewards once per worker. A failure is kept and reported by
    ``_ready`` so the trainer can print it in one line, instead of a broken pool with no reason."""
    if threads:
        torch.set_num_threads(threads)
    try:
        torch.manual_seed(context.seed)
        train = [WeightedReward(r.key, r.spec.factory(r.config, context), r.weight) for r in train_refs]
        eval_only = [WeightedReward(r.key, r.spec.factory(r.config, context), r.weight) for r in eval_refs]
    except Exception as exc:  # reported by _ready, in the trainer
        _WORKER["error"] = f"{type(exc).__name__}: {exc}"
        return
    _WORKER.update({TRAIN: train, EVAL: [*train, *eval_only]})


def _ready() -> str | None:
    return _WORKER.get("error")


def _score_in_worker(
    which: str, samples: Samples, prompts: list[str], step: int | None, group_size: int | None = None
) -> tuple[Scores, float]:
    t0 = time.perf_counter()
    scores = score_all(_WORKER[which], samples, prompts, step=step, group_size=group_size)
    return scores, time.perf_counter() - t0


class ProcessScorer(Scorer):
    """Rewards built and scored in one spawned worker process (``scoring.isolation = "process"``)."""

    def __init__(
        self,
        train_refs: Sequence[Any],
        eval_refs: Sequence[Any] = (),
        *,
        context: BuildContext,
        overlap: bool = False,
        max_restarts: int = 1,
        threads: int | None = None,
        on_restart: Callable[[str], None] | None = None,
        timeout_s: float | None = None,
    ) -> None:
        for ref in [*train_refs, *eval_refs]:
            try:
                pickle.dumps(ref)
            except Exception as exc:
                raise RecipeError(
                    f"reward '{ref.key}' cannot be sent to a worker process ({type(exc).__name__}: {exc}); "
                    "register a module-level factory and options class, or set scoring.isolation = 'inline'"
                ) from None
        self._initargs = (list(train_refs), list(eval_refs), context, threads)
        self.overlap = overlap
        self.max_restarts = max_restarts
        self.timeout_s = timeout_s  # seconds one batch may wait for its scores; None = no limit
        self.restarts = 0
        self.on_restart = on_restart
        self._gone: str | None = None  # why no worker is left (scoring.max_restarts spent)
        self._pool: Executor | None = self._start()

    def _start(self) -> Executor:
        import torch.multiprocessing as tmp  # registers shared-memory pickling of tensors

        pool = ProcessPoolExecutor(
            max_workers=1,
            mp_context=tmp.get_context("spawn"),
            initializer=_start_worker,
            initargs=self._initargs,
        )
        try:
            error = pool.submit(_ready).result()
        except BrokenProcessPool:
            pool.shutdown(wait=False, cancel_futures=True)
            raise RewardError(
                "the reward worker process died while building its rewards; "
                "run with scoring.isolation = 'inline' to see the reward's own error"
            ) from None
        if error is not None:
            pool.shutdown(wait=True)
            raise RewardError(f"the reward worker could not build its rewards: {error}")
        return pool

    def submit(
        self,
        samples: Samples,
        prompts: Sequence[str],
        *,
        step: int | None,
        which: str = TRAIN,
        group_size: int | None = None,
    ) -> ScoreJob:
        samples = samples.map_tensors(lambda x: x.detach().cpu())  # shared memory, not a device copy
        prompts = list(prompts)
        future = self._send(which, samples, prompts, step, group_size)
        return ScoreJob(which, samples, prompts, step, future, group_size)

    def _send(
        self, which: str, samples: Samples, prompts: list[str], step: int | None, group_size: int | None
    ) -> Future:
        future: Future = Future()
        if self._pool is None:  # every restart spent: each later batch fails the same way (train.on_fault)
            future.set_exception(RewardError(self._gone or "the reward worker is gone"))
            return future
        try:
            return self._pool.submit(_score_in_worker, which, samples, prompts, step, group_size)
        except BrokenProcessPool:  # died between two jobs: collect() restarts it
            future.set_exception(BrokenProcessPool("the worker is gone"))
            return future

    def collect(self, jobs: Sequence[ScoreJob]) -> Scores:
        results: list[Scores] = []
        i = 0
        while i < len(jobs):
            try:
                scores, seconds = jobs[i].future.result(timeout=self.timeout_s)
            except BrokenProcessPool:
                self._restart(jobs[i:], "died")  # then job i is tried again
                continue
            except FutureTimeout:  # paused or hung: treated as dead (killed, replaced, job i again)
                self._restart(jobs[i:], f"did not answer within scoring.timeout_s = {self.timeout_s:g} s")
                continue
            self._busy += seconds
            results.append(scores)
            i += 1
        return merge(results)

    def _restart(self, unscored: Sequence[ScoreJob], what: str) -> None:
        """A fresh worker after a death or a timeout (``what`` the worker did), and the jobs it had not
        scored sent to it again."""
        self.restarts += 1
        step = unscored[0].step
        where = f" at iteration {step}" if step is not None else ""
        if self._pool is not None:
            _kill(self._pool)
            self._pool = None
        if self.restarts > self.max_restarts:
            self._gone = (
                f"the reward worker process {what}{where} ({self.restarts} failures, scoring.max_restarts = "
                f"{self.max_restarts}): a crash, out of memory or a hang in a reward; run with "
                "scoring.isolation = 'inline' to see its error, or raise scoring.max_restarts"
                + (" or scoring.timeout_s" if what != "died" else "")
            )
            raise RewardError(self._gone)
        if self.on_restart is not None:
            self.on_restart(
                f"the reward worker process {what}{where}; started a new one ({self.restarts} of "
                f"scoring.max_restarts = {self.max_restarts}) and scored the lost samples again"
            )
        self._pool = self._start()
        for job in unscored:
            job.future = self._send(job.which, job.samples, job.prompts, job.step, job.group_size)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _kill(pool: Executor) -> None:
    """Stop a pool whose worker may be paused or hung: ``shutdown`` alone would wait on it forever.
    SIGKILL ends a stopped process too; the standard library offers no public way before Python 3.14."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.kill()
    pool.shutdown(wait=False, cancel_futures=True)


def build_scorer(
    scoring: Any,  # config.schema.ScoringSection
    session: Any,  # session.Session: the inline rewards
    refs: tuple[Sequence[Any], Sequence[Any]],  # the rewards' and eval-only rewards' references: a worker
    # rebuilds them from these
    context: BuildContext,  # the worker's (its device is scoring.device or the run's)
    *,
    offload_device: torch.device | None,
    on_restart: Callable[[str], None],
) -> Scorer:
    """``[scoring]``: the session's rewards scored here, or a worker process that builds its own."""
    if scoring.isolation == "inline":
        return InlineScorer(
            session.rewards, session.eval_rewards, offload_device=offload_device, overlap=scoring.overlap
        )
    return ProcessScorer(
        *refs,
        context=context,
        overlap=scoring.overlap,
        max_restarts=scoring.max_restarts,
        threads=scoring.worker_threads,
        on_restart=on_restart,
        timeout_s=scoring.timeout_s,
    )


def merge(parts: Sequence[Scores]) -> Scores:
    """Concatenate per-batch ``(terms, details)`` along the batch, in order."""
    if len(parts) == 1:
        return parts[0]
    terms = {k: torch.cat([p[0][k] for p in parts]) for k in parts[0][0]}
    details = {k: torch.cat([p[1][k] for p in parts]) for k in parts[0][1]}
    return terms, details


class GroupFeeder:
    """Turns the rollout's chunks into scoring jobs of whole prompt groups, as soon as they are complete.

    ``prompts[i]`` is row ``i``'s prompt; rows come in order, ``group_size`` per prompt.
    """

    def __init__(self, scorer: Scorer, prompts: Sequence[str], group_size: int, *, step: int | None) -> None:
        self.scorer, self.prompts, self.group_size, self.step = scorer, list(prompts), group_size, step
        self.jobs: list[ScoreJob] = []
        self._held: list[Samples] = []
        self._rows = 0  # rows received
        self._sent = 0  # rows submitted

    def __call__(self, chunk: Samples) -> None:
        self._held.append(chunk)
        self._rows += len(chunk)
        ready = self._rows - self._rows % self.group_size  # rows up to the last complete group
        if ready > self._sent:
            self._flush(ready)

    def _flush(self, upto: int) -> None:
        held = _concat(self._held)
        take = upto - self._sent
        now = held.select(slice(0, take))
        rest = held.select(slice(take, None))
        self._held = [rest] if len(rest) else []
        prompts = self.prompts[self._sent : upto]
        self.jobs.append(self.scorer.submit(now, prompts, step=self.step, group_size=self.group_size))
        self._sent = upto

    def finish(self) -> list[ScoreJob]:
        if self._rows > self._sent:  # a ragged tail (never with whole groups): scored as it is
            self._flush(self._rows)
        return self.jobs


def _concat(parts: Sequence[Samples]) -> Samples:
    if len(parts) == 1:
        return parts[0]
    return Samples.concat(parts)
