"""GenEval's scoring rules on detected objects, written once for every detector (no torch, no model).

What GenEval (Ghosh et al. 2023, ``evaluation/evaluate_images.py``) does, in our words:

- **Keeping detections.** Per class, detections are ranked by confidence; those above the confidence
  threshold are kept (0.3; 0.9 for prompts tagged ``counting``, so a count is not inflated by unsure
  duplicates), at most 16 per class, optionally thinned by greedy non-maximum suppression (GenEval turns
  it off: overlap limit 1.0).
- **Include clauses** (all must hold): the class is found at least ``count`` times; the ``count`` most
  confident of them are the clause's objects. With a ``color``, at least ``count`` of those objects must
  be classified as that colour. With a ``position`` ``[relation, k]``, every object must stand in that
  relation to every object of include clause ``k`` (which must itself have matched).
- **Exclude clauses** (any fails the image): the class is found ``count`` or more times (how counting
  prompts forbid one object too many).
- **Relative position.** From box centres ``c`` and sizes ``d`` of A and B: the offset ``c_A - c_B`` is
  shrunk towards zero per axis by ``margin * (d_A + d_B)`` (margin 0.1), then divided by the plain
  offset's length; A is "left of" B when the shrunk x-component is below -0.5, "right of" above 0.5,
  "above" / "below" likewise on y (image y grows downwards). Objects too close on both axes are in no
  relation.

The graded score is Flow-GRPO's partial credit (its reward server's ``evaluate_reward``): per include
clause a count term ``1 - |count - found| / count`` over *all* detections of the class (floored at 0
here), then, if the count is exact, a colour term ``1 - |count - right colour| / count`` and a position
term (1 when every pair stands in the relation, else 0), or a 0 for each of those asked when the count
is off; the score is the mean of the terms. Exclude clauses do not enter it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .classes import COLORS, RELATIONS


@dataclass(frozen=True)
class Detection:
    """One detected object: GenEval class name, confidence, pixel box ``(x0, y0, x1, y1)``, and the
    instance mask ``[H, W]`` (bool numpy array) when the detector segments."""

    label: str
    score: float
    box: tuple[float, float, float, float]
    mask: Any = None


@dataclass(frozen=True)
class Thresholds:
    """GenEval's evaluation settings (its defaults)."""

    threshold: float = 0.3
    counting_threshold: float = 0.9
    max_objects: int = 16
    max_overlap: float = 1.0
    position_margin: float = 0.1


@dataclass(frozen=True)
class Clause:
    cls: str
    count: int
    color: str | None = None
    position: tuple[str, int] | None = None


@dataclass(frozen=True)
class Spec:
    """One prompt's GenEval metadata, checked."""

    tag: str | None
    include: tuple[Clause, ...]
    exclude: tuple[Clause, ...] = ()


@dataclass
class Verdict:
    """``correct``: GenEval's 1/0; ``graded``: Flow-GRPO's partial credit; ``criteria``: the share of the
    prompt's clauses of each kind that hold (1 where the prompt asks nothing of that kind)."""

    correct: bool
    graded: float
    criteria: dict[str, float]
    reasons: list[str] = field(default_factory=list)


CRITERIA = ("presence", "count", "color", "position", "exclude")

ColorNamer = Callable[[Sequence[Detection], str], list[str]]
"""``(objects, class name) -> one colour name of COLORS per object``."""


def parse_spec(meta: Mapping[str, Any]) -> Spec:
    """A prompt's metadata as a ``Spec``; ``ValueError`` naming the field that is wrong."""
    include = meta.get("include")
    if not isinstance(include, list) or not include:
        raise ValueError("no 'include' list of objects in its metadata")
    clauses = tuple(_clause(c, i, "include") for i, c in enumerate(include))
    for i, c in enumerate(clauses):
        if c.position is not None and not 0 <= c.position[1] < i:
            raise ValueError(f"include[{i}].position names clause {c.position[1]}; it must be an earlier one")
    exclude = meta.get("exclude", [])
    if not isinstance(exclude, list):
        raise ValueError("'exclude' must be a list")
    tag = meta.get("tag")
    return Spec(
        tag if isinstance(tag, str) else None,
        clauses,
        tuple(_clause(c, i, "exclude") for i, c in enumerate(exclude)),
    )


def _clause(raw: Any, i: int, kind: str) -> Clause:
    where = f"{kind}[{i}]"
    if not isinstance(raw, Mapping) or not isinstance(raw.get("class"), str) or not raw["class"]:
        raise ValueError(f"{where} must be an object with a 'class' name")
    count = raw.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"{where}.count must be a whole number >= 1, got {count!r}")
    color = raw.get("color")
    if color is not None and color not in COLORS:
        raise ValueError(f"{where}.color {color!r} is not one of GenEval's colours {', '.join(COLORS)}")
    position = raw.get("position")
    if position is not None:
        ok = isinstance(position, Sequence) and len(position) == 2 and position[0] in RELATIONS
        target = position[1] if ok else None
        if isinstance(target, str) and target.isdigit():
            target = int(target)  # some GenEval copies store the clause index as a string
        if not ok or isinstance(target, bool) or not isinstance(target, int):
            raise ValueError(
                f"{where}.position must be [relation, clause index], relation one of {RELATIONS}"
            )
        position = (str(position[0]), target)
    return Clause(raw["class"], count, color, position)


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two pixel boxes, with GenEval's inclusive (+1) pixel extents."""

    def area(box: Sequence[float]) -> float:
        return max(box[2] - box[0] + 1, 0) * max(box[3] - box[1] + 1, 0)

    inter = area([max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])])
    union = area(a) + area(b) - inter
    return inter / union if union else 0.0


def keep(detections: Sequence[Detection], tag: str | None, t: Thresholds) -> dict[str, list[Detection]]:
    """The detections GenEval counts, by class, most confident first."""
    cut = t.counting_threshold if tag == "counting" else t.threshold
    by_class: dict[str, list[Detection]] = {}
    for det in sorted(detections, key=lambda d: -d.score):
        if det.score > cut:
            by_class.setdefault(det.label, []).append(det)
    out = {}
    for name, dets in by_class.items():
        ranked, kept = dets[: t.max_objects], []
        while ranked:
            best = ranked.pop(0)
            kept.append(best)
            if t.max_overlap < 1:
                ranked = [d for d in ranked if iou(best.box, d.box) < t.max_overlap]
        out[name] = kept
    return out


def relations(a: Sequence[float], b: Sequence[float], margin: float) -> set[str]:
    """The relations box ``a`` stands in to box ``b`` (see the module docstring)."""
    ca = ((a[0] + a[2]) / 2, (a[1] + a[3]) / 2)
    cb = ((b[0] + b[2]) / 2, (b[1] + b[3]) / 2)
    da, db = (abs(a[2] - a[0]), abs(a[3] - a[1])), (abs(b[2] - b[0]), abs(b[3] - b[1]))
    offset = (ca[0] - cb[0], ca[1] - cb[1])
    shrunk = [
        max(abs(o) - margin * (sa + sb), 0.0) * (1 if o > 0 else -1 if o < 0 else 0)
        for o, sa, sb in zip(offset, da, db, strict=True)
    ]
    if all(abs(s) < 1e-3 for s in shrunk):
        return set()
    norm = (offset[0] ** 2 + offset[1] ** 2) ** 0.5
    dx, dy = shrunk[0] / norm, shrunk[1] / norm
    found = set()
    if dx < -0.5:
        found.add("left of")
    if dx > 0.5:
        found.add("right of")
    if dy < -0.5:
        found.add("above")
    if dy > 0.5:
        found.add("below")
    return found


def _positioned(objs: Sequence[Detection], targets: Sequence[Detection], rel: str, margin: float) -> bool:
    return all(rel in relations(o.box, t.box, margin) for o in objs for t in targets)


def judge(
    objects: Mapping[str, Sequence[Detection]], spec: Spec, colors: ColorNamer, margin: float
) -> Verdict:
    """GenEval's verdict, Flow-GRPO's graded score and the per-criterion shares for one image."""
    correct, reasons = True, []
    groups: list[Sequence[Detection] | None] = []  # GenEval: each include clause's objects, None if it failed
    exact_groups: list[Sequence[Detection] | None] = []  # the graded rule's, with exact counts
    tally = {c: [0, 0] for c in CRITERIA}  # criterion -> [held, asked]
    terms: list[float] = []

    def mark(criterion: str, held: bool) -> None:
        tally[criterion][0] += int(held)
        tally[criterion][1] += 1

    for c in spec.include:
        found = list(objects.get(c.cls, []))
        mark("presence", bool(found))
        # GenEval's rule: at least `count`, the most confident `count` of them carry the attributes
        objs, matched = found[: c.count], len(found) >= c.count
        mark("count", matched)
        if not matched:
            reasons.append(f"expected {c.cls}>={c.count}, found {len(found)}")
        if c.color is not None:
            right = matched and colors(objs, c.cls).count(c.color) >= c.count
            mark("color", right)
            if matched and not right:
                reasons.append(f"expected {c.count} {c.color} {c.cls}")
            matched = right
        if c.position is not None:
            rel, k = c.position
            placed = matched and groups[k] is not None and _positioned(objs, groups[k] or [], rel, margin)
            mark("position", placed)
            if matched and not placed:
                reasons.append(f"expected {c.cls} {rel} {spec.include[k].cls}")
            matched = placed
        correct &= matched
        groups.append(objs if matched else None)
        # Flow-GRPO's graded terms: exact counts over every detection of the class
        exact = len(found) == c.count
        terms.append(max(0.0, 1 - abs(c.count - len(found)) / c.count))
        if not exact:
            terms.extend(0.0 for a in (c.color, c.position) if a is not None)
        else:
            if c.color is not None:
                n_right = colors(found, c.cls).count(c.color)
                terms.append(max(0.0, 1 - abs(c.count - n_right) / c.count))
                exact = n_right == c.count
            if c.position is not None:
                rel, k = c.position
                target = exact_groups[k]
                placed = target is not None and _positioned(found, target, rel, margin)
                terms.append(float(placed))
                exact = exact and placed
        exact_groups.append(found if exact else None)
    for c in spec.exclude:
        n = len(objects.get(c.cls, []))
        mark("exclude", n < c.count)
        if n >= c.count:
            correct = False
            reasons.append(f"expected {c.cls}<{c.count}, found {n}")
    criteria = {k: held / asked if asked else 1.0 for k, (held, asked) in tally.items()}
    return Verdict(correct, sum(terms) / len(terms), criteria, reasons)
