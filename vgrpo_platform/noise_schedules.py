"""Noise schedules: the forward process and the model's parameterisation, apart from any model.

Only rectified flow lives here for now (FLUX, SD3, Wan): ``z_t = (1 - t) x0 + t eps`` with a network
that predicts the velocity ``v ~ eps - x0``. Diffusion-style schedules (``z_t = a_t x0 + b_t eps``)
would add a class with the same three methods.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def expand_like(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Broadcast a per-sample ``t`` ``[B]`` over a batch ``x`` ``[B, *L]`` -> ``[B, 1, ..., 1]``."""
    return t.to(x.dtype).reshape(t.shape + (1,) * (x.ndim - t.ndim))


@dataclass(frozen=True)
class RectifiedFlowSchedule:
    """Rectified flow with the SD3 / FLUX timestep shift.

    ``shift > 1`` spends more of the timestep grid at high noise, as SD3 (shift 3) and FLUX do; the
    surrogate draws ``t = warp(u)`` so its Monte-Carlo pairs follow the model's own grid.
    """

    shift: float = 1.0

    def __post_init__(self) -> None:
        if not self.shift > 0:
            raise ValueError(f"shift must be > 0, got {self.shift}")

    def noise(self, x0: torch.Tensor, eps: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``z_t = (1 - t) x0 + t eps``; ``x0``, ``eps`` ``[B, *L]``, ``t`` ``[B]``."""
        tb = expand_like(t, x0)  # [B, 1, ..., 1]
        return (1 - tb) * x0 + tb * eps

    def predict_x0(self, z_t: torch.Tensor, model_output: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """x-space estimate from a velocity: ``x_hat = z_t - t v`` (exact when ``v = eps - x0``)."""
        return z_t - expand_like(t, z_t) * model_output

    def warp(self, u: torch.Tensor) -> torch.Tensor:
        """``shift * u / (1 + (shift - 1) u)``: monotone, fixes 0 and 1 (diffusers' static shift)."""
        if self.shift == 1.0:
            return u
        return self.shift * u / (1 + (self.shift - 1) * u)
