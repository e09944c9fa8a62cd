"""Tiny models shared by the surrogate and diagnostics tests: nothing to download, fast in float64.

Why one module: the linear velocity adapter is the smallest thing a surrogate can differentiate
through, and each surrogate's tests need the same one (the conftest exposes it as a fixture too).
"""

from __future__ import annotations

import math

import torch

from vgrpo_platform.noise_schedules import RectifiedFlowSchedule

DT = torch.float64


class LinearVelocityAdapter:
    """A linear velocity model ``v(z_t, t, emb)`` on a small latent, with weights from a fixed seed."""

    modality = "image"
    lora_target_modules = ()

    def __init__(self, latent_shape: tuple[int, ...] = (2, 3), cond_dim: int = 2, shift: float = 2.0) -> None:
        torch.manual_seed(0)
        d = math.prod(latent_shape)
        self.denoiser = torch.nn.Linear(d + 1 + cond_dim, d).to(DT)
        self.schedule = RectifiedFlowSchedule(shift=shift)
        self._shape = latent_shape

    def latent_shape(self) -> tuple[int, ...]:
        return self._shape

    def predict(self, z_t: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        inp = torch.cat([z_t.flatten(1), t[:, None].to(z_t.dtype), cond["emb"]], dim=1)
        return self.denoiser(inp).view_as(z_t)
