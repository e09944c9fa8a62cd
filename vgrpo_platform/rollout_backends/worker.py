"""``worker``: a spawned process with its own copy of the denoiser generates the training rollouts.

The worker rebuilds the adapter from the recipe (the same factory, options and fine-tuning setup as
the trainer, so the trainable weights have the same names), receives only the trainable weights after
each update, and answers rollout requests with clean latents. It may sit on another device
(``rollout.backend_options.device``). With ``rollout.overlap = true`` the trainer asks for iteration
``i + 1``'s rollout before iteration ``i``'s update, so generation and training run at the same time
and every rollout after the first is one update old; the trainer takes the ratio against the weights
that generated it (``RolloutResult.weights_version``).

Requests and weights travel through ``torch.multiprocessing``'s shared-memory pickling; a pool of one
process keeps them in order (weights, then the request that must use them).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool, ProcessPoolExecutor
from dataclasses import replace
from typing import Any

import torch

from vgrpo_platform.conditions import encode_conditioned
from vgrpo_platform.errors import VgrpoError
from vgrpo_platform.protocols import SamplerSpec
from vgrpo_platform.rollout_backends.contract import RolloutBackend, RolloutRequest, RolloutResult

_WORKER: dict[str, Any] = {}  # in the worker: {"adapter", "trainable", "version"} or {"error": "..."}


class RolloutWorkerError(VgrpoError):
    """The rollout worker could not start, or died."""


def _start(adapter_name: str, adapter_config: Any, train: Any, context: Any, threads: int | None) -> None:
    """Pool initializer: build the adapter and its trainable weights once (errors kept for ``_ready``).

    The adapter is looked up by name among the installed plugins (a factory need not pickle)."""
    if threads:
        torch.set_num_threads(threads)
    try:
        from vgrpo_platform.finetune import make_trainable
        from vgrpo_platform.host.collect import default_registry
        from vgrpo_platform.kernels import apply_to_denoiser

        torch.manual_seed(context.seed)
        adapter = default_registry().get("adapter", adapter_name).factory(adapter_config, context)
        trainable = make_trainable(adapter, train)
        apply_to_denoiser(adapter.network.module, train, adapter_name)  # the same kernels as training's
        adapter.denoiser.eval()  # generation only; the same numbers (no dropout in these models)
    except Exception as exc:
        _WORKER["error"] = f"{type(exc).__name__}: {exc}"
        return
    _WORKER.update(adapter=adapter, trainable=trainable, version=-1)


def _ready() -> str | None:
    return _WORKER.get("error")


def _load(weights: Mapping[str, torch.Tensor], version: int) -> None:
    with torch.no_grad():
        for name, param in _WORKER["trainable"].items():
            param.copy_(weights[name])
    _WORKER["version"] = version


def _generate(
    prompts: list[str], noise: torch.Tensor, sampler: SamplerSpec, chunk_size: int
) -> tuple[torch.Tensor, int, float]:
    adapter = _WORKER["adapter"]
    t0 = time.perf_counter()
    cond = encode_conditioned(adapter, prompts)  # prompts pickle with their condition images' paths
    noise = noise.to(adapter.device)
    parts = []
    for start in range(0, len(prompts), chunk_size):
        rows = slice(start, start + chunk_size)
        parts.append(adapter.sample(noise[rows], {k: v[rows] for k, v in cond.items()}, sampler).cpu())
    return torch.cat(parts), int(_WORKER["version"]), time.perf_counter() - t0


class WorkerBackend(RolloutBackend):
    exact = False
    overlaps = True
    name = "worker"

    def __init__(self, config: Any, context: Any) -> None:
        self.config = config
        self.context = context
        self._pool: ProcessPoolExecutor | None = None
        self._sent_version: int | None = None

    def start(self, adapter: Any, trainable: Mapping[str, torch.Tensor]) -> None:
        import torch.multiprocessing as tmp  # shared-memory tensor pickling

        self.adapter = adapter
        resolved = self.context.extra.get("resolved")
        if resolved is None:
            raise RolloutWorkerError("the worker backend needs the resolved recipe in its build context")
        device = self.config.device or str(self.context.device)
        context = replace(self.context, device=torch.device(device), extra={})
        self._pool = ProcessPoolExecutor(
            max_workers=1,
            mp_context=tmp.get_context("spawn"),
            initializer=_start,
            initargs=(
                resolved.adapter.spec.name,
                resolved.adapter.config,
                resolved.recipe.train,
                context,
                self.config.threads,
            ),
        )
        try:
            error = self._pool.submit(_ready).result(timeout=self.config.start_timeout)
        except BrokenProcessPool:
            self.close()
            raise RolloutWorkerError(
                "the rollout worker died while building the model; run with rollout.backend = 'in_process' "
                "to see the model's own error"
            ) from None
        if error is not None:
            self.close()
            raise RolloutWorkerError(f"the rollout worker could not build the model: {error}")

    def push_weights(self, trainable: Mapping[str, torch.Tensor], version: int) -> None:
        if version == self._sent_version or self._pool is None:
            return
        weights = {n: p.detach().to("cpu", copy=True) for n, p in trainable.items()}
        self._pool.submit(_load, weights, version)  # ordered before every later request
        self._sent_version = version

    def submit(self, request: RolloutRequest) -> Future[RolloutResult]:
        if self._pool is None:
            raise RolloutWorkerError("the rollout worker is not running")
        inner = self._pool.submit(
            _generate, request.prompts, request.noise.detach().cpu(), request.sampler, request.chunk_size
        )
        outer: Future[RolloutResult] = Future()

        def done(f: Future) -> None:
            try:
                latents, version, seconds = f.result()
            except BrokenProcessPool:
                outer.set_exception(
                    RolloutWorkerError(
                        "the rollout worker process died (out of memory, or a crash in the model)"
                    )
                )
            except Exception as exc:
                outer.set_exception(exc)
            else:
                outer.set_result(RolloutResult(latents, version, seconds=seconds))

        inner.add_done_callback(done)
        return outer

    def generate(self, request: RolloutRequest) -> RolloutResult:
        return self.submit(request).result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
