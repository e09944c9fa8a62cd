"""What counts as a fault inside one training iteration, told apart from a bug, and agreed across ranks.

A fault is something that spoils one iteration but not the run: a reward plugin that raises or
returns NaN/inf, a loss that is not finite, running out of memory during a rollout. What the run then
does (``train.on_fault``) is ``fault_policy``'s job; the update step raises these without knowing it.
"""

from __future__ import annotations

from typing import Any

import torch

from vgrpo_platform.errors import RewardError, VgrpoError
from vgrpo_platform.parallel.data_parallel import any_rank


class NonFiniteLossError(VgrpoError):
    """The surrogate's loss was NaN or infinite."""


class RolloutOutOfMemory(VgrpoError):
    """The device ran out of memory while sampling rollouts."""


class PeerFault(VgrpoError):
    """Another data-parallel process hit a fault in this iteration (it reports the details)."""


FAULTS: tuple[type[VgrpoError], ...] = (RewardError, NonFiniteLossError, RolloutOutOfMemory, PeerFault)


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


def agree_on_fault(accelerator: Any, fault: VgrpoError | None) -> None:
    """Raise ``fault`` here, or ``PeerFault`` where another rank has one: all ranks leave together."""
    if any_rank(accelerator, fault is not None):
        raise fault if fault is not None else PeerFault("another process hit a fault in this iteration")
