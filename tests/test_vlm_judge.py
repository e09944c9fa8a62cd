"""The ``vlm_judge`` reward against a fake OpenAI-compatible judge on loopback (``tests/fake_judge.py``):
the requests it sends (model, PNG data URLs of the right size, the prompt in the text), the three ways it
reads an answer (a number, P(yes), a group's list of numbers), concurrency, and a one-line
``RewardError`` naming the fix for every way a server or an answer can fail. Bounded waits only."""

from __future__ import annotations

import base64
import io
import math
import time

import pytest
import torch
from fake_judge import (
    DATA_URL,
    MODEL,
    FakeJudge,
    one_line_error,
    p_no,
    p_yes,
    reply,
    serving,
    unused_port_url,
)
from PIL import Image
from pydantic import ValidationError
from vgrpo_rewards.vlm_judge import (
    GROUPWISE_NUMBER_TEMPLATE,
    POINTWISE_NUMBER_TEMPLATE,
    POINTWISE_YES_TEMPLATE,
    Config,
    build,
)

from vgrpo_platform.errors import RewardError
from vgrpo_platform.host.collect import default_registry
from vgrpo_platform.protocols import Samples

PROMPTS = ["a red fox in the snow", "a lighthouse at dusk", "a bowl of ramen", "a red fox in the snow"]


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


@pytest.fixture(scope="module")
def samples() -> Samples:
    """Four 24 x 40 images of distinct brightness: flat grey levels and noise."""
    g = torch.Generator().manual_seed(0)
    data = torch.stack(
        [
            torch.full((3, 24, 40), 0.2),
            torch.rand((3, 24, 40), generator=g),
            torch.full((3, 24, 40), 0.9),
            torch.rand((3, 24, 40), generator=g) * 0.5,
        ]
    )
    return Samples("image", data)


def brightness(samples: Samples) -> torch.Tensor:
    """Each image's mean brightness after the 8-bit rounding the PNG applies, what the fake judge sees."""
    return ((samples.data * 255).round() / 255).mean(dim=(1, 2, 3))


def make(url: str, **options) -> object:
    return build(Config(base_url=url, model=MODEL, **options), None)


def score(reward, samples, prompts=PROMPTS):
    return reward.score(samples, list(prompts), [{}] * len(samples))


def decoded(url: str) -> Image.Image:
    assert url.startswith(DATA_URL)
    return Image.open(io.BytesIO(base64.b64decode(url[len(DATA_URL) :])))


# ------------------------------------------------------------------------------- scoring


def test_pointwise_number_is_the_judges_number_normalised(judge, samples):
    app, url = judge
    out = score(make(url), samples)
    expected = brightness(samples)
    assert out.keys() == {"score", "raw"}
    assert torch.allclose(out["score"], expected, atol=1e-5), (out["score"], expected)
    assert torch.allclose(out["raw"], 10 * expected, atol=1e-5)
    assert out["score"].dtype == torch.float32 and len(set(out["score"].tolist())) == 4
    assert len(app.requests) == 4  # one request per image
    by_prompt = sorted((r["texts"][-1], r["brightness"][0]) for r in app.requests)
    want = sorted(
        (POINTWISE_NUMBER_TEMPLATE.format(prompt=p, min_score="0", max_score="10"), float(b))
        for p, b in zip(PROMPTS, expected, strict=True)
    )
    assert [t for t, _ in by_prompt] == [t for t, _ in want]
    for r in app.requests:
        body = r["body"]
        assert body["model"] == MODEL and body["temperature"] == 0.0 and body["max_tokens"] == 512
        assert body["seed"] == 0 and "logprobs" not in body and "top_logprobs" not in body
        assert r["sizes"] == [(40, 24)] and len(r["texts"]) == 1 and r["auth"] is None
        (part,) = [p for p in body["messages"][-1]["content"] if p["type"] == "image_url"]
        image = decoded(part["image_url"]["url"])
        assert image.format == "PNG" and image.size == (40, 24) and image.mode == "RGB"
        assert "on a scale from 0 (worst) to 10 (best)" in r["texts"][0]


def test_number_scale_score_after_and_thinking(judge, samples):
    app, url = judge
    unified = "Alignment: 1, Quality: 0\nFinal Score: 4"
    app.override = lambda body: reply(unified)
    out = score(make(url, min_score=1, max_score=5, score_after="final score:"), samples)
    assert out["score"].tolist() == [0.75] * 4 and out["raw"].tolist() == [4.0] * 4
    out = score(make(url, min_score=1, max_score=5), samples)  # the first number of the reply
    assert out["score"].tolist() == [0.0] * 4
    app.override = lambda body: reply("<think>a 2 or a 9?</think>I give it 7.5 out of 10.")
    assert score(make(url), samples)["score"].tolist() == [0.75] * 4
    app.override = lambda body: reply([{"type": "text", "text": "Score: "}, {"type": "text", "text": "3"}])
    assert score(make(url), samples)["score"].tolist() == pytest.approx([0.3] * 4)


def test_yes_probability_over_the_first_tokens_top_logprobs(judge, samples):
    app, url = judge
    out = score(make(url, score_rule="yes_probability"), samples)
    b = brightness(samples).double()
    expected = p_yes(b) / (p_yes(b) + p_no(b))  # " Yes" and "yes" both count as yes
    assert out.keys() == {"score", "yes_no_mass"}
    assert torch.allclose(out["score"].double(), expected, atol=1e-6)
    assert torch.allclose(out["yes_no_mass"].double(), p_yes(b) + p_no(b), atol=1e-6)
    for r in app.requests:
        body = r["body"]
        assert body["logprobs"] is True and body["top_logprobs"] == 20 and body["max_tokens"] == 1
        assert r["texts"][-1].endswith("Answer Yes or No.")
    assert sorted(r["texts"][-1] for r in app.requests) == sorted(
        POINTWISE_YES_TEMPLATE.replace("{prompt}", p) for p in PROMPTS
    )


def test_groupwise_sends_each_prompts_images_in_one_request(judge, samples):
    app, url = judge
    prompts = ["a fox", "a lighthouse", "a fox", "a fox"]
    out = score(make(url, mode="groupwise"), samples, prompts)
    expected = brightness(samples)
    assert torch.allclose(out["score"], expected, atol=1e-5)
    assert len(app.requests) == 2
    by_count = sorted(app.requests, key=lambda r: len(r["sizes"]))
    lighthouse, fox = by_count
    assert fox["texts"][:3] == ["Image 1:", "Image 2:", "Image 3:"]
    assert fox["texts"][-1] == GROUPWISE_NUMBER_TEMPLATE.replace("{n}", "3").format(
        prompt="a fox", min_score="0", max_score="10"
    )
    assert fox["brightness"] == pytest.approx([float(expected[i]) for i in (0, 2, 3)], abs=1e-6)
    assert lighthouse["texts"][0] == "Image 1:" and "judging 1 AI-generated" in lighthouse["texts"][-1]
    content = fox["body"]["messages"][-1]["content"]
    assert [p["type"] for p in content] == ["text", "image_url"] * 3 + ["text"]
    app.reset()
    app.reply_format = "json"
    assert torch.allclose(score(make(url, mode="groupwise"), samples, prompts)["score"], expected, atol=1e-5)


@pytest.mark.parametrize(
    "text",
    [
        "**Image 1**: 2\n**Image 2**: 5\n**Image 3**: 8",
        "Scores: [2, 5, 8]",
        "2, 5, 8",
        "image #3 = 8, image #1 = 2, image #2 = 5",
    ],
)
def test_groupwise_reply_formats(judge, samples, text):
    app, url = judge
    app.override = lambda body: reply(text)
    three = Samples("image", samples.data[:3])
    out = score(make(url, mode="groupwise"), three, ["p"] * 3)
    assert out["score"].tolist() == pytest.approx([0.2, 0.5, 0.8]) and out["raw"].tolist() == [2, 5, 8]


def test_concurrency_gives_the_serial_results(judge, samples):
    app, url = judge
    app.delay_s = 0.05
    batch = Samples("image", torch.cat([samples.data, samples.data.flip(-1)]))
    serial = score(make(url, concurrency=1), batch, PROMPTS * 2)
    assert app.max_in_flight == 1
    app.max_in_flight = 0
    parallel = score(make(url, concurrency=4), batch, PROMPTS * 2)
    assert app.max_in_flight > 1
    assert torch.equal(serial["score"], parallel["score"]) and torch.equal(serial["raw"], parallel["raw"])
    app.max_in_flight = 0
    groups = score(make(url, mode="groupwise", concurrency=4), batch, PROMPTS * 2)
    assert torch.allclose(groups["score"], serial["score"], atol=1e-6)


def test_image_size_caps_the_longer_side(judge):
    app, url = judge
    reward = make(url, image_size=16)
    big = score(reward, Samples("image", torch.full((1, 3, 20, 40), 0.5)), ["a"])
    small = score(reward, Samples("image", torch.full((1, 3, 8, 12), 0.25)), ["b"])
    assert sorted(tuple(r["sizes"][0]) for r in app.requests) == [(12, 8), (16, 8)]  # the small one as is
    assert [*big["score"].tolist(), *small["score"].tolist()] == pytest.approx(
        [128 / 255, 64 / 255], abs=1e-5
    )


def test_template_placeholders_system_prompt_and_extra_body(judge, samples):
    app, url = judge
    template = 'Rate {prompt} from {min_score} to {max_score} as JSON {"score": x} ({n} image)'
    reward = make(
        url,
        prompt_template=template,
        min_score=1,
        max_score=10,
        system_prompt="You are a strict judge.",
        extra_body={"top_p": 1.0, "chat_template_kwargs": {"enable_thinking": False}},
        seed=None,
        max_tokens=8,
    )
    app.override = lambda body: reply("5.5")
    out = score(reward, Samples("image", samples.data[:1]), ["a fox"])
    assert out["score"].tolist() == [pytest.approx(0.5)]
    (r,) = app.requests
    assert r["texts"] == ['Rate a fox from 1 to 10 as JSON {"score": x} (1 image)']
    body = r["body"]
    assert body["messages"][0] == {"role": "system", "content": "You are a strict judge."}
    assert body["top_p"] == 1.0 and body["chat_template_kwargs"] == {"enable_thinking": False}
    assert "seed" not in body and body["max_tokens"] == 8


def test_api_key_and_api_key_env_are_sent_as_bearer(judge, samples, monkeypatch):
    app, url = judge
    one = Samples("image", samples.data[:1])
    score(make(url, api_key="sk-local"), one, ["a"])
    monkeypatch.setenv("JUDGE_KEY", "sk-from-env")
    score(make(url, api_key_env="JUDGE_KEY"), one, ["a"])
    assert [r["auth"] for r in app.requests] == ["Bearer sk-local", "Bearer sk-from-env"]
    monkeypatch.delenv("JUDGE_KEY")
    with pytest.raises(RewardError) as excinfo:
        make(url, api_key_env="JUDGE_KEY")
    one_line_error(excinfo, "options.api_key_env names JUDGE_KEY, which is not set")


def test_empty_batch_and_wrong_modality(judge):
    _, url = judge
    out = make(url).score(Samples("image", torch.zeros(0, 3, 8, 8)), [], [])
    assert out["score"].shape == (0,) and out["raw"].shape == (0,)
    with pytest.raises(RewardError) as excinfo:
        make(url).score(Samples("audio", torch.zeros(2, 1, 16), sample_rate=16000), ["a", "b"], [{}, {}])
    one_line_error(excinfo, "vlm_judge scores images")


# ------------------------------------------------------------------------------- failures


def test_unreachable_server_names_the_command_to_start_it(samples):
    reward = make(f"{unused_port_url()}/v1", timeout_s=2, retries=2, backoff_s=0.01)
    start = time.monotonic()
    with pytest.raises(RewardError) as excinfo:
        score(reward, samples)
    assert time.monotonic() - start < 10
    one_line_error(
        excinfo, "cannot reach the judge server", "vllm serve", "options.base_url", "after 3 tries"
    )


def test_timeout_names_the_option_to_raise(judge, samples):
    app, url = judge
    app.delay_s = 1.0
    start = time.monotonic()
    with pytest.raises(RewardError) as excinfo:
        score(
            make(url, timeout_s=0.2, retries=1, backoff_s=0.01),
            Samples("image", samples.data[:2]),
            ["a", "b"],
        )
    assert time.monotonic() - start < 5
    one_line_error(
        excinfo, "no reply from the judge server", "within 0.2 s", "options.timeout_s", "after 2 tries"
    )


def test_server_errors_are_retried_then_reported(judge, samples):
    app, url = judge
    one = Samples("image", samples.data[:1])
    app.override = lambda body: (500, {"object": "error", "message": "CUDA out of memory", "code": 500})
    with pytest.raises(RewardError) as excinfo:
        score(make(url, retries=2, backoff_s=0.01), one, ["a"])
    one_line_error(excinfo, "failed (HTTP 500): CUDA out of memory", "after 3 tries")
    assert len(app.requests) == 3
    app.reset()
    answers = [(503, b"busy"), (429, {"error": {"message": "rate limited"}}), None]  # None: the normal one
    app.override = lambda body: answers.pop(0)
    out = score(make(url, retries=2, backoff_s=0.01), one, ["a"])
    assert out["score"].tolist() == pytest.approx(brightness(one).tolist(), abs=1e-5)
    assert not answers and len(app.requests) == 3


@pytest.mark.parametrize(
    "status, body, fragments",
    [
        (401, {"error": {"message": "Unauthorized"}}, ["HTTP 401", "Unauthorized", "options.api_key_env"]),
        (
            400,
            {"object": "error", "message": "At most 1 image(s) may be provided in one request."},
            ["HTTP 400", "At most 1 image(s)", "--limit-mm-per-prompt"],
        ),
        (422, b"<html>unprocessable</html>", ["HTTP 422", "<html>unprocessable</html>", "options.model"]),
    ],
)
def test_client_errors_are_not_retried_and_name_the_fix(judge, samples, status, body, fragments):
    app, url = judge
    app.override = lambda request: (status, body)
    with pytest.raises(RewardError) as excinfo:
        score(make(url, retries=3, backoff_s=0.01), Samples("image", samples.data[:1]), ["a"])
    assert "tries" not in one_line_error(excinfo, "refused the request", *fragments)
    assert len(app.requests) == 1


def test_unknown_model_and_wrong_base_url_name_the_options(judge, samples):
    app, url = judge
    one = Samples("image", samples.data[:1])
    with pytest.raises(RewardError) as excinfo:
        score(build(Config(base_url=url, model="Qwen/Qwen2.5-VL-7B-Instruct"), None), one, ["a"])
    one_line_error(excinfo, "HTTP 404", "does not exist", "options.model", f"GET {url}/models")
    with pytest.raises(RewardError) as excinfo:
        score(make(url.removesuffix("/v1")), one, ["a"])
    one_line_error(excinfo, "HTTP 404", "ending in /v1")


@pytest.mark.parametrize(
    "answer, options, fragments",
    [
        ((200, b"not json at all"), {}, ["malformed reply from the judge", "not JSON"]),
        ((200, [1, 2]), {}, ["not a JSON object"]),
        ((200, {"object": "list"}), {}, ["no 'choices'", "OpenAI-compatible"]),
        ((200, {"choices": [{"text": "7"}]}), {}, ["'choices[0]' has no 'message'"]),
        (reply(None, finish_reason="length"), {}, ["no reply text", "'length'", "options.max_tokens"]),
        (reply("Excellent!"), {}, ["no number in the judge's reply 'Excellent!'", "options.prompt_template"]),
        (
            reply("Excellent", finish_reason="length"),
            {},
            ["no number", "raise options.max_tokens (the reply was cut off)"],
        ),
        (reply("12"), {}, ["answered 12", "outside [min_score, max_score] = [0, 10]", "options.max_score"]),
        (reply("-1"), {}, ["answered -1", "outside"]),
        (
            reply("Final Score: 4"),
            {"score_after": "Score=", "max_score": 5},
            ["no 'Score='", "options.score_after"],
        ),
        (reply("Yes"), {"score_rule": "yes_probability"}, ["no top logprobs", "--max-logprobs", "'number'"]),
        (
            reply("Yes", logprobs={"content": [{"token": "Yes", "logprob": 0.0, "top_logprobs": []}]}),
            {"score_rule": "yes_probability"},
            ["no top logprobs"],
        ),
        (
            reply(
                "The",
                logprobs={
                    "content": [
                        {
                            "token": "The",
                            "logprob": -0.1,
                            "top_logprobs": [
                                {"token": "The", "logprob": -0.1},
                                {"token": "A", "logprob": -2.5},
                            ],
                        }
                    ]
                },
            ),
            {"score_rule": "yes_probability"},
            ["neither 'yes' nor 'no'", "'The', 'A'", "Yes or No", "options.top_logprobs"],
        ),
    ],
)
def test_malformed_or_unusable_answers_are_one_line(judge, samples, answer, options, fragments):
    app, url = judge
    app.override = lambda body: answer
    with pytest.raises(RewardError) as excinfo:
        score(make(url, retries=0, **options), Samples("image", samples.data[:2]), ["a", "b"])
    one_line_error(excinfo, *fragments)


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("Image 1: 3\nImage 2: 5", ["scores for images [1, 2] of a group of 3"]),
        ("Image 1: 3\nImage 2: 5\nImage 4: 1", ["scores for images [1, 2, 4] of a group of 3"]),
        ("[3, 5]", ["2 scores for a group of 3 images"]),
        ("3 5 7 9", ["4 scores for a group of 3 images"]),
        ("Image 1: 3\nImage 2: 11\nImage 3: 1", ["answered 11", "outside"]),
    ],
)
def test_groupwise_wrong_count_is_one_line(judge, samples, text, fragments):
    app, url = judge
    app.override = lambda body: reply(text)
    with pytest.raises(RewardError) as excinfo:
        score(make(url, mode="groupwise", retries=0), Samples("image", samples.data[:3]), ["a fox"] * 3)
    message = one_line_error(excinfo, *fragments)
    if "outside" not in message:
        assert (
            "'Image k: <score>'" in message and "options.prompt_template" in message and "'a fox'" in message
        )


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"mode": "groupwise", "score_rule": "yes_probability"}, "use mode 'pointwise'"),
        ({"min_score": 5, "max_score": 5}, "min_score (5) must be below max_score (5)"),
        ({"prompt_template": "Rate this image."}, "must contain the placeholder {prompt}"),
        ({"api_key": "a", "api_key_env": "B"}, "not both"),
        ({"extra_body": {"model": "x"}}, "extra_body must not set"),
        ({"top_logprobs": 0}, "top_logprobs"),
        ({"mode": "listwise"}, "mode"),
        ({"temperture": 0}, "temperture"),
    ],
)
def test_invalid_options_are_refused(options, fragment):
    with pytest.raises(ValidationError) as excinfo:
        Config(base_url="http://127.0.0.1:8000/v1", model=MODEL, **options)
    assert fragment in str(excinfo.value)
    with pytest.raises(ValidationError):
        Config(base_url="127.0.0.1:8000/v1", model=MODEL)


# ------------------------------------------------------------------------------- the plugin


def test_vlm_judge_is_an_installed_reward():
    spec = default_registry().get("reward", "vlm_judge")
    assert spec.config is Config and spec.distribution == "vgrpo"


@pytest.mark.parametrize(
    "options",
    [{}, {"score_rule": "yes_probability"}, {"mode": "groupwise", "concurrency": 2}],
    ids=["number", "yes_probability", "groupwise"],
)
def test_vlm_judge_passes_the_reward_conformance_kit(judge, options):
    from vgrpo_platform.testing import REWARD_CHECKS, check_reward

    _, url = judge
    report = check_reward(
        build,
        Config(base_url=url, model=MODEL, timeout_s=10, **options),
        entry_module="vgrpo_rewards.vlm_judge",
    )
    assert not report.skipped and sorted(report.passed) == sorted(REWARD_CHECKS), report


def test_default_templates_use_only_the_documented_placeholders():
    for template in (POINTWISE_NUMBER_TEMPLATE, POINTWISE_YES_TEMPLATE, GROUPWISE_NUMBER_TEMPLATE):
        assert "{prompt}" in template
        rest = template
        for name in ("prompt", "min_score", "max_score", "n"):
            rest = rest.replace("{" + name + "}", "")
        assert "{" not in rest and "}" not in rest
    assert math.isclose(p_yes(0.5) / (p_yes(0.5) + p_no(0.5)), 0.5)
