"""The reward-hacking stop rule: the training reward keeps rising while a held-out check falls.

A policy can raise its reward by exploiting the reward model (reward hacking) or by collapsing
onto a few outputs; both show as a metric the training does not optimise (an evaluation-only
reward, a criterion, ``monitor/diversity``) falling while the reward goes on rising. The rule, on
the run's evaluation records in order (``[eval.monitor]``: keys ``stop_when_falls``, ``margin``,
``patience``, ``rising``):

- For a watched key ``m`` at evaluation ``j``, let ``b`` be the evaluation, among ``0 .. j``, where
  ``m`` was highest (the earliest such one on ties). Evaluation ``j`` is *flagged* for ``m`` when
  ``m[b] - m[j] > margin`` (the metric has lost more than ``margin`` since its best) and
  ``rising[j] > rising[b]`` (while the training reward is higher than it was then).
- The run stops (with a checkpoint) at an evaluation when it and the ``patience - 1`` evaluations
  before it are all flagged for the same key.

A pure function of the records, so a resumed run (whose earlier evaluations are in
``metrics.jsonl``) decides exactly as an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vgrpo_platform.errors import RecipeError

if TYPE_CHECKING:
    from vgrpo_platform.config.schema import MonitorSection


@dataclass(frozen=True)
class Alarm:
    """Why the rule fired: ``key`` fell from its best while ``rising`` rose."""

    key: str
    rising: str
    iteration: int  # the evaluation that fired
    best_iteration: int
    best: float
    now: float
    rising_at_best: float
    rising_now: float
    evaluations: int  # consecutive flagged evaluations

    def message(self) -> str:
        return (
            f"reward-hacking monitor: {self.key} fell from {self.best:.4f} (iteration {self.best_iteration}) "
            f"to {self.now:.4f} while {self.rising} rose from {self.rising_at_best:.4f} to "
            f"{self.rising_now:.4f}, at {self.evaluations} evaluations in a row"
        )


def require_keys(record: Mapping[str, Any], stop_when_falls: Sequence[str], rising: str) -> None:
    """A one-line error when an evaluation lacks a key the rule watches (a misspelt criterion)."""
    for key in [*stop_when_falls, rising]:
        if key not in record:
            found = sorted(k for k in record if k.startswith(("reward", "detail/", "monitor/")))
            raise RecipeError(
                f"eval.monitor: '{key}' is not in the evaluation's metrics; use one of {', '.join(found)}"
            )


def flagged(evals: Sequence[Mapping[str, Any]], key: str, rising: str, margin: float) -> list[int | None]:
    """Per evaluation: the index of its best evaluation so far of ``key`` when flagged, else None."""
    out: list[int | None] = []
    best = 0
    for j, record in enumerate(evals):
        if record[key] > evals[best][key]:
            best = j
        fell = evals[best][key] - record[key] > margin
        rose = record[rising] > evals[best][rising]
        out.append(best if fell and rose else None)
    return out


def check(
    evals: Sequence[Mapping[str, Any]],
    stop_when_falls: Sequence[str],
    *,
    margin: float,
    patience: int,
    rising: str = "reward",
) -> Alarm | None:
    """The alarm when the last ``patience`` of ``evals`` are all flagged for a watched key (the first
    such key in ``stop_when_falls``), else None."""
    if len(evals) <= patience:  # the first evaluation is never flagged
        return None
    for key in stop_when_falls:
        marks = flagged(evals, key, rising, margin)
        recent = marks[-patience:]
        if all(m is not None for m in recent):
            in_a_row = 0
            while in_a_row < len(marks) and marks[-1 - in_a_row] is not None:
                in_a_row += 1
            b, last = recent[-1], evals[-1]
            assert b is not None
            return Alarm(
                key=key,
                rising=rising,
                iteration=int(last["iteration"]),
                best_iteration=int(evals[b]["iteration"]),
                best=float(evals[b][key]),
                now=float(last[key]),
                rising_at_best=float(evals[b][rising]),
                rising_now=float(last[rising]),
                evaluations=in_a_row,
            )
    return None


class Watch:
    """``[eval.monitor]`` over a run's evaluations, on every rank: the main process judges the
    records it keeps (``history``, the resumed run's earlier evaluations included) and every rank
    learns its verdict, so all of them stop at the same evaluation."""

    def __init__(self, rule: MonitorSection, accelerator: Any, history: list[dict]) -> None:
        self.rule = rule
        self.accelerator = accelerator
        self.history = history

    def __call__(self, record: dict[str, float]) -> str | None:
        """Why the run must stop after this evaluation, or None."""
        # here, not at the top: recipes import this module for its key names, without torch
        from vgrpo_platform.parallel.data_parallel import any_rank

        rule = self.rule
        if not rule.stop_when_falls:
            return None
        require_keys(record, rule.stop_when_falls, rule.rising)  # the same record on every rank
        alarm = None
        if self.accelerator.is_main_process:
            self.history.append(record)
            alarm = check(
                self.history,
                rule.stop_when_falls,
                margin=rule.margin,
                patience=rule.patience,
                rising=rule.rising,
            )
        if not any_rank(self.accelerator, alarm is not None):
            return None
        return alarm.message() if alarm is not None else "reward-hacking monitor (main process)"
