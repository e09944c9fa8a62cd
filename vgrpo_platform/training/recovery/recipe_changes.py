"""What changed in a recipe since a run saved it, and whether a checkpoint can go on under the change.

A run directory keeps the recipe it ran with (``resolved_recipe.json``). ``--resume`` compares the
new recipe with it: keys that only locate the run, say how it logs, when it evaluates or what to do on
a fault (``SAFE_ON_RESUME``) change freely; any other change breaks "the rest of the run equals an
uninterrupted one" and needs ``--force``; a change of the model or LoRA setup (``MODEL_KEYS``, what
``session.fingerprint`` hashes) never fits the checkpoint's weights. ``vgrpo sample`` and ``vgrpo eval``
name the same model keys when a checkpoint was trained under other ones.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from vgrpo_platform.config.recipe import ORIGINAL_TOML, RESOLVED_JSON, ResolvedRecipe, load_resolved
from vgrpo_platform.config.schema import Recipe
from vgrpo_platform.errors import CheckpointError, RecipeError, VgrpoError
from vgrpo_platform.training.session import run_dir_of

MODEL_KEYS = (
    "adapter",
    "train.finetune",
    "train.lora_rank",
    "train.lora_alpha",
    "train.lora_targets",
    "train.init_lora",  # the LoRA's rank, alpha and targets come from its file
)
"""The recipe keys ``session.fingerprint`` hashes: what a checkpoint's weights were trained for."""

LOAD_KEYS = ("adapter.name", *MODEL_KEYS[1:])
"""Model keys under which a checkpoint never serves the run's policy: another adapter, or other LoRA
weights or scale. Other adapter options (guidance, resolution, a moved model folder) may: the weights
are loaded when they fit."""

SAFE_ON_RESUME = (
    "run.name",
    "run.output_dir",
    "train.iterations",
    "train.on_fault",
    "train.max_consecutive_skips",
    "train.offload_rewards",
    "train.collective_timeout_s",
    "eval.every",
    "eval.monitor",
    "log",
    "scoring",
    "rewards.*.options.url",
    "rewards.*.options.timeout_s",
    "rewards.*.options.retries",
    "rewards.*.options.backoff_s",
)
"""Keys a resumed run may change and still equal an uninterrupted one: where the run lives, how long it
goes on (``train.iterations``, unless ``lr_schedule = "cosine"`` spreads its decay over them), how it
logs, when it evaluates (evaluations and diagnostics draw from generators of their own), what a fault
does, the reward-hacking monitor's rule, and where the rewards are scored (``[scoring]``, reward models
offloaded, a reward server's address and patience): the same scores. ``*`` stands for a list index."""

CHECKED_ENV = "VGRPO_RESUME_CHECKED"  # set by `vgrpo run --gpus` for the processes it starts: checked once


@dataclass(frozen=True)
class Change:
    key: str
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.key} {_short(self.old)} -> {_short(self.new)}"


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _under(key: str, prefixes: Iterable[str]) -> bool:
    """``key`` is one of ``prefixes`` or below one (a ``*`` in a prefix matches one list index)."""
    return any(fnmatchcase(key, p) or fnmatchcase(key, p + ".*") for p in prefixes)


_MISSING = object()


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys to leaf values; a list of tables by index (``rewards.0.weight``), other lists whole."""
    if isinstance(tree, dict):
        items: Iterable[tuple[str, Any]] = tree.items()
    elif isinstance(tree, list) and tree and all(isinstance(v, dict) for v in tree):
        items = ((str(i), v) for i, v in enumerate(tree))
    else:
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in items:
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def changes(old: Recipe, new: Recipe) -> list[Change]:
    """Every leaf key whose value differs, in the recipe's order (a key only one side has: ``None``)."""
    before, after = _flat(old.model_dump(mode="json")), _flat(new.model_dump(mode="json"))
    keys = [*after, *(k for k in before if k not in after)]
    return [
        Change(k, before.get(k), after.get(k))
        for k in keys
        if before.get(k, _MISSING) != after.get(k, _MISSING)
    ]


def saved_recipe(run_dir: Path) -> Recipe | None:
    """The recipe a run directory was last started with; ``None`` where it is missing or unreadable."""
    if not (Path(run_dir) / RESOLVED_JSON).is_file():
        return None
    try:
        return load_resolved(run_dir)
    except VgrpoError:
        return None


def _breaks_resume(change: Change, old: Recipe, new: Recipe) -> bool:
    if change.key == "train.iterations":
        return "cosine" in (old.train.lr_schedule, new.train.lr_schedule)
    return not _under(change.key, SAFE_ON_RESUME)


def listed(found: list[Change]) -> str:
    """``key old -> new, ...``: how a message names changes."""
    return ", ".join(map(str, found))


def check_resume(resolved: ResolvedRecipe, run_dir: Path, *, force: bool) -> list[str]:
    """The notes to print before ``--resume`` goes on; a ``RecipeError`` for a change that breaks an exact
    resume without ``force``, a ``CheckpointError`` for one the checkpoint's weights cannot follow."""
    old = saved_recipe(run_dir)
    if old is None:  # nothing to compare with: the trainer says what is missing
        return []
    new = resolved.recipe
    found = changes(old, new)
    where = Path(run_dir) / RESOLVED_JSON
    model = [c for c in found if _under(c.key, MODEL_KEYS)]
    if model:
        raise CheckpointError(
            f"run {run_dir} was trained with a different model or LoRA setup than this recipe: "
            f"{listed(model)} (the run's -> this recipe's); resume with the recipe that started the run, "
            "or choose another run.name"
        )
    breaking = [c for c in found if _breaks_resume(c, old, new)]
    safe = [c for c in found if c not in breaking]
    also = f" (also changed, safe: {listed(safe)})" if safe else ""
    if breaking and not force:
        raise RecipeError(
            f"--resume with settings that differ from the run's ({where}): {listed(breaking)}; they break "
            f"an exact resume{also}; pass --force to resume with them anyway, or drop those --set"
        )
    notes = []
    if breaking:
        notes.append(f"warning: resuming with changed settings (--force): {listed(breaking)}")
    if safe:
        notes.append(f"note: resuming with changed settings: {listed(safe)}")
    return notes


def before_run(resolved: ResolvedRecipe, *, resume: bool, force: bool) -> None:
    """``vgrpo run``'s check of ``--resume`` and ``--force``, once per launch; notes on the main process."""
    if force and not resume:
        raise RecipeError("--force only applies with --resume; drop it, or add --resume")
    if not resume or os.environ.get(CHECKED_ENV):
        return
    notes = check_resume(resolved, run_dir_of(resolved.recipe), force=force)
    if os.environ.get("RANK", "0") == "0":
        for line in notes:
            print(line, file=sys.stderr)


def model_changes(run_dir: Path, recipe: Recipe) -> list[Change] | None:
    """The model keys in which ``recipe`` differs from the run's saved one (``None``: no saved recipe)."""
    old = saved_recipe(run_dir)
    if old is None:
        return None
    return [c for c in changes(old, recipe) if _under(c.key, MODEL_KEYS)]


def refuse_foreign(checkpoint: Path, found: list[Change], recipe_source: str) -> None:
    """Stop before any model loads when the checkpoint was trained for another adapter or LoRA setup."""
    fatal = [c for c in found if _under(c.key, LOAD_KEYS)]
    if fatal:
        raise CheckpointError(
            f"checkpoint {checkpoint} was trained with another model or LoRA setup than {recipe_source}: "
            f"{listed(fatal)} (the run's -> this recipe's); use the run's own recipe "
            f"({checkpoint.parent.parent / ORIGINAL_TOML}) or --set those keys back"
        )
