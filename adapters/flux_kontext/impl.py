"""The ``flux_kontext`` adapter: FLUX.1 Kontext image editing through ``diffusers.FluxKontextPipeline``.

Beyond the ``flux`` adapter (whose latents, packing and shift it shares), one thing: the condition.
``encode_conditions`` resizes each prompt's source image to the output resolution, encodes it with the
VAE (the mode of its latent distribution, scaled as the pipeline does) and packs it into tokens
``[B, N, 4C]``, stored in the conditioning beside the text's, so the core repeats and slices it per row.
Every transformer call appends these tokens to the noisy latents' tokens, with position ids whose first
axis is 1 (the pipeline's marker of the context image), and keeps only the first ``N`` output tokens:
the velocity is the noisy latents', exactly as ``FluxKontextPipeline.__call__`` computes it.

The output is square at ``resolution``; the pipeline's auto-resize to Kontext's preferred resolutions
is left out (a training rollout uses one fixed size), so a source of another aspect ratio is stretched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from diffusers import FluxKontextPipeline
from vgrpo_adapters._diffusers_condition import ConditionImageMixin, resized_source
from vgrpo_adapters.flux.impl import FluxAdapter

from vgrpo_platform.protocols import Conditioning


class FluxKontextAdapter(ConditionImageMixin, FluxAdapter):
    """FLUX.1 Kontext: FLUX's transformer with the source image's latents as extra tokens."""

    pipeline_class = FluxKontextPipeline
    display_name = "FLUX.1 Kontext"
    adapter_name = "flux_kontext"

    def __init__(self, pipe: FluxKontextPipeline, *, guidance: float = 2.5, **kwargs: Any) -> None:
        super().__init__(pipe, guidance=guidance, **kwargs)
        self.image_ids = self.img_ids.clone()  # [S, 3]: the source's tokens sit on the same grid ...
        self.image_ids[:, 0] = 1  # ... marked as the context image, as the pipeline marks them
        self.all_ids = torch.cat([self.img_ids, self.image_ids])  # [2S, 3]

    @torch.no_grad()
    def encode_conditions(
        self, prompts: Sequence[str], images: Sequence[Sequence[torch.Tensor]]
    ) -> Conditioning:
        """The text's conditioning (cached per prompt text) and ``image_latents`` ``[B, N, 4C]``, the packed
        VAE latents of each prompt's source image at the output resolution."""
        self.one_image_each(prompts, images)
        cond = self.text_conditioning(prompts)
        side, device = self.resolution, self.device
        sources = torch.stack([resized_source(im[0], side, side, device) for im in images])  # [B, 3, H, W]
        cond["image_latents"] = self.pack(self._vae_encode(sources))
        return cond

    def denoiser_inputs(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> dict[str, Any]:
        inputs = super().denoiser_inputs(z, t, cond)
        source = cond["image_latents"].to(self.device, self.dtype)  # [B, N, 4C]
        inputs["hidden_states"] = torch.cat([inputs["hidden_states"], source], dim=1)  # [B, 2N, 4C]
        inputs["img_ids"] = self.all_ids
        return inputs

    def denoiser_output(self, output: Any, z: torch.Tensor) -> torch.Tensor:
        tokens = output[0][:, : self.img_ids.shape[0]]  # the noisy latents' tokens; the source's are dropped
        return self.unpack(tokens)  # [B, C, h, w]
