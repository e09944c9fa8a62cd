"""True classifier-free guidance for the diffusers-backed adapters (SD3, FLUX.2 [klein], Qwen-Image, Wan,
HunyuanVideo 1.5, LongCat audio).

One mixin so that the scale checks, the negative prompt and the guided velocity are written once; an
adapter overrides ``null_conditioning`` (LongCat: zero text) or ``guided_velocity`` (Qwen-Image's norm
rescaling, Wan 2.2's scale per expert) where its pipeline guides differently.
"""

from __future__ import annotations

from typing import Any

import torch

from vgrpo_platform.protocols import Conditioning


class TrueCFGMixin:
    """Rollouts are guided when ``cfg_scale > 1``; the policy's own predictions (what the surrogate trains)
    only when ``cfg_in_training`` is set too. Put the mixin before the adapter base class in the bases."""

    def __init__(
        self,
        *args: Any,
        cfg_scale: float = 1.0,
        cfg_in_training: bool = False,
        negative_prompt: str = "",
        **kwargs: Any,
    ) -> None:
        if cfg_scale < 1.0:
            raise ValueError(f"cfg_scale must be >= 1 (1 = off), got {cfg_scale}")
        super().__init__(*args, **kwargs)
        self.cfg_scale = float(cfg_scale)
        self.cfg_in_training = cfg_in_training
        self.negative_prompt = negative_prompt

    @property
    def uses_cfg(self) -> bool:
        return self.cfg_scale > 1.0

    def null_conditioning(self, cond: Conditioning, batch: int) -> Conditioning:
        """The negative prompt's encoding (cached), repeated over the batch like ``cond`` ``[batch, ...]``."""
        negative = self.encode_prompts([self.negative_prompt])  # [1, ...]
        return {k: negative[k].expand(batch, *negative[k].shape[1:]) for k in cond}

    def guided_velocity(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """``v_null + s (v_cond - v_null)`` from one network call on the doubled batch ``[2B, ...]``."""
        v_null, v_cond, _ = self.doubled_batch_velocities(z, t, cond)
        return (v_null + self.cfg_scale * (v_cond - v_null)).to(z.dtype)

    def doubled_batch_velocities(
        self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(v_null, v_cond, t)`` of one network call on ``[null; cond]``, with ``t`` expanded to ``[B]``."""
        batch = z.shape[0]
        null = self.null_conditioning(cond, batch)
        both = {k: torch.cat([null[k].to(self.device), cond[k].to(self.device)]) for k in cond}
        t = t.to(device=z.device, dtype=torch.float32).expand(batch)  # [B]
        v_null, v_cond = self.network_velocity(torch.cat([z, z]), torch.cat([t, t]), both).chunk(2)
        return v_null, v_cond, t

    def policy_velocity(self, z_t: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        if self.uses_cfg and self.cfg_in_training:
            return self.guided_velocity(z_t, t, cond)
        return super().policy_velocity(z_t, t, cond)  # type: ignore[misc]

    def rollout_velocity(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        if self.uses_cfg:
            return self.guided_velocity(z, t, cond)
        return super().rollout_velocity(z, t, cond)  # type: ignore[misc]
