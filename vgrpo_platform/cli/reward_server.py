"""``vgrpo serve-reward``: any installed reward plugin behind ``GET /health`` and ``POST /score``.

Why a separate process: a reward with a large model (a VLM judge) can live on its own GPU or host
and serve several training runs; the ``remote`` reward plugin is the client. The server is
Werkzeug's WSGI server (the optional extra ``vgrpo[serve]``); scoring is serialised by a lock
because rewards are not required to be thread-safe, while ``/health`` answers during a long call.
A protocol-2 request's body is read from the connection straight into the samples tensor
(``reward_wire.read_frame``); protocol 1's JSON body is still served.

What it defends (docs/rewards.md, "Security"): an optional bearer token checked in constant time; no
option value in any reply; encoded images refused beyond a pixel budget read from their headers, and
decoded under a bounded semaphore; a socket timeout and a cap on handler threads, so idle connections
cannot pile up threads; every malformed request a 4xx naming the field.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from vgrpo_platform import reward_wire as wire
from vgrpo_platform.errors import VgrpoError
from vgrpo_platform.protocols import Reward
from vgrpo_platform.training.iteration.scoring import is_group_reward

MAX_JSON_BODY = 1 << 30
"""Protocol 1's limit (1 GiB): its JSON body, base64 text a third larger than the samples, is held whole."""
MAX_FRAME_BODY = 1 << 38
"""Protocol 2's limit (256 GiB): the body streams into the samples tensor, so only the samples' own size
counts (a batch of 64 float32 clips of 33 x 3 x 480 x 832 is ~10 GiB); a larger one is a mistake."""
DECODE_SLOTS = 2
"""Protocol-1 requests decoded or scored at once: each holds its decoded samples (at most the pixel budget
of images) from decoding to its reply, so this bounds their memory while one decodes as another scores."""
TIMEOUT_S = 60.0
"""Default seconds a connection may stay silent (no request line, a stalled body, an unread reply)."""
MAX_CONNECTIONS = 32
"""Default connections served at once, each on its own thread; more wait in the listen backlog."""


class RewardApp:
    """The WSGI application: one reward instance, built once, scored under a lock.

    ``token``: the bearer token every request must carry (``Authorization: Bearer ...``), None for none;
    ``max_pixels``: the pixel budget of one request's encoded images.
    """

    def __init__(
        self,
        name: str,
        reward: Reward,
        options: Mapping[str, Any] | None = None,
        *,
        token: str | None = None,
        max_pixels: int = wire.MAX_PIXELS,
    ) -> None:
        self.name = name
        self.reward = reward
        self.options = dict(options or {})
        self._hidden = sorted(set(_strings(self.options)), key=len, reverse=True)
        self.token = token.encode() if token else None
        self.max_pixels = max_pixels
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(DECODE_SLOTS)

    def health(self) -> dict[str, Any]:
        """Status, protocol and the option *names* (a value may be a secret such as an API key)."""
        return {
            "status": "ok",
            "reward": self.name,
            "protocol": wire.PROTOCOL,
            "protocols": list(wire.PROTOCOLS),
            "modalities": sorted(self.reward.modalities),
            "groups": is_group_reward(self.reward),
            "options": sorted(self.options),
        }

    def score(self, body: bytes) -> dict[str, Any]:
        """The reply to a protocol-1 JSON body: decoded and scored holding one of ``DECODE_SLOTS``."""
        with self._slots:
            return self.score_request(wire.decode_request(body, self.max_pixels))

    def score_request(self, request: wire.ScoreRequest) -> dict[str, Any]:
        """The reply to a request of either protocol: the reward's scores, in the request's protocol."""
        if request.samples.modality not in self.reward.modalities:
            modality, scored = request.samples.modality, sorted(self.reward.modalities)
            raise wire.WireError(f"reward '{self.name}' scores {scored}, not {modality}")
        if is_group_reward(self.reward) and not request.whole_group:
            raise wire.WireError(
                f"reward '{self.name}' scores one prompt's whole group per call; set options.groups = true "
                "in the recipe's remote reward (it then sends each group as one request)"
            )
        with self._lock:
            try:
                out = self.reward.score(request.samples, request.prompts, request.metadata)
            except Exception as exc:
                raise RewardFailed(exc) from exc
        return {"protocol": request.protocol, "reward": self.name, "scores": wire.encode_scores(out)}

    def redact(self, text: str) -> str:
        """``text`` with every string option value of 4 or more characters replaced by ``<redacted>``:
        a reward's error message may quote its options, and one may be a secret."""
        for value in self._hidden:
            text = text.replace(value, "<redacted>")
        return text

    def authorised(self, header: str | None) -> bool:
        """Whether ``header`` (the request's ``Authorization``) carries the token; compared in constant
        time, so the reply's timing does not tell how much of a guess was right."""
        if self.token is None:
            return True
        scheme, _, given = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        from werkzeug.exceptions import HTTPException
        from werkzeug.wrappers import Request, Response

        request = Request(environ)
        status, reply = 200, None
        try:
            if not self.authorised(request.headers.get("Authorization")):
                status, reply = 401, {"error": "missing or wrong token: send 'Authorization: Bearer <token>'"}
            elif request.path == "/health" and request.method == "GET":
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
        except RewardFailed as failed:  # the reward's own failure: one line back, the traceback here
            cause = failed.__cause__ or failed
            traceback.print_exception(cause, file=sys.stderr)
            status, reply = 500, {"error": self.redact(f"reward '{self.name}' raised {_one_line(cause)}")}
        except Exception as exc:  # a fault of the server itself: its traceback here, not to the client
            traceback.print_exc(file=sys.stderr)
            status, reply = 500, {"error": f"the reward server failed ({type(exc).__name__}); see its log"}
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        text = json.dumps(reply, allow_nan=False)
        response = Response(text, status=status, headers=headers, mimetype="application/json")
        return response(environ, start_response)


class RewardFailed(Exception):
    """The served reward raised (its exception is the ``__cause__``): a 500, unlike a bad request's 4xx."""


def _strings(value: Any) -> Iterable[str]:
    """The strings of 4 or more characters in an option value, nested lists and tables included."""
    if isinstance(value, str):
        if len(value) >= 4:
            yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def _one_line(exc: BaseException) -> str:
    """``Type: message`` of the reward's exception on one line, at most 300 characters."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 300 else text[:297] + "..."


def _server_class(timeout_s: float, max_connections: int) -> type[Any]:
    """Werkzeug's threaded server with a socket timeout and at most ``max_connections`` handler threads.

    Why: the stock server starts a thread per connection and waits on each socket forever, so idle or
    half-open connections pile up threads. Here the accept loop takes a slot before starting a thread
    (a connection beyond the cap waits in the listen backlog), the thread frees it when its connection
    ends, and a connection silent for ``timeout_s`` is closed.
    """
    from werkzeug.serving import ThreadedWSGIServer, WSGIRequestHandler

    class Handler(WSGIRequestHandler):
        timeout = timeout_s  # socketserver sets it on the connection: every read and write

    class BoundedServer(ThreadedWSGIServer):
        def __init__(self, host: str, port: int, app: Any) -> None:
            self.slots = threading.BoundedSemaphore(max_connections)
            self.stopping = False
            super().__init__(host, port, app, Handler)

        def process_request(self, request: Any, client_address: Any) -> None:
            while not self.slots.acquire(timeout=0.2):
                if self.stopping:
                    self.shutdown_request(request)
                    return
            try:
                super().process_request(request, client_address)
            except BaseException:  # no thread started: its slot is free again
                self.slots.release()
                raise

        def process_request_thread(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                self.slots.release()

        def shutdown(self) -> None:
            self.stopping = True
            super().shutdown()

    return BoundedServer


def read_token(env_name: str | None) -> str | None:
    """The token in environment variable ``env_name`` (``--token-env``; None: no token). Read from the
    environment, not the command line, so it does not show in ``ps``."""
    if env_name is None:
        return None
    token = os.environ.get(env_name, "").strip()
    if not token:
        raise VgrpoError(
            f"--token-env names {env_name}, which is not set or empty; export {env_name}=<token>"
        )
    return token


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable only from this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost: it may resolve to anything
        return False


def make_server(
    app: RewardApp,
    host: str,
    port: int,
    *,
    timeout_s: float = TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
) -> Any:
    """A threaded Werkzeug server bound to ``host:port`` (port 0: a free one, see ``.server_port``), at
    most ``max_connections`` connections at once, each closed after ``timeout_s`` of silence."""
    try:
        server_class = _server_class(timeout_s, max_connections)
    except ImportError:
        raise VgrpoError(
            "vgrpo serve-reward needs Werkzeug, which is not installed; pip install 'vgrpo[serve]'"
        ) from None
    try:
        return server_class(host, port, app)
    except OSError as exc:
        raise VgrpoError(f"cannot listen on {host}:{port}: {exc}; choose another --port or --host") from None
