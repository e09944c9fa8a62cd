"""A tiny ``HunyuanVideo15Pipeline`` built from configs, offline, saved in the diffusers folder layout.

Every component is the real class at toy size: ``HunyuanVideo15Transformer3DModel`` (2 blocks),
``AutoencoderKLHunyuanVideo15`` (4x spatial, 2x temporal compression, 4 latent channels), a
``Qwen2_5_VLTextModel`` text encoder with the byte-level ``Qwen2Tokenizer`` of ``tiny_pipelines`` (given
a ChatML chat template, which the pipeline applies), a ``T5EncoderModel`` glyph encoder with the real,
file-free ``ByT5Tokenizer``, and a ``ClassifierFreeGuidance`` guider. Kept in its own module so the shared
``tiny_pipelines`` stays as it is.
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import (
    AutoencoderKLHunyuanVideo15,
    ClassifierFreeGuidance,
    FlowMatchEulerDiscreteScheduler,
    HunyuanVideo15Pipeline,
    HunyuanVideo15Transformer3DModel,
)
from tiny_pipelines import qwen_tokenizer
from transformers import ByT5Tokenizer, Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel, T5Config, T5EncoderModel

HY_SIDE, HY_FRAMES = 16, 5  # tiny clips: latents [4, 3, 4, 4]
HY_LATENT = (4, 3, 4, 4)
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _qwen_text(tokenizer, hidden: int = 32) -> Qwen2_5_VLTextModel:
    config = Qwen2_5_VLTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        rope_scaling={"mrope_section": [2, 2, 4], "rope_type": "default", "type": "default"},
        rope_theta=1000000.0,
        pad_token_id=tokenizer.pad_token_id,
    )
    return Qwen2_5_VLTextModel(config).eval()


def _byt5(tokenizer: ByT5Tokenizer, d_model: int = 16) -> T5EncoderModel:
    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=d_model,
        d_kv=8,
        d_ff=24,
        num_layers=1,
        num_heads=2,
        relative_attention_num_buckets=8,
        pad_token_id=0,
        eos_token_id=1,
    )
    return T5EncoderModel(config).eval()


def tiny_hunyuan_video15_transformer() -> HunyuanVideo15Transformer3DModel:
    """The toy-size ``HunyuanVideo15Transformer3DModel`` of ``build_tiny_hunyuan_video15`` (2 heads)."""
    return HunyuanVideo15Transformer3DModel(
        in_channels=9,  # latents (4) + conditioning latents (4) + mask (1)
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=8,
        num_layers=2,
        num_refiner_layers=1,
        mlp_ratio=2.0,
        text_embed_dim=32,
        text_embed_2_dim=16,
        image_embed_dim=12,
        rope_axes_dim=(2, 2, 4),
        target_size=16,
        task_type="t2v",
    )


def build_tiny_hunyuan_video15(folder: str | Path, seed: int = 0, guidance_scale: float = 6.0) -> Path:
    """``HunyuanVideo15Pipeline`` at toy size with true CFG at ``guidance_scale`` (1 = the guider off)."""
    tok = qwen_tokenizer()
    tok.chat_template = CHATML
    tok_2 = ByT5Tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pipe = HunyuanVideo15Pipeline(
            text_encoder=_qwen_text(tok),
            tokenizer=tok,
            text_encoder_2=_byt5(tok_2),
            tokenizer_2=tok_2,
            transformer=tiny_hunyuan_video15_transformer(),
            vae=AutoencoderKLHunyuanVideo15(
                latent_channels=4,
                block_out_channels=(8, 8, 8),
                layers_per_block=1,
                spatial_compression_ratio=4,
                temporal_compression_ratio=2,
            ),
            scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0),
            guider=ClassifierFreeGuidance(guidance_scale=guidance_scale),
        )
    pipe.save_pretrained(folder)
    return Path(folder)
