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

Whether or not the rule is on, a guard that ends an evaluation more than ``margin`` below its best
(``falls``) is a warning in the run's log and in ``vgrpo report``: a policy collapsing onto a few
outputs must be seen even by a run that was not told to stop for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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


@dataclass(frozen=True)
class Fall:
    """A guard's last evaluation lies more than the margin below its best one so far."""

    key: str
    iteration: int  # the last evaluation
    best_iteration: int
    best: float
    now: float
    margin: float
    rising: str
    rising_at_best: float | None  # None where the evaluations lack ``rising``
    rising_now: float | None

    def drop(self) -> str:
        """The fall as a share of the best (``31%``), or in the metric's units where the best is 0."""
        drop = self.best - self.now
        return f"{drop / abs(self.best):.0%}" if self.best else f"{drop:.4g}"

    def message(self) -> str:
        """One sentence: the fall, since when, and what ``rising`` did meanwhile."""
        text = (
            f"{self.key} is {self.drop()} below its best: {self.best:.4g} at iteration "
            f"{self.best_iteration}, {self.now:.4g} at iteration {self.iteration} (eval.monitor.margin "
            f"{self.margin:g})"
        )
        if self.rising_at_best is not None and self.rising_now is not None:
            went = "rose" if self.rising_now > self.rising_at_best else "did not rise"
            text += (
                f"; {self.rising} {went} from {self.rising_at_best:.4g} to {self.rising_now:.4g} meanwhile"
            )
        return text


def warning_line(found: Sequence[Fall], rule_on: bool) -> str | None:
    """The run's log line for an evaluation's falls (one line, however many guards fell); None if none."""
    if not found:
        return None
    last = found[0]
    now = f", {last.rising} now {last.rising_now:.4g}" if last.rising_now is not None else ""
    parts = []
    for f in found:
        then = f", {f.rising} then {f.rising_at_best:.4g}" if f.rising_at_best is not None else ""
        parts.append(f"{f.key} -{f.drop()} (best {f.best:.4g} at iteration {f.best_iteration}{then})")
    rule = "" if rule_on else "; the stop rule is off (eval.monitor.stop_when_falls = [])"
    return (
        f"warning: more than eval.monitor.margin {last.margin:g} below their best at iteration "
        f"{last.iteration}{now}: {', '.join(parts)}{rule}"
    )


def guard_keys(keys: Iterable[str], watched: Sequence[str], evaluation_only: Sequence[str]) -> list[str]:
    """What can reveal reward hacking among an evaluation's ``keys``: the watched ones, then ``monitor/*``,
    then the rewards and criteria of ``evaluation_only`` reward keys (the ``[[eval.rewards]]``)."""
    keys = list(keys)
    found = dict.fromkeys(k for k in watched if k in keys)
    found.update(dict.fromkeys(k for k in keys if k.startswith("monitor/")))
    for k in keys:
        if k.startswith(("reward/", "detail/")) and k.split("/")[1] in evaluation_only:
            found.setdefault(k)
    return list(found)


def falls(
    evals: Sequence[Mapping[str, Any]], keys: Sequence[str], *, margin: float, rising: str
) -> list[Fall]:
    """Each of ``keys`` whose last value in ``evals`` is more than ``margin`` below its best before it
    (the earliest best on ties), in ``keys`` order; a key an evaluation lacks is skipped there."""
    out = []
    for key in keys:
        points = [r for r in evals if isinstance(r.get(key), int | float)]
        if len(points) < 2:
            continue
        last = points[-1]
        best = max(points, key=lambda r: r[key])  # max keeps the first of equal values
        if best[key] - last[key] <= margin:
            continue
        both = all(isinstance(r.get(rising), int | float) for r in (best, last))
        out.append(
            Fall(
                key=key,
                iteration=int(last["iteration"]),
                best_iteration=int(best["iteration"]),
                best=float(best[key]),
                now=float(last[key]),
                margin=margin,
                rising=rising,
                rising_at_best=float(best[rising]) if both else None,
                rising_now=float(last[rising]) if both else None,
            )
        )
    return out


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
    learns its verdict, so all of them stop at the same evaluation. ``evaluation_only``: the
    ``[[eval.rewards]]`` keys, guards the warnings watch even with the rule off."""

    def __init__(
        self,
        rule: MonitorSection,
        accelerator: Any,
        history: list[dict],
        evaluation_only: Sequence[str] = (),
    ) -> None:
        self.rule = rule
        self.accelerator = accelerator
        self.history = history
        self.evaluation_only = list(evaluation_only)

    def __call__(self, record: dict[str, float]) -> str | None:
        """Why the run must stop after this evaluation, or None."""
        # here, not at the top: recipes import this module for its key names, without torch
        from vgrpo_platform.parallel.data_parallel import any_rank

        rule = self.rule
        if rule.stop_when_falls:
            require_keys(record, rule.stop_when_falls, rule.rising)  # the same record on every rank
        if self.accelerator.is_main_process:
            self.history.append(record)
        if not rule.stop_when_falls:
            return None
        alarm = None
        if self.accelerator.is_main_process:
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

    def warning(self) -> str | None:
        """The log line naming the guards the last evaluation left more than ``margin`` below their best,
        or None (main process: the others keep no history)."""
        if not self.history:
            return None
        keys = guard_keys(self.history[-1], self.rule.stop_when_falls, self.evaluation_only)
        found = falls(self.history, keys, margin=self.rule.margin, rising=self.rule.rising)
        return warning_line(found, rule_on=bool(self.rule.stop_when_falls))
