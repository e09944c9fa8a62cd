"""Tiny FLUX, SD3, Wan, Qwen-Image and LongCat-AudioDiT pipelines built from configs, offline, saved in the
diffusers folder layout.

Every component is the real library class at toy size (the shapes of diffusers' own
``get_dummy_components`` tests), so the adapters load them through the same
``FluxPipeline.from_pretrained`` / ``StableDiffusion3Pipeline.from_pretrained`` path as a real checkpoint.
Tokenizers are built in memory: a byte-level ``CLIPTokenizer`` (the toy adapter's), a ``T5Tokenizer``
whose unigram vocabulary is the printable ASCII characters, and a byte-level BPE ``Qwen2Tokenizer``
(``qwen_tokenizer``), so any prompt tokenizes without a download.

Sizes: VAE with 2 blocks (8x fewer pixels per latent side -> 2x here), 4 latent channels; at 32 px the
latents are ``[4, 16, 16]``, which FLUX packs into 64 tokens of 16 channels.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch
from diffusers import (
    AutoencoderKL,
    AutoencoderKLQwenImage,
    AutoencoderKLWan,
    FlowMatchEulerDiscreteScheduler,
    FluxPipeline,
    FluxTransformer2DModel,
    LongCatAudioDiTPipeline,
    LongCatAudioDiTTransformer,
    LongCatAudioDiTVae,
    QwenImagePipeline,
    QwenImageTransformer2DModel,
    SD3Transformer2DModel,
    StableDiffusion3Pipeline,
    WanPipeline,
    WanTransformer3DModel,
)
from tokenizers import AddedToken, pre_tokenizers
from transformers import (
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2Tokenizer,
    T5Config,
    T5EncoderModel,
    T5Tokenizer,
    UMT5Config,
    UMT5EncoderModel,
)
from vgrpo_adapters.toy.build import byte_level_tokenizer

CLIP_TOKENS = 32  # CLIP's model_max_length in the tiny pipelines (77 in the real ones)
RESOLUTION = 32  # the image side the tests use; latents are RESOLUTION / 2 per side
WAN_SIDE, WAN_FRAMES, WAN_TOKENS = 32, 5, 16  # tiny Wan clips: latents [4, 2, 4, 4]
WAN22_BOUNDARY = 0.7  # tiny Wan 2.2: switch at timestep 700, inside the tests' short rollouts (A14B: 0.875)
AUDIO_RATE, AUDIO_HOP, AUDIO_LATENT_DIM, AUDIO_TOKENS = 8000, 64, 8, 12  # tiny LongCat-AudioDiT
QWEN_TOKENS = 64  # tiny Qwen-Image: text tokens kept per prompt (a prompt's characters + 5 template tokens)
# Qwen-Image's own scheduler config (huggingface.co/Qwen/Qwen-Image, scheduler/scheduler_config.json)
QWEN_SCHEDULER = {
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 8192,
    "max_shift": 0.9,
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "shift_terminal": 0.02,
    "time_shift_type": "exponential",
    "use_dynamic_shifting": True,
}
# The words of QwenImagePipeline's prompt template, each one BPE token as in the real Qwen2 vocabulary
# (a leading space is part of the word): the template's prefix is then 34 tokens, the number of tokens
# the pipeline drops (prompt_template_encode_start_idx), and what is kept is the prompt and the template's
# 5-token suffix, as with the real tokenizer.
QWEN_TEMPLATE_WORDS = (
    "system",
    "Describe",
    " the",
    " image",
    " by",
    " detailing",
    " color",
    " shape",
    " size",
    " texture",
    " quantity",
    " text",
    " spatial",
    " relationships",
    " of",
    " objects",
    " and",
    " background",
    "user",
    "assistant",
)


def t5_tokenizer() -> T5Tokenizer:
    """A unigram T5 tokenizer over printable ASCII (one piece per character, plus word-initial letters)."""
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    pieces += [(c, -3.0) for c in string.ascii_letters + string.digits + string.punctuation]
    pieces += [("\u2581" + c, -2.5) for c in string.ascii_lowercase]
    return T5Tokenizer(vocab=pieces, extra_ids=0)


def _clip_config(vocab_size: int, tokenizer) -> CLIPTextConfig:
    return CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=37,
        projection_dim=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=CLIP_TOKENS,
        hidden_act="gelu",
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _t5(vocab_size: int, d_model: int) -> T5EncoderModel:
    return T5EncoderModel(
        T5Config(
            vocab_size=vocab_size,
            d_model=d_model,
            d_kv=8,
            d_ff=37,
            num_layers=1,
            num_heads=4,
            relative_attention_num_buckets=8,
            decoder_start_token_id=0,
            pad_token_id=0,
            eos_token_id=1,
        )
    )


SMALL_VAE = dict(
    latent_channels=4,
    block_out_channels=(8, 8),
    layers_per_block=1,
    down_block_types=("DownEncoderBlock2D",) * 2,
    up_block_types=("UpDecoderBlock2D",) * 2,
    norm_num_groups=4,
    sample_size=RESOLUTION,
)
"""The toy image VAE's layout (two 8-channel blocks: factor 2, 4 latent channels), FLUX's and FLUX.2's."""


def _vae() -> AutoencoderKL:
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        **SMALL_VAE,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.0609,
        scaling_factor=1.5035,
    )


def build_tiny_flux(folder: str | Path, seed: int = 0) -> Path:
    """``FluxPipeline`` at toy size, saved under ``folder``; its scheduler shifts dynamically (``mu``)."""
    clip_tok = byte_level_tokenizer(CLIP_TOKENS)
    t5_tok = t5_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pipe = FluxPipeline(
            scheduler=FlowMatchEulerDiscreteScheduler(
                shift=3.0,
                use_dynamic_shifting=True,
                base_shift=0.5,
                max_shift=1.15,
                base_image_seq_len=16,
                max_image_seq_len=256,  # tiny sequences get a real shift > 1
            ),
            vae=_vae(),
            text_encoder=CLIPTextModel(_clip_config(len(clip_tok), clip_tok)),
            tokenizer=clip_tok,
            text_encoder_2=_t5(len(t5_tok), 32),
            tokenizer_2=t5_tok,
            transformer=FluxTransformer2DModel(
                patch_size=1,
                in_channels=16,
                num_layers=1,
                num_single_layers=1,
                attention_head_dim=16,
                num_attention_heads=2,
                joint_attention_dim=32,
                pooled_projection_dim=32,
                guidance_embeds=True,
                axes_dims_rope=(4, 4, 8),
            ),
        )
    pipe.save_pretrained(folder)
    return Path(folder)


def build_tiny_sd3(folder: str | Path, seed: int = 0) -> Path:
    """``StableDiffusion3Pipeline`` at toy size (SD3.5-M style: QK RMS-norm, one dual-attention block)."""
    clip_tok = byte_level_tokenizer(CLIP_TOKENS)
    t5_tok = t5_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pipe = StableDiffusion3Pipeline(
            scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
            vae=_vae(),
            text_encoder=CLIPTextModelWithProjection(_clip_config(len(clip_tok), clip_tok)),
            tokenizer=clip_tok,
            text_encoder_2=CLIPTextModelWithProjection(_clip_config(len(clip_tok), clip_tok)),
            tokenizer_2=clip_tok,
            text_encoder_3=_t5(len(t5_tok), 64),  # CLIP-L + CLIP-G states (32 + 32) are padded to T5's width
            tokenizer_3=t5_tok,
            transformer=SD3Transformer2DModel(
                sample_size=RESOLUTION // 2,
                patch_size=2,
                in_channels=4,
                out_channels=4,
                num_layers=2,
                attention_head_dim=8,
                num_attention_heads=4,
                joint_attention_dim=64,
                caption_projection_dim=32,
                pooled_projection_dim=64,
                pos_embed_max_size=16,
                dual_attention_layers=(0,),
                qk_norm="rms_norm",
            ),
        )
    pipe.save_pretrained(folder)
    return Path(folder)


def _umt5(vocab_size: int) -> UMT5EncoderModel:
    return UMT5EncoderModel(
        UMT5Config(
            vocab_size=vocab_size,
            d_model=32,
            d_kv=8,
            d_ff=37,
            num_layers=1,
            num_heads=4,
            relative_attention_num_buckets=8,
            pad_token_id=0,
            eos_token_id=1,
        )
    )


def _make_wan_decoder_responsive(vae: AutoencoderKLWan, gain: float = 5.0) -> None:
    """Turn the random decoder into a smooth, monotone map so that clip brightness follows the latents.

    A random tiny decoder squeezes every upsampling stage to one channel, ends on a per-pixel RMS norm,
    and its biases dominate: the decoded brightness then varies by ~1e-4 between latents. Here the
    residual branches are zeroed (each block is its skip path), biases dropped and the remaining
    weights made non-negative, so the pre-norm feature is a positive-weighted local sum of the latents;
    the RMS norm keeps its sign and ``conv_out`` (all weights ``gain / 81``) maps it to near black or
    white. Clip brightness then spans [0, 1] across noise draws and rises with the latent mean.
    """
    with torch.no_grad():
        for name, module in [*vae.decoder.named_modules(), ("post_quant_conv", vae.post_quant_conv)]:
            weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
            if isinstance(weight, torch.nn.Parameter):
                zero = name.endswith(("conv2", ".proj"))  # last layer of a residual / attention branch
                weight.zero_() if zero else weight.abs_()
            if isinstance(bias, torch.nn.Parameter) and not name.endswith("norm_out"):
                bias.zero_()
        vae.decoder.conv_out.weight.fill_(gain / vae.decoder.conv_out.weight[0].numel())


def _tiny_wan_transformer(in_channels: int = 4, image_dim: int | None = None) -> WanTransformer3DModel:
    """The tiny Wan DiT: ``in_channels`` beyond the latents' 4 for image-to-video's condition, ``image_dim``
    for Wan 2.1 I2V's CLIP states."""
    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=in_channels,
        out_channels=4,
        text_dim=32,
        freq_dim=32,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
        image_dim=image_dim,
    )


def _tiny_wan_vae() -> AutoencoderKLWan:
    """Wan's causal video VAE at toy size: 4 latent channels, 8x spatial and 4x temporal compression."""
    return AutoencoderKLWan(
        base_dim=3,
        z_dim=4,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.1, -0.2, 0.0, 0.3],
        latents_std=[1.5, 0.8, 1.0, 2.0],
    )


def build_tiny_wan22(folder: str | Path, seed: int = 0, boundary_ratio: float = WAN22_BOUNDARY) -> Path:
    """A two-expert (Wan 2.2 T2V layout) tiny ``WanPipeline``: ``transformer_2`` and ``boundary_ratio``."""
    return build_tiny_wan(folder, seed, boundary_ratio=boundary_ratio)


def build_tiny_wan(
    folder: str | Path, seed: int = 0, responsive_vae: bool = False, boundary_ratio: float | None = None
) -> Path:
    """``WanPipeline`` at toy size (diffusers' own dummy-component shapes), UMT5 text encoder.

    ``responsive_vae``: a decoder whose clip brightness follows the latents (see
    ``_make_wan_decoder_responsive``), for tests that a signal-level reward moves under training.
    ``boundary_ratio``: add a second expert (``transformer_2``, other random weights), Wan 2.2's layout.
    """
    tok = t5_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        encoder = _umt5(len(tok))
        vae = _tiny_wan_vae()
        if responsive_vae:
            _make_wan_decoder_responsive(vae)
        transformer = _tiny_wan_transformer()
        experts = {}
        if boundary_ratio is not None:  # drawn after the first expert: the Wan 2.1 build is unchanged
            experts = {"transformer_2": _tiny_wan_transformer(), "boundary_ratio": boundary_ratio}
        pipe = WanPipeline(
            tokenizer=tok,
            text_encoder=encoder,
            vae=vae,
            transformer=transformer,
            scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
            **experts,
        )
    pipe.save_pretrained(folder)
    return Path(folder)


def qwen_tokenizer() -> Qwen2Tokenizer:
    """A byte-level BPE ``Qwen2Tokenizer`` built in memory: Qwen2's pre-tokenizer and special tokens
    (``<|endoftext|>`` pads, ``<|im_start|>`` / ``<|im_end|>`` frame the chat template), the 256 byte
    symbols, and merge chains that make each of ``QWEN_TEMPLATE_WORDS`` one token. Any other text falls
    back to (mostly) one token per character. Longer words take the lower merge ranks, so that a short
    word's chain never pre-empts a longer one's."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = {token: i for i, token in enumerate(specials)}
    for symbol in sorted(pre_tokenizers.ByteLevel.alphabet()):  # the byte-level symbols GPT-2 / Qwen use
        vocab[symbol] = len(vocab)
    merges: list[tuple[str, str]] = []
    for word in sorted(QWEN_TEMPLATE_WORDS, key=lambda w: (-len(w), w)):
        symbols = list(word.replace(" ", "\u0120"))  # byte-level: the space byte is "\u0120" (G-dot)
        merged = symbols[0]
        for symbol in symbols[1:]:
            if (merged, symbol) not in merges:
                merges.append((merged, symbol))
            merged += symbol
            vocab.setdefault(merged, len(vocab))
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=merges, model_max_length=2048)
    tokenizer.add_tokens([AddedToken(token, special=True, normalized=False) for token in specials[1:]])
    return tokenizer


def _qwen_vl(tokenizer: Qwen2Tokenizer, hidden: int = 32) -> Qwen2_5_VLForConditionalGeneration:
    """Qwen2.5-VL at toy size (diffusers' own dummy shapes, with ``hidden`` text channels); its vision
    tower is built but never used by the text-to-image pipeline."""
    ids = {
        "bos_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": hidden,
            "intermediate_size": 37,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "rope_scaling": {"mrope_section": [2, 2, 4], "rope_type": "default", "type": "default"},
            "rope_theta": 1000000.0,
            **ids,
        },
        vision_config={
            "depth": 1,
            "hidden_size": 16,
            "intermediate_size": 16,
            "num_heads": 2,
            "out_hidden_size": hidden,
        },
        vocab_size=len(tokenizer),
        **ids,
    )
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def build_tiny_qwen_image(folder: str | Path, seed: int = 0, shift_terminal: float | None = 0.02) -> Path:
    """``QwenImagePipeline`` at toy size: ``QwenImageTransformer2DModel`` (2 blocks), the video VAE
    ``AutoencoderKLQwenImage`` with 4 latent channels and 4x spatial downsampling (at 32 px: latents
    ``[4, 8, 8]``, 16 packed tokens), a tiny Qwen2.5-VL text encoder, ``qwen_tokenizer``, and Qwen-Image's
    own scheduler config (``shift_terminal`` replaceable: ``None`` gives a grid without the terminal
    stretch)."""
    tok = qwen_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pipe = QwenImagePipeline(
            scheduler=FlowMatchEulerDiscreteScheduler(**{**QWEN_SCHEDULER, "shift_terminal": shift_terminal}),
            vae=tiny_qwen_vae(),
            text_encoder=_qwen_vl(tok),
            tokenizer=tok,
            transformer=tiny_qwen_transformer(),
        )
    pipe.save_pretrained(folder)
    return Path(folder)


def tiny_qwen_vae() -> AutoencoderKLQwenImage:
    """Qwen-Image's video VAE at toy size: 4 latent channels, 4x spatial downsampling."""
    return AutoencoderKLQwenImage(
        base_dim=24,
        z_dim=4,
        dim_mult=[1, 2, 4],
        num_res_blocks=1,
        temperal_downsample=[False, True],
        latents_mean=[0.1, -0.2, 0.0, 0.3],
        latents_std=[1.5, 0.8, 1.0, 2.0],
    )


def tiny_qwen_transformer() -> QwenImageTransformer2DModel:
    """Qwen-Image's MMDiT at toy size (2 blocks, 2x2 patches of the 4 latent channels)."""
    return QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        guidance_embeds=False,
        axes_dims_rope=(8, 4, 4),
    )


def build_tiny_longcat(folder: str | Path, seed: int = 0) -> Path:
    """LongCat-AudioDiT at toy size; the VAE's ``downsampling_ratio`` equals its real hop (8 x 8)."""
    tok = t5_tokenizer()
    tok.model_max_length = AUDIO_TOKENS
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        encoder = _umt5(len(tok))
        vae = LongCatAudioDiTVae(
            channels=4,
            c_mults=[1, 2],
            strides=[8, 8],
            latent_dim=AUDIO_LATENT_DIM,
            encoder_latent_dim=16,
            downsampling_ratio=AUDIO_HOP,
            sample_rate=AUDIO_RATE,
        )
        transformer = LongCatAudioDiTTransformer(
            dit_dim=32, dit_depth=2, dit_heads=2, dit_text_dim=32, latent_dim=AUDIO_LATENT_DIM, ff_mult=2.0
        )
        with torch.no_grad():  # the model zero-initialises its output layers: give the toy a real output
            for p in transformer.parameters():
                if p.abs().sum() == 0 and p.ndim > 1:
                    p.normal_(0, 0.05)
    LongCatAudioDiTPipeline(
        vae=vae, text_encoder=encoder, tokenizer=tok, transformer=transformer
    ).save_pretrained(folder)
    return Path(folder)
