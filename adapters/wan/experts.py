"""Wan 2.2's two experts behind one ``torch.nn.Module``, routed per batch row as ``WanPipeline`` routes steps.

``WanPipeline`` (diffusers) denoises a step with ``transformer`` (the high-noise expert) when its timestep
``t >= boundary_ratio * num_train_timesteps`` and with ``transformer_2`` (the low-noise expert) below.
The core trains one ``denoiser`` module; ``WanExperts`` is that module. It applies the same rule to each
row's timestep, so rollouts switch expert at the pipeline's step and a surrogate batch whose rows lie
on both sides of the boundary sends each row to the expert the pipeline would use at its ``t``.

Only the experts being trained are registered submodules: LoRA injection, full fine-tuning, gradient
checkpointing, checkpoints and EMA see only them, and an expert left out stays frozen by construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

EXPERTS = ("high", "low")
"""``high`` = ``pipe.transformer`` (t >= boundary), ``low`` = ``pipe.transformer_2`` (t < boundary)."""


class WanExperts(torch.nn.Module):
    """The high- and low-noise experts, called like one ``WanTransformer3DModel`` (``[0]`` of its tuple)."""

    def __init__(
        self,
        high: torch.nn.Module,
        low: torch.nn.Module,
        boundary_timestep: float,
        trained: Sequence[str] = EXPERTS,
    ) -> None:
        super().__init__()
        unknown = set(trained) - set(EXPERTS)
        if unknown or not trained:
            raise ValueError(f"train_experts must name some of {list(EXPERTS)}, got {list(trained)}")
        self.boundary_timestep = float(boundary_timestep)
        self.trained = tuple(name for name in EXPERTS if name in trained)
        # a plain dict is not registered: the frozen expert stays outside parameters() and state_dict()
        self.experts: dict[str, torch.nn.Module] = {"high": high, "low": low}
        for name, expert in self.experts.items():
            if name in self.trained:
                self.add_module(name, expert)
            else:
                expert.requires_grad_(False).eval()

    # the adapter reads these as it would on one transformer
    @property
    def config(self) -> Any:
        return self.experts["high"].config

    @property
    def dtype(self) -> torch.dtype:
        return self.experts["high"].dtype

    def to_device(self, device: torch.device) -> WanExperts:
        """Move both experts (``.to`` alone would skip the unregistered frozen one)."""
        for expert in self.experts.values():
            expert.to(device)
        return self

    def enable_gradient_checkpointing(self) -> None:
        for name in self.trained:
            self.experts[name].enable_gradient_checkpointing()

    def is_high(self, timestep: torch.Tensor) -> torch.Tensor:
        """``WanPipeline``'s rule, compared in the timestep's dtype as the pipeline compares it."""
        return timestep >= self.boundary_timestep

    def forward(
        self,
        hidden_states: torch.Tensor,
        timestep: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        return_dict: bool = False,
        **kwargs: Any,
    ) -> tuple[torch.Tensor]:
        """``hidden_states`` ``[B, C, f, h, w]``, ``timestep`` ``[B]`` in 0..1000 -> ``(velocity,)`` alike."""
        high = self.is_high(timestep)  # [B]

        def run(name: str, rows: torch.Tensor | slice) -> torch.Tensor:
            return self.experts[name](
                hidden_states=hidden_states[rows],
                timestep=timestep[rows],
                encoder_hidden_states=encoder_hidden_states[rows],
                return_dict=False,
                **kwargs,
            )[0]

        if bool(high.all()) or not bool(high.any()):  # a rollout step: one expert for the whole batch
            name = "high" if bool(high.all()) else "low"
            return (self._touch_idle(run(name, slice(None)), idle="low" if name == "high" else "high"),)
        out_high, out_low = run("high", high), run("low", ~high)
        out = out_high.new_empty((hidden_states.shape[0], *out_high.shape[1:]))
        out[high], out[~high] = out_high, out_low  # autograd follows the index writes to each expert
        return (out,)

    def _touch_idle(self, out: torch.Tensor, idle: str) -> torch.Tensor:
        """Under DDP, give a trained expert that no row used a zero-valued path into the output, so the
        gradient all-reduce sees all its parameters used in every micro-batch (DDP fails otherwise).
        Sharded (FSDP2 DTensor) parameters need no such path and are left alone."""
        if idle not in self.trained or not torch.is_grad_enabled() or not _distributed():
            return out
        params = [p for p in self.experts[idle].parameters() if p.requires_grad]
        if not params or any(type(p).__name__ == "DTensor" for p in params):
            return out
        return out + 0.0 * sum(p.reshape(-1)[:1].sum() for p in params).to(out.dtype)


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()
