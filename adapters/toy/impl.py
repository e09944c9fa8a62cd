"""The ``toy`` adapter: a pixel-space text-to-image rectified-flow model small enough for CPU tests.

Latents are the images themselves, ``[B, 3, R, R]`` in ``[-1, 1]``; ``decode`` only rescales them.

Export (``export_trained``, shared with the ``shapes`` adapter): a LoRA is written in SD3's diffusers
layout (``pytorch_lora_weights.safetensors``, ``transformer.``-prefixed keys, rank and alpha in its
metadata) and loads into a plain ``SD3Transformer2DModel`` with ``load_lora_adapter``; full fine-tuning
writes a whole model folder (``transformer/``, ``text_encoder/``, ``tokenizer/``) that
``adapter.options.model_path`` loads. There is no SD3 pipeline of the toy model (no VAE, one text encoder).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from diffusers import SD3Transformer2DModel
from transformers import CLIPTextModelWithProjection, CLIPTokenizer
from vgrpo_adapters._diffusers_common import resized_source
from vgrpo_adapters._diffusers_export import FolderModelExport
from vgrpo_adapters._tiny_models import load_model_folder, padded_tokens, resolve_model_path
from vgrpo_adapters.toy import ToyAdapterConfig
from vgrpo_adapters.toy.build import build_toy_model, is_built

from vgrpo_platform.network import CoreCalledAdapter
from vgrpo_platform.noise_schedules import RectifiedFlowSchedule
from vgrpo_platform.protocols import BuildContext, Conditioning, Samples

TIMESTEP_SCALE = 1000.0
"""SD3's transformer embeds ``timestep = 1000 t`` (the scheduler's ``sigma * num_train_timesteps``)."""

HEAD_DIM, TEXT_DIM, MAX_PROMPT_TOKENS = 16, 32, 32  # fixed sizes of a built toy model


class ToyAdapter(CoreCalledAdapter, FolderModelExport):
    """SD3 MMDiT (trained) + CLIP text encoder (frozen) + byte-level CLIP tokenizer."""

    modality = "image"
    folder_placeholder = "<toy model folder>"
    lora_target_modules: Sequence[str] = ("to_q", "to_k", "to_v", "to_out.0", "proj_out", "norm_out.linear")

    def __init__(
        self,
        transformer: SD3Transformer2DModel,
        text_encoder: CLIPTextModelWithProjection,
        tokenizer: CLIPTokenizer,
        resolution: int | None = None,
        shift: float = 1.0,
        owned_dir: tempfile.TemporaryDirectory | None = None,
        model_folder: str | Path | None = None,
    ) -> None:
        cfg = transformer.config
        if cfg.in_channels != 3 or (cfg.out_channels or cfg.in_channels) != 3:
            raise ValueError(
                f"the toy adapter works in pixel space: the transformer needs 3 input and output channels, "
                f"got in_channels={cfg.in_channels}, out_channels={cfg.out_channels}"
            )
        resolution = resolution or cfg.sample_size
        max_side = cfg.pos_embed_max_size * cfg.patch_size
        if resolution % cfg.patch_size or resolution > max_side:
            raise ValueError(
                f"resolution {resolution} must be a multiple of the patch size {cfg.patch_size} and at most "
                f"{max_side} (pos_embed_max_size {cfg.pos_embed_max_size} x patch size) for this transformer"
            )
        self.denoiser = transformer
        self.text_encoder = text_encoder.requires_grad_(False).eval()  # frozen: conditioning has no grad
        self.tokenizer = tokenizer
        self.resolution = resolution
        self.schedule = RectifiedFlowSchedule(shift)
        self.device = transformer.device
        self.dtype = transformer.dtype
        self.max_prompt_tokens = min(tokenizer.model_max_length, text_encoder.config.max_position_embeddings)
        self._owned_dir = owned_dir  # a temporary build folder lives as long as the adapter
        self.model_folder = model_folder  # where it was loaded from: the export's base model

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        resolution: int | None = None,
        shift: float = 1.0,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        owned_dir: tempfile.TemporaryDirectory | None = None,
        allow_pickle_weights: bool = False,
    ) -> ToyAdapter:
        """Load a folder with ``transformer/``, ``text_encoder/``, ``tokenizer/`` (``from_pretrained``);
        safetensors only unless ``allow_pickle_weights`` (``vgrpo_adapters._weights``)."""
        path = Path(path)
        transformer, text_encoder, tokenizer = load_model_folder(
            path,
            SD3Transformer2DModel,
            CLIPTextModelWithProjection,
            dtype=dtype or torch.float32,
            allow_pickle=allow_pickle_weights,
            fix="point adapter.options.model_path at a folder holding all three, or leave it unset to "
            "build one",
        )
        return cls(
            transformer.to(device),
            text_encoder.to(device),
            tokenizer,
            resolution=resolution,
            shift=shift,
            owned_dir=owned_dir,
            model_folder=path,
        )

    @classmethod
    def from_config(cls, config: ToyAdapterConfig, context: BuildContext) -> ToyAdapter:
        """The factory's work: resolve or build the model folder, then load it like any checkpoint."""
        owned_dir = None
        folder = resolve_model_path(config.model_path, context)
        if folder is None:
            if context.run_dir is not None:
                folder = Path(context.run_dir) / "toy_model"
            else:
                owned_dir = tempfile.TemporaryDirectory(prefix="vgrpo_toy_")
                folder = Path(owned_dir.name)
            args = dict(
                seed=config.init_seed,
                resolution=config.resolution,
                num_layers=config.num_layers,
                num_heads=config.num_heads,
                head_dim=HEAD_DIM,
                text_dim=TEXT_DIM,
                max_prompt_tokens=MAX_PROMPT_TOKENS,
            )
            if not is_built(folder, **args):
                build_toy_model(folder, **args)
        return cls.load(
            folder,
            resolution=config.resolution,
            shift=config.shift,
            device=context.device,
            dtype=context.dtype,
            owned_dir=owned_dir,
            allow_pickle_weights=config.allow_pickle_weights,
        )

    def latent_shape(self) -> tuple[int, ...]:
        return (3, self.resolution, self.resolution)

    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str]) -> Conditioning:
        """``prompt_embeds`` ``[B, S, D]`` (per-token, joint attention) and ``pooled_prompt_embeds``
        ``[B, D]`` (projected EOS state, added to the timestep embedding), as in SD3."""
        return self.encode_with_grad(prompts)

    def encode_with_grad(self, prompts: Sequence[str]) -> Conditioning:
        """``encode_prompts`` without its ``no_grad``: the text encoder trains in pretraining."""
        ids, _ = padded_tokens(self.tokenizer, prompts, self.max_prompt_tokens, self.device)
        out = self.text_encoder(input_ids=ids)
        return {"prompt_embeds": out.last_hidden_state, "pooled_prompt_embeds": out.text_embeds}

    def denoiser_inputs(self, z_t: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> dict[str, Any]:
        """The SD3 transformer's inputs for ``z_t`` ``[B, 3, R, R]`` at ``t`` ``[B]`` in ``[0, 1]``; its
        output is the velocity ``v ~ eps - x0`` (``CoreCalledAdapter`` gives ``predict`` and ``sample``)."""
        return {
            "hidden_states": z_t.to(self.dtype),
            "encoder_hidden_states": cond["prompt_embeds"].to(self.dtype),
            "pooled_projections": cond["pooled_prompt_embeds"].to(self.dtype),
            "timestep": t * TIMESTEP_SCALE,
            "return_dict": False,
        }

    def decode(self, latents: torch.Tensor) -> Samples:
        """``[-1, 1]`` pixels -> ``[0, 1]`` images ``[B, 3, R, R]`` (float32, clamped)."""
        return Samples("image", ((latents.float() + 1) / 2).clamp(0, 1))

    def encode_images(self, images: Sequence[torch.Tensor]) -> torch.Tensor:
        """Images ``[3, h, w]`` in ``[0, 1]`` -> latents ``[N, 3, R, R]`` in ``[-1, 1]`` (resized to the
        resolution): ``decode``'s inverse, data for ``[train.data_anchor]``."""
        side = self.resolution
        return torch.stack([resized_source(im, side, side, torch.device("cpu")) for im in images])

    # ------------------------------------------------------------------------------------ export
    @property
    def pipeline_class(self) -> type:
        """Only the LoRA saver (``save_lora_weights`` is a classmethod): SD3's layout; nothing is built."""
        from diffusers import StableDiffusion3Pipeline

        return StableDiffusion3Pipeline
