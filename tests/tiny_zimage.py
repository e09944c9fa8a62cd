"""A tiny Z-Image pipeline built from configs, offline, saved in the diffusers folder layout.

Every component is the real library class at toy size (the shapes of diffusers' own ``ZImagePipeline``
tests): ``ZImageTransformer2DModel`` (one refiner layer of each kind, two main layers), ``AutoencoderKL``
(2 blocks: 2x downsampling, 16 latent channels, Z-Image's scaling and shift factors) and a Qwen3 text
model (``Qwen3Model``, whose second-to-last hidden states the pipeline reads) behind the byte-level
``tiny_pipelines.qwen_tokenizer`` with a Qwen3 chat template. The scheduler is Z-Image's own: a static
shift of 3 (the Turbo checkpoint's ``scheduler_config.json``).

At 32 px the latents are ``[16, 16, 16]``: 64 image tokens of 2x2 patches.
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
from tiny_flux2 import QWEN3_TEMPLATE
from tiny_pipelines import RESOLUTION, qwen_tokenizer
from tokenizers import AddedToken
from transformers import Qwen3Config, Qwen3Model

ZIMAGE_TOKENS = 48  # text tokens per prompt: the chat template's frame and the prompt, byte by byte
LATENT = (16, RESOLUTION // 2, RESOLUTION // 2)  # VAE factor 2, 16 channels
SCHEDULER = {"num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": False}


def _tokenizer():
    tok = qwen_tokenizer()
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in ("<think>", "</think>")])
    tok.chat_template = QWEN3_TEMPLATE
    return tok


def build_tiny_zimage(folder: str | Path, seed: int = 0) -> Path:
    """``ZImagePipeline`` at toy size, saved to ``folder``; returns it."""
    tok = _tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = ZImageTransformer2DModel(
            all_patch_size=(2,),
            all_f_patch_size=(1,),
            in_channels=LATENT[0],
            dim=32,
            n_layers=2,
            n_refiner_layers=1,
            n_heads=2,
            n_kv_heads=2,
            cap_feat_dim=16,
            axes_dims=[8, 4, 4],
            axes_lens=[256, 32, 32],
        )
        with torch.no_grad():  # created with torch.empty: give them values
            transformer.x_pad_token.normal_()
            transformer.cap_pad_token.normal_()
        vae = AutoencoderKL(
            down_block_types=["DownEncoderBlock2D"] * 2,
            up_block_types=["UpDecoderBlock2D"] * 2,
            block_out_channels=[32, 64],
            layers_per_block=1,
            latent_channels=LATENT[0],
            norm_num_groups=32,
            sample_size=RESOLUTION,
            scaling_factor=0.3611,  # Z-Image's VAE (FLUX.1's)
            shift_factor=0.1159,
        )
        text_encoder = Qwen3Model(
            Qwen3Config(
                vocab_size=len(tok),
                hidden_size=16,
                intermediate_size=24,
                num_hidden_layers=3,
                num_attention_heads=2,
                num_key_value_heads=1,
                head_dim=8,
                max_position_embeddings=256,
                pad_token_id=tok.pad_token_id,
            )
        ).eval()
        pipe = ZImagePipeline(
            scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
            vae=vae,
            text_encoder=text_encoder,
            tokenizer=tok,
            transformer=transformer,
        )
    pipe.save_pretrained(folder)
    return Path(folder)
