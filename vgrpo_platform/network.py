"""The one place the denoiser is called.

An adapter says which module is its denoiser, how to build that module's keyword inputs from
``(z_t, t, cond)`` (packing, position ids, guidance embeddings, timestep scaling) and how to read its
output back into the latent layout. The core holds the module and makes the call (``DenoiserCall``),
so every wrapper is applied here once, whatever the model: the data-parallel wrapper that averages
gradients (DDP, a DeepSpeed engine), hooks installed for a rollout only (diffusers' caches) and a cap
on the rows one forward sees.

``CoreCalledAdapter`` is the adapter side of that contract: an adapter that subclasses it writes
``denoiser_inputs`` (and ``denoiser_output`` where the output needs unpacking) and gets ``predict``
and ``sample`` from the core.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from vgrpo_platform.noise_schedules import RectifiedFlowSchedule
    from vgrpo_platform.protocols import Conditioning, SamplerSpec

CallHook = Callable[[torch.nn.Module, str], AbstractContextManager[Any]]
"""Entered around each call of the module with the call's branch name (``"cond"``, ``"uncond"``), e.g. a
diffusers cache that keeps one state per branch; installed for a while with ``DenoiserCall.hooked``."""


class DenoiserCall:
    """Holds the denoiser module and calls it; wrappers are set here, never patched into the module.

    - ``route_gradients(wrapper)``: forwards that build a graph go through ``wrapper`` (accelerate's DDP
      module or DeepSpeed engine, which all-reduce the gradients); forwards without gradients (rollouts,
      the old policy's values, evaluation) reach the module itself, as there is nothing to average.
    - ``hooked(hook)``: a ``CallHook`` around every call while its context lasts (a rollout backend's cache;
      training forwards run outside it). ``branch(name)`` names the calls that follow (CFG's second call).
    - ``max_rows``: the most rows one ``predict`` sends through the module (``rows_at_most``).
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.gradient_wrapper: Callable[..., Any] | None = None
        self.call_hooks: list[CallHook] = []
        self.branch_name = "cond"
        self.max_rows: int | None = None
        self._local = threading.local()  # per-thread: a bypass in one thread leaves others routed

    def __call__(self, inputs: Mapping[str, Any]) -> Any:
        """The network's raw output for keyword ``inputs`` (what ``denoiser_inputs`` built)."""
        if not self.call_hooks:
            return self._forward(inputs)
        with ExitStack() as stack:
            for hook in self.call_hooks:
                stack.enter_context(hook(self.module, self.branch_name))
            return self._forward(inputs)

    def _forward(self, inputs: Mapping[str, Any]) -> Any:
        if self.gradient_wrapper is not None and torch.is_grad_enabled() and not self._bypassed():
            return self.gradient_wrapper(**inputs)
        return self.module(**inputs)

    # ------------------------------------------------------------------------------------- wrappers
    def route_gradients(self, wrapper: Callable[..., Any] | None) -> None:
        """Send forwards with gradients through ``wrapper`` (None: straight to the module again)."""
        self.gradient_wrapper = wrapper

    def _bypassed(self) -> bool:
        return bool(getattr(self._local, "bypass", False))

    @contextmanager
    def unrouted(self) -> Iterator[None]:
        """Inside, forwards reach the module itself: gradients a rank takes for itself, never averaged."""
        previous = self._bypassed()
        self._local.bypass = True
        try:
            yield
        finally:
            self._local.bypass = previous

    @contextmanager
    def rows_at_most(self, rows: int) -> Iterator[None]:
        """Inside, ``predict`` splits any batch into slices of at most ``rows`` rows (bounded memory)."""
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        previous, self.max_rows = self.max_rows, rows
        try:
            yield
        finally:
            self.max_rows = previous

    @contextmanager
    def hooked(self, hook: CallHook) -> Iterator[None]:
        """Inside, ``hook`` wraps every call of the module."""
        self.call_hooks.append(hook)
        try:
            yield
        finally:
            self.call_hooks.remove(hook)

    @contextmanager
    def branch(self, name: str) -> Iterator[None]:
        """Inside, calls are named ``name`` for the call hooks (default ``"cond"``)."""
        previous, self.branch_name = self.branch_name, name
        try:
            yield
        finally:
            self.branch_name = previous


class CoreCalledAdapter:
    """The adapter side of ``DenoiserCall``: ``predict`` and ``sample`` written once, in the core.

    A subclass sets ``denoiser`` (the trained module) and ``schedule`` and implements
    ``denoiser_inputs``; it overrides ``denoiser_output`` when the raw output needs more than taking
    its first element, ``policy_velocity`` when the trained prediction is more than one call (CFG in
    training), and ``rollout_velocity`` when rollouts guide differently from training.
    """

    denoiser: torch.nn.Module
    schedule: RectifiedFlowSchedule  # sample() integrates the rectified-flow ODE with its shift

    @property
    def network(self) -> DenoiserCall:
        """The core's call of ``denoiser`` (made on first use, then kept with its wrappers)."""
        call = self.__dict__.get("_denoiser_call")
        if call is None:
            call = self.__dict__["_denoiser_call"] = DenoiserCall(self.denoiser)
        return call

    # ------------------------------------------------------------------------------ what it describes
    def denoiser_inputs(self, z_t: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> dict[str, Any]:
        """The denoiser's keyword inputs for latents ``z_t`` ``[B, *L]`` at ``t`` ``[B]`` in ``[0, 1]``."""
        raise NotImplementedError(f"{type(self).__name__} must implement denoiser_inputs()")

    def denoiser_output(self, output: Any, z_t: torch.Tensor) -> torch.Tensor:
        """The raw output read back as ``[B, *L]`` (default: the first element of a tuple, as diffusers'
        ``return_dict=False`` gives)."""
        return output[0] if isinstance(output, (tuple, list)) else output

    # ------------------------------------------------------------------------------ what the core does
    def network_velocity(self, z_t: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """One call of the denoiser through the core: ``[B, *L]`` in the network's dtype."""
        return self.denoiser_output(self.network(self.denoiser_inputs(z_t, t, cond)), z_t)

    def policy_velocity(self, z_t: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """The trained policy's output (``t`` already ``[B]``); CFG adapters may guide it."""
        return self.network_velocity(z_t, t, cond)

    def rollout_velocity(self, z_t: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """The velocity a rollout integrates; the policy's own unless the adapter guides rollouts."""
        return self.predict(z_t, t, cond)

    def predict(self, z_t: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """Model output at ``z_t`` ``[B, *L]``, ``t`` ``[B]`` (or a scalar), in ``z_t``'s dtype;
        at most ``network.max_rows`` rows per forward."""
        t = t.to(device=z_t.device, dtype=torch.float32).expand(z_t.shape[0])  # [B]
        rows = self.network.max_rows
        if rows is None or z_t.shape[0] <= rows:
            return self.policy_velocity(z_t, t, cond).to(z_t.dtype)
        parts = []
        for start in range(0, z_t.shape[0], rows):
            part = slice(start, start + rows)
            cond_part = {k: v[part] for k, v in cond.items()}
            parts.append(self.policy_velocity(z_t[part], t[part], cond_part).to(z_t.dtype))
        return torch.cat(parts)

    def sample(self, noise: torch.Tensor, cond: Conditioning, sampler: SamplerSpec) -> torch.Tensor:
        """Clean latents ``[B, *L]`` integrated from noise at t=1, without gradient."""
        from vgrpo_platform.ode_solvers import solve_flow_ode

        with torch.no_grad():
            return solve_flow_ode(
                lambda z, t: self.rollout_velocity(z, t, cond), noise, sampler, shift=self.schedule.shift
            )


def denoiser_call_of(adapter: Any) -> DenoiserCall:
    """The adapter's ``DenoiserCall``; a one-line error for an adapter that still calls its module itself."""
    call = getattr(adapter, "network", None)
    if not isinstance(call, DenoiserCall):
        from vgrpo_platform.errors import PluginError

        raise PluginError(
            f"adapter {type(adapter).__name__} has no core-owned denoiser call (adapter.network); subclass "
            "vgrpo_platform.network.CoreCalledAdapter and describe the call with denoiser_inputs()"
        )
    return call
