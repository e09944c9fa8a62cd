"""A tiny LTX-2 pipeline (joint audio and video) built from configs, offline, in the diffusers folder layout.

Every component is the real library class at toy size (the shapes of diffusers' own ``LTX2Pipeline``
tests): ``LTX2VideoTransformer3DModel`` (two audio-video blocks), ``AutoencoderKLLTX2Video`` (2x spatial and
temporal compression, 4 latent channels), ``AutoencoderKLLTX2Audio`` (2 latent channels of 2 mel bins) with
``LTX2Vocoder``, the ``LTX2TextConnectors`` and a Gemma 3 text model (``Gemma3ForConditionalGeneration``
with a tiny SigLIP tower the text-to-video pipeline never uses) behind a character-level ``GemmaTokenizer``
built in memory. The VAEs' latent statistics are set to non-trivial values, so the (de)normalisation of
both latents matters in the tests.

At 32 x 32 px and 5 frames at 10 fps (0.5 s) the video latents are ``[4, 3, 16, 16]`` (768 tokens) and the
audio latents ``[2, 12, 2]`` (12 latent frames of 2 mel bins): 3120 numbers per sample in the adapter's flat
layout; the vocoder writes 160 samples per mel frame at 16 kHz.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch
from diffusers import (
    AutoencoderKLLTX2Audio,
    AutoencoderKLLTX2Video,
    FlowMatchEulerDiscreteScheduler,
    LTX2Pipeline,
    LTX2VideoTransformer3DModel,
)
from diffusers.pipelines.ltx2 import LTX2TextConnectors
from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
from transformers import Gemma3Config, Gemma3ForConditionalGeneration, GemmaTokenizer

LTX2_SIDE, LTX2_FRAMES, LTX2_FPS, LTX2_TOKENS = 32, 5, 10.0, 16  # 0.5 s clips
VIDEO_LATENT = (4, 3, 16, 16)
AUDIO_LATENT = (2, 12, 2)  # round(0.5 s x 16000 / 160 / 4) latent frames of 8 / 4 mel bins
FLAT_LATENT = (4 * 3 * 16 * 16 + 2 * 12 * 2,)
TEXT_WIDTH, TEXT_LAYERS = 16, 2
# the LTX family's dynamic shift with its terminal stretch (LTX-Video's scheduler_config.json)
SCHEDULER = {
    "use_dynamic_shifting": True,
    "base_image_seq_len": 1024,
    "max_image_seq_len": 4096,
    "base_shift": 0.95,
    "max_shift": 2.05,
    "shift_terminal": 0.1,
}


def gemma_tokenizer() -> GemmaTokenizer:
    """A character-level ``GemmaTokenizer``: Gemma's special tokens, the metaspace and printable ASCII."""
    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"])}
    for c in ["\u2581", *string.ascii_letters, *string.digits, *string.punctuation]:
        vocab.setdefault(c, len(vocab))
    return GemmaTokenizer(vocab=vocab, merges=[])


def _text_encoder(tok: GemmaTokenizer) -> Gemma3ForConditionalGeneration:
    config = Gemma3Config(
        text_config={
            "vocab_size": len(tok),
            "hidden_size": TEXT_WIDTH,
            "intermediate_size": 24,
            "num_hidden_layers": TEXT_LAYERS,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 8,
            "pad_token_id": tok.pad_token_id,
            "sliding_window": 8,
        },
        vision_config={
            "hidden_size": 16,
            "intermediate_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 16,
            "patch_size": 4,
        },
        mm_tokens_per_image=4,
    )
    return Gemma3ForConditionalGeneration(config).eval()


def build_tiny_ltx2(folder: str | Path, seed: int = 0) -> Path:
    """``LTX2Pipeline`` at toy size, saved to ``folder``; returns it."""
    tok = gemma_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        text_encoder = _text_encoder(tok)
        transformer = LTX2VideoTransformer3DModel(
            in_channels=VIDEO_LATENT[0],
            out_channels=VIDEO_LATENT[0],
            num_attention_heads=2,
            attention_head_dim=8,
            cross_attention_dim=16,
            audio_in_channels=AUDIO_LATENT[0] * AUDIO_LATENT[2],
            audio_out_channels=AUDIO_LATENT[0] * AUDIO_LATENT[2],
            audio_num_attention_heads=2,
            audio_attention_head_dim=4,
            audio_cross_attention_dim=8,
            num_layers=2,
            caption_channels=TEXT_WIDTH,
            rope_double_precision=False,
            rope_type="split",
        )
        connectors = LTX2TextConnectors(
            caption_channels=TEXT_WIDTH,
            text_proj_in_factor=TEXT_LAYERS + 1,
            video_connector_num_attention_heads=2,
            video_connector_attention_head_dim=8,
            video_connector_num_layers=1,
            video_connector_num_learnable_registers=None,
            audio_connector_num_attention_heads=2,
            audio_connector_attention_head_dim=8,
            audio_connector_num_layers=1,
            audio_connector_num_learnable_registers=None,
            connector_rope_base_seq_len=32,
            rope_double_precision=False,
            rope_type="split",
        )
        vae = AutoencoderKLLTX2Video(
            latent_channels=VIDEO_LATENT[0],
            block_out_channels=(8,),
            decoder_block_out_channels=(8,),
            layers_per_block=(1,),
            decoder_layers_per_block=(1, 1),
            spatio_temporal_scaling=(True,),
            decoder_spatio_temporal_scaling=(True,),
            decoder_inject_noise=(False, False),
            downsample_type=("spatial",),
            upsample_residual=(False,),
            upsample_factor=(1,),
            timestep_conditioning=False,
            patch_size=1,
            patch_size_t=1,
            encoder_causal=True,
            decoder_causal=False,
        )
        audio_vae = AutoencoderKLLTX2Audio(
            base_channels=AUDIO_LATENT[0] * AUDIO_LATENT[2],
            output_channels=2,
            ch_mult=(1,),
            num_res_blocks=1,
            attn_resolutions=None,
            in_channels=2,
            resolution=32,
            latent_channels=AUDIO_LATENT[0],
            mel_bins=8,
        )
        with torch.no_grad():  # latent statistics that make the normalisation matter
            vae.latents_mean.copy_(torch.linspace(-0.2, 0.3, VIDEO_LATENT[0]))
            vae.latents_std.copy_(torch.linspace(0.6, 1.5, VIDEO_LATENT[0]))
            audio_vae.latents_mean.copy_(torch.linspace(0.1, -0.3, audio_vae.latents_mean.numel()))
            audio_vae.latents_std.copy_(torch.linspace(0.8, 1.7, audio_vae.latents_std.numel()))
        vocoder = LTX2Vocoder(
            in_channels=audio_vae.config.output_channels * audio_vae.config.mel_bins,
            hidden_channels=32,
            out_channels=2,
            upsample_kernel_sizes=[16, 40],
            upsample_factors=[8, 20],  # one mel frame per 160 samples (mel_hop_length), as LTX-2's
            resnet_kernel_sizes=[3],
            resnet_dilations=[[1, 3, 5]],
            output_sampling_rate=16000,
        )
        pipe = LTX2Pipeline(
            scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
            vae=vae,
            audio_vae=audio_vae,
            text_encoder=text_encoder,
            tokenizer=tok,
            connectors=connectors,
            transformer=transformer,
            vocoder=vocoder,
        )
    pipe.save_pretrained(folder)
    return Path(folder)
