"""A tiny Qwen-Image-Edit-Plus pipeline: the tiny Qwen-Image transformer and VAE of ``tiny_pipelines``, and a
Qwen2.5-VL text encoder whose vision tower reads the condition images (its tokenizer gains Qwen2-VL's
vision tokens, a ``Qwen2VLProcessor`` feeds it). The pipeline's image areas are module constants
(1024^2 for the VAE, 384^2 for the encoder); tests shrink them with ``small_areas``.
The VAE and transformer are ``build_tiny_qwen_image``'s (the encoder is drawn first here, so the weights
differ)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
from diffusers import FlowMatchEulerDiscreteScheduler, QwenImageEditPlusPipeline
from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as edit_plus
from tiny_pipelines import QWEN_SCHEDULER, _qwen_vl, qwen_tokenizer, tiny_qwen_transformer, tiny_qwen_vae
from tokenizers import AddedToken
from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
VAE_SIDE, CONDITION_SIDE = 32, 56  # the tiny test's image areas: 32^2 (VAE) and 56^2 (two 28 px merges)


def build_tiny_qwen_image_edit_plus(folder: str | Path, seed: int = 0) -> Path:
    """``QwenImageEditPlusPipeline`` at toy size, without the scheduler's terminal stretch (as the
    ``qwen_image`` rollout-equality test): latents ``[4, 8, 8]`` at 32 px."""
    tok = qwen_tokenizer()
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        encoder = _qwen_vl(tok)
        config = encoder.config
        ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
        config.vision_start_token_id = ids["<|vision_start|>"]
        config.vision_end_token_id = ids["<|vision_end|>"]
        config.image_token_id = ids["<|image_pad|>"]
        config.video_token_id = ids["<|video_pad|>"]
        pipe = QwenImageEditPlusPipeline(
            scheduler=FlowMatchEulerDiscreteScheduler(**{**QWEN_SCHEDULER, "shift_terminal": None}),
            vae=tiny_qwen_vae(),
            text_encoder=encoder,
            tokenizer=tok,
            processor=Qwen2VLProcessor(
                image_processor=Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=56 * 56),
                tokenizer=tok,
                video_processor=Qwen2VLVideoProcessor(),
            ),
            transformer=tiny_qwen_transformer(),
        )
    pipe.save_pretrained(folder)
    return Path(folder)


@contextlib.contextmanager
def small_areas() -> Iterator[None]:
    """The pipeline's VAE and condition image areas at the tiny test's sizes while inside."""
    saved = edit_plus.VAE_IMAGE_SIZE, edit_plus.CONDITION_IMAGE_SIZE
    edit_plus.VAE_IMAGE_SIZE, edit_plus.CONDITION_IMAGE_SIZE = VAE_SIDE**2, CONDITION_SIDE**2
    try:
        yield
    finally:
        edit_plus.VAE_IMAGE_SIZE, edit_plus.CONDITION_IMAGE_SIZE = saved
