"""Tiny Wan image-to-video pipelines: the Wan 2.2 I2V layout (no image encoder; optionally two experts) and
the Wan 2.1 layout (a CLIP vision encoder whose states the transformer cross-attends to)."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline
from diffusers.models import WanTransformer3DModel
from tiny_pipelines import WAN22_BOUNDARY, _tiny_wan_transformer, _tiny_wan_vae, _umt5, t5_tokenizer
from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

Z_DIM = 4
CLIP_DIM = 16


def _transformer(image_dim: int | None) -> WanTransformer3DModel:
    """Input channels: the noisy latents, the 4 mask channels and the source's latents."""
    return _tiny_wan_transformer(in_channels=Z_DIM + 4 + Z_DIM, image_dim=image_dim)


def build_tiny_wan_i2v(
    folder: str | Path, seed: int = 0, *, clip: bool = False, two_experts: bool = False
) -> Path:
    """``WanImageToVideoPipeline`` at toy size: ``clip`` = the Wan 2.1 layout (CLIP vision encoder, the
    transformer's ``image_dim``), ``two_experts`` = Wan 2.2 A14B's (``transformer_2``, ``boundary_ratio``)."""
    tok = t5_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        extra: dict = {}
        if clip:
            vision = CLIPVisionConfig(
                hidden_size=CLIP_DIM, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                image_size=32, patch_size=8, projection_dim=CLIP_DIM,
            )  # fmt: skip
            extra["image_encoder"] = CLIPVisionModelWithProjection(vision)
            extra["image_processor"] = CLIPImageProcessor(crop_size=32, size={"shortest_edge": 32})
        if two_experts:
            extra |= {"transformer_2": _transformer(None), "boundary_ratio": WAN22_BOUNDARY}
        pipe = WanImageToVideoPipeline(
            tokenizer=tok,
            text_encoder=_umt5(len(tok)),
            vae=_tiny_wan_vae(),
            transformer=_transformer(CLIP_DIM if clip else None),
            scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
            **extra,
        )
    pipe.save_pretrained(folder)
    return Path(folder)
