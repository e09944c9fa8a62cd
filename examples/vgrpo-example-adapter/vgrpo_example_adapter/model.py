"""The ``signal_flow`` adapter: a rectified-flow MLP over 1-D signals ``[1, T]`` in ``[-1, 1]``.

Everything the core needs from a model family, in one small file: a frozen prompt encoder, the
trained velocity network (``denoiser``) and how to call it (``denoiser_inputs``: the core makes the
call, and gives ``predict`` and ``sample``), the noise schedule (reused from vgrpo), and ``decode``
into the adapter's own modality, ``"signal"``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from vgrpo_platform.network import CoreCalledAdapter
from vgrpo_platform.noise_schedules import RectifiedFlowSchedule
from vgrpo_platform.protocols import BuildContext, Conditioning, Samples

PROMPT_DIM = 32  # width of the prompt embedding
TIME_FEATURES = 8  # sin/cos pairs of the timestep embedding


class PromptEncoder(nn.Module):
    """Prompt bytes -> mean of per-byte embeddings ``[B, PROMPT_DIM]`` (frozen, like a text encoder)."""

    def __init__(self, dim: int = PROMPT_DIM) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, dim)

    def forward(self, prompts: Sequence[str]) -> torch.Tensor:
        device = self.embed.weight.device
        rows = [self.embed(torch.tensor(list(p.encode()) or [0], device=device)) for p in prompts]  # [n, D]
        return torch.stack([r.mean(dim=0) for r in rows])  # [B, D]


class VelocityMLP(nn.Module):
    """``v(z_t, t, c)``: the exact velocity of white noise of std ``prior_std`` plus a learned MLP term.

    For data ``x0 ~ N(0, s^2 I)`` the flow's velocity is linear in ``z_t``:
    ``E[eps - x0 | z_t] = (t - (1 - t) s^2) / ((1 - t)^2 s^2 + t^2) z_t``. With a small MLP on top,
    the untrained model already samples sensible signals (white noise of std ``s``) for RL to shape.
    """

    def __init__(self, length: int, hidden: int, prior_std: float = 0.3, cond_dim: int = PROMPT_DIM) -> None:
        super().__init__()
        self.prior_var = prior_std**2
        self.register_buffer("freqs", torch.exp(torch.linspace(0, math.log(100.0), TIME_FEATURES)))
        self.inp = nn.Linear(length + 2 * TIME_FEATURES + cond_dim, hidden)
        self.mid = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, length)
        with torch.no_grad():
            self.out.weight.mul_(0.1)  # a small residual: start near the white-noise prior
            self.out.bias.zero_()

    def forward(self, z_t: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        angles = t[:, None] * self.freqs  # [B, F]
        h = torch.cat([z_t.flatten(1), angles.sin(), angles.cos(), cond], dim=1)  # [B, T + 2F + D]
        h = nn.functional.silu(self.inp(h))
        h = nn.functional.silu(self.mid(h))
        tb = t[:, None, None]  # [B, 1, 1]
        prior = (tb - (1 - tb) * self.prior_var) / ((1 - tb) ** 2 * self.prior_var + tb**2) * z_t  # [B, 1, T]
        return prior + self.out(h).reshape(z_t.shape)  # [B, 1, T]


class SignalFlowAdapter(CoreCalledAdapter):
    """``protocols.Adapter`` for 1-D signals: latents are the signals themselves, ``[B, 1, T]``."""

    modality = "signal"
    lora_target_modules: Sequence[str] = ("inp", "mid", "out")

    def __init__(
        self, length: int = 32, hidden: int = 128, prior_std: float = 0.3, shift: float = 1.0, seed: int = 0
    ) -> None:
        with torch.random.fork_rng(devices=[]):  # the same seed gives the same weights, whatever ran before
            torch.manual_seed(seed)
            self.prompt_encoder = PromptEncoder().requires_grad_(False).eval()
            self.denoiser = VelocityMLP(length, hidden, prior_std)
        self.length = length
        self.schedule = RectifiedFlowSchedule(shift)

    @classmethod
    def from_config(cls, config: Any, context: BuildContext) -> SignalFlowAdapter:
        adapter = cls(config.length, config.hidden, config.prior_std, config.shift, config.init_seed)
        adapter.prompt_encoder.to(context.device)
        adapter.denoiser.to(context.device)
        return adapter

    def latent_shape(self) -> tuple[int, ...]:
        return (1, self.length)

    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str]) -> Conditioning:
        return {"prompt": self.prompt_encoder(list(prompts))}  # [B, D], batch-first like every entry

    def denoiser_inputs(self, z_t: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> dict[str, Any]:
        """The velocity network's inputs at ``z_t`` ``[B, 1, T]``, ``t`` ``[B]``: the core makes the call and
        gives ``predict`` (differentiable) and ``sample`` (any ODE solver), so every wrapper (data
        parallel, caches, a rollout engine) reaches this model without code here."""
        return {"z_t": z_t, "t": t.to(z_t), "cond": cond["prompt"].to(z_t)}

    def decode(self, latents: torch.Tensor) -> Samples:
        """The signals, clamped to ``[-1, 1]`` ``[B, 1, T]``."""
        return Samples("signal", latents.float().clamp(-1, 1))
