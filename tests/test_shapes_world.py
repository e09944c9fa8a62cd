"""The shapes world: grammar round trip, layouts that keep their promises, and the compositional split."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from vgrpo_rewards.shapes import world as w


def test_enumeration_counts_and_uniqueness():
    n_pairs = len(w.COLORS) * len(w.SHAPES)
    expected = (
        n_pairs * len(w.NUMBERS) + n_pairs * (n_pairs - 1) // 2 + n_pairs * (n_pairs - 1) * len(w.RELATIONS)
    )
    prompts = w.all_prompts()
    assert len(prompts) == expected == len(set(prompts))


def test_parse_inverts_to_prompt_on_every_prompt():
    for spec in w.all_specs():
        text = spec.to_prompt()
        assert w.parse_prompt(text) == spec
        assert w.parse_prompt(text).to_prompt() == text


def test_parse_examples_and_tolerance():
    spec = w.parse_prompt("a red circle above a green triangle")
    assert spec == w.SceneSpec((w.ObjectSpec("red", "circle"), w.ObjectSpec("green", "triangle")), "above")
    assert w.parse_prompt("two blue squares") == w.SceneSpec((w.ObjectSpec("blue", "square", 2),))
    assert w.parse_prompt("  A Yellow  circle to the LEFT of a red square. ").relation == "left of"
    # grammar beyond the enumerated set still round-trips
    spec = w.parse_prompt("two red circles and a blue square")
    assert spec.slots() == [("red", "circle"), ("red", "circle"), ("blue", "square")]
    assert spec.to_prompt() == "two red circles and a blue square"


@pytest.mark.parametrize(
    "bad",
    [
        "a purple circle",  # unknown colour
        "a red hexagon",  # unknown shape
        "two red circle",  # number / noun disagree
        "a red circles",
        "a red circle and a red circle",  # identical groups: that is a count
        "two red circles above a blue square",  # relations link single objects
        "three red circles and a blue square",  # too many objects
        "a red circle near a blue square",  # unknown relation
        "",
    ],
)
def test_parse_rejects(bad):
    with pytest.raises(ValueError):
        w.parse_prompt(bad)


def test_relations_are_mutually_exclusive_and_antisymmetric():
    rng = np.random.default_rng(0)
    for a, b in rng.uniform(0, 32, (2000, 2, 2)):
        held = [r for r in w.RELATIONS if w.relation_holds(tuple(a), tuple(b), r)]
        assert len(held) <= 1
        opposite = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
        for r in held:
            assert w.relation_holds(tuple(b), tuple(a), opposite[r])
    # image coordinates: y grows downwards
    assert w.relation_holds((10, 5), (10, 20), "above")
    assert w.relation_holds((5, 10), (20, 10), "left of")


def _box_pixels_inside(box, size):
    x0, y0, x1, y1 = box
    return 1 <= x0 and 1 <= y0 and x1 <= size - 1 and y1 <= size - 1


@pytest.mark.parametrize("size", [32, 48])
def test_layout_keeps_its_promises(size):
    rng = np.random.default_rng(1)
    specs = w.all_specs()
    for i in rng.choice(len(specs), 300, replace=False):
        spec = specs[i]
        objs = w.layout(spec, rng, size)
        assert [(c, s) for c, s, _ in objs] == spec.slots()
        for _, _, (x0, y0, x1, y1) in objs:
            side = x1 - x0
            assert side == y1 - y0 and 0.3 * size - 1 <= side <= 0.42 * size + 1
            assert _box_pixels_inside((x0, y0, x1, y1), size)
        for (_, _, p), (_, _, q) in itertools.combinations(objs, 2):  # >= 2 px apart along some axis
            assert p[2] + 2 <= q[0] or q[2] + 2 <= p[0] or p[3] + 2 <= q[1] or q[3] + 2 <= p[1]
        if spec.relation is not None:
            ca, cb = (w.shape_centroid(s, b) for _, s, b in objs)
            assert w.relation_holds(ca, cb, spec.relation, dominance=2.0)


def test_render_paints_each_object_in_its_colour_on_black():
    for prompt in [
        "a red circle above a green triangle",
        "three yellow squares",
        "a blue triangle and a red square",
    ]:
        spec = w.parse_prompt(prompt)
        objs = w.layout(spec, np.random.default_rng(7))
        img = np.asarray(w.render(spec, np.random.default_rng(7)))  # same seed -> same layout
        assert img.shape == (32, 32, 3) and img.dtype == np.uint8
        covered = np.zeros((32, 32), bool)
        for color, shape, (x0, y0, x1, y1) in objs:
            cx, cy = w.shape_centroid(shape, (x0, y0, x1, y1))
            assert tuple(img[int(cy), int(cx)]) == w.COLORS[color]  # interior pixel, exact colour
            covered[int(y0) : int(y1), int(x0) : int(x1)] = True
        assert (img[~covered] == 0).all()  # nothing painted outside the boxes


def pairs_in(prompt: str) -> set[tuple[str, str]]:
    """The colour-shape pairs a prompt names."""
    return {(o.color, o.shape) for o in w.parse_prompt(prompt).objects}


def test_split_is_a_deterministic_compositional_partition():
    train, held = w.split_prompts()
    assert (train, held) == (w.train_prompts(), w.heldout_prompts())
    assert set(train).isdisjoint(held) and sorted(train + held) == sorted(w.all_prompts())
    pairs = w.heldout_pairs()
    assert len(pairs) == 2
    assert len({c for c, _ in pairs}) == len({s for _, s in pairs}) == len(pairs)

    def two_object(prompt):
        return len(w.parse_prompt(prompt).objects) == 2

    # the rule: train never shows a held-out pair in a two-object prompt; every held-out prompt does
    assert not any(two_object(p) and pairs_in(p) & pairs for p in train)
    assert all(two_object(p) and pairs_in(p) & pairs for p in held)
    # ... while train still shows each held-out pair alone, and every colour, shape and relation in
    # two-object prompts
    assert pairs <= set().union(*(pairs_in(p) for p in train if not two_object(p)))
    train2 = [w.parse_prompt(p) for p in train if two_object(p)]
    assert {o.color for s in train2 for o in s.objects} == set(w.COLORS)
    assert {o.shape for s in train2 for o in s.objects} == set(w.SHAPES)
    assert {s.relation for s in train2} == set(w.RELATIONS) | {None}
    assert held, "the held-out split must not be empty"


def test_split_depends_on_seed_and_size():
    assert w.heldout_pairs(0) == w.heldout_pairs(0)
    assert len({w.heldout_pairs(s) for s in range(10)}) > 1
    train, held = w.split_prompts(n_heldout_pairs=0)
    assert held == [] and len(train) == len(w.all_prompts())
    with pytest.raises(ValueError):
        w.heldout_pairs(0, 4)


def test_partner_split_keeps_evaluated_partners_out_of_rl_and_matches_the_shipped_files():
    rl, evaluation = w.heldout_partner_split()
    held = w.heldout_pairs()
    assert sorted(rl + evaluation) == sorted(w.heldout_prompts()) and set(rl).isdisjoint(evaluation)

    def meetings(prompt: str) -> set[tuple[tuple[str, str], tuple[str, str]]]:
        """(held-out pair, partner) for each held-out pair the prompt shows beside another object."""
        pairs = pairs_in(prompt)
        return {(h, p) for h in pairs & held for p in pairs - held}

    met_in_rl = set().union(*map(meetings, rl))
    assert met_in_rl  # RL does show the held-out pairs with partners
    for prompt in evaluation:  # a held-out pair never meets, in evaluation, a partner RL showed it with
        assert not meetings(prompt) & met_in_rl
    root = Path(__file__).resolve().parents[1] / "recipes" / "prompts"
    assert sorted((root / "shapes_heldout_rl.txt").read_text().splitlines()) == sorted(rl)
    assert sorted((root / "shapes_heldout_eval.txt").read_text().splitlines()) == sorted(evaluation)
