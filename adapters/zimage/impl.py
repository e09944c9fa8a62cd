"""The ``zimage`` adapter: Z-Image through ``diffusers.ZImagePipeline``.

Latent representation: the VAE's latents ``[C, H/8, W/8]`` (``C`` = 16), scaled as the pipeline samples
them (``(x - shift_factor) * scaling_factor``); noise drawn as ``[B, C, h, w]`` is exactly what the pipeline
draws. The transformer takes a *list* of per-sample latents ``[C, 1, h, w]`` (it patchifies them itself)
and a list of per-sample text embeddings of each prompt's own length, and returns a list again; the
adapter stacks and unstacks.

Time runs backwards in Z-Image's network: it sees ``1 - t`` (``1`` is data) and predicts ``x - eps``, the
negative of the core's velocity ``v = eps - x``, so ``v(z, t) = -net(z, 1 - t)`` (the pipeline negates the
output before its Euler step). Its Euler grid is the core's ``euler`` grid, so rollouts equal the
pipeline's from the same noise.

Text: Qwen3's second-to-last hidden states of the prompt in the chat template (thinking enabled, as the
pipeline does), only the prompt's real tokens. The prompt cache keeps each prompt zero-padded to
``max_sequence_length`` with its mask; each call hands the transformer each prompt's own tokens, which it
pads per sample and masks across the batch, so a row never reads its batch-mates.

True CFG: the pipeline computes ``v_cond + g (v_cond - v_neg)``, which is ``v_neg + s (v_cond - v_neg)``
with ``s = g + 1``; ``cfg_scale`` is ``s``. Its optional ``cfg_normalization`` and ``cfg_truncation`` (off by
default) are not reproduced.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from diffusers import ZImagePipeline
from vgrpo_adapters._diffusers_cfg import TrueCFGMixin
from vgrpo_adapters._diffusers_common import DiffusersImageAdapter
from vgrpo_adapters.qwen_image.impl import pad_text

from vgrpo_platform.protocols import Conditioning


class ZImageAdapter(TrueCFGMixin, DiffusersImageAdapter):
    """Z-Image S3-DiT (trained) + VAE and Qwen3 (frozen), optional true CFG."""

    pipeline_class = ZImagePipeline
    display_name = "Z-Image"
    # Flow-Factory's Z-Image targets: every attention projection and SwiGLU MLP of the refiners and the
    # main layers (the adaLN modulations are left out)
    lora_target_modules: Sequence[str] = (
        "attention.to_q",
        "attention.to_k",
        "attention.to_v",
        "attention.to_out.0",
        "feed_forward.w1",
        "feed_forward.w2",
        "feed_forward.w3",
    )

    def __init__(self, pipe: ZImagePipeline, *, max_sequence_length: int = 512, **kwargs: Any) -> None:
        super().__init__(pipe, max_sequence_length=max_sequence_length, **kwargs)

    def _encode(self, prompts: list[str]) -> Conditioning:
        """``prompt_embeds`` ``[B, max_sequence_length, D]`` zero-padded and ``prompt_mask`` ``[B, S]``
        (1 on each prompt's own tokens, the chat template's included)."""
        rows, _ = self.pipe.encode_prompt(  # a copy: the pipeline writes the templated prompts into its list
            list(prompts),
            device=self.device,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
        )
        embeds = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)  # [B, longest, D]
        lengths = torch.tensor([len(r) for r in rows], device=embeds.device)
        mask = torch.arange(embeds.shape[1], device=embeds.device)[None] < lengths[:, None]
        return pad_text(embeds, mask, self.max_sequence_length)

    def denoiser_inputs(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> dict[str, Any]:
        embeds = cond["prompt_embeds"].to(self.device, self.dtype)  # [B, S, D]
        lengths = cond["prompt_mask"].sum(dim=1).tolist()
        return dict(
            x=list(z.to(self.device, self.dtype)[:, :, None].unbind(0)),  # B x [C, 1, h, w]
            t=1 - t.to(self.device),  # Z-Image's time: 1 = data
            cap_feats=[row[:n] for row, n in zip(embeds, lengths, strict=True)],  # B x [s_i, D]
            return_dict=False,
        )

    def denoiser_output(self, output: Any, z: torch.Tensor) -> torch.Tensor:
        """The core's velocity ``[B, C, h, w]``: the negated per-sample predictions, stacked."""
        return -torch.stack(output[0])[:, :, 0]
