"""The moving-shapes video world: grammar, split, renderer and the reward's criteria."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from vgrpo_rewards.moving_shapes import Config
from vgrpo_rewards.moving_shapes import world as w
from vgrpo_rewards.moving_shapes.impl import MovingShapesReward
from vgrpo_rewards.moving_shapes.prompt_files import FILES, write_prompt_files
from vgrpo_rewards.moving_shapes.track import centroid_track, displacement, score_clip
from vgrpo_rewards.shapes.world import COLORS, SHAPES

from vgrpo_platform.protocols import Samples


def test_enumeration_counts_and_parse_inverts_every_prompt() -> None:
    specs = w.all_specs()
    singles = len(COLORS) * len(SHAPES) * len(w.MOTIONS)
    objects = [(c, s) for c in COLORS for s in SHAPES]
    pairs = sum(a[0] != b[0] for i, a in enumerate(objects) for b in objects[i + 1 :]) * len(w.MOTIONS) ** 2
    prompts = w.all_prompts()
    assert len(specs) == singles + pairs == len(set(prompts))
    for spec in specs:
        assert w.parse_prompt(spec.to_prompt()) == spec


def test_parse_examples_and_rejections() -> None:
    spec = w.parse_prompt("  A red Square moving LEFT while a blue circle rises. ")
    assert spec.objects == (w.MovingObject("red", "square", "left"), w.MovingObject("blue", "circle", "up"))
    assert spec.to_prompt() == "a red square moving left while a blue circle rises"
    assert w.parse_prompt("a green triangle falls").objects[0].motion == "down"
    for bad in [
        "a red square",
        "a red square jumps",
        "a red square rises while a red circle falls",
        "two red squares rises",
    ]:
        with pytest.raises(ValueError):
            w.parse_prompt(bad)


def test_split_is_a_deterministic_compositional_partition() -> None:
    train, held = w.split_prompts()
    assert (train, held) == w.split_prompts() and held
    assert set(train).isdisjoint(held) and sorted(train + held) == sorted(w.all_prompts())
    pairs = w.heldout_pairs()
    assert len({s for s, _ in pairs}) == len({m for _, m in pairs}) == 2

    def shown(prompt: str) -> set[tuple[str, str]]:
        return {(o.shape, o.motion) for o in w.parse_prompt(prompt).objects}

    two = [p for p in train if len(w.parse_prompt(p).objects) == 2]
    assert not any(shown(p) & pairs for p in two)  # train never shows a held-out pair beside another object
    assert all(len(w.parse_prompt(p).objects) == 2 and shown(p) & pairs for p in held)
    assert pairs <= set().union(*(shown(p) for p in train))  # ... but shows each alone
    seen_in_pairs = set().union(*(shown(p) for p in two))
    assert {m for _, m in seen_in_pairs} == set(w.MOTIONS) and {s for s, _ in seen_in_pairs} == set(SHAPES)
    assert w.split_prompts(n_heldout_pairs=0)[1] == []


def test_committed_prompt_files_are_the_split(tmp_path: Path) -> None:
    written = write_prompt_files(tmp_path)
    root = Path(__file__).resolve().parents[1] / "recipes" / "prompts"
    for path, name in zip(written, FILES, strict=True):
        assert path.read_text() == (root / name).read_text()
    assert (root / FILES[1]).read_text().splitlines() == w.heldout_prompts()


def test_renderer_is_deterministic_and_moves_objects_the_prompt_way() -> None:
    prompt = "a red square moving left while a blue circle rises"
    clip = w.render(prompt, 3)
    assert clip.shape == (w.DEFAULT_FRAMES, 32, 32, 3) and clip.dtype == np.uint8
    assert np.array_equal(clip, w.render(prompt, 3)) and not np.array_equal(clip, w.render(prompt, 4))
    red, blue = centroid_track(clip, "red"), centroid_track(clip, "blue")
    assert red is not None and blue is not None
    (rdx, rdy), (bdx, bdy) = displacement(red), displacement(blue)
    assert rdx < -7 and abs(rdy) < 0.5 and bdy < -7 and abs(bdx) < 0.5
    assert (clip.reshape(-1, 3).max(-1) == 0).mean() > 0.5  # black background


def test_rendered_clips_of_their_prompt_are_correct() -> None:
    rng = np.random.default_rng(0)
    prompts = w.all_prompts()
    for k, i in enumerate(rng.permutation(len(prompts))[:60]):
        spec = w.parse_prompt(prompts[i])
        assert score_clip(w.render(spec, k), spec)["correct"] == 1.0, prompts[i]


def _as_samples(*clips: np.ndarray) -> Samples:
    """uint8 ``[F, H, W, 3]`` clips -> video ``Samples`` ``[B, F, 3, H, W]`` in [0, 1]."""
    data = torch.from_numpy(np.stack(clips)).permute(0, 1, 4, 2, 3).float() / 255
    return Samples("video", data, fps=8.0)


def test_reward_fails_exactly_the_criterion_that_is_wrong() -> None:
    reward = MovingShapesReward(Config(objective="product"))
    asked = "a red square moving left while a blue circle rises"
    rendered = {
        "right": asked,
        "motion": "a red square moving right while a blue circle rises",
        "color": "a green square moving left while a blue circle rises",
        "shape": "a red triangle moving left while a blue circle rises",
        "count": "a red square moving left",
    }
    scores = reward.score(_as_samples(*(w.render(p, 1) for p in rendered.values())), [asked] * 5, [{}] * 5)
    by_case = {case: {k: float(v[i]) for k, v in scores.items()} for i, case in enumerate(rendered)}
    assert by_case["right"] == {
        "score": 1.0,
        "color": 1.0,
        "shape": 1.0,
        "count": 1.0,
        "motion": 1.0,
        "correct": 1.0,
    }
    assert by_case["motion"]["motion"] == 0.5 and by_case["motion"]["color"] == 1.0
    assert by_case["color"]["color"] == 0.5 and by_case["color"]["shape"] == 1.0
    assert (
        by_case["shape"]["shape"] == 0.5
        and by_case["shape"]["color"] == 1.0
        and by_case["shape"]["motion"] == 1
    )
    assert by_case["count"]["count"] == 0.5 and by_case["count"]["motion"] == 0.5
    for case in ("motion", "color", "shape", "count"):
        assert by_case[case]["correct"] == 0.0 and 0 <= by_case[case]["score"] < 1.0


def test_a_still_clip_has_no_motion_and_a_blank_one_scores_zero() -> None:
    clip = w.render("a yellow triangle falls", 0)
    still = np.repeat(clip[:1], len(clip), axis=0)
    reward = MovingShapesReward(Config())
    prompts = ["a yellow triangle falls"] * 2
    scores = reward.score(_as_samples(still, np.zeros_like(clip)), prompts, [{}] * 2)
    assert scores["motion"].tolist() == [0.0, 0.0] and scores["color"][0] == 1.0
    assert scores["correct"].tolist() == [0.0, 0.0] and scores["count"][1] == 0.0


def test_reward_rejects_images() -> None:
    with pytest.raises(ValueError, match=r"clips \[B, F, 3, H, W\]"):
        MovingShapesReward(Config()).score(
            Samples("image", torch.zeros(1, 3, 32, 32)), ["a red square rises"], [{}]
        )
