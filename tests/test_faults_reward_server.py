"""Faults of ``vgrpo serve-reward`` and its ``remote`` client (issue 41, the reward-server half).

Each finding the red team made has a test here: no secret in a reply; PNG means PNG; a pixel budget read
from the headers before decoding, decoding under a bounded semaphore; a bearer token; a socket timeout and
a cap on handler threads; every malformed request a 4xx naming the field; valid JSON for non-finite
scores; a client that retries 5xx and timeouts only. A barrage of all of them leaves the server serving.
Loopback only, bounded waits; the slow test measures the server's resident memory.
"""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from fake_judge import HOST, one_line_error
from PIL import Image
from typer.testing import CliRunner
from vgrpo_rewards.remote import Config as RemoteConfig
from vgrpo_rewards.remote import build as build_remote
from werkzeug.test import Client

from vgrpo_platform import reward_wire as wire
from vgrpo_platform.cli import reward_server
from vgrpo_platform.cli.reward_server import RewardApp, make_server
from vgrpo_platform.errors import RewardError
from vgrpo_platform.protocols import Samples
from vgrpo_platform.training.iteration.scoring import WeightedReward, score_all

SECRET = "sk-live-DO-NOT-LEAK-0123456789"
TOKEN = "t0ken-for-the-tests"


class Recording:
    """An image reward scoring mean brightness; it records each call, so a test can see that a malformed
    request never reached it, and raises ``SECRET`` if it ever gets samples of the wrong layout."""

    modalities = frozenset({"image"})

    def __init__(self, scores: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.calls: list[tuple[int, ...]] = []
        self.scores = scores

    def score(self, samples: Samples, prompts: Any, metadata: Any) -> torch.Tensor:
        self.calls.append(tuple(samples.data.shape))
        if samples.data.dim() != 4 or samples.data.shape[1] != 3:
            raise RuntimeError(f"internal state {SECRET}: bad layout {tuple(samples.data.shape)}")
        if self.scores is not None:
            return self.scores(samples.data)
        return samples.data.mean(dim=(1, 2, 3))


@contextmanager
def bounded_server(app: Any, timeout_s: float = 5.0, max_connections: int = 8) -> Iterator[str]:
    """``app`` behind the bounded server on a free loopback port, in a daemon thread; yields its URL."""
    server = make_server(app, HOST, 0, timeout_s=timeout_s, max_connections=max_connections)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://{HOST}:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def post(
    url: str, body: bytes, content_type: str = wire.JSON_TYPE, token: str | None = None
) -> tuple[int, bytes]:
    """``POST url/score``: the status and the raw body, whatever the status."""
    headers = {"Content-Type": content_type}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"{url}/score", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def strict_json(raw: bytes) -> Any:
    """``json.loads`` refusing ``NaN``/``Infinity``, which are not JSON."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(raw, parse_constant=refuse)


def encoded(image: Image.Image, fmt: str, **save: Any) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **save)
    return base64.b64encode(buffer.getvalue()).decode()


def png_body(items: list[str], **extra: Any) -> bytes:
    samples = {"modality": "image", "encoding": "png", "data": items}
    return json.dumps({"protocol": 1, "samples": samples, "prompts": ["p"] * len(items), **extra}).encode()


def raw_body(shape: Any, data: Any = "", top: dict[str, Any] | None = None, **samples: Any) -> bytes:
    """A protocol-1 body of raw samples; ``top`` replaces its top-level fields, ``samples`` its samples'."""
    fields = {"modality": "image", "encoding": "raw", "dtype": "float32", "shape": shape, "data": data}
    body = {"protocol": 1, "samples": {**fields, **samples}, "prompts": ["p"], **(top or {})}
    return json.dumps(body).encode()


ONE = "AAAAAAAAAAAAAAAA"  # base64 of 12 zero bytes: one 3 x 1 x 1 image


def frame_body(
    shape: list[Any], header: dict[str, Any] | None = None, raw_header: bytes | None = None
) -> bytes:
    """A protocol-2 frame whose safetensors header describes ``shape`` (its data: as many zero bytes as
    fit a small body, so a lying shape is caught by its description, not by the bytes sent)."""
    text = (
        raw_header
        or json.dumps(header or {"protocol": 2, "samples": {"modality": "image"}, "prompts": ["p"]}).encode()
    )
    count = 1
    for n in shape:
        count *= n if isinstance(n, int) else 1
    layout = {"samples": {"dtype": "F32", "shape": shape, "data_offsets": [0, 4 * count]}}
    described = json.dumps(layout).encode()
    data = b"\0" * min(4 * count, 4096)
    return struct.pack("<Q", len(text)) + text + struct.pack("<Q", len(described)) + described + data


def deep(n: int) -> str:
    return "[" * n + "]" * n


VALID_IMAGE = Image.new("RGB", (8, 8), (200, 100, 50))


def valid_body() -> bytes:
    return png_body([encoded(VALID_IMAGE, "PNG")] * 2)


# ------------------------------------------------------------------------------- 1. no secret in a reply


def test_health_names_the_options_but_shows_no_value():
    app = RewardApp("judge", Recording(), {"api_key": SECRET, "model": "m", "nested": {"key": SECRET}})
    client = Client(app)
    health = client.get("/health")
    assert health.status_code == 200 and health.json["options"] == ["api_key", "model", "nested"]
    replies = [
        health,
        client.get("/other"),
        client.post("/score", data=b"{", content_type="application/json"),
    ]
    replies.append(client.post("/score", data=valid_body(), content_type="application/json"))
    for reply in replies:
        assert SECRET not in reply.get_data(as_text=True), reply.status


def test_a_reward_error_quoting_an_option_value_is_redacted():
    class Leaky:
        modalities = frozenset({"image"})

        def score(self, samples: Samples, prompts: Any, metadata: Any) -> torch.Tensor:
            raise PermissionError(f"the judge refused key {SECRET} (model m)")

    app = RewardApp("judge", Leaky(), {"api_key": SECRET, "headers": {"X": [SECRET + "-2"]}, "model": "m"})
    reply = Client(app).post("/score", data=valid_body(), content_type="application/json")
    assert reply.status_code == 500 and SECRET not in reply.get_data(as_text=True)
    assert (
        reply.json["error"]
        == "reward 'judge' raised PermissionError: the judge refused key <redacted> (model m)"
    )


# ------------------------------------------------------------------------------- 2. PNG means PNG


def _eps() -> str:
    """A tiny EPS file, which Pillow would hand to Ghostscript to render."""
    text = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\nnewpath 0 0 moveto 8 8 lineto stroke\n%%EOF\n"
    return base64.b64encode(text).decode()


@pytest.mark.parametrize("fmt", ["BMP", "GIF", "TIFF", "JPEG", "EPS", "WEBP", "garbage"])
def test_png_encoding_refuses_every_other_format_naming_the_item(fmt):
    if fmt == "EPS":
        item = _eps()
    elif fmt == "garbage":
        item = base64.b64encode(b"not an image at all").decode()
    else:
        item = encoded(VALID_IMAGE, fmt)
    reward = Recording()
    reply = Client(RewardApp("r", reward)).post(
        "/score", data=png_body([encoded(VALID_IMAGE, "PNG"), item]), content_type="application/json"
    )
    assert reply.status_code == 400, reply.get_data(as_text=True)
    assert "'samples.data[1]' is not a base64 PNG file" in reply.json["error"]
    assert reward.calls == []


def test_an_eps_sent_as_png_never_reaches_ghostscript(monkeypatch):
    from PIL import EpsImagePlugin

    def ghostscript(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("Ghostscript was called")

    monkeypatch.setattr(EpsImagePlugin, "Ghostscript", ghostscript)
    with pytest.raises(wire.WireError, match="not a base64 PNG"):
        wire.decode_images([_eps()], "png", wire.MAX_PIXELS)


# ------------------------------------------------------------------------------- 3. budget, slots, token


def test_the_pixel_budget_is_checked_from_the_headers_before_anything_is_decoded(monkeypatch):
    decoded: list[Any] = []
    real_convert = Image.Image.convert

    def convert(self: Image.Image, *args: Any, **kwargs: Any) -> Image.Image:
        decoded.append(1)
        return real_convert(self, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "convert", convert)
    reward = Recording()
    app = RewardApp("r", reward, max_pixels=2 * 64 * 64)
    items = [encoded(Image.new("RGB", (64, 64)), "PNG")] * 3
    reply = Client(app).post("/score", data=png_body(items), content_type="application/json")
    assert reply.status_code == 400 and "--max-pixels" in reply.json["error"], reply.json
    assert "more than 8192 pixels" in reply.json["error"] and decoded == [] and reward.calls == []
    reply = Client(app).post("/score", data=png_body(items[:2]), content_type="application/json")
    assert reply.status_code == 200 and len(decoded) == 2 and reward.calls == [(2, 3, 64, 64)]


def test_images_of_different_sizes_are_a_400():
    items = [encoded(Image.new("RGB", (8, 8)), "PNG"), encoded(Image.new("RGB", (8, 9)), "PNG")]
    reply = Client(RewardApp("r", Recording())).post("/score", data=png_body(items), content_type="a/json")
    assert reply.status_code == 400 and "'samples.data[1]' is 8x9" in reply.json["error"]


def test_protocol_1_decoding_runs_under_a_bounded_semaphore(monkeypatch):
    """Decoded samples live until their reply, so the requests between decoding and reply are bounded."""
    active, peak, lock = [0], [0], threading.Lock()
    real = wire.decode_images

    def counting(*args: Any) -> torch.Tensor:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.15)
        try:
            return real(*args)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(wire, "decode_images", counting)
    app = RewardApp("r", Recording())
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda _: app.score(valid_body()), range(8)))
    assert all(len(r["scores"]["score"]) == 2 for r in replies)
    assert 1 <= peak[0] <= reward_server.DECODE_SLOTS


def test_a_token_is_required_on_every_request_and_compared_in_constant_time(monkeypatch):
    import hmac

    compared: list[bytes] = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: compared.append(a) or real(a, b))
    reward = Recording()
    client = Client(RewardApp("r", reward, {"api_key": SECRET}, token=TOKEN))
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        for reply in (
            client.get("/health", headers=headers),
            client.post("/score", data=valid_body(), content_type="application/json", headers=headers),
        ):
            assert reply.status_code == 401 and "Bearer" in reply.json["error"], reply.json
            assert reply.headers["WWW-Authenticate"] == "Bearer" and SECRET not in reply.get_data(
                as_text=True
            )
    assert reward.calls == [] and b"wrong" in compared
    ok = {"Authorization": f"Bearer {TOKEN}"}
    assert client.get("/health", headers=ok).status_code == 200
    assert client.post("/score", data=valid_body(), content_type="a/json", headers=ok).status_code == 200


def test_the_remote_reward_sends_the_token_named_by_token_env(monkeypatch):
    samples = Samples("image", torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(0)))
    hits: list[int] = []
    app = RewardApp("r", Recording(), token=TOKEN)

    def counting(environ: Any, start_response: Any) -> Any:
        hits.append(1)
        return app(environ, start_response)

    with bounded_server(counting) as url:
        monkeypatch.setenv("VGRPO_TEST_TOKEN", TOKEN)
        client = build_remote(RemoteConfig(url=url, token_env="VGRPO_TEST_TOKEN", timeout_s=10), None)
        out = client.score(samples, ["a"] * 3, [{}] * 3)
        assert torch.equal(out["score"], samples.data.mean(dim=(1, 2, 3)))
        hits.clear()
        anonymous = build_remote(RemoteConfig(url=url, timeout_s=10, retries=3, backoff_s=0.01), None)
        with pytest.raises(RewardError) as excinfo:
            anonymous.score(samples, ["a"] * 3, [{}] * 3)
        one_line_error(excinfo, "HTTP 401", "options.token_env", "--token-env")
        assert hits == [1]  # a 401 is not retried
    monkeypatch.delenv("VGRPO_TEST_TOKEN")
    with pytest.raises(RewardError) as excinfo:
        build_remote(RemoteConfig(url="http://127.0.0.1:1", token_env="VGRPO_TEST_TOKEN"), None)
    one_line_error(excinfo, "options.token_env names VGRPO_TEST_TOKEN, which is not set")
    with pytest.raises(ValueError, match="token_env"):
        RemoteConfig(url="http://127.0.0.1:1", token_env="not a variable name!")


class FakeServer:
    """What ``make_server`` returns, minus the socket: ``serve_forever`` stops at once (as Ctrl-C)."""

    server_port = 9

    def __init__(self, app: RewardApp, host: str, port: int, **limits: Any) -> None:
        FakeServer.made = (app, host, limits)

    def serve_forever(self) -> None:
        raise KeyboardInterrupt

    def server_close(self) -> None:
        pass


@pytest.mark.parametrize(
    "host, token, warned", [("0.0.0.0", None, True), ("10.1.2.3", TOKEN, False), ("127.0.0.1", None, False)]
)
def test_cli_reads_the_token_from_the_environment_and_warns_beyond_loopback(monkeypatch, host, token, warned):
    from vgrpo_platform.cli import app as cli

    monkeypatch.setattr(reward_server, "make_server", FakeServer)
    args = ["serve-reward", "brightness", "--host", host, "--max-pixels", "1000", "--timeout-s", "3"]
    args += ["--max-connections", "5"]
    env = {"COLUMNS": "200", "SERVE_TOKEN": token or ""}
    if token is not None:
        args += ["--token-env", "SERVE_TOKEN"]
    result = CliRunner().invoke(cli.app, args, env=env)
    assert result.exit_code == 0, result.output
    app, bound, limits = FakeServer.made
    assert bound == host and app.max_pixels == 1000 and limits == {"timeout_s": 3.0, "max_connections": 5}
    assert app.token == (token.encode() if token else None)
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == int(warned) and (not warned or "--token-env" in warnings[0]), result.stderr
    assert TOKEN not in result.output


def test_cli_defaults_are_the_documented_limits(monkeypatch):
    from vgrpo_platform.cli import app as cli

    monkeypatch.setattr(reward_server, "make_server", FakeServer)
    result = CliRunner().invoke(cli.app, ["serve-reward", "brightness"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and result.stderr == "", result.output
    app, bound, limits = FakeServer.made
    assert bound == "127.0.0.1" and app.token is None and app.max_pixels == wire.MAX_PIXELS == 1 << 25
    assert limits == {"timeout_s": reward_server.TIMEOUT_S, "max_connections": reward_server.MAX_CONNECTIONS}
    assert (reward_server.TIMEOUT_S, reward_server.MAX_CONNECTIONS) == (60.0, 32)  # as docs/cli.md says


def test_cli_token_env_that_is_not_set_is_one_line(monkeypatch):
    from vgrpo_platform.cli import app as cli

    monkeypatch.setattr(reward_server, "make_server", FakeServer)
    result = CliRunner().invoke(cli.app, ["serve-reward", "brightness", "--token-env", "NO_SUCH_VAR_41"])
    assert result.exit_code != 0 and len(result.stderr.splitlines()) == 1
    assert "--token-env names NO_SUCH_VAR_41, which is not set" in result.stderr


def test_loopback_hosts():
    assert all(reward_server.is_loopback(h) for h in ("127.0.0.1", "127.9.9.9", "::1", "localhost"))
    assert not any(reward_server.is_loopback(h) for h in ("0.0.0.0", "", "::", "10.0.0.1", "example.org"))


# ------------------------------------------------------------------------------- 4. timeouts, thread bound


def _half_open(url: str, count: int) -> list[socket.socket]:
    """``count`` connections that send half a request line and then nothing."""
    port = int(url.rsplit(":", 1)[1])
    sockets = []
    for i in range(count):
        s = socket.create_connection((HOST, port), timeout=5)
        if i % 2:
            s.sendall(b"GET /hea")
        sockets.append(s)
    return sockets


def test_idle_connections_hold_a_bounded_number_of_threads_and_time_out():
    before = threading.active_count()
    with bounded_server(RewardApp("r", Recording()), timeout_s=0.5, max_connections=4) as url:
        sockets = _half_open(url, 24)
        try:
            peak = 0
            for _ in range(20):  # sample the thread count while the connections are held
                peak = max(peak, threading.active_count())
                time.sleep(0.05)
            assert peak - before <= 4 + 1, peak - before  # the handler threads and the accept loop
            status, body = post(url, valid_body())  # served once the silent ones time out
            assert status == 200 and len(json.loads(body)["scores"]["score"]) == 2
            closed = sum(1 for s in sockets if _closed_by_server(s))
            assert closed == len(sockets)  # every silent connection was closed by its timeout
        finally:
            for s in sockets:
                s.close()


def _closed_by_server(s: socket.socket) -> bool:
    s.settimeout(10)
    try:
        while s.recv(4096):  # a half-sent request line may get a 408/400 before the close
            pass
        return True
    except (TimeoutError, ConnectionError):
        return False


# ------------------------------------------------------------------------------- 5. malformed requests


JSON = wire.JSON_TYPE
FRAME = wire.FRAME_TYPE
MALFORMED: list[tuple[str, bytes, str, str]] = [
    ("deep JSON body", deep(100_000).encode(), JSON, "nested too deeply"),
    (
        "deep JSON in metadata",
        b'{"protocol": 1, "metadata": ' + deep(100_000).encode() + b"}",
        JSON,
        "nested",
    ),
    ("deep frame header", frame_body([1, 3, 2, 2], raw_header=deep(100_000).encode()), FRAME, "nested"),
    ("shape that wraps to 0", raw_body([2**32, 2**32, 3, 1]), JSON, "'samples.shape'"),
    ("frame shape that wraps to 0", frame_body([2**32, 2**32, 3, 1]), FRAME, "'samples' shape"),
    ("boolean shape", raw_body([True, 3, 1, 1], ONE), JSON, "positive integers"),
    ("short shape", raw_body([4], base64.b64encode(bytes(16)).decode()), JSON, "4 dimensions"),
    ("short frame shape", frame_body([4]), FRAME, "4 dimensions"),
    ("zero size", raw_body([1, 3, 0, 2]), JSON, "positive integers"),
    ("float shape", raw_body([1.0, 3, 1, 1], ONE), JSON, "'samples.shape'"),
    ("negative frame size", frame_body([1, 3, -2, 2]), FRAME, "positive integers"),
    ("one colour channel", raw_body([1, 1, 2, 2], base64.b64encode(bytes(16)).decode()), JSON, "3 colour"),
    ("data not a string", raw_body([1, 3, 1, 1], 12), JSON, "'samples.data'"),
    ("shape not a list", raw_body("1,3,1,1"), JSON, "'samples.shape'"),
    ("prompts not strings", raw_body([1, 3, 1, 1], ONE, {"prompts": [{"x": 1}]}), JSON, "'prompts'"),
    ("metadata not objects", raw_body([1, 3, 1, 1], ONE, {"metadata": [3]}), JSON, "'metadata'"),
    ("sample_rate a string", raw_body([1, 3, 1, 1], ONE, sample_rate="x"), JSON, "sample_rate"),
    ("fps not finite", raw_body([1, 3, 1, 1], ONE, fps=1e400), JSON, "fps"),
    ("empty png list", png_body([]), JSON, "non-empty list"),
    ("png item not a string", png_body([12]), JSON, "'samples.data[0]'"),
    ("bmp as png", png_body([encoded(VALID_IMAGE, "BMP")]), JSON, "'samples.data[0]'"),
    ("truncated png", png_body([encoded(VALID_IMAGE, "PNG")[:60]]), JSON, "'samples.data[0]'"),
    ("not JSON", b"{", JSON, "not JSON"),
    ("not a frame", b"\xff" * 32, FRAME, "not a vgrpo frame"),
]


@pytest.mark.parametrize("case, body, content_type, fragment", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_request_is_a_4xx_naming_the_field_and_never_reaches_the_reward(
    case, body, content_type, fragment
):
    reward = Recording()
    reply = Client(RewardApp("r", reward)).post("/score", data=body, content_type=content_type)
    text = reply.get_data(as_text=True)
    assert 400 <= reply.status_code < 500, (reply.status_code, text)
    error = reply.json["error"]
    assert fragment in error and "\n" not in error and "Traceback" not in text and SECRET not in text, error
    assert reward.calls == []


def test_non_finite_scores_travel_as_null_and_the_run_refuses_them_in_one_line():
    def scores(data: torch.Tensor) -> torch.Tensor:
        return torch.tensor([float("nan"), float("inf"), 0.5])

    body = png_body([encoded(VALID_IMAGE, "PNG")] * 3)
    reply = Client(RewardApp("r", Recording(scores))).post("/score", data=body, content_type="a/json")
    assert reply.status_code == 200
    assert strict_json(reply.get_data())["scores"]["score"] == [None, None, 0.5]
    with bounded_server(RewardApp("r", Recording(scores))) as url:
        client = build_remote(RemoteConfig(url=url, timeout_s=10), None)
        with pytest.raises(RewardError) as excinfo:
            samples = Samples("image", torch.rand(3, 3, 4, 4))
            score_all([WeightedReward("remote", client, 1.0)], samples, ["a"] * 3)
    one_line_error(excinfo, "returned nan for sample 0", "rewards must be finite")


def test_a_reward_failure_is_a_500_with_one_line_and_the_traceback_stays_on_the_server(capsys):
    class Broken:
        modalities = frozenset({"image"})

        def score(self, samples: Samples, prompts: Any, metadata: Any) -> torch.Tensor:
            raise ValueError("weights not loaded\nsecond line")

    reply = Client(RewardApp("broken", Broken())).post("/score", data=valid_body(), content_type="a/json")
    assert reply.status_code == 500
    assert reply.json["error"] == "reward 'broken' raised ValueError: weights not loaded second line"
    assert "Traceback" in capsys.readouterr().err


# ------------------------------------------------------------------------------- 6. the client's retries


@pytest.mark.parametrize("status, tries", [(400, 1), (404, 1), (413, 1), (422, 1), (500, 3), (503, 3)])
def test_the_remote_client_retries_5xx_only(status, tries):
    hits: list[int] = []

    def answer(environ: Any, start_response: Any) -> list[bytes]:
        environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        hits.append(1)
        start_response(f"{status} X", [("Content-Type", "application/json")])
        return [json.dumps({"error": "the server's own words\nsplit"}).encode()]

    with bounded_server(answer) as url:
        client = build_remote(RemoteConfig(url=url, timeout_s=10, retries=2, backoff_s=0.01), None)
        with pytest.raises(RewardError) as excinfo:
            client.score(Samples("image", torch.rand(1, 3, 2, 2)), ["a"], [{}])
    one_line_error(excinfo, "the server's own words split", *([f"HTTP {status}"] if status < 500 else []))
    assert len(hits) == tries


def test_a_request_the_server_refuses_is_not_retried():
    """A wrong-rank batch was a 500 from the reward's internals, retried as if transient: now one 400."""
    hits: list[int] = []
    app = RewardApp("r", Recording())

    def counting(environ: Any, start_response: Any) -> Any:
        hits.append(1)
        return app(environ, start_response)

    with bounded_server(counting) as url:
        client = build_remote(RemoteConfig(url=url, timeout_s=10, retries=3, backoff_s=0.01), None)
        with pytest.raises(RewardError) as excinfo:
            client.score(Samples("image", torch.rand(2, 3, 8)), ["a", "b"], [{}, {}])
    message = one_line_error(excinfo, "HTTP 400", "4 dimensions")
    assert hits == [1] and SECRET not in message


# ------------------------------------------------------------------------------- 7. a barrage


def test_the_server_survives_a_barrage_of_every_malformed_case_and_then_scores():
    reward = Recording()
    with bounded_server(RewardApp("r", reward, token=TOKEN), timeout_s=1.0, max_connections=6) as url:
        sockets = _half_open(url, 10)
        try:
            for case, body, content_type, _ in MALFORMED:
                status, raw = post(url, body, content_type, TOKEN)
                assert 400 <= status < 500 and b"Traceback" not in raw, (case, status, raw[:200])
            assert post(url, valid_body(), JSON)[0] == 401
            with ThreadPoolExecutor(6) as pool:
                parallel = list(pool.map(lambda m: post(url, m[1], m[2], TOKEN)[0], MALFORMED[:12]))
            assert all(400 <= s < 500 for s in parallel), parallel
            assert reward.calls == []
        finally:
            for s in sockets:
                s.close()
        status, raw = post(url, valid_body(), JSON, TOKEN)
        assert status == 200 and strict_json(raw)["scores"]["score"] == pytest.approx(
            [(200 + 100 + 50) / 765] * 2
        )


def _peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory (``VmHWM``), in MB."""
    with open(f"/proc/{pid}/status") as status:
        line = next(ln for ln in status if ln.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_serve_reward_memory_under_a_bomb_and_under_the_largest_allowed_request(capsys):
    """``vgrpo serve-reward brightness`` (default --max-pixels): four 6000 x 6000 PNGs (the red team's
    4.5 GB bomb) are refused from their headers; a request of exactly the budget is scored. Prints the
    server's peak resident memory after each (``-s`` shows it)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "vgrpo_platform",
        "serve-reward",
        "brightness",
        "--host",
        HOST,
        "--port",
        "0",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout=120)
        assert lines and "serving reward 'brightness'" in lines[0], (lines, proc.poll())
        url = lines[0].split(" on ")[1].strip()
        idle = _peak_rss_mb(proc.pid)
        bomb = encoded(Image.new("RGB", (6000, 6000)), "PNG", compress_level=9)
        status, raw = post(url, png_body([bomb] * 4))
        assert status == 400 and b"--max-pixels" in raw, raw[:300]
        after_bomb = _peak_rss_mb(proc.pid)
        assert after_bomb - idle < 200, (idle, after_bomb)  # refused from the headers: nothing decoded
        side = int((wire.MAX_PIXELS // 128) ** 0.5)  # 128 images of 512 x 512: exactly the budget
        largest = encoded(Image.new("RGB", (side, side), (90, 160, 30)), "PNG")
        status, raw = post(url, png_body([largest] * 128))
        assert status == 200 and len(strict_json(raw)["scores"]["score"]) == 128
        after_largest = _peak_rss_mb(proc.pid)
        status, _ = post(url, valid_body())
        assert status == 200
    finally:
        proc.kill()
        proc.wait(timeout=30)
    with capsys.disabled():
        print(
            f"\nserve-reward peak RSS: idle {idle:.0f} MB, after the 4 x 6000x6000 bomb {after_bomb:.0f} MB, "
            f"after the largest allowed request (128 x {side}x{side} png) {after_largest:.0f} MB"
        )
