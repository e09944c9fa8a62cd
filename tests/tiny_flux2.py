"""Tiny FLUX.2 [dev] and FLUX.2 [klein] pipelines built from configs, offline, in the diffusers folder layout.

Every component is the real library class at toy size: ``Flux2Transformer2DModel``, ``AutoencoderKLFlux2``
(2 blocks: 2x downsampling, 4 latent channels, patchified to 16 channels and normalised by its batch-norm
statistics, which are set to non-trivial values here), and the text encoders the pipelines expect:
Mistral-3 (``Mistral3ForConditionalGeneration`` behind a ``PixtralProcessor``) for [dev], Qwen3
(``Qwen3ForCausalLM``) for [klein]. The text models have just enough layers for the pipelines' default
hidden-state taps ((10, 20, 30) and (9, 18, 27)), each 16 wide, so prompt embeddings are 48 wide. The
tokenizer is ``tiny_pipelines.qwen_tokenizer`` (byte-level BPE) with a small chat template.

At 32 px the latents are ``[16, 8, 8]``: 64 image tokens of 16 channels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from diffusers import (
    AutoencoderKLFlux2,
    FlowMatchEulerDiscreteScheduler,
    Flux2KleinPipeline,
    Flux2Pipeline,
    Flux2Transformer2DModel,
)
from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE
from tiny_pipelines import RESOLUTION, SMALL_VAE, qwen_tokenizer
from tokenizers import AddedToken
from transformers import (
    Mistral3Config,
    Mistral3ForConditionalGeneration,
    PixtralImageProcessor,
    PixtralProcessor,
    Qwen3Config,
    Qwen3ForCausalLM,
)

TEXT_WIDTH = 16  # hidden size of the tiny text models; prompt embeddings stack 3 layers: 48
DEV_TOKENS = 48  # [dev] text tokens per prompt (the system message is one token, see build_tiny_flux2)
KLEIN_TOKENS = 48  # [klein] text tokens per prompt
LATENT = (16, RESOLUTION // 4, RESOLUTION // 4)  # VAE factor 2, then 2x2 patchified: [4 * 4, 8, 8]
# FLUX.2's scheduler config (use_dynamic_shifting; the pipelines pass their own empirical mu)
SCHEDULER = {"shift": 3.0, "use_dynamic_shifting": True, "time_shift_type": "exponential"}
MISTRAL_SPECIALS = [
    "[IMG]",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[INST]",
    "[/INST]",
]
MISTRAL_TEMPLATE = (
    "{% for m in messages %}{% for c in m['content'] %}"
    "{% if m['role'] == 'system' %}[SYSTEM_PROMPT]{{ c['text'] }}[/SYSTEM_PROMPT]"
    "{% else %}[INST]{{ c['text'] }}[/INST]{% endif %}{% endfor %}{% endfor %}"
)
QWEN3_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def _transformer(guidance_embeds: bool) -> Flux2Transformer2DModel:
    return Flux2Transformer2DModel(
        patch_size=1,
        in_channels=LATENT[0],
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=3 * TEXT_WIDTH,
        timestep_guidance_channels=32,
        axes_dims_rope=(4, 4, 4, 4),
        guidance_embeds=guidance_embeds,
    )


def _vae() -> AutoencoderKLFlux2:
    vae = AutoencoderKLFlux2(**SMALL_VAE, mid_block_add_attention=False)
    with torch.no_grad():  # the latents' normalisation must matter in the tests
        vae.bn.running_mean.copy_(torch.linspace(-0.3, 0.3, LATENT[0]))
        vae.bn.running_var.copy_(torch.linspace(0.5, 2.0, LATENT[0]))
    return vae


def _tokenizer(template: str, extra_tokens: list[str]):
    tok = qwen_tokenizer()
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in extra_tokens])
    tok.chat_template = template
    return tok


def _pipeline(
    pipeline_class: type, text_encoder: Any, tokenizer: Any, guidance_embeds: bool, **options: Any
) -> Any:
    """A FLUX.2 pipeline of ``pipeline_class``: the shared scheduler config, the tiny VAE and transformer
    (created in that order), and the variant's text encoder and tokenizer."""
    return pipeline_class(
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        vae=_vae(),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=_transformer(guidance_embeds=guidance_embeds),
        **options,
    )


def build_tiny_flux2(folder: str | Path, seed: int = 0) -> Path:
    """``Flux2Pipeline`` (FLUX.2 [dev]) at toy size: embedded guidance, Mistral-3 text encoder. The
    pipeline's system message is one token of the tiny vocabulary (byte-level it would take ~170 of the
    prompt's tokens), so short token budgets keep the user's prompt."""
    tok = _tokenizer(MISTRAL_TEMPLATE, [*MISTRAL_SPECIALS, SYSTEM_MESSAGE])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        text_config = {
            "model_type": "mistral",
            "vocab_size": len(tok),
            "hidden_size": TEXT_WIDTH,
            "intermediate_size": 24,
            "num_hidden_layers": 30,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 8,
            "pad_token_id": tok.pad_token_id,
        }
        vision_config = {
            "model_type": "pixtral",
            "hidden_size": 16,
            "intermediate_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "patch_size": 4,
            "image_size": 32,
        }
        config = Mistral3Config(
            text_config=text_config,
            vision_config=vision_config,
            image_token_index=tok.convert_tokens_to_ids("[IMG]"),
        )
        encoder = Mistral3ForConditionalGeneration(config).eval()
        processor = PixtralProcessor(
            image_processor=PixtralImageProcessor(patch_size=4), tokenizer=tok, patch_size=4
        )
        processor.chat_template = MISTRAL_TEMPLATE
        pipe = _pipeline(Flux2Pipeline, encoder, processor, guidance_embeds=True)
    pipe.save_pretrained(folder)
    return Path(folder)


def build_tiny_flux2_klein(folder: str | Path, seed: int = 0, is_distilled: bool = False) -> Path:
    """``Flux2KleinPipeline`` (FLUX.2 [klein]) at toy size: no guidance embedding, Qwen3 text encoder;
    ``is_distilled`` as in the step-distilled checkpoints (the pipeline then ignores CFG)."""
    tok = _tokenizer(QWEN3_TEMPLATE, ["<think>", "</think>"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        encoder = Qwen3ForCausalLM(
            Qwen3Config(
                vocab_size=len(tok),
                hidden_size=TEXT_WIDTH,
                intermediate_size=24,
                num_hidden_layers=27,
                num_attention_heads=2,
                num_key_value_heads=1,
                head_dim=8,
                pad_token_id=tok.pad_token_id,
            )
        ).eval()
        pipe = _pipeline(Flux2KleinPipeline, encoder, tok, guidance_embeds=False, is_distilled=is_distilled)
    pipe.save_pretrained(folder)
    return Path(folder)
