"""Faults inside one training iteration, and what the recipe's ``train.on_fault`` policy does with them.

A fault is something that spoils one iteration but not the run: a reward plugin that raises or
returns NaN/inf, a loss that is not finite, running out of memory during a rollout. Under
``on_fault = "stop"`` the run saves a checkpoint (when no optimiser step of the failing iteration
has happened yet, the weights are exactly those after the previous iteration, so the checkpoint
is exact) and exits with a one-line error; ``--resume`` then retries the same iteration. Under
``"skip"`` the iteration is dropped (no update, a ``kind = "skipped"`` line in ``metrics.jsonl``) and
training goes on, until ``train.max_consecutive_skips`` faults in a row stop it.

A ``RewardError`` during an evaluation (the first, one every ``eval.every``, the final one) follows
the same policy. The evaluated iteration's training is done, so "stop" saves the checkpoint *of that
iteration*, marked ``eval_pending`` and holding the RNG state from before the evaluation: ``--resume``
re-runs exactly that evaluation, then goes on. "skip" writes a ``kind = "eval_skipped"`` line and goes
on (it counts towards ``train.max_consecutive_skips``); the final evaluation, the run's result, is
never skipped: the run stops as under "stop" and ``--resume`` runs only that evaluation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from vgrpo_platform.errors import RewardError, VgrpoError
from vgrpo_platform.training.recovery.faults import with_evaluation_hint, with_policy_hint

if TYPE_CHECKING:
    from vgrpo_platform.config.schema import TrainSection
    from vgrpo_platform.training.observe.metrics import Progress
    from vgrpo_platform.training.recovery.run_state import RunState


class FaultPolicy:
    """``train.on_fault`` over a run: counts the faults in a row, logs a skip or saves what is exact
    and raises. ``write`` puts a line in ``metrics.jsonl``."""

    def __init__(self, train: TrainSection, state: RunState, write: Callable[[dict], None]) -> None:
        self.train = train
        self.state = state
        self.write = write
        self.in_a_row = 0

    def iteration_done(self) -> None:
        self.in_a_row = 0

    def iteration_failed(self, fault: VgrpoError, iteration: int, before: dict, elapsed: float) -> dict:
        """The ``skipped`` record to log, or raise after saving what is exact.

        ``before``: the loop state before the iteration. What the update already did decides what is
        exact: after an optimiser step of the iteration (``stepped``) its start cannot be saved any
        more; a DeepSpeed engine holding half-accumulated gradients (``half_step``) cannot skip it.
        """
        self.in_a_row += 1
        t = self.train
        stepped, half_step = self.state.update.stepped, self.state.update.half_step
        hint_policy = t.on_fault
        if half_step:  # DeepSpeed holds the reduced gradients of a half-accumulated step: no skip
            fault = type(fault)(f"{fault}; DeepSpeed cannot drop a half-accumulated step, so the run stops")
            hint_policy = "skip"  # so the message does not suggest switching to "skip"
        if t.on_fault == "stop" or self.in_a_row >= t.max_consecutive_skips or half_step:
            saved = None
            if not stepped and iteration > 1:  # the weights are still those after iteration - 1
                self.state.loop.restore(before)
                self.state.save(iteration - 1, elapsed)
                saved = iteration - 1
            raise with_policy_hint(fault, hint_policy, saved) from fault
        self.state.update.optimizer.zero_grad(set_to_none=True)
        return {"kind": "skipped", "iteration": iteration, "reason": str(fault)}

    def evaluation(
        self,
        evaluate: Callable[[], dict],
        iteration: int,
        wall: float,
        elapsed: Callable[[], float],
        progress: Progress,
    ) -> dict | None:
        """Run the evaluation at ``iteration``: its record, or None when it was skipped.

        A ``RewardError`` (raised on every rank alike, see ``evaluation.evaluate``) is a fault as in an
        iteration. "skip" writes ``{"kind": "eval_skipped", "iteration", "wall_seconds", "reason"}``
        and goes on, except for the final evaluation (the run's result) and after
        ``train.max_consecutive_skips`` faults in a row. Otherwise the run stops: the checkpoint of
        ``iteration`` (whose training is done) is saved with the RNG state from before the evaluation
        and marked ``eval_pending``, so ``--resume`` re-runs exactly this evaluation, then goes on.
        """
        before = self.state.loop.snapshot()
        try:
            record = evaluate()
        except RewardError as fault:
            self.in_a_row += 1
            t = self.train
            final = iteration == t.iterations
            if t.on_fault == "skip" and not final and self.in_a_row < t.max_consecutive_skips:
                reason = str(fault)
                self.write(
                    {"kind": "eval_skipped", "iteration": iteration, "wall_seconds": wall, "reason": reason}
                )
                progress.message(f"skipped the evaluation of iteration {iteration}: {fault}")
                return None
            self.state.loop.restore(before)  # the evaluation drew nothing the checkpoint should miss
            self.state.save(iteration, elapsed(), eval_pending={"wall_seconds": wall})
            raise with_evaluation_hint(fault, iteration, policy=t.on_fault, final=final) from fault
        progress.message(f"eval @{iteration}: reward {record['reward']:.4f}")
        return record
