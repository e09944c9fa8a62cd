"""The ``qwen_image21`` adapter: Qwen-Image 2.x through ``diffusers.QwenImage21Pipeline`` (text-to-image).

It reuses the ``qwen_image`` adapter (``QwenImageAdapter``: the per-channel latent normalisation, the
one-frame video VAE, the prompt cache's padding and per-batch trimming, the static shift) and changes what
2.x does differently:

Latents: the VAE's unpacked latents ``[C, H/16, W/16]`` (``C`` = 64 for the real model), normalised per
channel. 2.x consumes them unpatched: one token per latent pixel, ``[(H/16)(W/16), C]`` (the pipeline's
``_pack_latents``, a plain flatten). Noise drawn as ``[B, C, h, w]`` is what the pipeline draws as
``[B, 1, C, h, w]`` from the same generator.

Text: Qwen3-VL's last decoder-layer hidden states (before its final norm, as the pipeline hooks it) after
the system prefix, at each prompt's own length. The pipeline never truncates; a prompt longer than
``max_sequence_length`` is refused. The cache pads each prompt to ``max_sequence_length`` with its mask.
The transformer gives the image tokens RoPE positions after the text, padding included, so the pipeline's
own batch of prompts of different lengths depends on its neighbours; the adapter calls the transformer once
per prompt length in the batch, unpadded, which is exactly the pipeline's call for each prompt alone (and
for a batch of equal-length prompts).

The transformer call: one joint sequence of the text tokens and ``h w / 4`` encoder slots of 2x2 image
tokens each (``img_mask``), block-causal attention, text modulated from ``t = 0`` (``causal_condition``);
the output's last ``h w`` tokens are the velocity, as the pipeline slices them.

KV cache: the pipeline caches the text tokens' keys and values after the first step (they do not depend on
``t``). The adapter recomputes them at every call, which equals the cached result in exact arithmetic (the
target tokens attend to the same prefix) and is what training needs (a gradient through every call); in
floating point the two differ by rounding only, as the pipeline's own docstring says of its flag.

Timesteps: the pipeline samples ``linspace(1, 1/n, n)`` shifted dynamically (``mu`` linear in the token
count), which is the static shift ``e^mu``; ``shift_terminal`` is left out as in ``qwen_image``. A model whose
pipeline config sets ``sample_sigmas`` (an author's fixed grid) is sampled on the adapter's grid instead: a
warning says so.

True CFG as the pipeline does it: two network calls (each prompt set at its own length),
``v_neg + s (v_cond - v_neg)`` with no rescaling. Condition images (the pipeline's ``image``) are not
supported. Decoding keeps the VAE's RGB channels (the 2.x VAE decodes RGBA; alpha is dropped).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from diffusers import QwenImage21Pipeline
from vgrpo_adapters.qwen_image.impl import QwenImageAdapter, pad_text

from vgrpo_platform.errors import RecipeError
from vgrpo_platform.protocols import Conditioning

VAE_SCALE = 16
"""``QwenImage21Pipeline.vae_scale_factor``: the pipeline fixes it at 16 whatever the VAE's config says."""
SLOT = 4
"""Image tokens per Qwen3-VL image slot (2x2), the transformer's ``_IMG_TOKENS_PER_SLOT``."""


class QwenImage21Adapter(QwenImageAdapter):
    """Qwen-Image 2.x single-stream transformer (trained) + RGBA video VAE and Qwen3-VL (frozen)."""

    pipeline_class = QwenImage21Pipeline
    display_name = "Qwen-Image 2.x"
    # Every linear layer of the single-stream blocks: attention projections and the SwiGLU MLP (the
    # shared modulation and the input/output projections stay frozen).
    LORA_TARGETS: Sequence[str] = (
        "to_q",
        "to_k",
        "to_v",
        "to_out.0",
        "img_mlp.proj",
        "img_mlp.gate_layer",
        "img_mlp.out",
    )
    lora_target_modules: Sequence[str] = LORA_TARGETS

    def __init__(self, pipe: QwenImage21Pipeline, **kwargs: Any) -> None:
        super().__init__(pipe, **kwargs)
        self.lora_target_modules = self.LORA_TARGETS
        self.img_shapes = [(1, self.latent_side, self.latent_side)]  # unpatched: a token per latent pixel
        if getattr(pipe.config, "sample_sigmas", None) is not None:
            warnings.warn(
                "this Qwen-Image 2.x pipeline sets sample_sigmas; vgrpo samples on its own shifted grid "
                "(sampler steps, adapter shift) instead",
                stacklevel=2,
            )

    def _vae_scale_factor(self) -> int:
        return int(getattr(self.pipe, "vae_scale_factor", VAE_SCALE))

    def image_seq_len(self) -> int:
        """Image tokens the transformer sees: one per latent pixel (what the dynamic shift reads)."""
        return self.latent_side**2

    def latent_shape(self) -> tuple[int, ...]:
        return (int(self.denoiser.config.in_channels), self.latent_side, self.latent_side)

    def _encode(self, prompts: list[str]) -> Conditioning:
        embeds, mask, _ = self.pipe.encode_prompt(prompt=prompts, device=self.device)  # text only
        if embeds.shape[1] > self.max_sequence_length:
            raise ValueError(
                f"a prompt has {embeds.shape[1]} Qwen3-VL tokens, more than max_sequence_length = "
                f"{self.max_sequence_length} (the pipeline does not truncate); raise max_sequence_length"
            )
        return pad_text(embeds, mask, self.max_sequence_length)

    def network_velocity(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """One call per prompt length in the batch, each unpadded: the image tokens' RoPE positions follow
        the text length, padding included, so a padded prompt would not give its own unbatched result."""
        embeds, mask = cond["prompt_embeds"], cond["prompt_mask"]
        if mask.is_meta:  # FLOP counting without values (benchmarks/throughput.py): all S tokens
            return super().network_velocity(z, t, {"prompt_embeds": embeds})
        lengths = mask.sum(dim=1).to(z.device)
        parts, order = [], []
        for length in lengths.unique().tolist():
            rows = (lengths == length).nonzero(as_tuple=True)[0]
            one_length = {"prompt_embeds": embeds[rows.to(embeds.device), : int(length)]}
            parts.append(super().network_velocity(z[rows], t[rows], one_length))
            order.append(rows)
        return torch.cat(parts)[torch.cat(order).argsort()]

    def denoiser_inputs(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> dict[str, Any]:
        """The pipeline's transformer inputs for prompts of one length, ``[B, s, D]`` (no mask)."""
        embeds = cond["prompt_embeds"]
        batch, tokens = z.shape[0], self.latent_side**2
        text = torch.zeros(batch, embeds.shape[1], dtype=torch.bool, device=self.device)
        img_mask = torch.cat([text, text.new_ones(batch, tokens // SLOT)], dim=1)  # [B, s + N/4]
        return dict(
            hidden_states=self.pack(z.to(self.device, self.dtype)),  # [B, N, C]
            timestep=t.to(self.device),  # sigma in [0, 1], as the pipeline passes timestep / 1000
            encoder_hidden_states=embeds.to(self.device, self.dtype),  # [B, s, D]
            img_shapes=[self.img_shapes] * batch,
            img_mask=img_mask,
            return_dict=False,
        )

    def denoiser_output(self, output: Any, z: torch.Tensor) -> torch.Tensor:
        tokens = self.latent_side**2
        return self.unpack(output[0][:, -tokens:])  # the target image's tokens -> [B, C, h, w]

    def guided_velocity(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """The pipeline's true CFG: two calls (each prompt set at its own length), no rescaling."""
        t = t.to(device=z.device, dtype=torch.float32).expand(z.shape[0])
        v_cond = self.network_velocity(z, t, cond)
        with self.network.branch("uncond"):  # a second call per step: its own cache state
            v_null = self.network_velocity(z, t, self.null_conditioning(cond, z.shape[0]))
        return (v_null + self.cfg_scale * (v_cond - v_null)).to(z.dtype)

    def _vae_encode(self, images: torch.Tensor) -> torch.Tensor:
        raise RecipeError(
            f"{self.display_name} has no image encoder for data yet (its VAE takes an alpha channel); give "
            "train.data_anchor.source as a .safetensors file of latents instead"
        )

    def _vae_decode(self, part: torch.Tensor) -> torch.Tensor:
        """Latents ``[b, C, h, w]`` -> RGB images ``[b, 3, H, W]`` (the VAE's alpha channel dropped)."""
        return super()._vae_decode(part)[:, :3]
