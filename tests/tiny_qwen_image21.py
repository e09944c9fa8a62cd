"""Tiny Qwen-Image 2.1 pipeline (``diffusers.QwenImage21Pipeline``) built from configs, offline, in the
diffusers folder layout.

Every component is the real library class at toy size: ``QwenImage21Transformer2DModel`` (2 single-stream
blocks, ``causal_condition`` on so the pipeline's KV cache is usable), ``AutoencoderKLQwenImage21`` with 4
latent channels and the pipeline's fixed 16x spatial downsampling (at 64 px: latents ``[4, 4, 4]``, 16
image tokens, 4 encoder slots of 2x2 tokens), a tiny ``Qwen3VLForConditionalGeneration`` behind a
``Qwen3VLProcessor`` whose tokenizer is ``tiny_pipelines.qwen_tokenizer`` plus Qwen3-VL's vision tokens and
the pipeline's system prompt as one token (so short prompts stay short).
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import (
    AutoencoderKLQwenImage21,
    FlowMatchEulerDiscreteScheduler,
    QwenImage21Pipeline,
    QwenImage21Transformer2DModel,
)
from tiny_pipelines import QWEN_SCHEDULER, qwen_tokenizer
from tokenizers import AddedToken
from transformers import (
    Qwen2VLImageProcessor,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
    Qwen3VLVideoProcessor,
)

RESOLUTION21 = 64  # the pipeline's VAE factor is fixed at 16 and slots hold 2x2 tokens: multiples of 32
TOKENS21 = 48  # text tokens kept per prompt
SYSTEM_PROMPT = "Comprehend and analyze the provided prompt."  # QwenImage21Pipeline.sys_prompt
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
    "{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEXT_WIDTH = 32


def _processor() -> Qwen3VLProcessor:
    tok = qwen_tokenizer()
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in [*VISION_TOKENS, SYSTEM_PROMPT]])
    tok.chat_template = CHAT_TEMPLATE
    return Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(),
        tokenizer=tok,
        video_processor=Qwen3VLVideoProcessor(),
        chat_template=CHAT_TEMPLATE,
    )


def _text_encoder(processor: Qwen3VLProcessor) -> Qwen3VLForConditionalGeneration:
    tok = processor.tokenizer
    config = Qwen3VLConfig(
        text_config={
            "vocab_size": len(tok),
            "hidden_size": TEXT_WIDTH,
            "intermediate_size": 37,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "rope_scaling": {"mrope_section": [2, 3, 3], "rope_type": "default", "mrope_interleaved": True},
            "pad_token_id": tok.pad_token_id,
        },
        vision_config={
            "depth": 1,
            "hidden_size": 16,
            "intermediate_size": 16,
            "num_heads": 2,
            "out_hidden_size": TEXT_WIDTH,
            "deepstack_visual_indexes": [],
        },
        image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"),
        vision_end_token_id=tok.convert_tokens_to_ids("<|vision_end|>"),
    )
    return Qwen3VLForConditionalGeneration(config).eval()


def build_tiny_qwen_image21(folder: str | Path, seed: int = 0) -> Path:
    """``QwenImage21Pipeline`` at toy size with Qwen-Image's scheduler config less its terminal stretch
    (``shift_terminal = None``) and no ``sample_sigmas``, saved with ``save_pretrained`` to ``folder``."""
    processor = _processor()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pipe = QwenImage21Pipeline(
            scheduler=FlowMatchEulerDiscreteScheduler(**{**QWEN_SCHEDULER, "shift_terminal": None}),
            vae=AutoencoderKLQwenImage21(
                base_dim=8,
                decoder_base_dim=8,
                z_dim=4,
                dim_mult=[1, 1, 1, 1, 1],
                num_res_blocks=1,
                temperal_downsample=[False, False, False, False],
                latents_mean=[0.1, -0.2, 0.0, 0.3],
                latents_std=[1.5, 0.8, 1.0, 2.0],
            ),
            text_encoder=_text_encoder(processor),
            processor=processor,
            transformer=QwenImage21Transformer2DModel(
                in_channels=4,
                out_channels=4,
                num_layers=2,
                attention_head_dim=16,
                num_attention_heads=2,
                context_in_dim=TEXT_WIDTH,
                mlp_ratio=2,
                axes_dims_rope=(4, 6, 6),
            ),
        )
    pipe.save_pretrained(folder)
    return Path(folder)


def conformance_options(folder: Path) -> dict[str, object]:
    """The conformance kit's options of ``qwen_image21``: tiny weights written to ``folder``."""
    build_tiny_qwen_image21(folder)
    return {"model": str(folder), "resolution": RESOLUTION21, "max_sequence_length": TOKENS21}
