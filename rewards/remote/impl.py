"""The ``remote`` Reward: POST /score in chunks, bounded retries, one-line errors with the fix.

Each request is a protocol-2 frame (``reward_wire.encode_frame``): the samples' bytes are sent from the
tensor's memory as they are, so a batch of any size goes in one request without a text copy.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from vgrpo_platform import reward_wire as wire
from vgrpo_platform.errors import RewardError
from vgrpo_platform.protocols import Samples
from vgrpo_platform.retrying import TransientError

from .._http import JsonPoster

if TYPE_CHECKING:
    from . import Config


class RemoteReward(JsonPoster):
    """Sends each batch (or ``batch_size`` chunk) to ``url/score``; returns what the server's reward did."""

    modalities = frozenset({"image", "video", "audio"})
    not_json_fix = "check that options.url points at a vgrpo serve-reward"
    timeout_fix = "raise options.timeout_s or lower options.batch_size"
    unreachable_fix = "start it with `vgrpo serve-reward NAME --port P` or fix options.url"

    def __init__(self, config: Config) -> None:
        self.config = config
        self.url = config.url.rstrip("/")
        self.server = self.replier = f"the reward server at {self.url}"
        self.token = _token(config)
        self.groups = config.groups  # the core then calls score once per prompt group (scoring.py)

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> dict[str, torch.Tensor]:
        batch = len(samples)
        if batch == 0:
            return {"score": torch.zeros(0, device=samples.data.device)}
        size = batch if self.groups else self.config.batch_size or batch  # a group travels whole
        chunks = []
        for lo in range(0, batch, size):
            hi = min(lo + size, batch)
            part = Samples(samples.modality, samples.data[lo:hi], samples.sample_rate, samples.fps)
            chunks.append(self._score_chunk(part, prompts[lo:hi], metadata[lo:hi]))
        keys = chunks[0].keys()
        if any(c.keys() != keys for c in chunks):
            raise RewardError(
                f"remote reward at {self.url} returned different score keys for different chunks"
            )
        device = samples.data.device
        return {k: torch.cat([c[k] for c in chunks]).to(device) for k in keys}

    def _score_chunk(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> dict[str, torch.Tensor]:
        try:
            frame = wire.encode_frame(samples, prompts, metadata, whole_group=self.groups)
        except TypeError as exc:
            raise RewardError(
                f"remote reward: metadata is not JSON ({exc}); pass only strings, numbers, lists and dicts"
            ) from None
        reply = self._post(frame)
        if self.config.reward is not None and reply.get("reward") != self.config.reward:
            raise RewardError(
                f"the server at {self.url} serves reward {reply.get('reward')!r}, not "
                f"{self.config.reward!r}; fix options.url or options.reward"
            )
        try:
            return wire.decode_scores(reply, len(samples))
        except wire.WireError as exc:
            raise RewardError(
                f"malformed reply from the reward server at {self.url}: {exc}; run a vgrpo serve-reward "
                f"of protocol {wire.PROTOCOL} there"
            ) from None

    def _request(self, body: wire.Frame) -> urllib.request.Request:
        # an iterable body with its Content-Length: urllib sends the pieces one after another, unjoined
        headers = {"Content-Type": wire.FRAME_TYPE, "Content-Length": str(body.length)}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        return urllib.request.Request(f"{self.url}/score", data=body.chunks, headers=headers, method="POST")

    def _http_error(self, code: int, body: bytes) -> Exception:
        message = _error_text(body)
        if code >= 500:
            return TransientError(f"{self.server} failed: {message}; fix the served reward")
        if code in (401, 403):
            return RewardError(
                f"{self.server} refused the request (HTTP {code}): {message}; set options.token_env to "
                "the variable holding the token the server was started with (vgrpo serve-reward --token-env)"
            )
        return RewardError(
            f"{self.server} refused the request (HTTP {code}): {message}; check the modality, the "
            f"protocol (this client sends {wire.PROTOCOL}; a server that answers 'not JSON' is an older "
            "vgrpo that speaks only 1: upgrade it) and options.batch_size"
        )


def _token(config: Config) -> str | None:
    """The token in the variable ``options.token_env`` names (a recipe holds only the name)."""
    if config.token_env is None:
        return None
    value = os.environ.get(config.token_env, "").strip()
    if not value:
        raise RewardError(
            f"remote: options.token_env names {config.token_env}, which is not set; export it (the token "
            "the server was started with) or drop options.token_env"
        )
    return value


def _error_text(body: bytes) -> str:
    """The server's ``error``, else the body's start, on one line of at most 300 characters."""
    try:
        text = str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError, RecursionError):
        text = body[:300].decode("utf-8", "replace") or "no details"
    text = " ".join(text.split())
    return text if len(text) <= 300 else text[:297] + "..."
