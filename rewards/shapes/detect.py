"""Find the shapes in an image from its pixels, and score them against a prompt's ``SceneSpec``.

The pipeline is deliberately simple, so its errors are easy to reason about:

1. colour segmentation: a pixel is foreground when it is bright (max channel) and saturated enough;
   its colour is the palette colour of nearest hue (hue survives blur, noise and dimming);
2. connected components per colour (4-connectivity), specks below ``min_area_frac`` dropped;
3. shape from two normalised moments of a component's pixels, nearest prototype wins: the vertical
   skewness (an upward triangle's mass sits low: -0.57; circles and squares: 0) and the four-fold
   anisotropy ``(E[x^4] + E[y^4] - 6 E[x^2 y^2]) / E[x^2 + y^2]^2`` (a square: -0.6; anything
   rotation-symmetric such as a disc: 0). Bounding-box fill ratios failed under blur + noise (a
   stray pixel moves a box edge); these moments moved little in the same tests (a Gaussian blur
   adds nothing to third and fourth cumulants, so the thresholded mask keeps most of them);
4. scoring (``score_detections``): detections are matched to the prompt's objects, then
   per-criterion scores in [0, 1] (``color``, ``shape``, ``count``, ``position``) and ``correct``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from .world import COLORS, SceneSpec, relation_holds

try:  # scipy labels faster; the numpy fallback gives the same partition (tested)
    from scipy import ndimage as _ndimage
except ImportError:  # pragma: no cover - exercised by forcing the fallback in tests
    _ndimage = None

COLOR_NAMES: tuple[str, ...] = tuple(COLORS)
CRITERIA: tuple[str, ...] = ("color", "shape", "count", "position")
# (vertical skewness, four-fold anisotropy) of the continuous filled shapes: closed forms, except the
# triangle's anisotropy (numerical integration). The triangle is upward, base = height.
_PROTOTYPES = {"circle": (0.0, 0.0), "square": (0.0, -0.6), "triangle": (-2 * np.sqrt(2) / 5, 0.05)}


@dataclass(frozen=True)
class DetectorParams:
    """Thresholds of the detector. Fractions of the [0, 1] range and of the image area."""

    value_threshold: float = 0.4  # max(R, G, B) a foreground pixel reaches; the palette sits at ~0.95
    saturation_threshold: float = 0.35  # (max - min) / max; the palette sits at ~0.8
    min_area_frac: float = 0.015  # components smaller than this fraction of the image are specks
    max_objects: int = 6  # only the largest components take part in matching


@dataclass(frozen=True)
class Detection:
    color: str
    shape: str
    centroid: tuple[float, float]  # (x, y) in pixels, pixel centres at +0.5, y down
    area: int  # pixels
    bbox: tuple[int, int, int, int]  # x0, y0, x1, y1 (exclusive)
    skew: float  # vertical skewness of the pixels (y down)
    anisotropy: float  # four-fold anisotropy of the pixels


def hue_degrees(rgb: np.ndarray) -> np.ndarray:
    """Hue in [0, 360) of float RGB ``[..., 3]`` (any scale); 0 where the pixel is grey."""
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    mx, mn = rgb.max(-1), rgb.min(-1)
    chroma = np.where(mx > mn, mx - mn, 1.0)
    h = np.where(mx == r, (g - b) / chroma % 6, np.where(mx == g, (b - r) / chroma + 2, (r - g) / chroma + 4))
    return np.where(mx > mn, h * 60.0, 0.0) % 360.0


_PALETTE_HUES = hue_degrees(np.array([COLORS[c] for c in COLOR_NAMES], dtype=np.float64))  # [P]


def color_map(img: np.ndarray, params: DetectorParams = DetectorParams()) -> np.ndarray:
    """Palette index per pixel of uint8 ``img`` ``[H, W, 3]``, ``-1`` for background: ``[H, W]``."""
    rgb = img.astype(np.float64) / 255.0
    mx, mn = rgb.max(-1), rgb.min(-1)
    fg = (mx >= params.value_threshold) & (mx - mn >= params.saturation_threshold * np.maximum(mx, 1e-8))
    d = np.abs(hue_degrees(rgb)[..., None] - _PALETTE_HUES)  # [H, W, P]
    nearest = np.minimum(d, 360.0 - d).argmin(-1)
    return np.where(fg, nearest, -1)


def label(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """4-connected components of a boolean ``[H, W]`` mask: labels ``1..n`` (0 = background), n."""
    if _ndimage is not None:
        labels, n = _ndimage.label(mask)
        return labels, int(n)
    return label_numpy(mask)


def label_numpy(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """Pure-numpy components: propagate the minimum pixel index over 4-neighbours until stable."""
    h, w = mask.shape
    big = h * w
    lab = np.where(mask, np.arange(big).reshape(h, w), big)
    while True:
        p = np.pad(lab, 1, constant_values=big)
        nb = np.minimum.reduce([lab, p[:-2, 1:-1], p[2:, 1:-1], p[1:-1, :-2], p[1:-1, 2:]])
        nb = np.where(mask, nb, big)
        if np.array_equal(nb, lab):
            break
        lab = nb
    roots, dense = np.unique(lab[mask], return_inverse=True)
    out = np.zeros((h, w), dtype=np.int32)
    out[mask] = dense + 1
    return out, len(roots)


def classify(component: np.ndarray) -> tuple[str, float, float]:
    """``(shape, skew, anisotropy)`` of a boolean mask ``[h, w]`` (see the module docstring)."""
    ys, xs = np.nonzero(component)
    x, y = xs - xs.mean(), ys - ys.mean()
    vx, vy = (x * x).mean(), (y * y).mean()
    skew = float((y**3).mean() / max(vy, 1e-8) ** 1.5)
    aniso = float(((x**4).mean() + (y**4).mean() - 6 * (x * x * y * y).mean()) / max(vx + vy, 1e-8) ** 2)
    dist = {s: (skew - p[0]) ** 2 + (aniso - p[1]) ** 2 for s, p in _PROTOTYPES.items()}
    return min(dist, key=dist.__getitem__), skew, aniso


def detect(img: np.ndarray, params: DetectorParams = DetectorParams()) -> list[Detection]:
    """The objects in uint8 ``img`` ``[H, W, 3]``, largest first."""
    cmap = color_map(img, params)
    min_area = params.min_area_frac * cmap.size
    found: list[Detection] = []
    for ci, cname in enumerate(COLOR_NAMES):
        labels, n = label(cmap == ci)
        if n == 0:
            continue
        for sl, k in zip(_find_objects(labels, n), range(1, n + 1), strict=True):
            comp = labels[sl] == k
            area = int(comp.sum())
            if area < min_area:
                continue
            shape, skew, aniso = classify(comp)
            ys, xs = np.nonzero(comp)
            cx, cy = float(xs.mean()) + sl[1].start + 0.5, float(ys.mean()) + sl[0].start + 0.5
            bbox = (sl[1].start, sl[0].start, sl[1].stop, sl[0].stop)
            found.append(Detection(cname, shape, (cx, cy), area, bbox, skew, aniso))
    found.sort(key=lambda d: -d.area)
    return found


def _find_objects(labels: np.ndarray, n: int) -> list[tuple[slice, slice]]:
    if _ndimage is not None:
        return _ndimage.find_objects(labels, n)
    out = []
    for k in range(1, n + 1):
        ys, xs = np.nonzero(labels == k)
        out.append((slice(ys.min(), ys.max() + 1), slice(xs.min(), xs.max() + 1)))
    return out


def score_detections(detections: list[Detection], spec: SceneSpec, max_objects: int = 6) -> dict[str, float]:
    """Per-criterion scores of detected objects against the prompt's scene.

    The prompt's objects (groups expanded by count) are matched one-to-one to the ``max_objects``
    largest detections, maximising the number of right colour and shape attributes, then the
    relation. With ``n`` objects asked for, ``m`` detected and ``k = min(n, m)`` matched:

    - ``count``: ``min(n, m) / max(n, m)`` (the prompt describes the whole scene: extras count);
    - ``color`` / ``shape``: fraction of the ``k`` matched objects with the right colour / shape
      (0 when nothing is matched), so a missing object costs ``count`` only;
    - ``position``: 1 when both related objects are matched and their centroids satisfy the
      relation, else 0; 1 for prompts without a relation (not applicable);
    - ``correct``: 1 when all four are 1.
    """
    slots = spec.slots()
    dets = detections[:max_objects]
    n, m = len(slots), len(dets)
    best: tuple[tuple[int, int], tuple[int | None, ...]] | None = None
    padded: list[int | None] = list(range(m)) + [None] * max(0, n - m)
    for perm in itertools.permutations(padded, n):
        attrs = sum(
            (dets[j].color == c) + (dets[j].shape == s)
            for (c, s), j in zip(slots, perm, strict=True)
            if j is not None
        )
        key = (attrs, _position(dets, perm, spec))
        if best is None or key > best[0]:
            best = (key, perm)
    assert best is not None
    perm = best[1]
    matched = [(slot, dets[j]) for slot, j in zip(slots, perm, strict=True) if j is not None]
    k = len(matched)
    scores = {
        "color": sum(d.color == c for (c, _), d in matched) / k if k else 0.0,
        "shape": sum(d.shape == s for (_, s), d in matched) / k if k else 0.0,
        "count": min(n, m) / max(n, m) if max(n, m) else 1.0,
        "position": float(_position(dets, perm, spec)) if spec.relation is not None else 1.0,
    }
    scores["correct"] = float(all(scores[c] == 1.0 for c in CRITERIA))
    return {c: float(v) for c, v in scores.items()}


def _position(dets: list[Detection], perm: tuple[int | None, ...], spec: SceneSpec) -> int:
    if spec.relation is None or perm[0] is None or perm[1] is None:
        return 0
    return int(relation_holds(dets[perm[0]].centroid, dets[perm[1]].centroid, spec.relation))


def score_image(
    img: np.ndarray, spec: SceneSpec, params: DetectorParams = DetectorParams()
) -> dict[str, float]:
    """``score_detections(detect(img))``: uint8 ``img`` ``[H, W, 3]`` against ``spec``."""
    return score_detections(detect(img, params), spec, params.max_objects)
