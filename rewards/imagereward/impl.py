"""ImageReward on transformers' BLIP classes, scoring as ``ImageReward.score_gard`` does: BLIP ViT
tokens -> BERT text encoder cross-attending to them -> [CLS] feature -> MLP head -> standardise.

The original checkpoint (``blip.visual_encoder.*`` timm-style ViT keys, ``blip.text_encoder.*`` BERT
keys, ``mlp.layers.*``) is renamed to ``BlipVisionModel`` / ``BlipTextModel`` names (the mapping of
transformers' ``convert_blip_original_pytorch_to_hf.py``) and loaded strictly, so a wrong or partial
file fails loudly instead of scoring with random layers.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from vgrpo_platform.errors import RewardError

from .._clip_bases import PromptedImageReward
from .._clip_common import (
    ImageTransform,
    load_or_explain,
    pick_device,
    pick_dtype,
    resolve_file,
    resolve_source,
)
from ..aesthetic.impl import MLPHead, load_state_dict_file

if TYPE_CHECKING:
    from transformers import BlipTextConfig, BlipVisionConfig

    from . import Config

REWARD_MEAN, REWARD_STD = 0.16717362830052426, 1.0333394966054072  # ImageReward.py's standardisation
FIX = (
    "download it with `huggingface-cli download THUDM/ImageReward ImageReward.pt med_config.json "
    "--local-dir DIR` and set the reward's options.model to DIR"
)
_VIT_RENAMES = [  # original BLIP ViT (timm layout) -> transformers BlipVisionModel
    (r"^cls_token$", "embeddings.class_embedding"),
    (r"^pos_embed$", "embeddings.position_embedding"),
    (r"^patch_embed\.proj\.", "embeddings.patch_embedding."),
    (r"^blocks\.(\d+)\.norm1\.", r"encoder.layers.\1.layer_norm1."),
    (r"^blocks\.(\d+)\.norm2\.", r"encoder.layers.\1.layer_norm2."),
    (r"^blocks\.(\d+)\.attn\.qkv\.", r"encoder.layers.\1.self_attn.qkv."),
    (r"^blocks\.(\d+)\.attn\.proj\.", r"encoder.layers.\1.self_attn.projection."),
    (r"^blocks\.(\d+)\.mlp\.", r"encoder.layers.\1.mlp."),
    (r"^norm\.", "post_layernorm."),
]


def convert_state_dict(original: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``ImageReward.pt`` keys -> ``ImageRewardModel`` keys; BLIP's contrastive projections are dropped."""
    out = {}
    for key, value in original.items():
        if key.startswith("blip.visual_encoder."):
            name = key.removeprefix("blip.visual_encoder.")
            for pattern, repl in _VIT_RENAMES:
                name = re.sub(pattern, repl, name)
            out[f"vision_model.{name}"] = value
        elif key.startswith("blip.text_encoder.") and not key.endswith("position_ids"):
            out[key.removeprefix("blip.")] = value
        elif key.startswith("mlp."):
            out[key] = value
    return out


def configs_from(state: Mapping[str, torch.Tensor], med_config: Mapping[str, Any]) -> tuple[Any, Any]:
    """Vision config read off the checkpoint's shapes (BLIP ViTs use 64-d heads), text config from
    ``med_config.json`` (a BERT config) with BLIP's cross-attention width."""
    from transformers import BlipTextConfig, BlipVisionConfig

    pos = state["vision_model.embeddings.position_embedding"]  # [1, 1 + (S/p)^2, D]
    patch = int(state["vision_model.embeddings.patch_embedding.weight"].shape[-1])
    width = int(pos.shape[-1])
    depth = len({k.split(".")[3] for k in state if k.startswith("vision_model.encoder.layers.")})
    vision = BlipVisionConfig(
        hidden_size=width,
        intermediate_size=int(state["vision_model.encoder.layers.0.mlp.fc1.weight"].shape[0]),
        num_hidden_layers=depth,
        num_attention_heads=max(1, width // 64),
        image_size=patch * round((pos.shape[1] - 1) ** 0.5),
        patch_size=patch,
        hidden_act="gelu",
        layer_norm_eps=1e-6,
    )
    text = BlipTextConfig(
        vocab_size=int(state["text_encoder.embeddings.word_embeddings.weight"].shape[0]),
        hidden_size=med_config["hidden_size"],
        encoder_hidden_size=width,
        intermediate_size=med_config["intermediate_size"],
        num_hidden_layers=med_config["num_hidden_layers"],
        num_attention_heads=med_config["num_attention_heads"],
        max_position_embeddings=med_config["max_position_embeddings"],
        hidden_act=med_config.get("hidden_act", "gelu"),
        layer_norm_eps=med_config.get("layer_norm_eps", 1e-12),
        pad_token_id=med_config.get("pad_token_id", 0),
        is_decoder=True,  # builds the cross-attention layers; forward runs bidirectionally (is_decoder=False)
    )
    return vision, text


class ImageRewardModel(nn.Module):
    """BLIP image encoder + cross-attending text encoder + MLP head, in transformers' classes."""

    def __init__(self, vision_config: BlipVisionConfig, text_config: BlipTextConfig) -> None:
        super().__init__()
        from transformers import BlipTextModel, BlipVisionModel

        self.vision_model = BlipVisionModel(vision_config)
        self.text_encoder = BlipTextModel(text_config, add_pooling_layer=False)
        self.mlp = MLPHead(text_config.hidden_size)

    def forward(
        self, pixels: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        image_embeds = self.vision_model(pixel_values=pixels).last_hidden_state  # [B, 1 + P, Dv]
        image_atts = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=pixels.device)  # [B, 1 + P]
        text = self.text_encoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            encoder_hidden_states=image_embeds,
            encoder_attention_mask=image_atts,
        )
        cls = text.last_hidden_state[:, 0, :].float()  # [B, Dt]
        reward = self.mlp.float()(cls).squeeze(-1)  # [B]
        return (reward - REWARD_MEAN) / REWARD_STD


def load_imagereward(source: str, context: Any) -> ImageRewardModel:
    """``ImageRewardModel`` from a hub repo, a folder, or the ``.pt`` file (``med_config.json`` beside it)."""
    path = resolve_source(source, context)
    weights = resolve_file(source, "ImageReward.pt", "ImageReward", FIX, context)
    med = (
        os.path.join(os.path.dirname(weights), "med_config.json")
        if os.path.isfile(path)
        else resolve_file(source, "med_config.json", "ImageReward config", FIX, context)
    )
    if not os.path.isfile(med):
        raise RewardError(f"ImageReward config not found at {med!r}; {FIX}")
    with open(med) as f:
        med_config = json.load(f)
    state = convert_state_dict(
        load_or_explain(lambda: load_state_dict_file(weights), "ImageReward", weights, FIX)
    )
    if "vision_model.embeddings.position_embedding" not in state:
        raise RewardError(
            f"{weights!r} is not an ImageReward checkpoint (no blip.visual_encoder keys); {FIX}"
        )
    model = ImageRewardModel(*configs_from(state, med_config))
    model.load_state_dict(state, strict=True)
    return model


class ImageRewardReward(PromptedImageReward):
    reward_name = "imagereward"

    def __init__(self, config: Config, context: Any) -> None:
        from transformers import AutoTokenizer

        self.dtype, self.batch_size, self.max_length = (
            pick_dtype(config.dtype, context),
            config.batch_size,
            config.max_length,
        )
        model = load_imagereward(config.model, context)
        self.model = model.to(device=pick_device(context), dtype=self.dtype).eval().requires_grad_(False)
        tok_source = resolve_source(config.tokenizer, context)
        self.tokenizer = load_or_explain(
            lambda: AutoTokenizer.from_pretrained(tok_source),
            "ImageReward tokenizer",
            tok_source,
            "download it with `huggingface-cli download google-bert/bert-base-uncased --local-dir DIR` "
            "and set the reward's options.tokenizer to DIR",
        )
        size = int(model.vision_model.config.image_size)
        self.transform = ImageTransform(size, size)  # Resize(n, bicubic) + CenterCrop(n) + CLIP mean/std

    def score_batch(self, pixels: torch.Tensor, prompts: list[str], device: torch.device) -> torch.Tensor:
        tok = self.tokenizer(
            prompts, padding="max_length", truncation=True, max_length=self.max_length, return_tensors="pt"
        ).to(device)
        return self.model(pixels, tok["input_ids"], tok["attention_mask"])  # [b]
