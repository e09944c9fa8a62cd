"""The shapes detector and reward against the renderer's ground truth."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import deque

import numpy as np
import pluggy
import pytest
import torch
import vgrpo_rewards.shapes as plugin
from PIL import Image, ImageDraw, ImageFilter
from vgrpo_rewards.shapes import detect as d
from vgrpo_rewards.shapes import world as w

from vgrpo_platform import hookspecs
from vgrpo_platform.protocols import BuildContext, Reward, Samples

N_SCENES = 500


def _scenes(n: int, seed: int):
    """``n`` (spec, uint8 image) pairs over the whole prompt set, reproducibly."""
    rng = np.random.default_rng(seed)
    specs = w.all_specs()
    for i in rng.integers(len(specs), size=n):
        yield specs[i], w.render(specs[i], rng), rng


def _noise(img: Image.Image, rng: np.random.Generator, sigma: float) -> np.ndarray:
    x = np.asarray(img) / 255.0 + rng.normal(0, sigma, (*img.size[::-1], 3))
    return (np.clip(x, 0, 1) * 255).round().astype(np.uint8)


def _agreement(transform, n: int, seed: int = 0) -> float:
    return float(
        np.mean([d.score_image(transform(img, rng), spec)["correct"] for spec, img, rng in _scenes(n, seed)])
    )


def test_detector_agrees_with_renderer():
    agree = _agreement(lambda img, rng: np.asarray(img), N_SCENES)
    print(f"\nclean agreement on {N_SCENES} scenes: {agree:.3f}")
    assert agree >= 0.98


@pytest.mark.parametrize(
    ("name", "transform", "threshold"),
    [
        # measured on 300 scenes (seed 0) when written: 1.000, 1.000, 1.000, 1.000, 0.990
        ("noise 0.10", lambda img, rng: _noise(img, rng, 0.10), 0.97),
        ("noise 0.15", lambda img, rng: _noise(img, rng, 0.15), 0.97),
        ("blur 1.0", lambda img, rng: np.asarray(img.filter(ImageFilter.GaussianBlur(1.0))), 0.97),
        (
            "blur 0.7 + noise 0.05",
            lambda img, rng: _noise(img.filter(ImageFilter.GaussianBlur(0.7)), rng, 0.05),
            0.97,
        ),
        (
            "blur 1.0 + noise 0.10",
            lambda img, rng: _noise(img.filter(ImageFilter.GaussianBlur(1.0)), rng, 0.10),
            0.95,
        ),
    ],
)
def test_detector_is_robust_to_noise_and_blur(name, transform, threshold):
    agree = _agreement(transform, 300)
    print(f"\n{name}: agreement {agree:.3f}")
    assert agree >= threshold


def _perturb(spec: w.SceneSpec, rng: np.random.Generator) -> tuple[w.SceneSpec, str]:
    """A valid prompt that differs from ``spec`` in exactly one attribute, and that attribute."""
    options = ["color", "shape"] + (["count"] if len(spec.objects) == 1 else [])
    options += ["position"] if spec.relation is not None else []
    what = options[rng.integers(len(options))]
    while True:
        objs = list(spec.objects)
        g = int(rng.integers(len(objs)))
        o = objs[g]
        if what == "color":
            objs[g] = w.ObjectSpec(str(rng.choice([c for c in w.COLORS if c != o.color])), o.shape, o.count)
        elif what == "shape":
            objs[g] = w.ObjectSpec(o.color, str(rng.choice([s for s in w.SHAPES if s != o.shape])), o.count)
        elif what == "count":
            objs[g] = w.ObjectSpec(o.color, o.shape, int(rng.choice([n for n in w.NUMBERS if n != o.count])))
        rel = spec.relation
        if what == "position":
            rel = str(rng.choice([r for r in w.RELATIONS if r != spec.relation]))
        try:
            return w.SceneSpec(tuple(objs), rel), what
        except ValueError:  # e.g. both groups became identical: draw again
            continue


def test_detector_rejects_prompts_that_differ_in_one_attribute():
    rejected = isolated = 0
    seen = set()
    for spec, img, rng in _scenes(N_SCENES, seed=1):
        other, what = _perturb(spec, rng)
        seen.add(what)
        s = d.score_image(np.asarray(img), other)
        rejected += s["correct"] == 0
        isolated += s[what] < 1 and all(s[c] == 1 for c in d.CRITERIA if c != what)
    print(f"\nrejected {rejected / N_SCENES:.3f}, only the changed criterion fails {isolated / N_SCENES:.3f}")
    assert seen == set(d.CRITERIA)
    assert rejected / N_SCENES >= 0.98 and isolated / N_SCENES >= 0.98


def test_score_detections_closed_forms():
    red_circle = d.Detection("red", "circle", (8.0, 8.0), 80, (3, 3, 13, 13), 0.0, 0.0)
    blue_square = d.Detection("blue", "square", (8.0, 24.0), 100, (3, 19, 13, 29), 0.0, -0.6)
    spec = w.parse_prompt("a red circle above a blue square")
    assert d.score_detections([red_circle, blue_square], spec)["correct"] == 1
    below = d.score_detections([red_circle, blue_square], w.parse_prompt("a red circle below a blue square"))
    assert below == {"color": 1.0, "shape": 1.0, "count": 1.0, "position": 0.0, "correct": 0.0}
    empty = d.score_detections([], spec)
    assert empty == {"color": 0.0, "shape": 0.0, "count": 0.0, "position": 0.0, "correct": 0.0}
    # three asked, one found: only count suffers; one asked, two found: count 1/2
    assert d.score_detections([red_circle], w.parse_prompt("three red circles"))["count"] == pytest.approx(
        1 / 3
    )
    s = d.score_detections([red_circle, blue_square], w.parse_prompt("a red circle"))
    assert (s["count"], s["color"], s["shape"], s["correct"]) == (0.5, 1.0, 1.0, 0.0)
    # "a blue circle and a red square" on a red circle + blue square: 2 of 4 attributes right, however matched
    s = d.score_detections([red_circle, blue_square], w.parse_prompt("a blue circle and a red square"))
    assert s["color"] + s["shape"] == pytest.approx(1.0) and s["position"] == 1.0


def _bfs_labels(mask: np.ndarray) -> np.ndarray:
    """Independent 4-connected labelling by breadth-first search."""
    lab = np.zeros(mask.shape, int)
    k = 0
    for start in zip(*np.nonzero(mask), strict=True):
        if lab[start]:
            continue
        k += 1
        lab[start] = k
        queue = deque([start])
        while queue:
            y, x = queue.popleft()
            for ny, nx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
                if 0 <= ny < mask.shape[0] and 0 <= nx < mask.shape[1] and mask[ny, nx] and not lab[ny, nx]:
                    lab[ny, nx] = k
                    queue.append((ny, nx))
    return lab


def _same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    pairs = {(int(x), int(y)) for x, y in zip(a.ravel(), b.ravel(), strict=True)}
    return len(pairs) == len({x for x, _ in pairs}) == len({y for _, y in pairs})


@pytest.mark.parametrize("density", [0.3, 0.5, 0.6])
def test_labelling_matches_breadth_first_search(density):
    rng = np.random.default_rng(3)
    for _ in range(20):
        mask = rng.random((17, 23)) < density
        expected = _bfs_labels(mask)
        for labels, n in (d.label(mask), d.label_numpy(mask)):
            assert n == expected.max() and _same_partition(labels, expected)


@pytest.mark.parametrize("shape", w.SHAPES)
def test_shape_features_match_their_closed_forms_on_large_shapes(shape):
    """At 200 px the pixel moments approach the continuous prototypes the classifier uses."""
    img = w.draw([("red", shape, (20, 20, 220, 220))], size=240, supersample=1)
    comp = np.asarray(img)[..., 0] > 0
    name, skew, aniso = d.classify(comp)
    assert name == shape
    assert np.allclose((skew, aniso), d._PROTOTYPES[shape], atol=0.02)


def test_colour_segmentation_is_exact_on_flat_palette_pixels():
    img = Image.new("RGB", (8, 1))
    pen = ImageDraw.Draw(img)
    for i, c in enumerate(w.COLORS):
        pen.point((i, 0), fill=w.COLORS[c])
        pen.point((4 + i, 0), fill=tuple(v // 4 for v in w.COLORS[c]))  # too dark: background
    assert d.color_map(np.asarray(img)).tolist() == [[0, 1, 2, 3, -1, -1, -1, -1]]


# ------------------------------------------------------------------------------------------ plugin
def _registered() -> dict:
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    pm.register(plugin)
    return {
        c.name: (c.factory, c.config, c.summary) for records in pm.hook.register_components() for c in records
    }


def _build(**options) -> Reward:
    factory, config, _ = _registered()["shapes"]
    return factory(config(**options), BuildContext())


def test_plugin_registers_and_validates_options():
    factory, config, summary = _registered()["shapes"]
    assert summary and config().objective == "partial"
    with pytest.raises(ValueError):
        config(objectiv="correct")
    with pytest.raises(ValueError):
        config(weights={"colour": 1.0})
    assert isinstance(factory(config(), BuildContext()), Reward)


def test_entry_module_does_not_import_heavy_modules():
    code = "import sys, vgrpo_rewards.shapes; print(sorted({'torch', 'numpy', 'PIL'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _batch(prompts, seed=0) -> Samples:
    rng = np.random.default_rng(seed)
    imgs = np.stack([np.asarray(w.render(p, rng)) for p in prompts])  # [B, H, W, 3]
    return Samples("image", torch.from_numpy(imgs).permute(0, 3, 1, 2).float() / 255)  # [B, 3, H, W]


def test_reward_scores_a_batch():
    prompts = ["a red circle", "two blue squares", "a green triangle above a yellow circle", "a red square"]
    samples = _batch(prompts)
    asked = ["a red circle", "two blue squares", "a green triangle below a yellow circle", "a blue square"]
    out = _build().score(samples, asked, [{}] * 4)
    assert set(out) == {"score", "color", "shape", "count", "position", "correct"}
    for v in out.values():
        assert v.shape == (4,) and v.dtype == torch.float32 and v.device == samples.data.device
    assert out["correct"].tolist() == [1, 1, 0, 0]
    # partial = weighted mean of the criteria that apply: relation prompt 3/4, no relation 2/3
    assert out["score"].tolist() == pytest.approx([1, 1, 3 / 4, 2 / 3])
    weighted = _build(weights={"color": 3.0}).score(samples, asked, [{}] * 4)["score"]
    assert weighted[3].item() == pytest.approx((3 * 0 + 1 + 1) / 5)
    strict = _build(objective="correct").score(samples, asked, [{}] * 4)
    assert torch.equal(strict["score"], out["correct"])
    # product: one wrong criterion zeroes the score, which the mean only lowers
    product = _build(objective="product").score(samples, asked, [{}] * 4)["score"]
    assert product.tolist() == [1, 1, 0, 0]


def test_product_objective_multiplies_fractional_criteria_with_weights_as_exponents():
    samples = _batch(["two blue squares", "a red circle to the left of a green square"], seed=3)
    asked = ["three blue squares", "a red circle to the left of a green triangle"]
    out = _build(objective="product", weights={"count": 2.0}).score(samples, asked, [{}] * 2)
    applies = [("color", "shape", "count"), ("color", "shape", "count", "position")]
    for i, names in enumerate(applies):
        want = 1.0
        for c in names:
            want *= out[c][i].item() ** (2.0 if c == "count" else 1.0)
        assert out["score"][i].item() == pytest.approx(want, rel=1e-6)
    assert 0 < out["score"][0].item() < 1  # a fractional count, squared, not a 0/1 verdict


def test_reward_rejects_bad_input():
    reward = _build()
    with pytest.raises(ValueError, match="prompts"):
        reward.score(_batch(["a red circle"]), ["a red circle", "a red square"], [{}, {}])
    with pytest.raises(ValueError, match="shapes-world prompt"):
        reward.score(_batch(["a red circle"]), ["a photo of a cat"], [{}])


def test_reward_scores_500_images_and_reports_time():
    specs = w.all_specs()
    rng = np.random.default_rng(4)
    prompts = [specs[i].to_prompt() for i in rng.integers(len(specs), size=N_SCENES)]
    samples = _batch(prompts, seed=4)
    start = time.perf_counter()
    out = _build().score(samples, prompts, [{}] * N_SCENES)
    seconds = time.perf_counter() - start
    print(f"\nscored {N_SCENES} images of 32 px in {seconds:.2f} s; mean correct {out['correct'].mean():.3f}")
    assert out["correct"].mean() >= 0.98 and out["score"].mean() >= 0.99


def test_numpy_fallback_detects_the_same_objects(monkeypatch):
    scenes = [(spec, np.asarray(img)) for spec, img, _ in _scenes(40, seed=5)]
    with_scipy = [d.detect(img) for _, img in scenes]
    monkeypatch.setattr(d, "_ndimage", None)
    assert [d.detect(img) for _, img in scenes] == with_scipy


@pytest.mark.parametrize("size", [48, 64])
def test_detector_agrees_at_other_sizes(size):
    rng = np.random.default_rng(6)
    specs = w.all_specs()
    agree = np.mean(
        [
            d.score_image(np.asarray(w.render(specs[i], rng, size)), specs[i])["correct"]
            for i in rng.integers(len(specs), size=100)
        ]
    )
    print(f"\n{size} px agreement {agree:.3f}")
    assert agree >= 0.98


def test_latency_option_sleeps_per_image_and_leaves_the_scores_alone(monkeypatch):
    """``latency_per_sample_s`` stands in for a slow reward model (benchmarks/overlap.py)."""
    import vgrpo_rewards.shapes.impl as impl

    prompts = ["a red circle", "a blue square above a green triangle", "two yellow circles"]
    batch = _batch(prompts)
    plain = _build().score(batch, prompts, [{}] * 3)
    slept: list[float] = []
    monkeypatch.setattr(impl.time, "sleep", slept.append)
    slow = _build(latency_per_sample_s=0.25).score(batch, prompts, [{}] * 3)
    assert slept == [pytest.approx(0.75)]
    assert all(torch.equal(plain[k], slow[k]) for k in plain)
    assert _build().score(batch, prompts, [{}] * 3) and slept == [pytest.approx(0.75)]  # 0: no sleep
