"""A fake OpenAI-compatible VLM judge for the ``vlm_judge`` tests: a Werkzeug WSGI app on loopback.

It checks what a real server would reject (the model name, the message layout, that every image is a
``data:image/png;base64,...`` URL holding a PNG) and answers deterministically from each image's mean
brightness ``b`` in ``[0, 1]`` (of the decoded 8-bit PNG):

- pointwise ``number``: the reply is ``10 * b`` (so on the default 0-10 scale the score is ``b``);
- ``yes_probability`` (the request asks for ``top_logprobs``): ``P(yes) = 0.8 b + 0.01`` split over the
  tokens ``" Yes"`` (60 %) and ``"yes"`` (40 %), ``P(no) = 0.8 (1 - b) + 0.01`` as ``"No"``, and a
  distractor ``"The"``, so the normalised score is ``(0.8 b + 0.01) / 0.82``;
- groupwise (the request labels its images ``Image k:``): ``Image k: <10 b_k>`` lines, or a JSON list
  with ``reply_format = "json"``.

Every request is recorded (``requests``); ``override(body)`` may answer instead (``(status, body)``),
``delay_s`` slows each reply, and ``max_in_flight`` counts concurrent requests.

The loopback helpers at the end (``serving``, ``unused_port_url``, ``one_line_error``) serve the remote
reward's tests too.
"""

from __future__ import annotations

import base64
import io
import json
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from PIL import Image
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

HOST = "127.0.0.1"
MODEL = "fake/judge-vl-7b"
DATA_URL = "data:image/png;base64,"


def p_yes(b: float) -> float:
    return 0.8 * b + 0.01


def p_no(b: float) -> float:
    return 0.8 * (1 - b) + 0.01


class BadRequest(Exception):
    """A request a real server would refuse with HTTP 400."""


class FakeJudge:
    """The WSGI application; ``reset()`` between tests."""

    def __init__(self, model: str = MODEL) -> None:
        self.model = model
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.override: Callable[[dict[str, Any]], tuple[int, Any] | None] | None = None
        self.reply_format = "lines"
        self.delay_s = 0.0
        self.in_flight = 0
        self.max_in_flight = 0

    def __call__(self, environ: Any, start_response: Any) -> Any:
        request = Request(environ)
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            status, body = self._handle(request)
        finally:
            with self._lock:
                self.in_flight -= 1
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return Response(data, status=status, mimetype="application/json")(environ, start_response)

    def _handle(self, request: Request) -> tuple[int, Any]:
        if request.path != "/v1/chat/completions" or request.method != "POST":
            return 404, {"error": {"message": f"Not Found: {request.method} {request.path}", "code": 404}}
        body = json.loads(request.get_data())
        if self.delay_s:
            time.sleep(self.delay_s)
        try:
            record = self._parse(body)
        except BadRequest as exc:
            return 400, {"object": "error", "message": str(exc), "type": "BadRequestError", "code": 400}
        record["auth"] = request.headers.get("Authorization")
        with self._lock:
            self.requests.append(record)
        if self.override is not None:
            answer = self.override(body)
            if answer is not None:
                return answer
        if body["model"] != self.model:
            return 404, {"error": {"message": f"The model `{body['model']}` does not exist.", "code": 404}}
        return 200, self._answer(body, record)

    def _parse(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or messages[-1].get("role") != "user":
            raise BadRequest("messages must end with a user message")
        content = messages[-1]["content"]
        if not isinstance(content, list):
            raise BadRequest("the user message must be a list of content parts")
        texts, sizes, brightness = [], [], []
        for part in content:
            if part.get("type") == "text":
                texts.append(part["text"])
            elif part.get("type") == "image_url":
                url = part["image_url"]["url"]
                if not url.startswith(DATA_URL):
                    raise BadRequest(f"image URL is not a PNG data URL: {url[:40]!r}")
                image = Image.open(io.BytesIO(base64.b64decode(url[len(DATA_URL) :], validate=True)))
                if image.format != "PNG":
                    raise BadRequest(f"image is {image.format}, not PNG")
                pixels = np.asarray(image.convert("RGB"), dtype=np.float64)
                sizes.append(image.size)
                brightness.append(float(pixels.mean() / 255))
            else:
                raise BadRequest(f"unknown content part type {part.get('type')!r}")
        return {"body": body, "texts": texts, "sizes": sizes, "brightness": brightness}

    def _answer(self, body: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
        b = record["brightness"]
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
        if body.get("top_logprobs"):
            (x,) = b
            tops = [
                {"token": " Yes", "logprob": math.log(0.6 * p_yes(x))},
                {"token": "yes", "logprob": math.log(0.4 * p_yes(x))},
                {"token": "No", "logprob": math.log(p_no(x))},
                {"token": "The", "logprob": math.log(0.05)},
            ]
            tops = sorted(tops, key=lambda t: -t["logprob"])[: int(body["top_logprobs"])]
            text = tops[0]["token"].strip()
            first = {"token": tops[0]["token"], "logprob": tops[0]["logprob"], "top_logprobs": tops}
            choice["logprobs"] = {"content": [first]}
        elif "Image 1:" in record["texts"]:
            if self.reply_format == "json":
                text = json.dumps([round(10 * x, 6) for x in b])
            else:
                text = "\n".join(f"Image {k}: {10 * x:.6f}" for k, x in enumerate(b, 1))
        else:
            (x,) = b
            text = f"{10 * x:.6f}"
        choice["message"] = {"role": "assistant", "content": text}
        return {"id": "cmpl-fake", "object": "chat.completion", "model": self.model, "choices": [choice]}


def reply(text: str | None, **choice: Any) -> tuple[int, dict[str, Any]]:
    """An HTTP 200 chat completion whose message content is ``text``."""
    message = {"role": "assistant", "content": text}
    return 200, {"choices": [{"index": 0, "message": message, "finish_reason": "stop", **choice}]}


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` on a free loopback port in a daemon thread; yields its ``http://host:port``."""
    server = make_server(HOST, 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://{HOST}:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def serve_in_background(app: Any) -> str:
    """``app`` on a free loopback port for the rest of the process (a daemon thread); its URL."""
    server = make_server(HOST, 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return f"http://{HOST}:{server.server_port}"


def unused_port_url() -> str:
    """``http://host:port`` of a loopback port that was free a moment ago, and nothing listens on it now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    return f"http://{HOST}:{port}"


def one_line_error(excinfo: Any, *fragments: str) -> str:
    """The message of the error in ``excinfo`` (a ``pytest.raises`` result): one line, holding every
    fragment."""
    message = str(excinfo.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message
