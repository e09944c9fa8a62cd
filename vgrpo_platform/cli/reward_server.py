"""``vgrpo serve-reward``: any installed reward plugin behind ``GET /health`` and ``POST /score``.

Why a separate process: a reward with a large model (a VLM judge) can live on its own GPU or host
and serve several training runs; the ``remote`` reward plugin is the client. The server is
Werkzeug's WSGI server (the optional extra ``vgrpo[serve]``); scoring is serialised by a lock
because rewards are not required to be thread-safe, while ``/health`` answers during a long call.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from vgrpo_platform import reward_wire as wire
from vgrpo_platform.errors import VgrpoError
from vgrpo_platform.protocols import Reward

MAX_BODY = 1 << 30  # 1 GiB: a batch of 64 float32 videos of 33 x 3 x 480 x 832 is ~10 GiB, so chunk those


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
            "modalities": sorted(self.reward.modalities),
            "options": self.options,
        }

    def score(self, body: bytes) -> dict[str, Any]:
        try:
            request = json.loads(body)
        except ValueError as exc:
            raise wire.WireError(f"the body is not JSON: {exc}") from None
        if not isinstance(request, dict):
            raise wire.WireError("the body must be a JSON object")
        if request.get("protocol") != wire.PROTOCOL:
            raise wire.WireError(
                f"protocol {request.get('protocol')!r} requested, this server speaks {wire.PROTOCOL}"
            )
        samples = wire.decode_samples(request.get("samples"))
        prompts, metadata = request.get("prompts"), request.get("metadata", [{}] * len(samples))
        if not (isinstance(prompts, list) and len(prompts) == len(samples)):
            raise wire.WireError(f"'prompts' must be a list of {len(samples)} strings")
        if not (isinstance(metadata, list) and len(metadata) == len(samples)):
            raise wire.WireError(f"'metadata' must be a list of {len(samples)} objects")
        if samples.modality not in self.reward.modalities:
            raise wire.WireError(
                f"reward '{self.name}' scores {sorted(self.reward.modalities)}, not {samples.modality}"
            )
        with self._lock:
            out = self.reward.score(samples, prompts, metadata)
        return {"protocol": wire.PROTOCOL, "reward": self.name, "scores": wire.encode_scores(out)}

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        from werkzeug.exceptions import HTTPException
        from werkzeug.wrappers import Request, Response

        request = Request(environ)
        request.max_content_length = MAX_BODY
        status, reply = 200, None
        try:
            if request.path == "/health" and request.method == "GET":
                reply = self.health()
            elif request.path == "/score" and request.method == "POST":
                reply = self.score(request.get_data(cache=False))
            else:
                status, reply = (
                    404,
                    {"error": f"no {request.method} {request.path}; use GET /health or POST /score"},
                )
        except wire.WireError as exc:
            status, reply = 400, {"error": f"bad request: {exc}"}
        except HTTPException as exc:  # e.g. 413 for a body over MAX_BODY
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
