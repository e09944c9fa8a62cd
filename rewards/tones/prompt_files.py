"""Write the tones world's prompt files: ``python -m vgrpo_rewards.tones.prompt_files recipes/prompts``.

``tones_train.txt`` (what pretraining plays) and ``tones_heldout.txt`` (the compositions it never
plays), both ``split_prompts(seed=0)``; the committed files are checked against it by a test.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .world import split_prompts

FILES = ("tones_train.txt", "tones_heldout.txt")


def write_prompt_files(folder: str | Path, seed: int = 0) -> list[Path]:
    """Write ``FILES`` (one prompt a line) under ``folder``; returns their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, prompts in zip(FILES, split_prompts(seed), strict=True):
        path = folder / name
        path.write_text("\n".join(prompts) + "\n")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m vgrpo_rewards.tones.prompt_files FOLDER", file=sys.stderr)
        return 2
    for path in write_prompt_files(args[0]):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
