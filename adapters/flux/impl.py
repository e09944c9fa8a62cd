"""The ``flux`` adapter: FLUX.1 through ``diffusers.FluxPipeline``.

Latent representation: the VAE's *unpacked* latents ``[C, H/8, W/8]`` (``C`` = 16 for FLUX.1). FLUX's
transformer sees them packed into 2x2 patches, ``[(H/16)(W/16), 4C]`` tokens with 3-axis position ids;
``predict`` packs on the way in and unpacks on the way out. Packing is a fixed permutation of the
elements, so the surrogate's per-element noise and its mean squared / absolute errors are identical in
either layout; unpacked latents keep the image layout the rest of the platform expects, and noise drawn
as ``[B, C, h, w]`` is exactly what ``FluxPipeline`` itself draws (then packs) from the same generator.

Timestep shift: FLUX.1's scheduler shifts dynamically with ``mu`` linear in the image token count; at a
fixed resolution this equals the static shift ``e^mu`` (see ``_diffusers_common.static_shift``), e.g.
~1.88 at 512 px and ~3.16 at 1024 px for FLUX.1-dev.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from diffusers import FluxPipeline
from vgrpo_adapters._diffusers_common import JOINT_ATTENTION, DiffusersImageAdapter

from vgrpo_platform.protocols import Conditioning


class FluxAdapter(DiffusersImageAdapter):
    """FLUX transformer (trained) + VAE, CLIP-L and T5-XXL (frozen), with embedded guidance."""

    pipeline_class = FluxPipeline
    display_name = "FLUX"
    # diffusers' FLUX LoRA training scripts: attention of both streams and the dual-stream MLPs
    # ("attn.to_*" also matches the single-stream blocks' attention).
    lora_target_modules: Sequence[str] = (
        *JOINT_ATTENTION,
        "attn.to_add_out",
        "ff.net.0.proj",
        "ff.net.2",
        "ff_context.net.0.proj",
        "ff_context.net.2",
    )

    def __init__(self, pipe: FluxPipeline, *, guidance: float = 3.5, **kwargs: Any) -> None:
        super().__init__(pipe, **kwargs)
        has_guidance = bool(self.denoiser.config.guidance_embeds)
        self.guidance = float(guidance) if has_guidance else None  # schnell has no guidance embedding
        side = self.latent_side // 2  # tokens per side after 2x2 packing
        self.img_ids = FluxPipeline._prepare_latent_image_ids(
            1, side, side, self.device, self.dtype
        )  # [S, 3]

    def latent_shape(self) -> tuple[int, ...]:
        channels = self.denoiser.config.in_channels // 4  # packed tokens hold 2x2 patches
        return (channels, self.latent_side, self.latent_side)

    def _encode(self, prompts: list[str]) -> Conditioning:
        """``prompt_embeds`` ``[B, S, 4096]`` (T5 tokens) and ``pooled_prompt_embeds`` ``[B, 768]`` (CLIP)."""
        prompt_embeds, pooled, _text_ids = self.pipe.encode_prompt(
            prompts, prompt_2=None, device=self.device, max_sequence_length=self.max_sequence_length
        )
        return {"prompt_embeds": prompt_embeds, "pooled_prompt_embeds": pooled}

    def pack(self, z: torch.Tensor) -> torch.Tensor:
        """``[B, C, h, w]`` -> ``[B, (h/2)(w/2), 4C]``, FLUX's token layout."""
        b, c, h, w = z.shape
        return FluxPipeline._pack_latents(z, b, c, h, w)

    def unpack(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[B, (h/2)(w/2), 4C]`` -> ``[B, C, h, w]``."""
        return FluxPipeline._unpack_latents(tokens, self.resolution, self.resolution, self.vae_scale_factor)

    def denoiser_inputs(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> dict[str, Any]:
        batch = z.shape[0]
        prompt_embeds = cond["prompt_embeds"].to(self.device, self.dtype)  # [B, S, D]
        guidance = None
        if self.guidance is not None:
            guidance = torch.full((batch,), self.guidance, device=self.device, dtype=torch.float32)  # [B]
        return dict(
            hidden_states=self.pack(z.to(self.device, self.dtype)),  # [B, N, 4C]
            timestep=t.to(self.device),  # FLUX's transformer takes sigma in [0, 1] and scales it by 1000
            guidance=guidance,
            pooled_projections=cond["pooled_prompt_embeds"].to(self.device, self.dtype),
            encoder_hidden_states=prompt_embeds,
            txt_ids=torch.zeros(prompt_embeds.shape[1], 3, device=self.device, dtype=self.dtype),
            img_ids=self.img_ids,
            return_dict=False,
        )

    def denoiser_output(self, output: Any, z: torch.Tensor) -> torch.Tensor:
        return self.unpack(output[0])  # [B, C, h, w]
