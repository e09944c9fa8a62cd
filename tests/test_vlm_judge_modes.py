"""``vlm_judge``'s Soft-TIFA mode (``vqa``: one yes/no question per atom of the prompt's metadata, the mean
P(yes)) and its edit mode (source image and result in one request), against the fake judge of
``fake_judge.py``, whose answers here depend on the question asked and on both images sent."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from fake_judge import MODEL, FakeJudge, one_line_error, reply, serving
from PIL import Image
from pydantic import ValidationError
from vgrpo_rewards.vlm_judge import Config, build
from vgrpo_rewards.vlm_judge.atoms import questions

from vgrpo_platform.errors import RewardError
from vgrpo_platform.protocols import Samples

COUNTING = {
    "tag": "counting",
    "include": [{"class": "dog", "count": 2}],
    "exclude": [{"class": "dog", "count": 3}],
}
POSITION = {
    "tag": "position",
    "include": [{"class": "bench", "count": 1}, {"class": "cat", "count": 1, "position": ["left of", 0]}],
}
COLOR_ATTR = {"tag": "color_attr", "include": [{"class": "apple", "count": 1, "color": "red"},
                                               {"class": "cup", "count": 1, "color": "blue"}]}  # fmt: skip


@pytest.fixture(scope="module")
def server():
    app = FakeJudge()
    with serving(app) as url:
        yield app, url


@pytest.fixture
def judge(server):
    app, url = server
    app.reset()
    return app, f"{url}/v1"


def yes(p: float) -> tuple[int, dict]:
    """A reply whose first token is "Yes" with probability ``p`` (and "No" with the rest)."""
    tops = [{"token": "Yes", "logprob": math.log(p)}, {"token": "No", "logprob": math.log(1 - p)}]
    return reply("Yes", logprobs={"content": [{**tops[0], "top_logprobs": tops}]})


def question_of(body: dict) -> str:
    text = body["messages"][-1]["content"][-1]["text"]
    return text.split("Question: ", 1)[1]


def test_atom_questions_from_genevals_metadata():
    assert questions({"include": [{"class": "apple", "count": 1}]}) == ["Is there an apple in the image?"]
    assert questions(COUNTING) == ["Are there exactly two dogs in the image?"]
    assert questions(POSITION) == [
        "Is there a bench in the image?",
        "Is there a cat in the image?",
        "Is the cat to the left of the bench?",
    ]
    assert questions(COLOR_ATTR) == [
        "Is there an apple in the image?",
        "Is the apple red?",
        "Is there a cup in the image?",
        "Is the cup blue?",
    ]
    assert questions({"questions": ["Is it raining?"], "include": []}) == ["Is it raining?"]
    for bad in (
        {},
        {"questions": []},
        {"questions": ["ok", 3]},
        {"include": [{"class": "dog", "color": "teal"}]},
    ):
        with pytest.raises(ValueError):
            questions(bad)


@pytest.mark.parametrize("aggregate", ["mean", "geometric"])
def test_vqa_scores_the_mean_of_the_atoms_yes_probabilities(judge, aggregate):
    app, url = judge
    answers = {
        "Is there a bench in the image?": 0.9,
        "Is there a cat in the image?": 0.8,
        "Is the cat to the left of the bench?": 0.1,
        "Are there exactly two dogs in the image?": 0.6,
    }
    app.override = lambda body: yes(answers[question_of(body)])
    reward = build(
        Config(base_url=url, model=MODEL, mode="vqa", score_rule="yes_probability", vqa_aggregate=aggregate),
        None,
    )
    samples = Samples("image", torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0)))
    out = reward.score(samples, ["a cat left of a bench", "two dogs"], [POSITION, COUNTING])
    first = [0.9, 0.8, 0.1]
    expected = sum(first) / 3 if aggregate == "mean" else math.prod(first) ** (1 / 3)
    torch.testing.assert_close(out["score"], torch.tensor([expected, 0.6]))
    torch.testing.assert_close(out["min_atom"], torch.tensor([0.1, 0.6]))
    assert out["atoms"].tolist() == [3.0, 1.0]
    assert sorted(question_of(r["body"]) for r in app.requests) == sorted(answers)
    assert all(r["body"]["top_logprobs"] == 20 and r["body"]["max_tokens"] == 1 for r in app.requests)


def test_vqa_without_atoms_in_the_metadata_is_one_line(judge):
    _, url = judge
    reward = build(Config(base_url=url, model=MODEL, mode="vqa", score_rule="yes_probability"), None)
    with pytest.raises(RewardError) as err:
        reward.score(Samples("image", torch.rand(1, 3, 8, 8)), ["a dog"], [{}])
    one_line_error(err, "prompt 'a dog'", "no 'questions' list", "make_prompts")


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"mode": "vqa"}, "set score_rule 'yes_probability'"),
        ({"mode": "vqa", "score_rule": "yes_probability", "prompt_template": "{prompt}?"}, "{question}"),
        ({"mode": "vqa", "score_rule": "yes_probability", "vqa_aggregate": "median"}, "vqa_aggregate"),
        ({"mode": "edit", "prompt_template": "no placeholder"}, "{prompt}"),
    ],
)
def test_invalid_mode_options_are_refused(options, fragment):
    with pytest.raises(ValidationError, match=fragment.replace("{", r"\{").replace("}", r"\}")):
        Config(base_url="http://127.0.0.1:1/v1", model=MODEL, **options)


def brightness_of(url: str) -> float:
    import base64
    import io

    raw = base64.b64decode(url.split(",", 1)[1])
    return float(np.asarray(Image.open(io.BytesIO(raw)).convert("RGB"), dtype=np.float64).mean() / 255)


def edit_answer(rule: str):
    """The fake judge's edit verdict: 1 - |brightness(source) - brightness(result)| (how much was kept),
    times 0.5 when the source came second (so the order sent is checked too)."""

    def answer(body: dict) -> tuple[int, dict]:
        parts = body["messages"][-1]["content"]
        urls = [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]
        assert len(urls) == 2 and "first image is a source" in parts[-1]["text"]
        src, res = (brightness_of(u) for u in urls)
        kept = 1 - abs(src - res) if src <= res else 0.5 * (1 - abs(src - res))
        return yes(kept) if rule == "yes_probability" else reply(f"{10 * kept:.6f}")

    return answer


@pytest.mark.parametrize("rule", ["number", "yes_probability"])
def test_edit_mode_sends_the_source_then_the_result(judge, rule, tmp_path):
    app, url = judge
    app.override = edit_answer(rule)
    reward = build(Config(base_url=url, model=MODEL, mode="edit", score_rule=rule), None)
    source = torch.full((3, 12, 12), 0.2)
    result = torch.stack([torch.full((3, 12, 12), 0.4), torch.full((3, 12, 12), 0.8)])
    Image.fromarray(np.full((12, 12, 3), 51, np.uint8)).save(tmp_path / "src.png")  # 51 / 255 = 0.2
    metadata = [{"condition_image": source}, {"image": str(tmp_path / "src.png")}]
    out = reward.score(
        Samples("image", result), ["make it a bit brighter", "make it much brighter"], metadata
    )
    expected = torch.tensor([1 - (102 - 51) / 255, 1 - (204 - 51) / 255])  # after the 8-bit PNG rounding
    torch.testing.assert_close(out["score"], expected, atol=1e-5, rtol=0)
    texts = [r["body"]["messages"][-1]["content"][-1]["text"] for r in app.requests]
    assert any('"make it much brighter"' in t for t in texts)
    json.dumps([r["body"] for r in app.requests])  # the requests are plain JSON


def test_edit_mode_without_a_source_names_the_fix(judge, tmp_path):
    _, url = judge
    reward = build(Config(base_url=url, model=MODEL, mode="edit"), None)
    samples = Samples("image", torch.rand(1, 3, 8, 8))
    with pytest.raises(RewardError) as err:
        reward.score(samples, ["add a hat"], [{}])
    one_line_error(err, "no source image", "'image'")
    with pytest.raises(RewardError) as err:
        reward.score(samples, ["add a hat"], [{"image": str(tmp_path / "missing.png")}])
    one_line_error(err, "cannot read the source image", "missing.png")
