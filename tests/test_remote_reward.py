"""``vgrpo serve-reward`` and the ``remote`` reward: exact equality with the in-process reward, and a
one-line ``RewardError`` naming the fix for every way the server can fail. Loopback only, bounded waits."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from fake_judge import HOST, one_line_error, serving, unused_port_url
from PIL import Image
from vgrpo_rewards.remote import Config as RemoteConfig
from vgrpo_rewards.remote import build as build_remote
from vgrpo_rewards.shapes import Config as ShapesConfig
from vgrpo_rewards.shapes import build as build_shapes
from vgrpo_rewards.shapes import world
from werkzeug.wrappers import Request, Response

from vgrpo_platform import reward_wire as wire
from vgrpo_platform.cli.reward_server import RewardApp
from vgrpo_platform.errors import RewardError
from vgrpo_platform.host.collect import default_registry
from vgrpo_platform.protocols import Samples
from vgrpo_platform.training.iteration.scoring import WeightedReward, score_all
from vgrpo_platform.training.observe.metrics import without_timing


@pytest.fixture(scope="module")
def batch() -> tuple[Samples, list[str]]:
    """Five rendered shapes-world scenes, two of them scored against another scene's prompt."""
    rng = np.random.default_rng(0)
    specs = world.all_specs()
    chosen = [specs[int(i)] for i in rng.integers(len(specs), size=5)]
    images = np.stack([np.asarray(world.render(s, rng)) for s in chosen])  # [B, H, W, 3] uint8
    data = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255
    data[1] = (data[1] + 0.05 * torch.randn(data[1].shape, generator=torch.Generator().manual_seed(0))).clamp(
        0, 1
    )
    prompts = [s.to_prompt() for s in chosen]
    prompts[3], prompts[4] = prompts[4], prompts[3]
    return Samples("image", data), prompts


def remote(url: str, **options) -> object:
    return build_remote(RemoteConfig(url=url, **options), None)


def test_remote_scores_equal_the_in_process_reward_exactly(batch):
    samples, prompts = batch
    shapes = build_shapes(ShapesConfig(), None)
    with serving(RewardApp("shapes", build_shapes(ShapesConfig(), None))) as url:
        client = remote(url, reward="shapes", batch_size=2)  # three requests: 2 + 2 + 1
        here = score_all([WeightedReward("shapes", shapes, 1.0)], samples, prompts)
        there = score_all([WeightedReward("shapes", client, 1.0)], samples, prompts)
    assert torch.equal(here[0]["shapes"], there[0]["shapes"])
    assert here[1].keys() == there[1].keys() and "shapes/correct" in here[1]
    for key in here[1]:
        assert torch.equal(here[1][key], there[1][key]), key
    assert len(set(here[0]["shapes"].tolist())) > 1  # the batch has distinct scores, so order matters


def test_health_names_the_reward_and_protocol():
    with serving(RewardApp("shapes", build_shapes(ShapesConfig(), None), {"objective": "correct"})) as url:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            health = json.loads(response.read())
    assert health == {
        "status": "ok",
        "reward": "shapes",
        "protocol": 2,
        "protocols": [1, 2],
        "modalities": ["image"],
        "groups": False,
        "options": ["objective"],  # names only: a value may be a secret
    }


def _groups_batch() -> tuple[Samples, list[str]]:
    """Two prompt groups of 4, the first with two near-copies (a cluster), the second all distinct; the
    two groups share a prompt, so only the declared group size can tell them apart."""
    gen = torch.Generator().manual_seed(3)
    data = torch.rand(8, 3, 16, 16, generator=gen)
    data[1] = (data[0] + 0.01).clamp(0, 1)
    return Samples("image", data), ["a red square"] * 8


def test_a_group_reward_is_served_group_by_group_with_the_in_process_scores():
    from vgrpo_rewards.diversity import Config as DiversityConfig
    from vgrpo_rewards.diversity import build as build_diversity

    samples, prompts = _groups_batch()
    config = DiversityConfig(bonus="share")  # 1 - n / G: the group's size enters the score
    local = build_diversity(config, None)
    with serving(RewardApp("diversity", build_diversity(config, None))) as url:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            assert json.loads(response.read())["groups"] is True
        client = remote(url, reward="diversity", groups=True, batch_size=3)  # batch_size cannot split a group
        here = score_all([WeightedReward("d", local, 1.0)], samples, prompts, group_size=4)
        there = score_all([WeightedReward("d", client, 1.0)], samples, prompts, group_size=4)
        assert torch.equal(here[0]["d"], there[0]["d"]) and here[1].keys() == there[1].keys()
        assert here[0]["d"][0] < here[0]["d"][2]  # the near-copies share a cluster: a smaller bonus
        whole = score_all([WeightedReward("d", local, 1.0)], samples, prompts)  # one group of 8
        assert not torch.equal(whole[0]["d"], here[0]["d"])  # so the group bounds did matter
        with pytest.raises(RewardError) as refused:
            score_all([WeightedReward("d", remote(url), 1.0)], samples, prompts, group_size=4)
    one_line_error(refused, "whole group", "options.groups = true")


def test_png_encoded_images_are_scored_like_their_pixels(batch):
    samples, prompts = batch
    app = RewardApp("shapes", build_shapes(ShapesConfig(), None))
    pngs = []
    for img in (samples.data * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy():
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="PNG")
        pngs.append(base64.b64encode(buf.getvalue()).decode())
    body = {
        "protocol": 1,
        "samples": {"modality": "image", "encoding": "png", "data": pngs},
        "prompts": prompts,
    }
    reply = app.score(json.dumps(body).encode())
    expected = build_shapes(ShapesConfig(), None).score(samples, prompts, [{}] * len(prompts))
    assert reply["scores"]["score"] == expected["score"].tolist()


def test_cli_serves_an_installed_reward_with_options(batch):
    samples, prompts = batch
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "vgrpo_platform", "serve-reward", "shapes", "--option", "objective=correct"]
    proc = subprocess.Popen(
        [*cmd, "--host", HOST, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout=120)
        assert lines and lines[0].startswith("serving reward 'shapes' on http://"), (lines, proc.poll())
        url = lines[0].split(" on ")[1].strip()
        out = remote(url, reward="shapes", timeout_s=30).score(samples, prompts, [{}] * len(prompts))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    expected = build_shapes(ShapesConfig(objective="correct"), None).score(samples, prompts, [{}] * 5)
    assert torch.equal(out["score"], expected["score"]) and set(out["score"].tolist()) <= {0.0, 1.0}


def test_remote_is_an_installed_reward_whose_entry_module_has_no_torch():
    assert ("reward", "remote") in default_registry()
    code = "import sys, vgrpo_rewards.remote; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


# ------------------------------------------------------------------------------- failures


def fake(reply):
    """A WSGI app answering every request with ``reply`` (or ``reply(the request read from its frame)``)."""

    def app(environ, start_response):
        request = Request(environ)
        read = wire.read_frame(io.BytesIO(request.get_data()))
        status, body = reply(read) if callable(reply) else reply
        return Response(body, status=status, mimetype="application/json")(environ, start_response)

    return app


def score_one(client, batch) -> None:
    samples, prompts = batch
    score_all([WeightedReward("remote", client, 1.0)], samples, prompts)


def test_unreachable_server_names_the_command_to_start_it(batch):
    client = remote(unused_port_url(), timeout_s=2, retries=2, backoff_s=0.01)
    start = time.monotonic()
    with pytest.raises(RewardError) as excinfo:
        score_one(client, batch)
    assert time.monotonic() - start < 10
    one_line_error(excinfo, "cannot reach the reward server", "vgrpo serve-reward", "after 3 tries")


def test_timeout_names_the_option_to_raise(batch):
    def slow(request):
        time.sleep(1.0)
        return 200, b"{}"

    with serving(fake(slow)) as url:
        start = time.monotonic()
        with pytest.raises(RewardError) as excinfo:
            score_one(remote(url, timeout_s=0.2, retries=1, backoff_s=0.01), batch)
        assert time.monotonic() - start < 3
    one_line_error(excinfo, "no reply", "within 0.2 s", "options.timeout_s", "after 2 tries")


@pytest.mark.parametrize(
    "body, fragment",
    [
        (b"<html>hello</html>", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"protocol": 1, "reward": "x"}', "no 'scores' object"),
        (b'{"scores": {"score": ["a", "b", "c", "d", "e"]}}', "'scores.score' is not a list of numbers"),
    ],
)
def test_malformed_reply_is_one_line(batch, body, fragment):
    with serving(fake((200, body))) as url:
        with pytest.raises(RewardError) as excinfo:
            score_one(remote(url, timeout_s=5, retries=0), batch)
    one_line_error(excinfo, "malformed reply from the reward server", fragment)


def test_wrong_count_of_scores(batch):
    def short(request):
        n = len(request.prompts)
        return 200, json.dumps({"protocol": 1, "reward": "x", "scores": {"score": [0.5] * (n - 1)}})

    with serving(fake(short)) as url:
        with pytest.raises(RewardError) as excinfo:
            score_one(remote(url, timeout_s=5, retries=0), batch)
    one_line_error(excinfo, "'scores.score' has 4 values for 5 samples", "serve-reward of protocol 2")


def test_server_side_failures_are_reported_with_the_fix(batch):
    class Broken:
        modalities = frozenset({"image"})

        def score(self, samples, prompts, metadata):
            raise ValueError("model not loaded")

    with serving(RewardApp("broken", Broken())) as url:
        with pytest.raises(RewardError) as excinfo:
            score_one(remote(url, timeout_s=5, retries=1, backoff_s=0.01), batch)
        one_line_error(excinfo, "reward 'broken' raised ValueError: model not loaded", "after 2 tries")
        audio = Samples("audio", torch.zeros(2, 1, 16), sample_rate=16000)
        with pytest.raises(RewardError) as excinfo:
            remote(url, timeout_s=5).score(audio, ["a", "b"], [{}, {}])
        one_line_error(excinfo, "HTTP 400", "scores ['image'], not audio")


def test_a_server_of_another_reward_is_refused(batch):
    with serving(RewardApp("jpeg", build_shapes(ShapesConfig(), None))) as url:
        with pytest.raises(RewardError) as excinfo:
            score_one(remote(url, timeout_s=5, reward="shapes"), batch)
    one_line_error(excinfo, "serves reward 'jpeg', not 'shapes'", "options.url or options.reward")


def test_a_body_over_the_limit_is_refused_with_the_batch_size_hint(batch, monkeypatch):
    from vgrpo_platform.cli import reward_server

    monkeypatch.setattr(reward_server, "MAX_FRAME_BODY", 1000)
    with serving(RewardApp("shapes", build_shapes(ShapesConfig(), None))) as url:
        with pytest.raises(RewardError) as excinfo:
            score_one(remote(url, timeout_s=5, retries=3), batch)  # a 4xx is not retried
    one_line_error(excinfo, "HTTP 413", "options.batch_size")
    assert "tries" not in str(excinfo.value)


def test_remote_passes_the_reward_conformance_kit():
    from vgrpo_platform.testing import check_reward

    served = default_registry().build("reward", "brightness", {}, None)
    samples = Samples("image", torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(0)))
    with serving(RewardApp("brightness", served)) as url:
        check_reward(
            build_remote,
            RemoteConfig(url=url, timeout_s=10),
            entry_module="vgrpo_rewards.remote",
            samples=samples,
        )


# ------------------------------------------------------------------------------- the wire: protocols 2 and 1


class Trickle(io.RawIOBase):
    """A body that hands out at most ``step`` bytes per read, as a socket may."""

    def __init__(self, data: bytes, step: int) -> None:
        self.data, self.step, self.pos = data, step, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self.step, len(self.data) - self.pos)
        buffer[:n] = self.data[self.pos : self.pos + n]
        self.pos += n
        return n


def frame_bytes(samples: Samples, prompts: list[str], metadata: list[dict] | None = None) -> bytes:
    frame = wire.encode_frame(samples, prompts, metadata or [{}] * len(prompts))
    return b"".join(bytes(chunk) for chunk in frame.chunks)


def test_a_frame_is_a_json_header_and_a_safetensors_file_sent_from_the_samples_memory():
    from safetensors.torch import load, save

    data = torch.rand(3, 3, 5, 7, generator=torch.Generator().manual_seed(0))
    frame = wire.encode_frame(Samples("image", data), ["a", "b", "c"], [{"k": 1}, {}, {}])
    body = b"".join(bytes(chunk) for chunk in frame.chunks)
    assert frame.length == len(body)
    n = int.from_bytes(body[:8], "little")
    header = json.loads(body[8 : 8 + n])
    assert (
        header["protocol"] == 2 and header["prompts"] == ["a", "b", "c"] and header["metadata"][0] == {"k": 1}
    )
    assert torch.equal(load(body[8 + n :])["samples"], data)  # the rest is a safetensors file of the samples
    data[0, 0, 0, 0] = 7.0  # the frame sends the tensor's own memory, not a copy taken when it was built
    assert np.frombuffer(frame.chunks[-1], dtype="<f4")[0] == 7.0
    # the server reads a frame whose tensor safetensors itself wrote (with metadata), a few bytes at a time
    written = body[: 8 + n] + save({"samples": data}, metadata={"by": "safetensors"})
    read = wire.read_frame(Trickle(written, 100), len(written))
    assert read.protocol == 2 and read.prompts == ["a", "b", "c"] and read.metadata == [{"k": 1}, {}, {}]
    assert read.samples.modality == "image" and torch.equal(read.samples.data, data)


def test_64_video_clips_are_scored_in_one_request_exactly_as_in_process(monkeypatch):
    """What protocol 1 told users to chunk by hand: 64 clips go in one request (batch_size 0), over a
    limit the same batch as protocol-1 JSON does not fit, and score bit-for-bit as in process."""
    from werkzeug.test import Client

    from vgrpo_platform.cli import reward_server

    clips = torch.rand(64, 4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    samples, prompts = Samples("video", clips, fps=8), [f"clip {i}" for i in range(64)]
    registry = default_registry()
    expected = registry.build("reward", "temporal_consistency", {}, None).score(samples, prompts, [{}] * 64)
    app = RewardApp("temporal_consistency", registry.build("reward", "temporal_consistency", {}, None))
    seen = []

    def counted(environ, start_response):
        seen.append((environ["PATH_INFO"], environ.get("CONTENT_TYPE")))
        return app(environ, start_response)

    monkeypatch.setattr(reward_server, "MAX_JSON_BODY", clips.numel() * 4)  # the raw bytes, not base64
    with serving(counted) as url:
        out = remote(url, reward="temporal_consistency", timeout_s=60).score(samples, prompts, [{}] * 64)
    assert seen == [("/score", wire.FRAME_TYPE)]
    assert torch.equal(out["score"], expected)
    as_json = Client(app).post(
        "/score", data=wire.encode_request(samples, prompts, [{}] * 64), content_type=wire.JSON_TYPE
    )
    assert as_json.status_code == 413


def test_a_protocol_1_client_is_still_served_with_the_same_scores(batch):
    samples, prompts = batch
    with serving(RewardApp("shapes", build_shapes(ShapesConfig(), None))) as url:
        request = urllib.request.Request(
            f"{url}/score",
            data=wire.encode_request(samples, prompts, [{}] * len(prompts)),
            headers={"Content-Type": wire.JSON_TYPE},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            reply = json.loads(response.read())
        framed = remote(url, reward="shapes", timeout_s=30).score(samples, prompts, [{}] * len(prompts))
    assert reply["protocol"] == 1 and reply["reward"] == "shapes"
    old = wire.decode_scores(reply, len(prompts))
    assert old.keys() == framed.keys() and all(torch.equal(old[k], framed[k]) for k in old)


def _frame_with(samples_tensors: dict, header: dict | None = None) -> bytes:
    from safetensors.torch import save

    text = json.dumps(header or {"protocol": 2, "samples": {"modality": "image"}, "prompts": ["a"]}).encode()
    return len(text).to_bytes(8, "little") + text + save(samples_tensors)


MISMATCH = "its frame describes"  # over HTTP a body of another length than its frame fails on Content-Length


@pytest.mark.parametrize(
    "body, length, fragment, over_http",
    [
        (lambda b: b[:-10], None, "the body ended after", MISMATCH),
        (lambda b: b, 1, MISMATCH, False),  # a Content-Length that lies: not sendable over HTTP
        (lambda b: b + b"x", None, "a frame holds one tensor", MISMATCH),
        (
            lambda b: _frame_with({"samples": torch.zeros(1, 3, 2, 2).half()}),
            None,
            "send float32 (F32)",
            None,
        ),
        (
            lambda b: _frame_with({"samples": torch.zeros(1, 3), "x": torch.zeros(1)}),
            None,
            "one tensor named",
            None,
        ),
        (
            lambda b: _frame_with({"samples": torch.zeros(1, 3)}, {"protocol": 3}),
            None,
            "a frame is protocol 2",
            None,
        ),
        (lambda b: b"\xff" * 8 + b, None, "not a vgrpo frame", None),
    ],
)
def test_a_broken_frame_is_a_400_naming_the_problem(body, length, fragment, over_http):
    from werkzeug.test import Client

    good = frame_bytes(Samples("image", torch.zeros(1, 3, 2, 2)), ["a"])
    with pytest.raises(wire.WireError, match=re.escape(fragment)):
        wire.read_frame(io.BytesIO(body(good)), length)
    if over_http is False:
        return
    app = RewardApp("shapes", build_shapes(ShapesConfig(), None))
    reply = Client(app).post("/score", data=body(good), content_type=wire.FRAME_TYPE)
    error = reply.json["error"]
    assert reply.status_code == 400 and (over_http or fragment) in error and "\n" not in error, error


def test_protocol_2_sent_as_json_is_refused_with_the_content_type_to_use():
    body = json.dumps({"protocol": 2, "samples": {}, "prompts": []}).encode()
    with pytest.raises(wire.WireError, match="protocol 2 travels as a frame"):
        wire.decode_request(body)


# ------------------------------------------------------------------------------- training


@contextmanager
def serve_reward_process(name: str, *options: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """``vgrpo serve-reward NAME --option ...`` in a subprocess on a free loopback port; yields it and
    its URL."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "vgrpo_platform", "serve-reward", name, "--host", HOST, "--port", "0"]
    cmd += [a for option in options for a in ("--option", option)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout=120)
        assert lines and lines[0].startswith(f"serving reward '{name}' on http://"), (lines, proc.poll())
        yield proc, lines[0].split(" on ")[1].strip()
    finally:
        proc.kill()
        proc.wait(timeout=30)


def kill_before_iteration(monkeypatch, iteration: int, proc: subprocess.Popen) -> None:
    """The server dies between iterations ``iteration - 1`` and ``iteration`` of every Trainer."""
    from vgrpo_platform.training.loop import Trainer

    original_iterate = Trainer.iterate

    def iterate(self, i: int):
        if i == iteration and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        return original_iterate(self, i)

    monkeypatch.setattr(Trainer, "iterate", iterate)


def test_training_scores_remotely_then_skips_and_stops_once_the_server_is_killed(tmp_path, monkeypatch):
    """Under "skip" the iteration the dead server spoils is skipped; the final evaluation is never
    skipped, so the run stops with the checkpoint of iteration 2, and --resume against a restarted
    server runs only that evaluation."""
    import json

    from vgrpo_platform.config.recipe import resolve_recipe
    from vgrpo_platform.training.loop import Trainer
    from vgrpo_platform.training.observe.metrics import read_metrics
    from vgrpo_platform.training.recovery.checkpoint import list_checkpoints

    toy = os.path.join(os.path.dirname(__file__), "..", "recipes", "toy.toml")
    base = [
        f"run.output_dir={tmp_path.as_posix()!r}",
        "log.progress='none'",
        "train.iterations=2",
        "eval.every=0",
        "log.checkpoint_every=0",
        "log.diagnostics_every=0",
        "train.on_fault='skip'",
    ]
    local = Trainer(resolve_recipe(toy, [*base, "run.name='local'"]))
    local.run()

    def remote_recipe(url: str):
        remote_options = [
            f"rewards.0.options.url={url!r}",
            "rewards.0.options.reward='brightness'",
            "rewards.0.options.timeout_s=5",
            "rewards.0.options.retries=1",
            "rewards.0.options.backoff_s=0.05",
        ]
        return resolve_recipe(toy, [*base, "run.name='remote'", "rewards.0.name='remote'", *remote_options])

    with serve_reward_process("brightness") as (proc, url):
        trainer = Trainer(remote_recipe(url))
        kill_before_iteration(monkeypatch, 2, proc)
        with pytest.raises(RewardError) as excinfo:
            trainer.run()
    message = one_line_error(excinfo, "cannot reach the reward server", "vgrpo serve-reward")
    assert "the final evaluation of iteration 2 failed; checkpoint of iteration 2 saved" in message
    assert "never skipped" in message
    here = {r["iteration"]: r for r in read_metrics(local.run_dir / "metrics.jsonl") if r["kind"] == "train"}
    records = read_metrics(trainer.run_dir / "metrics.jsonl")
    assert [(r["kind"], r["iteration"]) for r in records] == [("eval", 0), ("train", 1), ("skipped", 2)]
    local_eval = next(r for r in read_metrics(local.run_dir / "metrics.jsonl") if r["kind"] == "eval")
    assert records[0]["reward"] == local_eval["reward"]
    there = records[1]
    assert there["reward"] == here[1]["reward"] and there["reward/remote"] == here[1]["reward/brightness"]
    skipped = records[2]
    assert "cannot reach the reward server" in skipped["reason"] and "vgrpo serve-reward" in skipped["reason"]
    [checkpoint] = list_checkpoints(trainer.run_dir)
    assert checkpoint.name == "iter_000002"
    assert json.loads((checkpoint / "state.json").read_text())["eval_pending"] is not None

    with serve_reward_process("brightness") as (_, url):  # back up, on another port
        Trainer(remote_recipe(url), resume=True).run()
    records = read_metrics(trainer.run_dir / "metrics.jsonl")
    assert [(r["kind"], r["iteration"]) for r in records][-2:] == [("skipped", 2), ("eval", 2)]
    assert "eval_pending" not in json.loads((checkpoint / "state.json").read_text())


# ------------------------------------------------------------- the quickstart through a server

QUICKSTART = os.path.join(os.path.dirname(__file__), "..", "recipes", "quickstart.toml")
QUICK = [
    "log.progress='none'",
    "train.iterations=2",
    "rollout.prompts_per_iteration=2",
    "rollout.group_size=4",
    "eval.every=0",
    "eval.max_prompts=8",
    "eval.samples_per_prompt=2",
    "log.diagnostics_every=0",
    "log.checkpoint_every=0",
    "log.save_grids=false",
]
SERVED_OPTIONS = ("objective=product",)  # what recipes/quickstart.toml gives its shapes reward


def remote_table(url: str) -> str:
    options = f"url = {url!r}, reward = 'shapes', timeout_s = 60, retries = 1, backoff_s = 0.05"
    return f"rewards.0.options={{{options}}}"


def comparable(records: list[dict]) -> list[dict]:
    """Records without timing, the ``remote`` reward's keys under the name of the reward it serves."""

    def key(k: str) -> str:
        parts = k.split("/")
        if len(parts) >= 2 and parts[1] == "remote":
            parts[1] = "shapes"
        return "/".join(parts)

    return [{key(k): v for k, v in r.items()} for r in without_timing(records)]


def vgrpo(monkeypatch, *argv: str) -> int:
    """``vgrpo ARGV`` through the console entry point, in this process; returns its exit code."""
    from vgrpo_platform.cli import app as cli

    monkeypatch.setattr(sys, "argv", ["vgrpo", *argv])
    try:
        cli.main()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def test_quickstart_through_serve_reward_equals_in_process_and_a_killed_server_resumes(
    tmp_path, monkeypatch, capsys
):
    """Done-when of "Rewards at scale": the quickstart recipe, 2 iterations, scored by
    ``vgrpo serve-reward shapes`` gives exactly the in-process run's metrics; the server killed after
    iteration 1 ends ``vgrpo run`` with one error line and the checkpoint of iteration 1, and
    ``--resume`` against a restarted server ends with the uninterrupted run's metrics."""
    from vgrpo_platform.config.recipe import resolve_recipe
    from vgrpo_platform.training.loop import Trainer
    from vgrpo_platform.training.observe.metrics import read_metrics
    from vgrpo_platform.training.recovery.checkpoint import list_checkpoints

    out = f"run.output_dir={tmp_path.as_posix()!r}"
    local = Trainer(resolve_recipe(QUICKSTART, [*QUICK, out, "run.name='local'"])).run()
    expected = comparable(read_metrics(local / "metrics.jsonl"))
    assert [(r["kind"], r["iteration"]) for r in expected] == [
        ("eval", 0),
        ("train", 1),
        ("train", 2),
        ("eval", 2),
    ]

    def sets(name: str, url: str, *extra: str) -> list[str]:
        items = [*QUICK, out, f"run.name={name!r}", "rewards.0.name='remote'", remote_table(url), *extra]
        return [a for item in items for a in ("--set", item)]

    with serve_reward_process("shapes", *SERVED_OPTIONS) as (proc, url):
        remote = Trainer(resolve_recipe(QUICKSTART, sets("remote", url)[1::2])).run()
        assert comparable(read_metrics(remote / "metrics.jsonl")) == expected
        assert "reward/remote" in read_metrics(remote / "metrics.jsonl")[0]  # the recipe's key: its name

        kill_before_iteration(monkeypatch, 2, proc)
        capsys.readouterr()
        code = vgrpo(monkeypatch, "run", QUICKSTART, *sets("cut", url, "train.on_fault='stop'"))
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    # stderr also holds the model loader's progress bar; the run's own report is its last line
    assert code == 2 and len(errors) == 1 and err.splitlines()[-1] == errors[0], err
    assert "cannot reach the reward server" in errors[0] and "vgrpo serve-reward" in errors[0]
    assert "checkpoint of iteration 1 saved; --resume retries from there" in errors[0]
    run_dir = tmp_path / "cut"
    assert [p.name for p in list_checkpoints(run_dir)] == ["iter_000001"]
    assert [(r["kind"], r["iteration"]) for r in read_metrics(run_dir / "metrics.jsonl")] == [
        ("eval", 0),
        ("train", 1),
    ]

    monkeypatch.undo()  # the real Trainer.iterate again
    with serve_reward_process("shapes", *SERVED_OPTIONS) as (_, url):  # restarted, on another port
        code = vgrpo(monkeypatch, "run", QUICKSTART, *sets("cut", url, "train.on_fault='stop'"), "--resume")
    assert code == 0, capsys.readouterr().err
    assert comparable(read_metrics(run_dir / "metrics.jsonl")) == expected
