"""Score a clip against a prompt's ``ClipSpec``: the image world's detector per frame, plus motion.

- ``color``, ``shape``, ``count``: ``vgrpo_rewards.shapes.detect.score_image`` on every frame against the
  clip's objects (a still scene, no relation), averaged over the frames: an object that vanishes, splits
  or changes shape for a frame costs that frame's share;
- ``motion``: per object, the centroid of its colour's mask (the detector's ``color_map``) in every frame,
  a least-squares line through them, and its displacement over the clip: right when it runs along the
  prompt's direction, by at least ``min_travel_px``, more than across it. Objects of a clip have different
  colours (the grammar's rule), so a colour's mask is one object's. The fraction of objects moving right;
- ``correct``: 1 when all four are 1.
"""

from __future__ import annotations

import numpy as np
from vgrpo_rewards.shapes.detect import COLOR_NAMES, DetectorParams, color_map, score_image
from vgrpo_rewards.shapes.world import ObjectSpec, SceneSpec

from .world import VELOCITY, ClipSpec

CRITERIA: tuple[str, ...] = ("color", "shape", "count", "motion")
FRAME_CRITERIA: tuple[str, ...] = ("color", "shape", "count")


def still_scene(spec: ClipSpec) -> SceneSpec:
    """The objects of a clip as the image world's scene: what every frame must show."""
    return SceneSpec(tuple(ObjectSpec(o.color, o.shape) for o in spec.objects))


def centroid_track(
    clip: np.ndarray, color: str, params: DetectorParams = DetectorParams()
) -> np.ndarray | None:
    """``(x, y)`` per frame ``[F, 2]`` of the pixels of ``color`` in uint8 ``clip`` ``[F, H, W, 3]`` (pixel
    centres at +0.5, y down); None when a frame has none."""
    index = COLOR_NAMES.index(color)
    points = []
    for frame in clip:
        ys, xs = np.nonzero(color_map(frame, params) == index)
        if len(xs) == 0:
            return None
        points.append((xs.mean() + 0.5, ys.mean() + 0.5))
    return np.asarray(points, dtype=np.float64)


def displacement(track: np.ndarray) -> tuple[float, float]:
    """``(dx, dy)`` over the clip of the least-squares line through a ``[F, 2]`` track (robust to one
    noisy frame, unlike last minus first)."""
    f = np.arange(len(track), dtype=np.float64)
    slope = np.polyfit(f, track, 1)[0]  # [2]
    return float(slope[0] * (len(track) - 1)), float(slope[1] * (len(track) - 1))


def moves(track: np.ndarray | None, motion: str, min_travel_px: float) -> bool:
    """Whether a centroid track runs ``motion``'s way by ``min_travel_px`` and more than across it."""
    if track is None:
        return False
    dx, dy = displacement(track)
    vx, vy = VELOCITY[motion]
    along = dx * vx + dy * vy
    across = abs(dx * vy - dy * vx)
    return along >= min_travel_px and along > across


def score_clip(
    clip: np.ndarray, spec: ClipSpec, params: DetectorParams = DetectorParams(), min_travel_px: float = 3.2
) -> dict[str, float]:
    """Per-criterion scores in [0, 1] and ``correct`` of uint8 ``clip`` ``[F, H, W, 3]`` against ``spec``."""
    scene = still_scene(spec)
    frames = [score_image(frame, scene, params) for frame in clip]
    scores = {c: float(np.mean([f[c] for f in frames])) for c in FRAME_CRITERIA}
    right = [moves(centroid_track(clip, o.color, params), o.motion, min_travel_px) for o in spec.objects]
    scores["motion"] = sum(right) / len(right)
    scores["correct"] = float(all(scores[c] == 1.0 for c in CRITERIA))
    return scores
