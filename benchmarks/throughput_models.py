"""The four real-size transformers of ``throughput.py``, built from their published configs with random
weights, behind the project's own adapters.

No download: each transformer is the diffusers class built from the numbers of the model's published
``transformer/config.json`` (cited beside each dict), with random weights. The text encoders and the
VAE are *not* built: a stand-in pipeline hands the adapter random prompt embeddings of the encoders'
output shapes, and a VAE stand-in that only carries the config the adapter reads (decoding is never
timed). Everything between noise and the transformer's output (packing, position ids, timestep scaling,
the samplers) is the shipped adapter's code.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


def _alias_adapters() -> None:
    """From a checkout that was never ``pip install``-ed, ``adapters/`` under its installed name."""
    if importlib.util.find_spec("vgrpo_adapters") is not None:
        return
    folder = ROOT / "adapters"
    spec = importlib.util.spec_from_file_location(
        "vgrpo_adapters", folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["vgrpo_adapters"] = module
    spec.loader.exec_module(module)


_alias_adapters()

# --- published configs -------------------------------------------------------------------------------
# huggingface.co/black-forest-labs/FLUX.1-dev/blob/main/transformer/config.json (11.9 B parameters)
FLUX_DEV = {
    "attention_head_dim": 128,
    "axes_dims_rope": [16, 56, 56],
    "guidance_embeds": True,
    "in_channels": 64,
    "joint_attention_dim": 4096,
    "num_attention_heads": 24,
    "num_layers": 19,
    "num_single_layers": 38,
    "patch_size": 1,
    "pooled_projection_dim": 768,
}
# huggingface.co/black-forest-labs/FLUX.1-dev/blob/main/scheduler/scheduler_config.json
FLUX_SCHEDULER = {
    "use_dynamic_shifting": True,
    "base_image_seq_len": 256,
    "max_image_seq_len": 4096,
    "base_shift": 0.5,
    "max_shift": 1.15,
    "shift": 3.0,
}
# huggingface.co/stabilityai/stable-diffusion-3.5-medium/blob/main/transformer/config.json (2.24 B)
SD35_MEDIUM = {
    "attention_head_dim": 64,
    "caption_projection_dim": 1536,
    "dual_attention_layers": list(range(13)),
    "in_channels": 16,
    "joint_attention_dim": 4096,
    "num_attention_heads": 24,
    "num_layers": 24,
    "out_channels": 16,
    "patch_size": 2,
    "pooled_projection_dim": 2048,
    "pos_embed_max_size": 384,
    "qk_norm": "rms_norm",
    "sample_size": 128,
}
SD35_SCHEDULER = {"shift": 3.0}  # stable-diffusion-3.5-medium/scheduler/scheduler_config.json
# huggingface.co/Qwen/Qwen-Image/blob/main/transformer/config.json (20.4 B)
QWEN_IMAGE = {
    "attention_head_dim": 128,
    "axes_dims_rope": [16, 56, 56],
    "guidance_embeds": False,
    "in_channels": 64,
    "joint_attention_dim": 3584,
    "num_attention_heads": 24,
    "num_layers": 60,
    "out_channels": 16,
    "patch_size": 2,
}
# huggingface.co/Qwen/Qwen-Image/blob/main/scheduler/scheduler_config.json
QWEN_SCHEDULER = {
    "use_dynamic_shifting": True,
    "base_image_seq_len": 256,
    "max_image_seq_len": 8192,
    "base_shift": 0.5,
    "max_shift": 0.9,
    "shift_terminal": 0.02,
}
# huggingface.co/Wan-AI/Wan2.1-T2V-1.3B-Diffusers/blob/main/transformer/config.json (1.42 B)
WAN_1_3B = {
    "added_kv_proj_dim": None,
    "attention_head_dim": 128,
    "cross_attn_norm": True,
    "eps": 1e-06,
    "ffn_dim": 8960,
    "freq_dim": 256,
    "image_dim": None,
    "in_channels": 16,
    "num_attention_heads": 12,
    "num_layers": 30,
    "out_channels": 16,
    "patch_size": [1, 2, 2],
    "qk_norm": "rms_norm_across_heads",
    "rope_max_seq_len": 1024,
    "text_dim": 4096,
}
WAN_SCHEDULER = {"use_flow_sigmas": True, "flow_shift": 3.0}  # Wan2.1-T2V-1.3B-Diffusers scheduler (UniPC)

# --- tiny configs: the same classes at toy size (CPU smoke runs) --------------------------------------
TINY = {
    "flux": {
        **FLUX_DEV,
        "attention_head_dim": 16,
        "axes_dims_rope": [4, 6, 6],
        "in_channels": 16,
        "joint_attention_dim": 32,
        "num_attention_heads": 2,
        "num_layers": 1,
        "num_single_layers": 1,
        "pooled_projection_dim": 32,
    },
    "sd3": {
        **SD35_MEDIUM,
        "attention_head_dim": 8,
        "caption_projection_dim": 32,
        "dual_attention_layers": [0],
        "in_channels": 4,
        "joint_attention_dim": 32,
        "num_attention_heads": 4,
        "num_layers": 2,
        "out_channels": 4,
        "pooled_projection_dim": 64,
        "pos_embed_max_size": 32,
        "sample_size": 32,
    },
    "qwen_image": {
        **QWEN_IMAGE,
        "attention_head_dim": 16,
        "axes_dims_rope": [4, 6, 6],
        "in_channels": 16,
        "joint_attention_dim": 32,
        "num_attention_heads": 2,
        "num_layers": 2,
        "out_channels": 4,
    },
    "wan": {
        **WAN_1_3B,
        "attention_head_dim": 12,
        "ffn_dim": 32,
        "freq_dim": 32,
        "in_channels": 4,
        "num_attention_heads": 2,
        "num_layers": 2,
        "out_channels": 4,
        "rope_max_seq_len": 32,
        "text_dim": 32,
    },
}


@dataclass(frozen=True)
class ModelSpec:
    """One benchmarked model: its transformer, shapes at real and tiny size, and how to wrap it."""

    key: str
    title: str
    transformer_class: str  # diffusers class name
    config: dict[str, Any]
    scheduler: dict[str, Any]
    size: dict[str, int]  # real size: resolution (or height/width/frames), text tokens
    tiny_size: dict[str, int]
    text: str  # what the random text embeddings stand in for, said in the output
    extra: dict[str, Any] = field(default_factory=dict)


SPECS: dict[str, ModelSpec] = {
    "flux": ModelSpec(
        "flux",
        "FLUX.1-dev",
        "FluxTransformer2DModel",
        FLUX_DEV,
        FLUX_SCHEDULER,
        {"resolution": 512, "text_tokens": 512},
        {"resolution": 64, "text_tokens": 8},
        "T5-XXL states [B, 512, 4096] + CLIP-L pooled [B, 768]",
    ),
    "sd3": ModelSpec(
        "sd3",
        "SD 3.5 Medium",
        "SD3Transformer2DModel",
        SD35_MEDIUM,
        SD35_SCHEDULER,
        {"resolution": 512, "text_tokens": 77 + 256},
        {"resolution": 64, "text_tokens": 8},
        "CLIP-L|G + T5-XXL states [B, 333, 4096] + pooled [B, 2048]",
    ),
    "qwen_image": ModelSpec(
        "qwen_image",
        "Qwen-Image",
        "QwenImageTransformer2DModel",
        QWEN_IMAGE,
        QWEN_SCHEDULER,
        {"resolution": 512, "text_tokens": 128},
        {"resolution": 64, "text_tokens": 8},
        "Qwen2.5-VL states [B, 128, 3584] (a long prompt's length after the template)",
    ),
    "wan": ModelSpec(
        "wan",
        "Wan 2.1 T2V 1.3B",
        "WanTransformer3DModel",
        WAN_1_3B,
        WAN_SCHEDULER,
        {"height": 480, "width": 832, "frames": 33, "text_tokens": 512},
        {"height": 32, "width": 32, "frames": 5, "text_tokens": 8},
        "UMT5-XXL states [B, 512, 4096]",
    ),
}


# --- stand-ins for the parts that are not built ---------------------------------------------------------
class StubModule(torch.nn.Module):
    """A frozen component that is never run: it only carries the ``config`` the adapter reads."""

    def __init__(self, **config: Any) -> None:
        super().__init__()
        self.config = SimpleNamespace(**config)


def _randn(*shape: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, device=device, dtype=dtype)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Build weights directly in ``dtype`` (a 20 B model never exists in fp32)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_transformer(spec: ModelSpec, *, tiny: bool, device: torch.device | str, dtype: torch.dtype) -> Any:
    """The diffusers transformer from its config, random weights, built on ``device`` in ``dtype``."""
    import diffusers

    cls = getattr(diffusers, spec.transformer_class)
    config = TINY[spec.key] if tiny else spec.config
    with torch.device(device), default_dtype(dtype):
        model = cls.from_config(config)
    return model.to(dtype)


def _encoder(spec: ModelSpec, config: dict[str, Any], text_tokens: int) -> Callable[..., Any]:
    """``pipe.encode_prompt`` returning random embeddings of the text encoders' output shapes."""
    width = config.get("joint_attention_dim", config.get("text_dim"))

    def encode_prompt(prompt: Any = None, *args: Any, device: Any = None, **kwargs: Any) -> Any:
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        b, dtype = len(prompts), torch.get_default_dtype()
        embeds = _randn(b, text_tokens, width, device=device, dtype=dtype)
        if spec.key == "flux":
            pooled = _randn(b, config["pooled_projection_dim"], device=device, dtype=dtype)
            return embeds, pooled, torch.zeros(text_tokens, 3, device=device)
        if spec.key == "sd3":
            pooled = _randn(b, config["pooled_projection_dim"], device=device, dtype=dtype)
            return embeds, None, pooled, None
        if spec.key == "qwen_image":
            return embeds, None  # no padding: every token is a prompt token
        return embeds, None  # wan

    return encode_prompt


def build_adapter(
    spec: ModelSpec,
    *,
    tiny: bool,
    device: torch.device | str,
    dtype: torch.dtype,
    size: dict[str, int] | None = None,
) -> Any:
    """The shipped adapter of ``spec``'s family around a random-weight transformer and stand-ins."""
    size = {**(spec.tiny_size if tiny else spec.size), **(size or {})}
    config = TINY[spec.key] if tiny else spec.config
    transformer = build_transformer(spec, tiny=tiny, device=device, dtype=dtype)
    text = StubModule()
    pipe = SimpleNamespace(
        transformer=transformer,
        scheduler=SimpleNamespace(config=spec.scheduler),
        encode_prompt=_encoder(spec, config, size["text_tokens"]),
        text_encoder=text,
        config={"expand_timesteps": False},
        transformer_2=None,
        name_or_path=f"random {spec.title} ({'tiny' if tiny else 'published'} config)",
    )
    common = dict(device=device, cache_text_embeddings=False, max_sequence_length=size["text_tokens"])
    if spec.key == "wan":
        from vgrpo_adapters.wan.impl import WanAdapter

        c = config["in_channels"]
        pipe.vae = StubModule(
            scale_factor_spatial=8,
            scale_factor_temporal=4,
            z_dim=c,
            latents_mean=[0.0] * c,
            latents_std=[1.0] * c,
        )
        return WanAdapter(
            pipe, height=size["height"], width=size["width"], num_frames=size["frames"], **common
        )
    if spec.key == "qwen_image":
        from vgrpo_adapters.qwen_image.impl import QwenImageAdapter

        c = config["out_channels"]
        pipe.vae = StubModule(z_dim=c, latents_mean=[0.0] * c, latents_std=[1.0] * c)
        return QwenImageAdapter(pipe, resolution=size["resolution"], **common)
    pipe.text_encoder = None  # the image adapters list their encoders by attribute
    latent = config["in_channels"] // 4 if spec.key == "flux" else config["in_channels"]
    pipe.vae = StubModule(
        block_out_channels=[1, 1, 1, 1], latent_channels=latent, scaling_factor=1.0, shift_factor=0.0
    )
    if spec.key == "flux":
        from vgrpo_adapters.flux.impl import FluxAdapter

        return FluxAdapter(pipe, resolution=size["resolution"], **common)
    from vgrpo_adapters.sd3.impl import SD3Adapter

    return SD3Adapter(pipe, resolution=size["resolution"], **common)
