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

import torch

from vgrpo_platform.errors import RewardError, VgrpoError


class NonFiniteLossError(VgrpoError):
    """The surrogate's loss was NaN or infinite."""


class RolloutOutOfMemory(VgrpoError):
    """The device ran out of memory while sampling rollouts."""


class PeerFault(VgrpoError):
    """Another data-parallel process hit a fault in this iteration (it reports the details)."""


FAULTS: tuple[type[Exception], ...] = (RewardError, NonFiniteLossError, RolloutOutOfMemory, PeerFault)


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA's ``OutOfMemoryError`` or the CPU allocator's failure (a plain ``RuntimeError``)."""
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def out_of_memory(iteration: int, prompt: str) -> RolloutOutOfMemory:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # give a skipped iteration's memory back before the next one
    return RolloutOutOfMemory(
        f"out of memory during the rollout of iteration {iteration} (prompt {prompt!r}); lower "
        "train.micro_batch_size (it also chunks rollouts), enable train.gradient_checkpointing or "
        "run.mixed_precision = 'bf16', then continue with --resume"
    )


def non_finite_loss(value: float, iteration: int, prompt: str) -> NonFiniteLossError:
    return NonFiniteLossError(
        f"the loss became {value} at iteration {iteration} (prompt {prompt!r}); lower train.lr or set "
        "train.grad_clip, then continue from the last checkpoint with --resume"
    )


def with_policy_hint(exc: VgrpoError, policy: str, saved: int | None) -> VgrpoError:
    """The error a stopped run reports: the fault, then what was saved and how to go on."""
    where = (
        f"checkpoint of iteration {saved} saved; --resume retries from there"
        if saved is not None
        else "no checkpoint written for this iteration; --resume continues from the last one"
    )
    hint = "" if policy == "skip" else "; set train.on_fault = 'skip' to drop such iterations"
    return type(exc)(f"{exc} [{where}{hint}]")


def with_evaluation_hint(exc: VgrpoError, iteration: int, *, policy: str, final: bool) -> VgrpoError:
    """The error a run stopped by an evaluation's fault reports (the checkpoint of ``iteration`` is saved)."""
    what = "the final evaluation" if final else "the evaluation"
    where = (
        f"{what} of iteration {iteration} failed; checkpoint of iteration {iteration} saved; "
        "--resume re-runs this evaluation"
    )
    if final:
        hint = ", the run's result, which is never skipped" if policy == "skip" else ""
    elif policy == "skip":
        hint = " and goes on (stopped: train.max_consecutive_skips faults in a row)"
    else:
        hint = " and goes on; set train.on_fault = 'skip' to skip such evaluations"
    return type(exc)(f"{exc} [{where}{hint}]")
