"""A run's state apart from the code: what a checkpoint saves, and what ``--resume`` restores.

Two parts. ``LoopState`` is what an iteration consumes besides the weights (the loop's random
generators and the prompt sampler's position): restoring it replays the iteration, which is how a
fault saves an exact checkpoint after the fact. ``RunState`` adds the weights, the optimiser, the
learning-rate schedule and the moving average, gathered out of any sharding, and writes or reads them
through ``checkpoint.py``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from vgrpo_platform.errors import CheckpointError, RecipeError, RunFilesError
from vgrpo_platform.parallel import sharded_state
from vgrpo_platform.training.iteration.prompts import PromptSampler
from vgrpo_platform.training.recovery import run_lock
from vgrpo_platform.training.recovery.checkpoint import (
    Checkpoint,
    DamagedCheckpoint,
    latest_valid_checkpoint,
    list_checkpoints,
    save_checkpoint,
)
from vgrpo_platform.training.recovery.checkpoint_contents import Expect

if TYPE_CHECKING:
    from vgrpo_platform.training.iteration.update import PolicyUpdate
    from vgrpo_platform.training.session import Session


@dataclass
class LoopState:
    """The random generators the loop draws from and the prompt sampler: an iteration's inputs."""

    prompts: PromptSampler
    rollout_rng: torch.Generator
    surrogate_rng: torch.Generator
    shuffle_rng: torch.Generator
    ahead: dict[str, Any] | None = None
    """``rollout.overlap``: the rollout generator's and the prompt sampler's states from before the draws
    of the earliest unfinished iteration's rollout, made one iteration early (``draws_ahead``); a
    checkpoint stores them, so ``--resume`` draws that rollout again."""

    @classmethod
    def seeded(cls, prompts: PromptSampler, seed: int) -> LoopState:
        """Three streams off one seed, so a change in one never shifts another's draws."""
        rollout, surrogate, shuffle = (torch.Generator().manual_seed(seed + k) for k in range(3))
        return cls(prompts, rollout, surrogate, shuffle)

    def rng_state(self) -> dict[str, torch.Tensor]:
        """Every RNG state the loop draws from (what a checkpoint stores under ``rng``)."""
        return {
            "rollout": self.rollout_rng.get_state(),
            "surrogate": self.surrogate_rng.get_state(),
            "shuffle": self.shuffle_rng.get_state(),
            "torch": torch.get_rng_state(),
        }

    def set_rng_state(self, rng: dict[str, torch.Tensor]) -> None:
        self.rollout_rng.set_state(rng["rollout"])
        self.surrogate_rng.set_state(rng["surrogate"])
        self.shuffle_rng.set_state(rng["shuffle"])
        torch.set_rng_state(rng["torch"])

    def snapshot(self) -> dict[str, Any]:
        """What an iteration consumes besides the weights: restoring it replays the iteration."""
        return {"rng": self.rng_state(), "prompts": self.prompts.state_dict()}

    def restore(self, snapshot: dict[str, Any]) -> None:
        self.set_rng_state(snapshot["rng"])
        self.prompts.load_state_dict(snapshot["prompts"])

    def draws_ahead(self) -> None:
        """Mark the rollout draws that follow as the next iteration's (``rollout.overlap``)."""
        self.ahead = {"rollout": self.rollout_rng.get_state(), "prompts": self.prompts.state_dict()}

    def resumable(self) -> dict[str, Any]:
        """The snapshot a checkpoint stores: the rollout's draws made ahead for a later iteration undone."""
        snapshot = self.snapshot()
        if self.ahead is not None:
            snapshot["rng"]["rollout"] = self.ahead["rollout"]
            snapshot["prompts"] = self.ahead["prompts"]
        return snapshot


@dataclass(frozen=True)
class Resumed:
    """Where a resumed run goes on: after ``iteration``, with ``elapsed`` seconds behind it.

    ``eval_pending``: the evaluation of ``iteration`` failed and is still to do (``fault_policy.py``).
    """

    iteration: int
    elapsed: float
    eval_pending: dict[str, Any] | None


@dataclass
class RunState:
    """Everything a checkpoint holds; every rank gathers it, the main process writes it."""

    run_dir: Path
    fingerprint: str  # what a checkpoint's weights must fit (``session.fingerprint`` of the recipe)
    keep_last: int  # log.keep_last: older checkpoints are deleted
    accelerator: Any
    session: Session  # its trainable weights, by name
    update: PolicyUpdate  # the optimiser, its learning-rate schedule, the moving average
    loop: LoopState
    total_iterations: int | None = None  # train.iterations: the last iteration a checkpoint may hold

    def save(self, iteration: int, elapsed: float, *, eval_pending: dict | None = None) -> Path | None:
        """Checkpoint ``iteration``; ``eval_pending``: its evaluation failed and is still to do."""
        update, average = self.update, self.update.average
        weights = sharded_state.full_weights(self.session.trainable)
        optimizer = sharded_state.gather_optimizer(update.optimizer, update.params)
        averaged = average.full_state() if average is not None else None
        loop = self.loop.resumable()
        path = None
        if self.accelerator.is_main_process:
            path = save_checkpoint(
                self.run_dir,
                iteration,
                weights=weights,
                optimizer={"optimizer": optimizer, "lr_schedule": update.lr_schedule.state_dict()},
                rng=loop["rng"],
                state={
                    "fingerprint": self.fingerprint,
                    "prompt_sampler": loop["prompts"],
                    "elapsed_seconds": elapsed,
                    **({"eval_pending": eval_pending} if eval_pending is not None else {}),
                },
                keep_last=self.keep_last,
                averaged=averaged,
            )
        self.accelerator.wait_for_everyone()
        return path

    def restore(self) -> Resumed:
        """Load the newest usable checkpoint that fits this recipe (``--resume``): one whose files read,
        whose contents check out (``checkpoint_contents.py``) and which loads into this run; newer damaged
        ones are skipped with a warning naming the file and what is wrong."""
        update, trainable = self.update, self.session.trainable
        expect = Expect(
            resume=True,
            fingerprint=self.fingerprint,
            shapes={k: tuple(p.shape) for k, p in trainable.items()},
            param_shapes=[tuple(p.shape) for p in update.params],
            total_iterations=self.total_iterations,
        )
        ckpt = latest_valid_checkpoint(
            self.run_dir,
            on_skip=lambda why: print(f"warning: {why}", file=sys.stderr),
            expect=expect,
            use=self._load,
        )
        if ckpt is None:
            raise CheckpointError(
                f"--resume found no usable checkpoint in {self.run_dir / 'checkpoints'} (no complete "
                "checkpoint, or only damaged ones: see the warnings); run without --resume, or name the "
                "run anew with --set run.name=<new name>"
            )
        return Resumed(
            iteration=int(ckpt.state["iteration"]),
            elapsed=float(ckpt.state.get("elapsed_seconds", 0.0)),
            eval_pending=ckpt.state.get("eval_pending"),
        )

    def _load(self, ckpt: Checkpoint) -> None:
        """Put ``ckpt`` into the live run. Another model's checkpoint is an error; one that fails to load
        is ``DamagedCheckpoint`` (the next older one then overwrites all that this one set)."""
        if ckpt.state.get("fingerprint") != self.fingerprint:
            raise CheckpointError(
                f"checkpoint {ckpt.path} was written for a different model or LoRA setup than this recipe; "
                "resume with the recipe that started the run, or choose another run.name"
            )
        update, average, trainable = self.update, self.update.average, self.session.trainable
        try:
            sharded_state.load_weights(trainable, ckpt.weights)
            sharded_state.load_optimizer(update.optimizer, update.params, ckpt.optimizer["optimizer"])
            update.lr_schedule.load_state_dict(ckpt.optimizer["lr_schedule"])
            if average is not None:
                if ckpt.averaged is None:  # EMA switched on for the rest of a run: it starts from here
                    print(
                        f"warning: {ckpt.path} holds no moving average; it starts from the restored weights",
                        file=sys.stderr,
                    )
                    average.load_full_state(ckpt.weights)
                else:
                    average.load_full_state(ckpt.averaged)
            self.loop.set_rng_state(ckpt.rng)
            self.loop.prompts.load_state_dict(ckpt.state["prompt_sampler"])
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as exc:
            raise DamagedCheckpoint(
                ckpt.path, f"does not load into this run ({type(exc).__name__}: {exc})"
            ) from exc


RECORDS = ("metrics.jsonl", "eval_stats.jsonl")  # a run's records: a new run would truncate them


def check_run_dir(run_dir: Path, resume: bool, *, probe_lock: bool = True) -> bool:
    """A new run never writes over another's records or checkpoints, nor into a directory a live run
    holds (``run_lock.py``); ``--resume`` is the way to continue one. Returns whether the run resumes from
    a checkpoint: ``--resume`` of a run that saved none (killed before its first checkpoint) starts it over,
    replacing records that no checkpoint kept. ``probe_lock = False``: the other ranks of a run, whose main
    process holds the lock."""
    pid = run_lock.holder(run_dir) if probe_lock else None
    if pid is not None:
        raise RunFilesError(run_lock.in_use(run_dir, pid))
    checkpoints = list_checkpoints(run_dir)
    records = held_records(run_dir)
    if not resume and (checkpoints or records):
        held = ", ".join([*records, *(["checkpoints/"] if checkpoints else [])])
        raise RecipeError(
            f"run directory {run_dir} already holds a run ({held}); continue it with --resume, "
            "or start a new run with --set run.name=<new name>"
        )
    if resume and not checkpoints and records:
        print(
            f"warning: {run_dir} holds no checkpoint yet: --resume starts the run over from iteration 0, "
            f"replacing {', '.join(records)}",
            file=sys.stderr,
        )
        return False
    return resume


def held_records(run_dir: Path) -> list[str]:
    """The names in ``RECORDS`` that ``run_dir`` holds with something in them (a run wrote there)."""
    return [name for name in RECORDS if _holds_text(Path(run_dir) / name)]


def _holds_text(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except FileNotFoundError:
        return False
    except OSError:
        return True  # there, but unreadable: not ours to overwrite
