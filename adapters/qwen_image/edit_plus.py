"""The ``qwen_image_edit_plus`` adapter: Qwen-Image-Edit (the Plus pipeline, one or several source images)
through ``diffusers.QwenImageEditPlusPipeline``.

Beyond ``qwen_image`` (latents, packing, shift, true CFG with its norm rescaling), the sources enter
twice, as the pipeline feeds them:

- the Qwen2.5-VL encoder reads each source (resized to ``condition_image_area``, 384^2 by default) with
  the instruction, through the pipeline's own ``encode_prompt``: the text conditioning depends on the
  image, so it is encoded per prompt and image, not cached by the text; CFG's negative prompt is
  encoded with the same images (``negative_prompt_embeds``), as the pipeline does;
- the VAE encodes each source (resized to ``vae_image_area``, 1024^2 by default, at the source's aspect
  ratio) into latents packed as extra tokens ``image_latents [B, n N', 4C]``; every transformer call
  appends them to the noisy tokens with their own ``img_shapes`` entries and keeps the first ``N``
  output tokens.

Sources are resized by the pipeline's own image processor from their 8-bit pixels, so a rollout equals
``QwenImageEditPlusPipeline.__call__`` from the same noise. Rows of one batch must share the number of
sources and their aspect ratio (the extra tokens are stacked batch-first).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from diffusers import QwenImageEditPlusPipeline
from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import calculate_dimensions
from PIL import Image
from vgrpo_adapters._diffusers_condition import ConditionImageMixin
from vgrpo_adapters.qwen_image.impl import QwenImageAdapter, pad_text

from vgrpo_platform.errors import RecipeError
from vgrpo_platform.protocols import Conditioning


def to_pil(image: torch.Tensor) -> Image.Image:
    """``[3, H, W]`` in ``[0, 1]`` -> the 8-bit RGB image the pipeline would be given."""
    pixels = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
    return Image.fromarray(np.ascontiguousarray(pixels))


class QwenImageEditPlusAdapter(ConditionImageMixin, QwenImageAdapter):
    """Qwen-Image-Edit-Plus: the sources read by Qwen2.5-VL and appended as latent tokens."""

    pipeline_class = QwenImageEditPlusPipeline
    display_name = "Qwen-Image-Edit"
    adapter_name = "qwen_image_edit_plus"

    def __init__(
        self,
        pipe: QwenImageEditPlusPipeline,
        *,
        max_sequence_length: int = 1024,
        vae_image_area: int = 1024 * 1024,
        condition_image_area: int = 384 * 384,
        **kwargs: Any,
    ) -> None:
        super().__init__(pipe, max_sequence_length=max_sequence_length, **kwargs)
        self.vae_image_area, self.condition_image_area = vae_image_area, condition_image_area

    # --------------------------------------------------------------------------------- conditions
    @torch.no_grad()
    def encode_conditions(
        self, prompts: Sequence[str], images: Sequence[Sequence[torch.Tensor]]
    ) -> Conditioning:
        """Per row: ``prompt_embeds``/``prompt_mask`` of the instruction read with its sources (and the
        negative prompt's, with CFG), ``image_latents [B, n N', 4C]`` and ``source_sizes [B, n, 2]``."""
        counts = sorted({len(im) for im in images})
        if len(images) != len(prompts) or len(counts) != 1 or counts[0] < 1:
            raise RecipeError(
                f"{self.adapter_name} batches prompts with one number of condition images, got {counts}; "
                'give every line of the prompt file as many "image" paths'
            )
        rows = [
            self._encode_row(str(p), [to_pil(x) for x in ims]) for p, ims in zip(prompts, images, strict=True)
        ]
        sizes = {tuple(map(tuple, r["source_sizes"][0].tolist())) for r in rows}
        if len(sizes) > 1:
            raise RecipeError(
                f"{self.adapter_name}: the sources of one batch resize to different shapes {sorted(sizes)}; "
                "give sources of one aspect ratio"
            )
        return {k: torch.cat([r[k] for r in rows]) for k in rows[0]}

    def _encode_row(self, prompt: str, sources: list[Image.Image]) -> Conditioning:
        """One prompt with its sources, as the pipeline's ``__call__`` prepares them (batch of 1)."""
        processor = self.pipe.image_processor
        readable, for_vae, sizes = [], [], []
        for img in sources:
            ratio = img.width / img.height
            cw, ch = calculate_dimensions(self.condition_image_area, ratio)
            vw, vh = calculate_dimensions(self.vae_image_area, ratio)
            readable.append(processor.resize(img, ch, cw))
            for_vae.append(processor.preprocess(img, vh, vw).unsqueeze(2))  # [1, 3, 1, vh, vw]
            sizes.append((vh // self.vae_scale_factor // 2, vw // self.vae_scale_factor // 2))
        cond = self._text_with_images(prompt, readable, "prompt")
        if self.uses_cfg:
            cond.update(self._text_with_images(self.negative_prompt, readable, "negative_prompt"))
        latents = []
        for x in for_vae:
            z = self.pipe._encode_vae_image(
                x.to(self.device, self.dtype), None
            )  # [1, C, 1, h, w], normalised
            latents.append(self.pipeline_class._pack_latents(z, 1, z.shape[1], z.shape[3], z.shape[4]))
        cond["image_latents"] = torch.cat(latents, dim=1)  # [1, n N', 4C]
        cond["source_sizes"] = torch.tensor([sizes])  # [1, n, 2]: packed tokens per side of each source
        return cond

    def _text_with_images(self, text: str, images: list[Image.Image], name: str) -> Conditioning:
        """``{name}_embeds``, ``{name}_mask`` padded to ``max_sequence_length``: Qwen2.5-VL's states of
        ``text`` read with ``images`` (the pipeline's ``encode_prompt``)."""
        with self.text_encoders_on_device():
            embeds, mask = self.pipe.encode_prompt(prompt=[text], image=images, device=self.device)
        if embeds.shape[1] > self.max_sequence_length:
            raise RecipeError(
                f"{self.adapter_name}: the instruction with its images is {embeds.shape[1]} tokens, more "
                f"than max_sequence_length = {self.max_sequence_length}; raise it (at most 1024) or shorten "
                "the prompt"
            )
        padded = pad_text(embeds, mask, self.max_sequence_length)
        return {f"{name}_embeds": padded["prompt_embeds"], f"{name}_mask": padded["prompt_mask"]}

    def null_conditioning(self, cond: Conditioning, batch: int) -> Conditioning:
        """CFG's unconditional half: the negative prompt read with the same sources, the same latents."""
        return dict(
            cond, prompt_embeds=cond["negative_prompt_embeds"], prompt_mask=cond["negative_prompt_mask"]
        )

    # ------------------------------------------------------------------------------ the network
    def denoiser_inputs(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> dict[str, Any]:
        inputs = super().denoiser_inputs(z, t, cond)
        sources = cond["image_latents"].to(self.device, self.dtype)  # [B, n N', 4C]
        inputs["hidden_states"] = torch.cat([inputs["hidden_states"], sources], dim=1)
        extra = [(1, int(h), int(w)) for h, w in cond["source_sizes"][0].tolist()]
        inputs["img_shapes"] = [[*self.img_shapes, *extra]] * z.shape[0]
        return inputs

    def denoiser_output(self, output: Any, z: torch.Tensor) -> torch.Tensor:
        side = self.latent_side // 2
        return self.unpack(output[0][:, : side * side])  # the noisy latents' tokens
