"""Soft-TIFA-style questions: one yes/no question per atom of a prompt (an object, its count, its colour,
its position), from the prompt's metadata. No torch here.

GenEval2 (Soft-TIFA) scores an image by asking a VQA model one question per atom and averaging the
probabilities of "yes", so a near miss costs one atom's share instead of the whole prompt. The atoms come
from a line's ``questions`` (a list of strings, written by whoever made the prompt set) or, failing that,
from GenEval's ``include`` clauses (``vgrpo_rewards.geneval``'s format).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..geneval.classes import NUMBERS, plural, with_article
from ..geneval.rules import parse_spec

PHRASES = {"left of": "to the left of", "right of": "to the right of", "above": "above", "below": "below"}


def questions(meta: Mapping[str, Any]) -> list[str]:
    """The prompt's atom questions; ``ValueError`` naming what the metadata lacks."""
    given = meta.get("questions")
    if given is not None:
        if (
            not isinstance(given, list)
            or not given
            or not all(isinstance(q, str) and q.strip() for q in given)
        ):
            raise ValueError("'questions' must be a non-empty list of question strings")
        return list(given)
    if "include" not in meta:
        raise ValueError("no 'questions' list and no GenEval 'include' objects in its metadata")
    spec = parse_spec(meta)
    out = []
    for c in spec.include:
        many = c.count > 1
        name = plural(c.cls) if many else c.cls
        if many:
            number = NUMBERS[c.count] if c.count < len(NUMBERS) else str(c.count)
            out.append(f"Are there exactly {number} {name} in the image?")
        else:
            out.append(f"Is there {with_article(c.cls)} in the image?")
        if c.color is not None:
            out.append(f"{'Are' if many else 'Is'} the {name} {c.color}?")
        if c.position is not None:
            rel, k = c.position
            out.append(f"{'Are' if many else 'Is'} the {name} {PHRASES[rel]} the {spec.include[k].cls}?")
    return out
