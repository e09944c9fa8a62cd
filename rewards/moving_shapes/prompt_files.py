"""Write the moving-shapes world's split as the prompt files recipes read.

    python -m vgrpo_rewards.moving_shapes.prompt_files recipes/prompts

writes ``moving_shapes_train.txt`` and ``moving_shapes_heldout.txt`` (one prompt a line, in
``split_prompts`` order); a test checks that the committed files equal what this writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .world import split_prompts

FILES = ("moving_shapes_train.txt", "moving_shapes_heldout.txt")


def write_prompt_files(folder: str | Path) -> list[Path]:
    """``FILES`` under ``folder`` from ``split_prompts()`` (the default seed and size)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, prompts in zip(FILES, split_prompts(), strict=True):
        path = folder / name
        path.write_text("\n".join(prompts) + "\n")
        paths.append(path)
    return paths


if __name__ == "__main__":  # pragma: no cover - a one-line command
    for written in write_prompt_files(sys.argv[1] if len(sys.argv) > 1 else "recipes/prompts"):
        print(f"wrote {written}")
