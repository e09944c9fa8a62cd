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
from vgrpo_adapters._diffusers_common import DiffusersFlowAdapter, TrueCFGMixin

from vgrpo_platform.protocols import Conditioning

TIMESTEP_SCALE = 1000.0
"""SD3's transformer embeds ``timestep = 1000 sigma`` (the scheduler's ``timesteps``)."""


class SD3Adapter(TrueCFGMixin, DiffusersFlowAdapter):
    """SD3 MMDiT (trained) + VAE, CLIP-L, CLIP-G and T5-XXL (frozen), optional true CFG."""

    pipeline_class = StableDiffusion3Pipeline
    # diffusers' SD3 LoRA training scripts (and Flow-GRPO): both streams' attention projections.
    lora_target_modules: Sequence[str] = (
        "attn.to_q",
        "attn.to_k",
        "attn.to_v",
        "attn.to_out.0",
        "attn.add_q_proj",
        "attn.add_k_proj",
        "attn.add_v_proj",
        "attn.to_add_out",
    )

    def __init__(
        self,
        pipe: StableDiffusion3Pipeline,
        *,
        cfg_scale: float = 1.0,
        cfg_in_training: bool = False,
        negative_prompt: str = "",
        **kwargs: Any,
    ) -> None:
        super().__init__(pipe, **kwargs)
        if cfg_scale < 1.0:
            raise ValueError(f"cfg_scale must be >= 1 (1 = off), got {cfg_scale}")
        self.cfg_scale = float(cfg_scale)
        self.cfg_in_training = cfg_in_training
        self.negative_prompt = negative_prompt

    @staticmethod
    def options_from_config(config: Any) -> dict[str, Any]:
        return {
            **DiffusersFlowAdapter.options_from_config(config),
            "cfg_scale": config.cfg_scale,
            "cfg_in_training": config.cfg_in_training,
            "negative_prompt": config.negative_prompt,
        }

    def _check_resolution(self, resolution: int) -> None:
        cfg = self.denoiser.config
        step = self.vae_scale_factor * cfg.patch_size
        if resolution % step:
            raise ValueError(
                f"SD3 needs a resolution divisible by {step} (VAE factor x patch), got {resolution}"
            )
        max_side = cfg.pos_embed_max_size * step
        if resolution > max_side:
            raise ValueError(
                f"resolution {resolution} exceeds this transformer's position table ({max_side} px: "
                f"pos_embed_max_size {cfg.pos_embed_max_size} x {step})"
            )

    def image_seq_len(self) -> int:
        return (self.latent_side // self.denoiser.config.patch_size) ** 2

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

    def _transformer(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        return self.denoiser(
            hidden_states=z.to(self.device, self.dtype),  # [B, C, h, w]
            timestep=t.to(self.device) * TIMESTEP_SCALE,
            encoder_hidden_states=cond["prompt_embeds"].to(self.device, self.dtype),
            pooled_projections=cond["pooled_prompt_embeds"].to(self.device, self.dtype),
            return_dict=False,
        )[0]

    def null_conditioning(self, cond: Conditioning, batch: int) -> Conditioning:
        """The negative prompt's encoding (cached), repeated over the batch."""
        negative = self.encode_prompts([self.negative_prompt])  # [1, ...]
        return {k: negative[k].expand(batch, *negative[k].shape[1:]) for k in cond}
