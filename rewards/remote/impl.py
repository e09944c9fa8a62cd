"""The ``remote`` Reward: POST /score in chunks, bounded retries, one-line errors with the fix."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from vgrpo_platform import reward_wire as wire
from vgrpo_platform.errors import RewardError
from vgrpo_platform.protocols import Samples
from vgrpo_platform.retrying import TransientError, with_retries

if TYPE_CHECKING:
    from . import Config


class RemoteReward:
    """Sends each batch (or ``batch_size`` chunk) to ``url/score``; returns what the server's reward did."""

    modalities = frozenset({"image", "video", "audio"})

    def __init__(self, config: Config) -> None:
        self.config = config
        self.url = config.url.rstrip("/")

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> dict[str, torch.Tensor]:
        batch = len(samples)
        if batch == 0:
            return {"score": torch.zeros(0, device=samples.data.device)}
        size = self.config.batch_size or batch
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
            body = wire.encode_request(samples, prompts, metadata)
        except TypeError as exc:
            raise RewardError(
                f"remote reward: metadata is not JSON ({exc}); pass only strings, numbers, lists and dicts"
            ) from None
        reply = self._post(body)
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

    def _post(self, body: bytes) -> dict[str, Any]:
        """One POST with up to ``retries`` more tries on transient failures, backing off between them."""
        return with_retries(
            lambda: self._post_once(body), retries=self.config.retries, backoff_s=self.config.backoff_s
        )

    def _post_once(self, body: bytes) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.url}/score", data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.config.timeout_s) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            message = _error_text(exc.read())
            if exc.code >= 500:
                raise TransientError(
                    f"the reward server at {self.url} failed: {message}; fix the served reward"
                ) from None
            raise RewardError(
                f"the reward server at {self.url} refused the request (HTTP {exc.code}): {message}; "
                "check the modality, the protocol and options.batch_size"
            ) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:  # timeouts are OSErrors
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError):
                raise TransientError(
                    f"no reply from the reward server at {self.url} within {self.config.timeout_s:g} s; "
                    "raise options.timeout_s or lower options.batch_size"
                ) from None
            raise TransientError(
                f"cannot reach the reward server at {self.url} ({reason}); start it with "
                "`vgrpo serve-reward NAME --port P` or fix options.url"
            ) from None
        try:
            reply = json.loads(text)
        except ValueError:
            raise RewardError(
                f"malformed reply from the reward server at {self.url}: not JSON ({text[:60]!r}); "
                "check that options.url points at a vgrpo serve-reward"
            ) from None
        if not isinstance(reply, dict):
            raise RewardError(f"malformed reply from the reward server at {self.url}: not a JSON object")
        return reply


def _error_text(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace") or "no details"
