"""The ``flux2`` and ``flux2_klein`` adapters: FLUX.2 [dev] / [klein] through ``Flux2Pipeline`` /
``Flux2KleinPipeline``.

Latent representation: the pipelines' own, ``[4C, H/2f, W/2f]`` (``C`` = 32 VAE channels and ``f`` = 8
for FLUX.2, so 128 channels at 1/16 of the image side): the VAE latents patchified into 2x2 patches
(channel-major) and normalised by the VAE's batch-norm statistics. The transformer sees them flattened
to ``[(H/2f)(W/2f), 4C]`` tokens with 4-axis position ids ``(t, h, w, l)``; noise drawn as ``[B, 4C, h, w]``
is what the pipelines draw from the same generator. Decoding undoes the normalisation and the
patchifying, then runs the VAE decoder.

Text: the prompt (with the pipeline's system message for [dev], its chat template for [klein]) padded to
``max_sequence_length`` tokens; the embeddings stack three of the text model's hidden layers (``[B, L,
3D]``) and the transformer attends to all ``L`` tokens, padding included, exactly as the pipelines call it
(no mask), so cached rows of any prompt batch together.

Timestep shift: the pipelines shift with ``mu = compute_empirical_mu(image_seq_len, num_steps)``, which
depends on the step count as well as the resolution; at one (resolution, step count) this is the static
shift ``e^mu``. ``shift_steps`` says which step count (the recipe sets it to ``rollout.steps``).

Guidance: [dev] feeds an embedded guidance value to the transformer (one pass per step); [klein] base
models use true CFG against the empty prompt, ``v_neg + s (v_cond - v_neg)`` (no rescaling), and the
step-distilled [klein] models none (their pipeline ignores ``guidance_scale``; this adapter refuses it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from diffusers import Flux2KleinPipeline, Flux2Pipeline
from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu
from vgrpo_adapters._diffusers_cfg import TrueCFGMixin
from vgrpo_adapters._diffusers_common import JOINT_ATTENTION, DiffusersImageAdapter

from vgrpo_platform.protocols import Conditioning


def flux2_shift(image_seq_len: int, steps: int) -> float:
    """``e^mu`` of the FLUX.2 pipelines' empirical shift at ``image_seq_len`` tokens and ``steps`` steps."""
    return math.exp(compute_empirical_mu(image_seq_len, steps))


class Flux2AdapterBase(DiffusersImageAdapter):
    """What FLUX.2 [dev] and [klein] share: latents, packing, position ids, the transformer call, decoding."""

    # Flow-Factory's default FLUX.2 LoRA targets: both streams' attention and MLPs of the dual-stream
    # blocks, and the fused QKV + MLP input projection of the single-stream blocks.
    lora_target_modules: Sequence[str] = (
        *JOINT_ATTENTION,
        "attn.to_add_out",
        "ff.linear_in",
        "ff.linear_out",
        "ff_context.linear_in",
        "ff_context.linear_out",
        "attn.to_qkv_mlp_proj",
    )
    display_name = "FLUX.2"

    def __init__(
        self, pipe: Any, *, shift_steps: int = 50, guidance: float | None = None, **kwargs: Any
    ) -> None:
        self.shift_steps = shift_steps  # read by default_shift, within the base constructor
        super().__init__(pipe, **kwargs)
        self.guidance = float(guidance) if guidance is not None else None
        side = self.latent_side // 2
        grid = torch.zeros(1, 1, side, side)
        self.img_ids = Flux2Pipeline._prepare_latent_ids(grid)[0].to(self.device)  # [S, 4] (t, h, w, l)
        self._txt_ids: dict[int, torch.Tensor] = {}
        cfg = self.vae.config
        bn = self.vae.bn
        self._bn_mean = bn.running_mean.detach().float().view(1, -1, 1, 1)  # [1, 4C, 1, 1]
        self._bn_std = (bn.running_var.detach().float() + cfg.batch_norm_eps).sqrt().view(1, -1, 1, 1)

    def default_shift(self) -> float:
        """The pipelines' empirical mu replaces the scheduler config's dynamic shift."""
        return flux2_shift(self.image_seq_len(), self.shift_steps)

    def latent_shape(self) -> tuple[int, ...]:
        side = self.latent_side // 2
        return (int(self.denoiser.config.in_channels), side, side)

    def _encode(self, prompts: list[str]) -> Conditioning:
        """``prompt_embeds`` ``[B, max_sequence_length, 3D]`` (three hidden layers of the text model)."""
        embeds, _text_ids = self.pipe.encode_prompt(
            prompt=prompts, device=self.device, max_sequence_length=self.max_sequence_length
        )
        return {"prompt_embeds": embeds}

    def pack(self, z: torch.Tensor) -> torch.Tensor:
        """``[B, 4C, h, w]`` -> ``[B, h w, 4C]``, the transformer's token layout (row-major positions)."""
        return Flux2Pipeline._pack_latents(z)

    def unpack(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[B, h w, 4C]`` -> ``[B, 4C, h, w]``."""
        side = self.latent_side // 2
        return tokens.permute(0, 2, 1).reshape(tokens.shape[0], tokens.shape[2], side, side)

    def _text_ids(self, length: int) -> torch.Tensor:
        """The pipelines' text position ids ``(0, 0, 0, l)`` for ``length`` tokens, ``[L, 4]``; made once."""
        if length not in self._txt_ids:
            self._txt_ids[length] = Flux2Pipeline._prepare_text_ids(torch.empty(1, length, 1))[0].to(
                self.device
            )
        return self._txt_ids[length]

    def denoiser_inputs(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> dict[str, Any]:
        batch = z.shape[0]
        embeds = cond["prompt_embeds"].to(self.device, self.dtype)  # [B, L, 3D]
        guidance = None
        if self.guidance is not None:
            guidance = torch.full((batch,), self.guidance, device=self.device, dtype=torch.float32)  # [B]
        txt_ids = self._text_ids(embeds.shape[1])  # [L, 4]
        return dict(
            hidden_states=self.pack(z.to(self.device, self.dtype)),  # [B, N, 4C]
            timestep=t.to(self.device),  # sigma in [0, 1], as the pipelines pass timestep / 1000
            guidance=guidance,
            encoder_hidden_states=embeds,
            txt_ids=txt_ids,
            img_ids=self.img_ids,
            return_dict=False,
        )

    def denoiser_output(self, output: Any, z: torch.Tensor) -> torch.Tensor:
        return self.unpack(output[0])  # [B, 4C, h, w]

    def _vae_encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images ``[b, 3, H, W]`` in ``[-1, 1]`` -> latents ``[b, 4C, h, w]``, ``_vae_decode``'s inverse: the
        posterior's mode, patchified, batch-normalised (as FLUX.2's pipeline encodes a reference image)."""
        x = self.vae.encode(images.to(self.device, self.vae.dtype)).latent_dist.mode().float()
        x = Flux2Pipeline._patchify_latents(x)  # [b, 4C, h, w]
        return ((x - self._bn_mean.to(x.device)) / self._bn_std.to(x.device)).to(self.dtype)

    def _vae_decode(self, part: torch.Tensor) -> torch.Tensor:
        """Latents ``[b, 4C, h, w]`` -> images ``[b, 3, H, W]``: un-normalised, unpatchified, decoded."""
        x = part.to(self.device, torch.float32)
        x = x * self._bn_std.to(x.device) + self._bn_mean.to(x.device)
        x = Flux2Pipeline._unpatchify_latents(x)  # [b, C, 2h, 2w]
        return self.vae.decode(x.to(self.vae.dtype), return_dict=False)[0].float()


class Flux2Adapter(Flux2AdapterBase):
    """FLUX.2 [dev]: transformer (trained) + VAE and Mistral-3 (frozen), embedded guidance."""

    pipeline_class = Flux2Pipeline

    def __init__(self, pipe: Flux2Pipeline, *, guidance: float = 4.0, **kwargs: Any) -> None:
        has_guidance = bool(pipe.transformer.config.guidance_embeds)
        super().__init__(pipe, guidance=guidance if has_guidance else None, **kwargs)


class Flux2KleinAdapter(TrueCFGMixin, Flux2AdapterBase):
    """FLUX.2 [klein]: transformer (trained) + VAE and Qwen3 (frozen), optional true CFG."""

    pipeline_class = Flux2KleinPipeline

    def __init__(self, pipe: Flux2KleinPipeline, *, cfg_scale: float = 1.0, **kwargs: Any) -> None:
        if cfg_scale > 1.0 and bool(getattr(pipe.config, "is_distilled", False)):
            raise ValueError(
                f"cfg_scale={cfg_scale} on a step-distilled FLUX.2 [klein] (model_index.json: is_distilled): "
                "its pipeline ignores guidance; set cfg_scale = 1, or use a klein-base model for CFG"
            )
        super().__init__(pipe, cfg_scale=cfg_scale, **kwargs)
