"""The procedural "moving shapes" world: prompt grammar, clip specs, rendering and the train / held-out split.

The video sibling of ``vgrpo_rewards.shapes.world`` (its colours, shapes and ``draw`` are reused): a clip
is ``DEFAULT_FRAMES`` frames of one or two flat shapes on black, each moving in a straight line at constant
speed. The prompt describes the *whole* clip, so the reward (``impl.py``) is exact on rendered clips.

Grammar::

    single  "a red square moving left"
    pair    "a red square moving left while a blue circle rises"
    motion  "moving left" | "moving right" | "rises" (up) | "falls" (down)

The two objects of a pair have different colours (the reward tracks each object by its colour mask) and
are listed in vocabulary order of (colour, shape), so each clip has one prompt.

Train / held-out split (``split_prompts``): a fixed seed picks ``n_heldout_pairs`` (shape, motion) pairs
H (distinct shapes, distinct motions). Train shows every H pair only *alone* (single prompts); every pair
prompt in which an object moves as an H pair says is held out. So a held-out clip asks for a motion the
model has seen a shape make, but never next to a second moving object, while every colour, shape and
motion still occurs in train's pair prompts. The image world's split follows the same rule.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from PIL import Image
from vgrpo_rewards._split import halves_by_kind
from vgrpo_rewards.shapes.world import COLORS, SHAPES, Box, _separated, draw

MOTIONS: dict[str, str] = {  # motion id -> the words in a prompt
    "left": "moving left",
    "right": "moving right",
    "up": "rises",
    "down": "falls",
}
VELOCITY: dict[str, tuple[int, int]] = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
"""Unit direction ``(dx, dy)`` of each motion in image coordinates (y down)."""
DEFAULT_SIZE = 32
DEFAULT_FRAMES = 4
SIZE_RANGE = (0.25, 0.3)  # object side as a fraction of the frame side (8-10 px at 32 px)
TRAVEL_RANGE = (0.2, 0.28)  # distance covered over the clip, as a fraction of the side (6.4-9 px at 32 px)


@dataclass(frozen=True)
class MovingObject:
    """One object and the direction it moves in."""

    color: str
    shape: str
    motion: str

    def phrase(self) -> str:
        return f"a {self.color} {self.shape} {MOTIONS[self.motion]}"


@dataclass(frozen=True)
class ClipSpec:
    """What a prompt asks for: one or two moving objects of different colours."""

    objects: tuple[MovingObject, ...]

    def __post_init__(self) -> None:
        if not 1 <= len(self.objects) <= 2:
            raise ValueError(f"a clip has one or two objects, got {len(self.objects)}")
        for o in self.objects:
            if o.color not in COLORS or o.shape not in SHAPES or o.motion not in MOTIONS:
                known = f"colours {list(COLORS)}, shapes {list(SHAPES)}, motions {list(MOTIONS)}"
                raise ValueError(f"unknown object {o}; {known}")
        if len(self.objects) == 2 and self.objects[0].color == self.objects[1].color:
            raise ValueError("the two objects of a clip must differ in colour")

    def to_prompt(self) -> str:
        return " while ".join(o.phrase() for o in self.objects)


# ---------------------------------------------------------------------------------------- parsing
_MOTION_WORDS = "|".join(re.escape(w) for w in MOTIONS.values())
_OBJECT = rf"(?:a|an|one)\s+(\w+)\s+(\w+)\s+({_MOTION_WORDS})"
_PROMPT_RE = re.compile(rf"^{_OBJECT}(?:\s+while\s+{_OBJECT})?$")
_MOTION_OF_WORDS = {w: m for m, w in MOTIONS.items()}


@lru_cache(maxsize=4096)
def parse_prompt(text: str) -> ClipSpec:
    """The clip a prompt asks for; the inverse of ``ClipSpec.to_prompt`` (case, surrounding spaces, a
    trailing full stop and repeated spaces are tolerated). Raises ``ValueError``."""
    norm = " ".join(text.strip().lower().rstrip(".").split())
    m = _PROMPT_RE.match(norm)
    if m is None:
        example = "a red square moving left while a blue circle rises"
        raise ValueError(f"not a moving-shapes prompt: {text!r} (e.g. {example!r})")
    g = m.groups()
    objects = [MovingObject(g[0], g[1], _MOTION_OF_WORDS[g[2]])]
    if g[3] is not None:
        objects.append(MovingObject(g[3], g[4], _MOTION_OF_WORDS[g[5]]))
    return ClipSpec(tuple(objects))


# ----------------------------------------------------------------------------------- enumeration
def all_specs() -> list[ClipSpec]:
    """Every clip of the grammar in a fixed order: singles, then pairs (objects of different colours in
    vocabulary order of (colour, shape), every combination of motions)."""
    pairs = [(c, s) for c in COLORS for s in SHAPES]
    specs = [ClipSpec((MovingObject(c, s, m),)) for c, s in pairs for m in MOTIONS]
    for a, b in itertools.combinations(pairs, 2):
        if a[0] == b[0]:
            continue
        specs += [
            ClipSpec((MovingObject(*a, ma), MovingObject(*b, mb)))
            for ma, mb in itertools.product(MOTIONS, MOTIONS)
        ]
    return specs


def all_prompts() -> list[str]:
    return [s.to_prompt() for s in all_specs()]


def heldout_pairs(seed: int = 0, n_heldout_pairs: int = 2) -> frozenset[tuple[str, str]]:
    """The (shape, motion) pairs H that train never shows in a pair prompt: distinct shapes and distinct
    motions, drawn with ``seed``."""
    if not 0 <= n_heldout_pairs <= min(len(SHAPES), len(MOTIONS)):
        raise ValueError(f"n_heldout_pairs must be in [0, {min(len(SHAPES), len(MOTIONS))}]")
    rng = np.random.default_rng(seed)
    shapes = rng.permutation(list(SHAPES))[:n_heldout_pairs]
    motions = rng.permutation(list(MOTIONS))[:n_heldout_pairs]
    return frozenset((str(s), str(m)) for s, m in zip(shapes, motions, strict=True))


def is_heldout(spec: ClipSpec, held: frozenset[tuple[str, str]]) -> bool:
    """The split rule: a two-object clip in which an object makes a held-out (shape, motion) pair."""
    return len(spec.objects) == 2 and any((o.shape, o.motion) in held for o in spec.objects)


def split_prompts(seed: int = 0, n_heldout_pairs: int = 2) -> tuple[list[str], list[str]]:
    """``(train, heldout)``: a deterministic partition of ``all_prompts()`` by ``is_heldout``."""
    held = heldout_pairs(seed, n_heldout_pairs)
    train: list[str] = []
    heldout: list[str] = []
    for spec in all_specs():
        (heldout if is_heldout(spec, held) else train).append(spec.to_prompt())
    return train, heldout


def train_prompts(seed: int = 0, n_heldout_pairs: int = 2) -> list[str]:
    return split_prompts(seed, n_heldout_pairs)[0]


def heldout_prompts(seed: int = 0, n_heldout_pairs: int = 2) -> list[str]:
    return split_prompts(seed, n_heldout_pairs)[1]


def heldout_validation_split(
    seed: int = 0, n_heldout_pairs: int = 2, split_seed: int = 0
) -> tuple[list[str], list[str]]:
    """``(validation, reported)``: the held-out prompts in two disjoint halves (``halves_by_kind``), a
    kind being which held-out (shape, motion) pair each object makes (or none), so both halves ask for
    every held-out pair, as the first object and as the second."""
    held = heldout_pairs(seed, n_heldout_pairs)

    def kind(spec: ClipSpec) -> tuple[str, ...]:
        return tuple(f"{o.shape} {o.motion}" if (o.shape, o.motion) in held else "-" for o in spec.objects)

    return halves_by_kind(
        ((kind(spec), spec.to_prompt()) for spec in all_specs() if is_heldout(spec, held)), split_seed
    )


# ------------------------------------------------------------------------------------- rendering
Track = tuple[str, str, list[Box]]  # colour, shape, the object's box in each frame


def _shifted(box: Box, dx: float, dy: float) -> Box:
    return (box[0] + dx, box[1] + dy, box[2] + dx, box[3] + dy)


def _quantised(box: Box) -> Box:
    x0, y0, x1, y1 = (round(v * 4) / 4 for v in box)
    return (x0, y0, x1, y1)


def layout(
    spec: ClipSpec, rng: np.random.Generator, size: int = DEFAULT_SIZE, frames: int = DEFAULT_FRAMES
) -> list[Track]:
    """Random straight tracks: each object's side in ``SIZE_RANGE``, its travel in ``TRAVEL_RANGE`` along
    its motion, inside the frame (1 px margin) in every frame, and apart from the other object by a gap in
    every frame. Positions are quantised to quarter pixels (the renderer's supersampling). Rejection
    sampling; raises if it fails."""
    if frames < 2:
        raise ValueError(f"a clip needs at least 2 frames to show motion, got {frames}")
    lo, hi = SIZE_RANGE[0] * size, SIZE_RANGE[1] * size
    gap, margin = max(2.0, 0.06 * size), 1.0
    for _ in range(500):
        tracks: list[Track] = []
        for o in spec.objects:
            side = float(round(rng.uniform(lo, hi)))
            travel = float(rng.uniform(TRAVEL_RANGE[0] * size, TRAVEL_RANGE[1] * size))
            vx, vy = VELOCITY[o.motion]
            # the start box's free range: the whole track stays inside the margins
            span_x = (margin - min(0.0, vx * travel), size - margin - side - max(0.0, vx * travel))
            span_y = (margin - min(0.0, vy * travel), size - margin - side - max(0.0, vy * travel))
            x0, y0 = rng.uniform(span_x[0], span_x[1]), rng.uniform(span_y[0], span_y[1])
            start = (float(x0), float(y0), float(x0 + side), float(y0 + side))
            steps = [travel * f / (frames - 1) for f in range(frames)]
            boxes = [_quantised(_shifted(start, vx * d, vy * d)) for d in steps]
            tracks.append((o.color, o.shape, boxes))
        if len(tracks) == 1 or all(
            _separated(p, q, gap) for p, q in zip(tracks[0][2], tracks[1][2], strict=True)
        ):
            return tracks
    raise RuntimeError(f"could not lay out {spec.to_prompt()!r} on a {size} px frame")


def render(
    spec: ClipSpec | str,
    rng: np.random.Generator | int | None = None,
    size: int = DEFAULT_SIZE,
    frames: int = DEFAULT_FRAMES,
    supersample: int = 4,
) -> np.ndarray:
    """A clip of the spec as uint8 ``[F, H, W, 3]``: a random valid layout (``layout``), each frame drawn
    by the image world's ``draw`` (supersampled, box-filtered down: anti-aliased edges)."""
    spec = parse_prompt(spec) if isinstance(spec, str) else spec
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    tracks = layout(spec, rng, size, frames)
    return np.stack([np.asarray(frame) for frame in draw_clip(tracks, size, supersample)])


def draw_clip(tracks: list[Track], size: int = DEFAULT_SIZE, supersample: int = 4) -> list[Image.Image]:
    """One image per frame of ``(colour, shape, boxes)`` tracks."""
    frames = len(tracks[0][2])
    return [draw([(c, s, boxes[f]) for c, s, boxes in tracks], size, supersample) for f in range(frames)]
