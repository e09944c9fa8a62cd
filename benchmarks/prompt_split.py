"""Writes the embedded worlds' validation and reported prompt files (``python -m benchmarks.prompt_split``).

The benchmark chooses each method's rate on one half of a world's held-out prompts and reports (and sets
the target) on the other (``protocol.WORLD_EVAL_FILES``); both halves come from the world's
``heldout_validation_split`` (``vgrpo_rewards.<world>.world``) and are committed, so the protocol reads
fixed files and a test checks that they still are the functions' output.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks.protocol import ROOT

PROMPTS = ROOT / "recipes" / "prompts"
VALIDATION = PROMPTS / "shapes_validation.txt"
REPORTED = PROMPTS / "shapes_reported.txt"


def split() -> tuple[list[str], list[str]]:
    """``(validation, reported)`` of the shipped world (held-out pairs of seed 0, split seed 0)."""
    from vgrpo_rewards.shapes.world import heldout_validation_split

    return heldout_validation_split(seed=0, n_heldout_pairs=2, split_seed=0)


def split_moving_shapes() -> tuple[list[str], list[str]]:
    """The video world's halves (its default split: held-out pairs of seed 0, split seed 0)."""
    from vgrpo_rewards.moving_shapes.world import heldout_validation_split

    return heldout_validation_split(seed=0, n_heldout_pairs=2, split_seed=0)


def split_tones() -> tuple[list[str], list[str]]:
    """The audio world's halves (held-out atoms of seed 0, split seed 0)."""
    from vgrpo_rewards.tones.world import heldout_validation_split

    return heldout_validation_split(seed=0, split_seed=0)


def files(world: str) -> tuple[Path, Path]:
    """``(validation, reported)`` prompt files of a world."""
    return PROMPTS / f"{world}_validation.txt", PROMPTS / f"{world}_reported.txt"


SPLITS: dict[str, Callable[[], tuple[list[str], list[str]]]] = {
    "shapes": split,
    "moving_shapes": split_moving_shapes,
    "tones": split_tones,
}


def main() -> int:
    for world, make in SPLITS.items():
        for path, prompts in zip(files(world), make(), strict=True):
            path.write_text("\n".join(prompts) + "\n")
            print(f"{path.relative_to(ROOT)}: {len(prompts)} prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
