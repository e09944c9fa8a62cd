"""``http_engine``: a rollout backend whose rollouts come from an engine behind HTTP.

The engine's side of the contract, three routes:

- ``GET /health`` -> ``{"ok": true}``.
- ``POST /weights`` (a safetensors file of the trainable weights; header ``X-Weights-Version``) -> 200.
- ``POST /generate`` (JSON: ``prompts`` [B], ``seeds`` [B], ``noise`` (optional, ``wire.pack``),
  ``sampler``, ``steps``, ``chunk_size``, ``weights_version``) -> JSON ``latents`` (``wire.pack``),
  ``weights_version`` (the weights it used), ``noise`` (what it drew, when no noise was sent) and
  ``seconds``.

Requests run in one background thread, in order, so ``submit`` returns at once and
``rollout.overlap = true`` can overlap the engine's generation with the trainer's update.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from safetensors.torch import save

from vgrpo_example_engine.wire import pack, unpack
from vgrpo_platform.errors import VgrpoError
from vgrpo_platform.rollout_backends.contract import RolloutBackend, RolloutRequest, RolloutResult


class EngineError(VgrpoError):
    """The engine could not be reached or refused a request."""


class HttpEngineBackend(RolloutBackend):
    exact = False
    overlaps = True
    name = "http_engine"

    def __init__(self, url: str, *, timeout: float = 600.0, send_noise: bool = True) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.send_noise = send_noise
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="http_engine")
        self._sent_version: int | None = None

    def _post(self, route: str, body: bytes, headers: dict[str, str]) -> bytes:
        request = urllib.request.Request(f"{self.url}{route}", data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.read()
        except OSError as exc:
            raise EngineError(f"the engine at {self.url} failed on {route}: {exc}") from None

    def start(self, adapter: Any, trainable: Mapping[str, torch.Tensor]) -> None:
        self.adapter = adapter
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=10) as response:
                json.loads(response.read())
        except OSError as exc:
            raise EngineError(
                f"no engine answers at {self.url} ({exc}); start it first, or set rollout.backend_options.url"
            ) from None

    def push_weights(self, trainable: Mapping[str, torch.Tensor], version: int) -> None:
        if version == self._sent_version:
            return
        body = save({n: p.detach().to("cpu", copy=True).contiguous() for n, p in trainable.items()})
        headers = {"Content-Type": "application/octet-stream", "X-Weights-Version": str(version)}
        self._thread.submit(self._post, "/weights", body, headers)  # ordered before later requests
        self._sent_version = version

    def _generate(self, request: RolloutRequest) -> RolloutResult:
        payload = {
            "prompts": request.prompts,
            "seeds": request.seeds,
            "sampler": request.sampler.name,
            "steps": request.sampler.steps,
            "chunk_size": request.chunk_size,
            "weights_version": request.weights_version,
        }
        if self.send_noise:
            payload["noise"] = pack(request.noise)
        body = self._post("/generate", json.dumps(payload).encode(), {"Content-Type": "application/json"})
        answer = json.loads(body)
        noise = unpack(answer["noise"]) if "noise" in answer else None
        return RolloutResult(
            unpack(answer["latents"]), int(answer["weights_version"]), noise=noise, seconds=answer["seconds"]
        )

    def submit(self, request: RolloutRequest) -> Future[RolloutResult]:
        return self._thread.submit(self._generate, request)

    def generate(self, request: RolloutRequest) -> RolloutResult:
        return self.submit(request).result()

    def close(self) -> None:
        self._thread.shutdown(wait=True, cancel_futures=True)
