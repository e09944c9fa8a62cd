"""The procedural "shapes" world: prompt grammar, scene specs, rendering and the train / held-out split.

A scene is a few flat, axis-aligned shapes on a black background, small enough (32 px by default)
that a tiny text-to-image model can learn it on a CPU. The prompt describes the *whole* scene: a
rendered image contains exactly the objects the prompt names, nothing else. That makes the
programmatic reward (``detect.py``) exact on rendered scenes and strict on generated ones.

Grammar (every prompt is one of these four templates)::

    single    "a red circle"
    counting  "two red circles" | "three red circles"
    pair      "a red circle and a blue square"
    position  "a red circle <relation> a blue square"
              relation in {"to the left of", "to the right of", "above", "below"}

Relations are mutually exclusive (see ``relation_holds``): "A above B" means B's centroid lies
below A's *and* the vertical offset dominates the horizontal one, so a scene satisfies exactly one
relation for a given ordered pair of objects.

Train / held-out split (``split_prompts``): a fixed seed picks ``n_heldout_pairs`` colour-shape
pairs H (distinct colours, distinct shapes). Train shows every H pair only *alone* (single and
counting prompts); every two-object prompt (pair or position) that contains an H pair is held
out. So each held-out prompt puts a known object into a multi-object context (a second object and
a relation) in which train never shows it, while every colour, shape and relation still occurs in
train's two-object prompts.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw
from vgrpo_rewards._split import halves_by_kind

COLORS: dict[str, tuple[int, int, int]] = {
    # Hues ~0, ~128, ~222 and ~54 degrees: at least 50 degrees apart, all highly saturated.
    "red": (235, 50, 50),
    "green": (50, 205, 60),
    "blue": (60, 100, 245),
    "yellow": (240, 220, 40),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
RELATIONS: dict[str, str] = {  # relation id -> the words in a prompt
    "left of": "to the left of",
    "right of": "to the right of",
    "above": "above",
    "below": "below",
}
NUMBERS: dict[int, str] = {1: "a", 2: "two", 3: "three"}
MAX_OBJECTS = 3  # per scene: three 10-13 px shapes still fit a 32 px canvas without overlap
BACKGROUND = (0, 0, 0)
DEFAULT_SIZE = 32
SIZE_RANGE = (0.3, 0.42)  # object side as a fraction of the image side (10-13 px at 32 px)


@dataclass(frozen=True)
class ObjectSpec:
    """One group of identical objects: ``count`` shapes of the same colour."""

    color: str
    shape: str
    count: int = 1

    def phrase(self) -> str:
        noun = self.shape if self.count == 1 else self.shape + "s"
        return f"{NUMBERS[self.count]} {self.color} {noun}"


@dataclass(frozen=True)
class SceneSpec:
    """What a prompt asks for: one or two object groups, and optionally how group 0 sits relative to
    group 1 (``relation`` is read "objects[0] <relation> objects[1]")."""

    objects: tuple[ObjectSpec, ...]
    relation: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= len(self.objects) <= 2:
            raise ValueError(f"a scene has one or two object groups, got {len(self.objects)}")
        for o in self.objects:
            if o.color not in COLORS or o.shape not in SHAPES or o.count not in NUMBERS:
                raise ValueError(f"unknown object {o}; colours {list(COLORS)}, shapes {list(SHAPES)}")
        if self.n_objects > MAX_OBJECTS:
            raise ValueError(f"at most {MAX_OBJECTS} objects per scene, got {self.n_objects}")
        if len(self.objects) == 2:
            a, b = self.objects
            if (a.color, a.shape) == (b.color, b.shape):
                raise ValueError("the two groups must differ in colour or shape; use a count instead")
        if self.relation is not None:
            if self.relation not in RELATIONS:
                raise ValueError(f"unknown relation {self.relation!r}; known {list(RELATIONS)}")
            if len(self.objects) != 2 or any(o.count != 1 for o in self.objects):
                raise ValueError("a relation links exactly two single objects")

    @property
    def n_objects(self) -> int:
        return sum(o.count for o in self.objects)

    def slots(self) -> list[tuple[str, str]]:
        """``(colour, shape)`` of every object the scene contains, groups expanded by their count."""
        return [(o.color, o.shape) for o in self.objects for _ in range(o.count)]

    def to_prompt(self) -> str:
        if len(self.objects) == 1:
            return self.objects[0].phrase()
        link = "and" if self.relation is None else RELATIONS[self.relation]
        return f"{self.objects[0].phrase()} {link} {self.objects[1].phrase()}"


# ---------------------------------------------------------------------------------------- parsing
_NUM_WORDS = {v: k for k, v in NUMBERS.items()} | {"an": 1, "one": 1}
_GROUP = r"(a|an|one|two|three)\s+(\w+)\s+(\w+?)(s?)"
_LINKS = "|".join(["and"] + [re.escape(w) for w in RELATIONS.values()])
_PROMPT_RE = re.compile(rf"^{_GROUP}(?:\s+({_LINKS})\s+{_GROUP})?$")
_RELATION_OF_WORDS = {w: r for r, w in RELATIONS.items()}


def _group(num: str, color: str, shape: str, plural: str, text: str) -> ObjectSpec:
    count = _NUM_WORDS[num]
    if (count > 1) != bool(plural):
        raise ValueError(f"number and noun disagree in {text!r}")
    return ObjectSpec(color, shape, count)


@lru_cache(maxsize=4096)
def parse_prompt(text: str) -> SceneSpec:
    """The scene a prompt asks for; the exact inverse of ``SceneSpec.to_prompt`` (case, surrounding
    spaces, a trailing full stop and repeated spaces are tolerated). Raises ``ValueError``."""
    norm = " ".join(text.strip().lower().rstrip(".").split())
    m = _PROMPT_RE.match(norm)
    if m is None:
        raise ValueError(f"not a shapes-world prompt: {text!r} (e.g. 'a red circle above two blue squares')")
    g = m.groups()
    first = _group(*g[0:4], text)
    if g[4] is None:
        return SceneSpec((first,))
    second = _group(*g[5:9], text)
    relation = None if g[4] == "and" else _RELATION_OF_WORDS[g[4]]
    return SceneSpec((first, second), relation)


# ----------------------------------------------------------------------------------- enumeration
def all_specs() -> list[SceneSpec]:
    """Every scene of the four templates, in a fixed order. Two-object prompts use single objects;
    pair prompts list each unordered pair once (vocabulary order), position prompts every ordered
    pair and relation."""
    pairs = [(c, s) for c in COLORS for s in SHAPES]
    specs = [SceneSpec((ObjectSpec(c, s, n),)) for n in NUMBERS for c, s in pairs]
    specs += [SceneSpec((ObjectSpec(*a), ObjectSpec(*b))) for a, b in itertools.combinations(pairs, 2)]
    specs += [
        SceneSpec((ObjectSpec(*a), ObjectSpec(*b)), rel)
        for a, b in itertools.permutations(pairs, 2)
        for rel in RELATIONS
    ]
    return specs


def all_prompts() -> list[str]:
    return [s.to_prompt() for s in all_specs()]


def heldout_pairs(seed: int = 0, n_heldout_pairs: int = 2) -> frozenset[tuple[str, str]]:
    """The colour-shape pairs H that train never shows in a two-object prompt: distinct colours and
    distinct shapes, drawn with ``seed``."""
    if not 0 <= n_heldout_pairs <= min(len(COLORS), len(SHAPES)):
        raise ValueError(f"n_heldout_pairs must be in [0, {min(len(COLORS), len(SHAPES))}]")
    rng = np.random.default_rng(seed)
    colors = rng.permutation(list(COLORS))[:n_heldout_pairs]
    shapes = rng.permutation(list(SHAPES))[:n_heldout_pairs]
    return frozenset((str(c), str(s)) for c, s in zip(colors, shapes, strict=True))


def is_heldout(spec: SceneSpec, held: frozenset[tuple[str, str]]) -> bool:
    """The split rule: a two-object scene that contains a held-out colour-shape pair."""
    return len(spec.objects) == 2 and any((o.color, o.shape) in held for o in spec.objects)


def split_prompts(seed: int = 0, n_heldout_pairs: int = 2) -> tuple[list[str], list[str]]:
    """``(train, heldout)``: a deterministic partition of ``all_prompts()`` by ``is_heldout``."""
    held = heldout_pairs(seed, n_heldout_pairs)
    train, heldout = [], []
    for spec in all_specs():
        (heldout if is_heldout(spec, held) else train).append(spec.to_prompt())
    return train, heldout


def train_prompts(seed: int = 0, n_heldout_pairs: int = 2) -> list[str]:
    return split_prompts(seed, n_heldout_pairs)[0]


def heldout_prompts(seed: int = 0, n_heldout_pairs: int = 2) -> list[str]:
    return split_prompts(seed, n_heldout_pairs)[1]


def heldout_partner_split(
    seed: int = 0, n_heldout_pairs: int = 2, split_seed: int = 0
) -> tuple[list[str], list[str]]:
    """``(rl, evaluation)``: the held-out prompts cut by the *other* object in them, so that RL can
    practise each held-out pair in two-object scenes while evaluation still puts it next to partners
    it never met, neither in pretraining nor in RL. Per held-out pair, a ``split_seed`` permutation
    of its partners (every colour-shape pair outside H) gives the first half to RL; a prompt that
    holds two held-out pairs is evaluated only."""
    held = heldout_pairs(seed, n_heldout_pairs)
    partners = [(c, s) for c in COLORS for s in SHAPES if (c, s) not in held]
    rng = np.random.default_rng(split_seed)
    rl_partners = {
        pair: {partners[i] for i in rng.permutation(len(partners))[: len(partners) // 2]}
        for pair in sorted(held)
    }
    rl, evaluation = [], []
    for spec in all_specs():
        if not is_heldout(spec, held):
            continue
        a, b = ((o.color, o.shape) for o in spec.objects)
        if a in held and b in held:
            evaluation.append(spec.to_prompt())
            continue
        pair, partner = (a, b) if a in held else (b, a)
        (rl if partner in rl_partners[pair] else evaluation).append(spec.to_prompt())
    return rl, evaluation


def composition_kind(
    spec: SceneSpec, held: frozenset[tuple[str, str]]
) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A held-out prompt's kind: its template ("and" or the relation) and the held-out pairs it shows."""
    pairs = tuple(sorted({(o.color, o.shape) for o in spec.objects} & held))
    return (spec.relation or "and", pairs)


def heldout_validation_split(
    seed: int = 0, n_heldout_pairs: int = 2, split_seed: int = 0
) -> tuple[list[str], list[str]]:
    """``(validation, reported)``: the held-out prompts cut in two disjoint halves, so that a benchmark
    chooses its settings on one and reports on the other. Each composition kind (``composition_kind``:
    the template and the held-out pairs shown) is split on its own, half to validation (rounded down),
    so every template and every held-out pair appears in both; the draws and each list's order come
    from ``split_seed`` (a list is read in its order when an evaluation takes its first N prompts)."""
    held = heldout_pairs(seed, n_heldout_pairs)
    kinds = [(composition_kind(s, held), s.to_prompt()) for s in all_specs() if is_heldout(s, held)]
    return halves_by_kind(kinds, split_seed)


# -------------------------------------------------------------------------------------- geometry
Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in pixels (x right, y down)


def shape_centroid(shape: str, box: Box) -> tuple[float, float]:
    """Centre of mass ``(x, y)`` of a shape filling ``box``; an upward triangle's sits 2/3 down."""
    x0, y0, x1, y1 = box
    cy = y0 + (y1 - y0) * (2.0 / 3.0) if shape == "triangle" else (y0 + y1) / 2
    return (x0 + x1) / 2, cy


def relation_holds(
    a: tuple[float, float], b: tuple[float, float], relation: str, dominance: float = 1.0
) -> bool:
    """Whether point ``a`` is ``relation`` of point ``b`` (image coordinates, y down).

    The offset along the relation's axis must exceed ``dominance`` times the offset along the other
    axis, so the four relations exclude each other. The detector uses ``dominance=1``; the renderer
    asks for more (2) so that detection noise cannot flip a relation.
    """
    dx, dy = b[0] - a[0], b[1] - a[1]  # from a to b
    major = {"left of": dx, "right of": -dx, "above": dy, "below": -dy}[relation]
    minor = abs(dy) if relation in ("left of", "right of") else abs(dx)
    return major > 0 and major > dominance * minor


def _separated(p: Box, q: Box, gap: float) -> bool:
    """Boxes at least ``gap`` apart along x or y, so the shapes neither overlap nor touch."""
    return p[2] + gap <= q[0] or q[2] + gap <= p[0] or p[3] + gap <= q[1] or q[3] + gap <= p[1]


def layout(spec: SceneSpec, rng: np.random.Generator, size: int = DEFAULT_SIZE) -> list[tuple[str, str, Box]]:
    """Random ``(colour, shape, box)`` for every object: sizes in ``SIZE_RANGE``, inside the canvas
    with a 1 px margin, pairwise separated by a gap, and satisfying the spec's relation with
    margin (``relation_holds`` with ``dominance=2``). Rejection sampling; raises if it fails."""
    slots = spec.slots()
    lo, hi = SIZE_RANGE[0] * size, SIZE_RANGE[1] * size
    gap, margin = max(2.0, 0.06 * size), 1.0
    for _ in range(200):  # redraw sizes now and then: some size draws leave little room
        sides = rng.uniform(lo, hi, len(slots)).round()
        for _ in range(50):
            boxes: list[Box] = []
            for side in sides:
                x0, y0 = rng.uniform(margin, size - margin - side, 2).round()
                boxes.append((float(x0), float(y0), float(x0 + side), float(y0 + side)))
            if not all(_separated(p, q, gap) for p, q in itertools.combinations(boxes, 2)):
                continue
            if spec.relation is not None:
                ca, cb = (shape_centroid(s[1], b) for s, b in zip(slots, boxes, strict=True))
                if not relation_holds(ca, cb, spec.relation, dominance=2.0):
                    continue
            return [(c, s, b) for (c, s), b in zip(slots, boxes, strict=True)]
    raise RuntimeError(f"could not lay out {spec.to_prompt()!r} on a {size} px canvas")


def render(
    spec: SceneSpec | str,
    rng: np.random.Generator | int | None = None,
    size: int = DEFAULT_SIZE,
    supersample: int = 4,
) -> Image.Image:
    """An RGB image of the scene: random valid layout (``layout``), drawn ``supersample`` times
    larger and box-filtered down, so edges are anti-aliased like a generator's soft output."""
    spec = parse_prompt(spec) if isinstance(spec, str) else spec
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    return draw(layout(spec, rng, size), size, supersample)


def draw(objects: list[tuple[str, str, Box]], size: int = DEFAULT_SIZE, supersample: int = 4) -> Image.Image:
    """Paint ``(colour, shape, box)`` objects on the background (boxes in output pixels)."""
    k = supersample
    img = Image.new("RGB", (size * k, size * k), BACKGROUND)
    pen = ImageDraw.Draw(img)
    for color, shape, (x0, y0, x1, y1) in objects:
        # PIL's right/bottom bounds are inclusive: stop one supersampled pixel short of x1, y1.
        b = (x0 * k, y0 * k, x1 * k - 1, y1 * k - 1)
        fill = COLORS[color]
        if shape == "circle":
            pen.ellipse(b, fill=fill)
        elif shape == "square":
            pen.rectangle(b, fill=fill)
        else:  # upward isosceles triangle, base at the bottom of the box
            pen.polygon([(b[0], b[3]), (b[2], b[3]), ((b[0] + b[2]) / 2, b[1])], fill=fill)
    return img.resize((size, size), Image.Resampling.BOX) if k > 1 else img
