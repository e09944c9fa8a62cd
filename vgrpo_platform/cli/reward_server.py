"""``vgrpo serve-reward``: any installed reward plugin behind ``GET /health`` and ``POST /score``.

Why a separate process: a reward with a large model (a VLM judge) can live on its own GPU or host
and serve several training runs; the ``remote`` reward plugin is the client. The server is
Werkzeug's WSGI server (the optional extra ``vgrpo[serve]``); scoring is serialised by a lock
because rewards are not required to be thread-safe, while ``/health`` answers during a long call.
A protocol-2 request's body is read from the connection straight into the samples tensor
(``reward_wire.read_frame``); protocol 1's JSON body is still served.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from vgrpo_platform import reward_wire as wire
from vgrpo_platform.errors import VgrpoError
from vgrpo_platform.protocols import Reward

MAX_JSON_BODY = 1 << 30
"""Protocol 1's limit (1 GiB): its JSON body, base64 text a third larger than the samples, is held whole."""
MAX_FRAME_BODY = 1 << 38
"""Protocol 2's limit (256 GiB): the body streams into the samples tensor, so only the samples' own size
counts (a batch of 64 float32 clips of 33 x 3 x 480 x 832 is ~10 GiB); a larger one is a mistake."""


class RewardApp:
    """The WSGI application: one reward instance, built once, scored under a lock."""

    def __init__(self, name: str, reward: Reward, options: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self.reward = reward
        self.options = dict(options or {})
        self._lock = threading.Lock()

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "reward": self.name,
            "protocol": wire.PROTOCOL,
            "protocols": list(wire.PROTOCOLS),
            "modalities": sorted(self.reward.modalities),
            "options": self.options,
        }

    def score(self, body: bytes) -> dict[str, Any]:
        """The reply to a protocol-1 JSON body."""
        return self.score_request(wire.decode_request(body))

    def score_request(self, request: wire.ScoreRequest) -> dict[str, Any]:
        """The reply to a request of either protocol: the reward's scores, in the request's protocol."""
        if request.samples.modality not in self.reward.modalities:
            modality, scored = request.samples.modality, sorted(self.reward.modalities)
            raise wire.WireError(f"reward '{self.name}' scores {scored}, not {modality}")
        with self._lock:
            out = self.reward.score(request.samples, request.prompts, request.metadata)
        return {"protocol": request.protocol, "reward": self.name, "scores": wire.encode_scores(out)}

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        from werkzeug.exceptions import HTTPException
        from werkzeug.wrappers import Request, Response

        request = Request(environ)
        status, reply = 200, None
        try:
            if request.path == "/health" and request.method == "GET":
                reply = self.health()
            elif (
                request.path == "/score" and request.method == "POST" and request.mimetype == wire.FRAME_TYPE
            ):
                request.max_content_length = MAX_FRAME_BODY  # checked before a byte is read
                reply = self.score_request(wire.read_frame(request.stream, request.content_length))
            elif request.path == "/score" and request.method == "POST":
                request.max_content_length = MAX_JSON_BODY
                reply = self.score(request.get_data(cache=False))
            else:
                status, reply = (
                    404,
                    {"error": f"no {request.method} {request.path}; use GET /health or POST /score"},
                )
        except wire.WireError as exc:
            status, reply = 400, {"error": f"bad request: {exc}"}
        except HTTPException as exc:  # e.g. 413 for a body over the limit
            status, reply = exc.code or 400, {"error": f"{exc.name}: {exc.description}"}
        except Exception as exc:  # the reward's own failure goes back to the client, the server lives on
            status, reply = 500, {"error": f"reward '{self.name}' raised {type(exc).__name__}: {exc}"}
        response = Response(json.dumps(reply), status=status, mimetype="application/json")
        return response(environ, start_response)


def make_server(app: RewardApp, host: str, port: int) -> Any:
    """A threaded Werkzeug server bound to ``host:port`` (port 0: a free one, see ``.server_port``)."""
    try:
        from werkzeug.serving import make_server as werkzeug_server
    except ImportError:
        raise VgrpoError(
            "vgrpo serve-reward needs Werkzeug, which is not installed; pip install 'vgrpo[serve]'"
        ) from None
    try:
        return werkzeug_server(host, port, app, threaded=True)
    except OSError as exc:
        raise VgrpoError(f"cannot listen on {host}:{port}: {exc}; choose another --port or --host") from None
