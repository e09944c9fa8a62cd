"""The ``wan_i2v`` adapter: Wan 2.1 / 2.2 image-to-video through ``diffusers.WanImageToVideoPipeline``.

Beyond the ``wan`` adapter (latents, shift, experts, CFG, export), the condition: each prompt's source
image is the clip's first frame. ``encode_conditions`` builds what the pipeline's ``prepare_latents``
builds, once per prompt: the source followed by ``F - 1`` black frames, encoded by the VAE (its latent
distribution's mode, normalised per channel) and prefixed by the first-frame mask folded to the latent
frame rate, ``condition [B, 4 + C, f, h, w]``; and, for Wan 2.1 (a transformer with ``image_dim``), the
CLIP vision encoder's penultimate states ``image_embeds [B, 257, 1280]``. Every transformer call
concatenates ``condition`` to the noisy latents along channels, as ``WanImageToVideoPipeline.__call__``
does; CFG's unconditional half keeps both and swaps the text only.

Wan 2.2 TI2V-5B (``expand_timesteps``: the first frame's latents replace the sample's) is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from diffusers import WanImageToVideoPipeline
from PIL import Image
from vgrpo_adapters._diffusers_condition import ConditionImageMixin, resized_source
from vgrpo_adapters.wan.impl import WanAdapter

from vgrpo_platform.protocols import Conditioning


class WanI2VAdapter(ConditionImageMixin, WanAdapter):
    """Wan image-to-video: the source frame's latents and mask beside the noisy latents."""

    pipeline_class = WanImageToVideoPipeline
    display_name = "Wan image-to-video"
    adapter_name = "wan_i2v"

    def __init__(self, pipe: WanImageToVideoPipeline, **kwargs: Any) -> None:
        super().__init__(pipe, **kwargs)
        self.image_encoder = getattr(pipe, "image_encoder", None)
        if self.denoiser_config().image_dim is not None:  # Wan 2.1 I2V: CLIP vision states too
            if self.image_encoder is None:
                raise ValueError(
                    "this Wan I2V transformer takes image embeddings but the pipeline has no image_encoder"
                )
            self.image_encoder.requires_grad_(False).eval().to(self.device)

    def denoiser_config(self) -> Any:
        """The (high-noise) transformer's config: what the pipeline reads ``image_dim`` from."""
        return self.pipe.transformer.config

    @torch.no_grad()
    def encode_conditions(
        self, prompts: Sequence[str], images: Sequence[Sequence[torch.Tensor]]
    ) -> Conditioning:
        """Text (cached per prompt text), ``condition [B, 4 + C, f, h, w]``; Wan 2.1: ``image_embeds``."""
        self.one_image_each(prompts, images)
        cond = self.text_conditioning(prompts)
        sources = [resized_source(im[0], self.height, self.width, self.device) for im in images]  # [3, H, W]
        cond["condition"] = torch.cat([self._first_frame_condition(x) for x in sources])
        if self.denoiser_config().image_dim is not None:
            cond["image_embeds"] = torch.cat([self._clip_states(x) for x in sources]).to(self.dtype)
        return cond

    def _first_frame_condition(self, source: torch.Tensor) -> torch.Tensor:
        """``[1, 4 + C, f, h, w]``: the first-frame mask, the normalised latents of source + black frames."""
        frames = torch.cat(
            [source[None, :, None], source.new_zeros(1, 3, self.num_frames - 1, *source.shape[1:])], 2
        )
        latents = self.vae.encode(frames.to(self.vae.dtype)).latent_dist.mode().float()  # [1, C, f, h, w]
        mean = self._latents_mean.to(latents.device)
        latents = (latents - mean) * (1.0 / self._latents_std.to(latents.device))  # the pipeline's order
        f, h, w = latents.shape[2:]
        mask = torch.zeros(1, 1, self.num_frames, h, w, device=latents.device)  # 1 where the frame is given
        mask[:, :, 0] = 1
        first = mask[:, :, :1].repeat_interleave(self.scale_temporal, dim=2)
        mask = (
            torch.cat([first, mask[:, :, 1:]], dim=2).view(1, -1, self.scale_temporal, h, w).transpose(1, 2)
        )
        return torch.cat([mask, latents], dim=1).to(self.dtype)  # [1, 4 + C, f, h, w]

    def _clip_states(self, source: torch.Tensor) -> torch.Tensor:
        """The CLIP vision encoder's penultimate hidden states of the source, through the pipeline's
        ``encode_image`` (its image processor takes the 8-bit image it would be given)."""
        pixels = ((source + 1) / 2 * 255).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).cpu().numpy()
        return self.pipe.encode_image(Image.fromarray(np.ascontiguousarray(pixels)), self.device)

    def denoiser_inputs(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> dict[str, Any]:
        inputs = super().denoiser_inputs(z, t, cond)
        condition = cond["condition"].to(self.device, self.dtype)  # [B, 4 + C, f, h, w]
        inputs["hidden_states"] = torch.cat([inputs["hidden_states"], condition], dim=1)
        if "image_embeds" in cond:
            inputs["encoder_hidden_states_image"] = cond["image_embeds"].to(self.device, self.dtype)
        return inputs
