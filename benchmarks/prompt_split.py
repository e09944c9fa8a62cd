"""Writes the shapes world's validation and reported prompt files (``python -m benchmarks.prompt_split``).

The benchmark chooses each method's rate on one half of the held-out prompts and reports (and sets the
target) on the other (``protocol.WORLD_EVAL_FILES``); both halves come from
``vgrpo_rewards.shapes.world.heldout_validation_split`` and are committed, so the protocol reads fixed
files and a test checks that they still are the function's output.
"""

from __future__ import annotations

import sys

from benchmarks.protocol import ROOT

PROMPTS = ROOT / "recipes" / "prompts"
VALIDATION = PROMPTS / "shapes_validation.txt"
REPORTED = PROMPTS / "shapes_reported.txt"


def split() -> tuple[list[str], list[str]]:
    """``(validation, reported)`` of the shipped world (held-out pairs of seed 0, split seed 0)."""
    from vgrpo_rewards.shapes.world import heldout_validation_split

    return heldout_validation_split(seed=0, n_heldout_pairs=2, split_seed=0)


def main() -> int:
    validation, reported = split()
    for path, prompts in ((VALIDATION, validation), (REPORTED, reported)):
        path.write_text("\n".join(prompts) + "\n")
        print(f"{path.relative_to(ROOT)}: {len(prompts)} prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
