"""The ``qwen_image`` adapter: Qwen-Image through ``diffusers.QwenImagePipeline``.

Latent representation: the VAE's *unpacked* latents ``[C, H/f, W/f]`` (``C`` = 16 and ``f`` = 8 for
Qwen-Image), normalised per channel as the pipeline samples them (``(x - latents_mean) / latents_std``).
The transformer sees them packed into 2x2 patches, ``[(H/2f)(W/2f), 4C]`` tokens (the same fixed
permutation as FLUX's, so the surrogate's per-element losses do not depend on the layout); noise drawn
as ``[B, C, h, w]`` is what the pipeline draws as ``[B, 1, C, h, w]`` from the same generator. The VAE is
a video VAE: decoding adds and drops a one-frame axis.

Text: Qwen2.5-VL's last hidden states after the chat template's prefix (the pipeline's
``prompt_template_encode``, whose first 34 tokens it drops), of a length that varies by prompt. The
prompt cache stores each prompt padded to ``max_sequence_length`` with its mask; each network call cuts
the batch back to its longest prompt, so a batch of one prompt length is exactly the pipeline's call
(no mask), and a mixed batch attends only to each prompt's own tokens.

Timestep shift: Qwen-Image shifts dynamically like FLUX (``mu`` linear in the token count) and then
stretches the grid so that its last non-zero sigma is ``shift_terminal`` (0.02). The stretch depends on
the step count and has no static equivalent: the adapter uses the static shift ``e^mu`` alone (rollouts
and the surrogate's ``t``), so its Euler grid differs from the pipeline's by that stretch only (equal
when the scheduler has ``shift_terminal = None``); ``shift`` overrides it.

True CFG as the pipeline does it: two network calls (each prompt set at its own length),
``v_neg + s (v_cond - v_neg)``, then each token's ``4C``-vector rescaled to the conditional prediction's
norm.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from diffusers import QwenImagePipeline
from vgrpo_adapters._diffusers_cfg import TrueCFGMixin
from vgrpo_adapters._diffusers_common import (
    DiffusersImageAdapter,
    latent_stats,
    lora_targets_but_last_block,
    static_shift,
)

from vgrpo_platform.protocols import Conditioning

DEFAULT_VAE_SCALE = 8
"""Qwen-Image's VAE downsamples 8x spatially (``2 ** len(temperal_downsample)``, the pipeline's
``vae_scale_factor``); used when the pipeline object does not say (the benchmark's stand-ins)."""


def qwen_static_shift(scheduler_config: Any, image_seq_len: int) -> float:
    """``e^mu`` of the pipeline's dynamic shift at ``image_seq_len`` tokens, ``shift_terminal`` left out."""
    return static_shift({**dict(scheduler_config), "shift_terminal": None}, image_seq_len)


def trim_text(embeds: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Cut ``embeds`` ``[B, S, D]`` and ``mask`` ``[B, S]`` to the batch's longest prompt; the mask is
    ``None`` when every kept token is real (as the pipeline passes it). A meta tensor (FLOP counting
    without memory, ``benchmarks/throughput.py``) has no values: all ``S`` tokens, no mask."""
    if mask.is_meta:
        return embeds, None
    length = int(mask.sum(dim=1).max())
    mask = mask[:, :length]
    return embeds[:, :length], None if bool(mask.all()) else mask


def pad_text(embeds: torch.Tensor, mask: torch.Tensor | None, length: int) -> Conditioning:
    """The prompt cache's rows: ``embeds`` ``[B, S, D]`` zero-padded to ``[B, length, D]`` and its mask
    ``[B, length]`` (1 on each prompt's own tokens; ``None``, as the pipelines pass an all-ones mask, is
    all ones)."""
    if mask is None:
        mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
    pad = length - embeds.shape[1]
    embeds = torch.nn.functional.pad(embeds, (0, 0, 0, pad))
    return {"prompt_embeds": embeds, "prompt_mask": torch.nn.functional.pad(mask.long(), (0, pad))}


class QwenImageAdapter(TrueCFGMixin, DiffusersImageAdapter):
    """Qwen-Image MMDiT (trained) + video VAE and Qwen2.5-VL (frozen), optional true CFG."""

    pipeline_class = QwenImagePipeline
    display_name = "Qwen-Image"
    # The Qwen-Image LoRA of verl's Flow-GRPO example (rank 64, alpha 128): both streams' attention
    # projections and MLPs, i.e. every linear layer of the dual-stream blocks except the modulation,
    # less the last block's text-stream outputs (the model discards that block's text states, so LoRA
    # there would never get a gradient). ``__init__`` spells out the text-output layers block by block.
    LORA_SHARED: Sequence[str] = (
        "to_q",
        "to_k",
        "to_v",
        "to_out.0",
        "add_q_proj",
        "add_k_proj",
        "add_v_proj",
        "img_mlp.net.0.proj",
        "img_mlp.net.2",
    )
    LORA_TEXT_OUTPUT: Sequence[str] = ("attn.to_add_out", "txt_mlp.net.0.proj", "txt_mlp.net.2")
    lora_target_modules: Sequence[str] = (*LORA_SHARED, *LORA_TEXT_OUTPUT)  # before __init__ narrows it

    def __init__(
        self,
        pipe: QwenImagePipeline,
        *,
        max_sequence_length: int = 512,
        negative_prompt: str = " ",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            pipe, max_sequence_length=max_sequence_length, negative_prompt=negative_prompt, **kwargs
        )
        blocks = len(self.denoiser.transformer_blocks)
        self.lora_target_modules = lora_targets_but_last_block(
            self.LORA_SHARED, self.LORA_TEXT_OUTPUT, blocks
        )
        side = self.latent_side // 2
        self.img_shapes = [(1, side, side)]  # one frame of side x side packed tokens, per sample
        self._latents_mean, self._latents_std = latent_stats(self.vae.config)  # [1, C, 1, 1, 1] each

    def _vae_scale_factor(self) -> int:
        return int(getattr(self.pipe, "vae_scale_factor", DEFAULT_VAE_SCALE))

    def default_shift(self) -> float:
        return qwen_static_shift(self.pipe.scheduler.config, self.image_seq_len())

    def latent_shape(self) -> tuple[int, ...]:
        channels = int(self.denoiser.config.in_channels) // 4  # packed tokens hold 2x2 patches
        return (channels, self.latent_side, self.latent_side)

    def _encode(self, prompts: list[str]) -> Conditioning:
        """``prompt_embeds`` ``[B, max_sequence_length, D]`` zero-padded and ``prompt_mask`` ``[B, S]``
        (1 on each prompt's own tokens)."""
        embeds, mask = self.pipe.encode_prompt(
            prompt=prompts, device=self.device, max_sequence_length=self.max_sequence_length
        )
        return pad_text(embeds, mask, self.max_sequence_length)

    def pack(self, z: torch.Tensor) -> torch.Tensor:
        """``[B, C, h, w]`` -> ``[B, (h/2)(w/2), 4C]``, the transformer's token layout."""
        b, c, h, w = z.shape
        return self.pipeline_class._pack_latents(z, b, c, h, w)

    def unpack(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[B, (h/2)(w/2), 4C]`` -> ``[B, C, h, w]``."""
        out = self.pipeline_class._unpack_latents(
            tokens, self.resolution, self.resolution, self.vae_scale_factor
        )  # [B, C, 1, h, w]
        return out[:, :, 0]  # drop the one-frame axis

    def denoiser_inputs(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> dict[str, Any]:
        embeds = cond["prompt_embeds"]
        embeds, mask = trim_text(embeds, cond["prompt_mask"].to(embeds.device))
        return dict(
            hidden_states=self.pack(z.to(self.device, self.dtype)),  # [B, N, 4C]
            timestep=t.to(self.device),  # sigma in [0, 1], as the pipeline passes timestep / 1000
            guidance=None,
            encoder_hidden_states=embeds.to(self.device, self.dtype),  # [B, s, D]
            encoder_hidden_states_mask=None if mask is None else mask.to(self.device),
            img_shapes=[self.img_shapes] * z.shape[0],
            return_dict=False,
        )

    def denoiser_output(self, output: Any, z: torch.Tensor) -> torch.Tensor:
        return self.unpack(output[0])  # [B, C, h, w]

    # --------------------------------------------------------------------------------------- CFG
    def guided_velocity(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """The pipeline's true CFG: two calls (each prompt set at its own length), combined, then each
        token's 4C-vector rescaled to the conditional prediction's norm."""
        batch = z.shape[0]
        t = t.to(device=z.device, dtype=torch.float32).expand(batch)
        v_cond = self.pack(self.network_velocity(z, t, cond))  # [B, N, 4C]
        with self.network.branch("uncond"):  # a second call per step: its own cache state
            v_null = self.pack(self.network_velocity(z, t, self.null_conditioning(cond, batch)))
        combined = v_null + self.cfg_scale * (v_cond - v_null)
        scale = v_cond.norm(dim=-1, keepdim=True) / combined.norm(dim=-1, keepdim=True)  # [B, N, 1]
        return self.unpack(combined * scale).to(z.dtype)

    # ------------------------------------------------------------------------------------ decode
    def _vae_encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images ``[b, 3, H, W]`` in ``[-1, 1]`` -> normalised latents ``[b, C, h, w]``: the inverse of
        ``_vae_decode`` (the posterior's mode of a one-frame video, then ``(x - mean) / std``)."""
        x = images.to(self.device, self.vae.dtype)[:, :, None]  # [b, 3, 1, H, W]
        latents = self.vae.encode(x).latent_dist.mode().float()  # [b, C, 1, h, w]
        latents = (latents - self._latents_mean.to(latents.device)) / self._latents_std.to(latents.device)
        return latents[:, :, 0].to(self.dtype)

    def _vae_decode(self, part: torch.Tensor) -> torch.Tensor:
        """Latents ``[b, C, h, w]`` -> images ``[b, 3, H, W]`` through the video VAE (a one-frame axis)."""
        x = part.to(self.device, torch.float32)[:, :, None]  # [b, C, 1, h, w]
        x = x * self._latents_std.to(x.device) + self._latents_mean.to(x.device)
        frames = self.vae.decode(x.to(self.vae.dtype), return_dict=False)[0]  # [b, 3, 1, H, W]
        return frames[:, :, 0].float()
