"""The ``sd3`` adapter: Stable Diffusion 3 / 3.5 through ``diffusers.StableDiffusion3Pipeline``.

Latents are the VAE's ``[16, H/8, W/8]`` (SD3's MMDiT patchifies them itself, so no packing here),
timesteps follow the scheduler's static shift (3.0 for SD3.5). With ``cfg_scale > 1`` rollouts use true
classifier-free guidance against ``negative_prompt``; ``cfg_in_training`` makes ``predict`` (hence the
surrogate) guided too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from diffusers import StableDiffusion3Pipeline
from vgrpo_adapters._diffusers_cfg import TrueCFGMixin
from vgrpo_adapters._diffusers_common import JOINT_ATTENTION, DiffusersImageAdapter

from vgrpo_platform.protocols import Conditioning

TIMESTEP_SCALE = 1000.0
"""SD3's transformer embeds ``timestep = 1000 sigma`` (the scheduler's ``timesteps``)."""


class SD3Adapter(TrueCFGMixin, DiffusersImageAdapter):
    """SD3 MMDiT (trained) + VAE, CLIP-L, CLIP-G and T5-XXL (frozen), optional true CFG."""

    pipeline_class = StableDiffusion3Pipeline
    display_name = "SD3"
    patch_label = "patch"
    # diffusers' SD3 LoRA training scripts (and Flow-GRPO): both streams' attention projections.
    lora_target_modules: Sequence[str] = (*JOINT_ATTENTION, "attn.to_add_out")

    def _patch(self) -> int:
        return int(self.denoiser.config.patch_size)

    def _check_resolution(self, resolution: int) -> None:
        super()._check_resolution(resolution)
        step = self.vae_scale_factor * self._patch()
        max_side = self.denoiser.config.pos_embed_max_size * step
        if resolution > max_side:
            raise ValueError(
                f"resolution {resolution} exceeds this transformer's position table ({max_side} px: "
                f"pos_embed_max_size {self.denoiser.config.pos_embed_max_size} x {step})"
            )

    def latent_shape(self) -> tuple[int, ...]:
        return (int(self.denoiser.config.in_channels), self.latent_side, self.latent_side)

    def _encode(self, prompts: list[str]) -> Conditioning:
        """``prompt_embeds`` ``[B, 77 + S, 4096]`` (CLIP-L|G states padded, then T5 tokens) and
        ``pooled_prompt_embeds`` ``[B, 2048]`` (CLIP-L and CLIP-G pooled, concatenated)."""
        prompt_embeds, _, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts,
            prompt_2=None,
            prompt_3=None,
            device=self.device,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
        )
        return {"prompt_embeds": prompt_embeds, "pooled_prompt_embeds": pooled}

    def denoiser_inputs(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> dict[str, Any]:
        return dict(
            hidden_states=z.to(self.device, self.dtype),  # [B, C, h, w]
            timestep=t.to(self.device) * TIMESTEP_SCALE,
            encoder_hidden_states=cond["prompt_embeds"].to(self.device, self.dtype),
            pooled_projections=cond["pooled_prompt_embeds"].to(self.device, self.dtype),
            return_dict=False,
        )
