"""Deterministic rollouts: integrate the rectified-flow ODE ``dz/dt = v(z, t)`` from t=1 to t=0.

V-GRPO needs no per-step log-probabilities, so rollouts can use any ODE solver; the solvers are
diffusers' flow-matching schedulers (kept and tested upstream), driven here by one short loop.

Time convention: ``predict`` receives the scheduler's *sigma* ``t`` in ``[0, 1]`` (the continuous
noise level of ``z_t = (1 - t) x + t eps``), never its ``timesteps`` (``sigma * 1000``, truncated
to integers by the multistep schedulers). Grids, after the shift ``s t / (1 + (s - 1) t)``:

- ``euler``: ``t_i = 1 - i / n`` for ``i < n`` (the FLUX pipeline's grid), then 0.
- ``unipc``: the same grid, its first point moved to ``1 - 1e-6`` by diffusers (``log(1 - t)`` at 1).
- ``dpmsolver++``: diffusers' own flow grid ``0.999 (1 - i / n)``, then 0 (it accepts no custom
  sigmas). The noise is taken as ``z`` at the first grid point, as in diffusers' pipelines.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

# from their modules, not the package root: diffusers' root declares dummy classes to type checkers
from diffusers.schedulers.scheduling_dpmsolver_multistep import DPMSolverMultistepScheduler
from diffusers.schedulers.scheduling_flow_match_euler_discrete import FlowMatchEulerDiscreteScheduler
from diffusers.schedulers.scheduling_unipc_multistep import UniPCMultistepScheduler

from vgrpo_platform.protocols import SamplerSpec

Velocity = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``predict(z [B, *L], t [B]) -> v [B, *L]`` with ``v = dz/dt`` (``eps - x0`` for a perfect model)."""

SAMPLERS = ("euler", "dpmsolver++", "unipc")


def _uniform_sigmas(steps: int) -> np.ndarray:
    """``1, 1 - 1/n, ..., 1/n``: the unshifted grid; the scheduler applies the shift itself.

    A fresh float array per call: UniPC needs an array (it does arithmetic on it) and edits it in place.
    """
    return np.linspace(1.0, 1.0 / steps, steps)


def make_scheduler(
    sampler: SamplerSpec, shift: float = 1.0, device: torch.device | str | None = None
) -> FlowMatchEulerDiscreteScheduler | DPMSolverMultistepScheduler | UniPCMultistepScheduler:
    """A fresh diffusers scheduler with its timesteps set (schedulers are stateful: one per rollout)."""
    if sampler.steps < 1:
        raise ValueError(f"sampler.steps must be >= 1, got {sampler.steps}")
    scheduler: FlowMatchEulerDiscreteScheduler | DPMSolverMultistepScheduler | UniPCMultistepScheduler
    if sampler.name == "euler":
        euler = FlowMatchEulerDiscreteScheduler(shift=shift)
        euler.set_timesteps(sigmas=_uniform_sigmas(sampler.steps), device=device)
        scheduler = euler
    elif sampler.name == "dpmsolver++":
        dpm = DPMSolverMultistepScheduler(
            use_flow_sigmas=True,
            flow_shift=shift,
            prediction_type="flow_prediction",
            algorithm_type="dpmsolver++",
            solver_order=2,
        )
        dpm.set_timesteps(num_inference_steps=sampler.steps, device=device)
        scheduler = dpm
    elif sampler.name == "unipc":
        unipc = UniPCMultistepScheduler(
            use_flow_sigmas=True, flow_shift=shift, prediction_type="flow_prediction", solver_order=2
        )
        unipc.set_timesteps(sigmas=_uniform_sigmas(sampler.steps), device=device)
        scheduler = unipc
    else:
        raise ValueError(f"unknown sampler {sampler.name!r}; valid names: {', '.join(SAMPLERS)}")
    scheduler.set_begin_index(0)  # step i uses sigmas[i]: no lookup of (possibly repeated) timesteps
    return scheduler


def solve_flow_ode(
    predict: Velocity, noise: torch.Tensor, sampler: SamplerSpec, shift: float = 1.0
) -> torch.Tensor:
    """Clean samples ``[B, *L]`` from pure noise ``[B, *L]`` by ``sampler.steps`` model calls.

    The solver state is kept in float32 whatever ``noise.dtype`` (diffusers upcasts inside its
    steps too); ``predict`` sees ``z`` in ``noise.dtype`` and the result has ``noise.dtype``.
    Gradients flow only if the caller enables them: wrap in ``torch.no_grad()`` for rollouts.
    """
    scheduler = make_scheduler(sampler, shift=shift, device=noise.device)
    batch = noise.shape[0]
    z = noise.float()  # [B, *L]
    for i, timestep in enumerate(scheduler.timesteps):
        t = scheduler.sigmas[i].to(device=noise.device, dtype=torch.float32).expand(batch)  # [B]
        v = predict(z.to(noise.dtype), t).float()  # [B, *L]
        z = scheduler.step(v, timestep, z, return_dict=False)[0].float()  # type: ignore[arg-type]
    return z.to(noise.dtype)
