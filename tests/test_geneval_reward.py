"""The ``geneval`` reward: GenEval's rules on hand-drawn scenes with known answers (a test double only
behind the detector interface; colours named by the real pixel rule), the rules' edge cases, the real
transformers detectors loaded from tiny saved checkpoints, and the reward through ``vgrpo serve-reward``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fake_judge import serving
from tiny_detectors import OracleDetector, Thing, draw, save_mask2former, save_owlv2
from vgrpo_rewards.geneval import Config
from vgrpo_rewards.geneval.impl import GenEvalReward
from vgrpo_rewards.geneval.rules import Detection, Thresholds, keep, relations

from vgrpo_platform.errors import RewardError
from vgrpo_platform.host.collect import default_registry
from vgrpo_platform.protocols import BuildContext, Samples

RED, BLUE, GREEN, WHITE = (230, 20, 20), (20, 30, 230), (10, 140, 20), (250, 250, 250)
DOG_LEFT = Thing("dog", WHITE, (4, 30, 34, 60))
CAT_RIGHT = Thing("cat", BLUE, (60, 30, 90, 60))


def one(cls, **kw):
    return {"class": cls, "count": 1, **kw}


CASES = [  # (what is drawn, metadata, GenEval's verdict, Flow-GRPO's graded score)
    ([DOG_LEFT], {"tag": "single_object", "include": [one("dog")]}, 1, 1.0),
    ([DOG_LEFT], {"tag": "single_object", "include": [one("cat")]}, 0, 0.0),
    ([DOG_LEFT, CAT_RIGHT], {"tag": "two_object", "include": [one("dog"), one("cat")]}, 1, 1.0),
    ([DOG_LEFT], {"tag": "two_object", "include": [one("dog"), one("cat")]}, 0, 0.5),
    # position: the cat right of the dog (the dog is clause 0, the target)
    (
        [DOG_LEFT, CAT_RIGHT],
        {"tag": "position", "include": [one("dog"), one("cat", position=["right of", 0])]},
        1,
        1.0,
    ),
    (
        [DOG_LEFT, CAT_RIGHT],
        {"tag": "position", "include": [one("dog"), one("cat", position=["left of", 0])]},
        0,
        2 / 3,
    ),
    (
        [DOG_LEFT, CAT_RIGHT],
        {"tag": "position", "include": [one("dog"), one("cat", position=["above", 0])]},
        0,
        2 / 3,
    ),
    # colours, named from the pixels
    (
        [Thing("car", RED, (20, 20, 70, 60), shape="rectangle")],
        {"tag": "colors", "include": [one("car", color="red")]},
        1,
        1.0,
    ),
    (
        [Thing("car", RED, (20, 20, 70, 60), shape="rectangle")],
        {"tag": "colors", "include": [one("car", color="blue")]},
        0,
        0.5,
    ),
    # colour attribution: a red cup and a green bowl, asked right and swapped
    (
        [Thing("cup", RED, (4, 10, 40, 50)), Thing("bowl", GREEN, (50, 10, 92, 50))],
        {"tag": "color_attr", "include": [one("cup", color="red"), one("bowl", color="green")]},
        1,
        1.0,
    ),
    (
        [Thing("cup", RED, (4, 10, 40, 50)), Thing("bowl", GREEN, (50, 10, 92, 50))],
        {"tag": "color_attr", "include": [one("cup", color="green"), one("bowl", color="red")]},
        0,
        0.5,
    ),
]
TWO_PETS = {"tag": "two_object", "include": [one("dog"), one("cat")]}
TWO = [Thing("apple", RED, (4, 30, 30, 56)), Thing("apple", RED, (40, 30, 66, 56))]
THREE = [*TWO, Thing("apple", RED, (70, 30, 94, 56))]
COUNT_TWO = {
    "tag": "counting",
    "include": [{"class": "apple", "count": 2}],
    "exclude": [{"class": "apple", "count": 3}],
}
CASES += [
    (TWO, COUNT_TWO, 1, 1.0),
    (THREE, COUNT_TWO, 0, 0.5),  # one too many: the exclude clause fails; graded 1 - |2 - 3| / 2
    ([TWO[0]], COUNT_TWO, 0, 0.5),
    # an unsure duplicate (0.5) is dropped at the counting threshold 0.9, so two stay
    ([*TWO, Thing("apple", RED, (70, 30, 94, 56), score=0.5)], COUNT_TWO, 1, 1.0),
    # ... but it counts as an object under the 0.3 threshold of other tags
    ([DOG_LEFT, Thing("cat", BLUE, (60, 30, 90, 60), score=0.5)], TWO_PETS, 1, 1.0),
    ([DOG_LEFT, Thing("cat", BLUE, (60, 30, 90, 60), score=0.2)], TWO_PETS, 0, 0.5),
]  # fmt: skip


def reward(objective: str = "strict", **options) -> tuple[GenEvalReward, OracleDetector]:
    oracle = OracleDetector()
    config = Config(color="pixels", objective=objective, **options)
    return GenEvalReward(config, BuildContext(), detector=oracle), oracle


def batch(cases, oracle: OracleDetector) -> tuple[Samples, list[str], list[dict]]:
    images = []
    for i, (things, _meta, *_) in enumerate(cases):
        image, dets = draw(things)
        image[0, 0] = (i, 0, 0)  # a background pixel tells apart scenes drawn alike but detected unalike
        oracle.add(image, dets)
        images.append(image)
    data = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255  # [B, 3, H, W]
    metadata = [{"prompt": f"case {i}", **c[1]} for i, c in enumerate(cases)]
    return Samples("image", data), [m["prompt"] for m in metadata], metadata


@pytest.mark.parametrize("objective", ["strict", "graded"])
def test_hand_drawn_scenes_get_genevals_verdict_and_the_graded_score(objective):
    scorer, oracle = reward(objective)
    samples, prompts, metadata = batch(CASES, oracle)
    out = scorer.score(samples, prompts, metadata)
    correct = torch.tensor([float(c[2]) for c in CASES])
    graded = torch.tensor([c[3] for c in CASES])
    torch.testing.assert_close(out["correct"], correct)
    torch.testing.assert_close(out["graded"], graded)
    torch.testing.assert_close(out["score"], correct if objective == "strict" else graded)
    assert sorted(oracle.asked[0]) == sorted({"dog", "cat", "car", "cup", "bowl", "apple"})


def test_per_criterion_diagnostics_name_what_failed():
    scorer, oracle = reward()
    picked = [CASES[3], CASES[5], CASES[8], (THREE, COUNT_TWO, 0, 0.5)]
    out = scorer.score(*batch(picked, oracle))
    assert out["presence"].tolist() == [0.5, 1.0, 1.0, 1.0]  # the cat is missing from the first
    assert out["count"].tolist() == [0.5, 1.0, 1.0, 1.0]
    assert out["position"].tolist() == [1.0, 0.0, 1.0, 1.0]  # asked only of the second
    assert out["color"].tolist() == [1.0, 1.0, 0.0, 1.0]  # the red car asked to be blue
    assert out["exclude"].tolist() == [1.0, 1.0, 1.0, 0.0]  # three apples for "two"


def test_relations_follow_genevals_margin_rule():
    a, b = (0, 0, 10, 10), (30, 0, 40, 10)
    assert relations(a, b, 0.1) == {"left of"} and relations(b, a, 0.1) == {"right of"}
    assert relations((0, 0, 10, 10), (0, 30, 10, 40), 0.1) == {"above"}
    # centres 6 apart, boxes 20 + 20 wide: the 0.1 margin (4 px) leaves 2 px, under half the offset
    assert relations((0, 0, 20, 10), (6, 0, 26, 10), 0.1) == set()
    assert relations((0, 0, 20, 10), (6, 0, 26, 10), 0.0) == {"left of"}
    # a diagonal offset is both "left of" and "above"
    assert relations((0, 0, 10, 10), (40, 40, 50, 50), 0.1) == {"left of", "above"}


def test_keep_ranks_caps_and_optionally_suppresses_overlaps():
    dets = [Detection("cup", s, (0, 0, 10, 10)) for s in (0.4, 0.95, 0.6)] + [
        Detection("cup", 0.8, (50, 0, 60, 10))
    ]
    kept = keep(dets, "single_object", Thresholds())
    assert [d.score for d in kept["cup"]] == [0.95, 0.8, 0.6, 0.4]  # GenEval keeps overlaps (limit 1.0)
    assert [d.score for d in keep(dets, "counting", Thresholds())["cup"]] == [0.95]
    assert [d.score for d in keep(dets, None, Thresholds(max_overlap=0.5))["cup"]] == [0.95, 0.8]
    assert len(keep(dets, None, Thresholds(max_objects=2))["cup"]) == 2


@pytest.mark.parametrize(
    ("meta", "fragment"),
    [
        ({}, "no 'include' list"),
        ({"include": [{"class": "dog", "count": 0}]}, "include[0].count must be a whole number >= 1"),
        ({"include": [{"class": "dog", "color": "teal"}]}, "include[0].color 'teal' is not one of"),
        ({"include": [one("dog", position=["left of", 0])]}, "it must be an earlier one"),
        ({"include": [one("dog"), one("cat", position=["beside", 0])]}, "position must be [relation"),
    ],
)
def test_bad_metadata_is_one_line_naming_the_fix(meta, fragment):
    scorer, _ = reward()
    samples = Samples("image", torch.rand(1, 3, 16, 16))
    with pytest.raises(RewardError) as err:
        scorer.score(samples, ["a dog"], [meta])
    message = str(err.value)
    assert fragment in message and "make_prompts" in message and "\n" not in message


def test_options_fill_detector_defaults_and_refuse_bad_values():
    m2f, owl = Config(), Config(detector="owlv2")
    assert (m2f.threshold, m2f.counting_threshold, m2f.max_overlap) == (0.3, 0.9, 1.0)
    assert m2f.model == "facebook/mask2former-swin-small-coco-instance"
    assert owl.model == "google/owlv2-base-patch16-ensemble" and owl.max_overlap == 0.5
    assert Config(detector="owlv2", threshold=0.2).threshold == 0.2
    for bad in ({"detector": "yolo"}, {"threshold": 1.5}, {"objective": "soft"}, {"colour": "clip"}):
        with pytest.raises(ValueError):
            Config(**bad)


def test_missing_weights_name_the_download_command():
    registry = default_registry()
    with pytest.raises(RewardError) as err:
        registry.build("reward", "geneval", {"model": "/nonexistent/m2f", "color": "pixels"}, BuildContext())
    assert "huggingface-cli download facebook/mask2former-swin-small-coco-instance" in str(err.value)


@pytest.mark.parametrize("detector", ["mask2former", "owlv2"])
def test_real_detector_classes_load_from_tiny_checkpoints_and_score(detector, tmp_path):
    """A random tiny model's answers mean nothing: this checks loading, the processors, the post-processing
    and GenEval's CLIP colour rule end to end, and the output's form."""
    from tiny_clip import save_clip

    folder = (save_mask2former if detector == "mask2former" else save_owlv2)(tmp_path / detector)
    clip = save_clip(tmp_path / "clip")
    options = {
        "detector": detector, "model": str(folder), "clip_model": str(clip), "threshold": 0.0,
        "counting_threshold": 0.0, "objective": "graded",
    }  # fmt: skip
    scorer = default_registry().build("reward", "geneval", options, BuildContext())
    data = torch.rand(3, 3, 40, 56, generator=torch.Generator().manual_seed(0))
    metadata = [
        {"tag": "colors", "include": [one("computer mouse", color="red")]},
        {"tag": "counting", "include": [{"class": "person", "count": 2}],
         "exclude": [{"class": "person", "count": 3}]},
        {"tag": "position", "include": [one("dog"), one("cat", position=["left of", 0])]},
    ]  # fmt: skip
    dets = scorer.detector.detect((data * 255).byte().permute(0, 2, 3, 1).numpy(), ["dog", "cat"], 0.0)
    assert len(dets) == 3 and all(isinstance(d, Detection) for row in dets for d in row)
    for d in (d for row in dets for d in row):
        x0, y0, x1, y1 = d.box
        assert 0 <= x0 <= x1 <= 56 and 0 <= y0 <= y1 <= 40
        assert d.mask is None or d.mask.shape == (40, 56)
    out = scorer.score(Samples("image", data), ["a", "b", "c"], metadata)
    assert set(out) == {"score", "correct", "graded", "presence", "count", "color", "position", "exclude"}
    for value in out.values():
        assert value.shape == (3,) and bool(((value >= 0) & (value <= 1)).all())


def test_mask2former_without_a_class_names_the_fix(tmp_path):
    folder = save_mask2former(tmp_path / "m2f")
    scorer = default_registry().build(
        "reward", "geneval", {"model": str(folder), "color": "pixels"}, BuildContext()
    )
    with pytest.raises(RewardError, match="has no class 'unicorn'.*detector = 'owlv2'"):
        scorer.score(
            Samples("image", torch.rand(1, 3, 32, 32)), ["a unicorn"], [{"include": [one("unicorn")]}]
        )


def test_geneval_passes_through_serve_reward_unchanged():
    from vgrpo_rewards.remote import Config as RemoteConfig
    from vgrpo_rewards.remote import build as build_remote

    from vgrpo_platform.cli.reward_server import RewardApp

    here, oracle = reward("graded")
    samples, prompts, metadata = batch(CASES, oracle)
    expected = here.score(samples, prompts, metadata)
    with serving(RewardApp("geneval", here)) as url:
        client = build_remote(RemoteConfig(url=url, reward="geneval", batch_size=5), None)
        got = client.score(samples, prompts, metadata)
    assert set(got) == set(expected)
    for k in expected:
        assert torch.equal(got[k].cpu(), expected[k].cpu()), k


def test_the_committed_prompt_set_is_what_the_script_writes(tmp_path):
    """GenEval's procedure at its seed 43: its 553 prompts, each line valid metadata for the reward."""
    import json
    from collections import Counter
    from pathlib import Path

    from vgrpo_rewards.geneval import make_prompts
    from vgrpo_rewards.geneval.rules import parse_spec

    committed = Path(__file__).parent.parent / "recipes" / "prompts" / "geneval.jsonl"
    out = tmp_path / "geneval.jsonl"
    assert make_prompts.main(["--out", str(out)]) == 0
    assert out.read_text() == committed.read_text()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 553 and len({r["prompt"] for r in rows}) == 553
    tags = Counter(r["tag"] for r in rows)
    assert tags["single_object"] == 80 and set(tags) == {
        "single_object", "two_object", "counting", "colors", "position", "color_attr"
    }  # fmt: skip
    for row in rows:
        spec = parse_spec(row)
        assert all(c.color is None for c in spec.include if c.cls == "person")
    counting = next(r for r in rows if r["tag"] == "counting")
    assert counting["exclude"][0]["count"] == counting["include"][0]["count"] + 1
    train = tmp_path / "train.jsonl"
    make_prompts.main(["--out", str(train), "--seed", "0", "--per-task", "20", "--exclude", str(out)])
    train_prompts = {json.loads(line)["prompt"] for line in train.read_text().splitlines()}
    assert train_prompts and not train_prompts & {r["prompt"] for r in rows}


def test_the_shipped_geneval_recipe_passes_check_with_flow_grpos_settings():
    from pathlib import Path

    from vgrpo_platform.config.recipe import resolve_recipe

    resolved = resolve_recipe(Path(__file__).parent.parent / "recipes" / "sd35_geneval.toml")
    r = resolved.recipe
    assert resolved.adapter.config.cfg_scale == 4.5 and resolved.adapter.config.resolution == 512
    assert (r.rollout.group_size, r.rollout.steps, r.eval.steps, r.grpo.std) == (24, 10, 40, "global")
    assert r.rewards[0].name == "geneval" and r.rewards[0].options["objective"] == "graded"
    assert len(resolved.train_prompts) > 1000 and len(resolved.eval_prompts) == 553


def test_the_detector_comparison_script_runs_on_a_geneval_layout(tmp_path):
    """``benchmarks/geneval_detectors.py`` on two tiny random detectors (their verdicts mean nothing): the
    layout is read, every image gets each detector's verdict, agreement and kappa are computed."""
    import json

    from PIL import Image

    from benchmarks.geneval_detectors import kappa, main

    assert kappa([1, 0, 1, 0], [1, 0, 1, 0]) == 1.0 and kappa([1, 1, 0, 0], [0, 0, 1, 1]) == -1.0
    for i, meta in enumerate([{"tag": "single_object", "include": [one("dog")]}, COUNT_TWO]):
        folder = tmp_path / "images" / f"{i:05d}"
        (folder / "samples").mkdir(parents=True)
        (folder / "metadata.jsonl").write_text(json.dumps({"prompt": f"p{i}", **meta}) + "\n")
        for k in range(2):
            Image.fromarray(draw([DOG_LEFT] if k else TWO)[0]).save(folder / "samples" / f"{k:04d}.png")
    m2f, owl = save_mask2former(tmp_path / "m2f"), save_owlv2(tmp_path / "owl")
    out = tmp_path / "agreement.json"
    summary = main(
        [str(tmp_path / "images"), "--out", str(out), "--color", "pixels",
         "--detector", f"mask2former={m2f}", "--detector", f"owlv2={owl}"]
    )  # fmt: skip
    record = json.loads(out.read_text())
    assert summary["images"] == 4 and len(record["images"]) == 4
    assert set(record["summary"]["score"]) == {"mask2former", "owlv2"}
    pair = record["summary"]["pairs"]["mask2former|owlv2"]
    assert 0 <= pair["agreement"] <= 1 and -1 <= pair["kappa"] <= 1
