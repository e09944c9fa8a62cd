"""Cutting a world's held-out prompts into a validation half and a reported half, kind by kind.

A benchmark chooses its settings (a learning rate) on one half and reports on the other, so the choice
never reads the prompts it is judged on. Each kind of held-out composition is halved on its own, so both
halves hold every kind; the draws and each half's order come from one seed. The three embedded worlds
(``shapes``, ``moving_shapes``, ``tones``) differ only in what a kind is.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

import numpy as np


def halves_by_kind(
    prompts: Iterable[tuple[Hashable, str]], split_seed: int = 0
) -> tuple[list[str], list[str]]:
    """``(validation, reported)`` of ``(kind, prompt)`` pairs: each kind's prompts shuffled and halved,
    validation taking the smaller half (rounded down), kinds in sorted order; then each half shuffled
    (an evaluation that takes its first N prompts gets a mix of kinds)."""
    kinds: dict[Hashable, list[str]] = {}
    for kind, prompt in prompts:
        kinds.setdefault(kind, []).append(prompt)
    rng = np.random.default_rng(split_seed)
    validation: list[str] = []
    reported: list[str] = []
    for kind in sorted(kinds):  # type: ignore[type-var]  # kinds are tuples of strings
        group = kinds[kind]
        order = rng.permutation(len(group))
        half = len(group) // 2
        validation += [group[i] for i in order[:half]]
        reported += [group[i] for i in order[half:]]
    return (
        [validation[i] for i in rng.permutation(len(validation))],
        [reported[i] for i in rng.permutation(len(reported))],
    )
