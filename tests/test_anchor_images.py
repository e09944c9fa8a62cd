"""A folder of captioned images as data for ``[train.data_anchor]``: ``adapter.encode_images`` against the
pipelines' own encoders, the folder's one-line errors, and ``vgrpo anchor-data`` end to end."""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import (
    Flux2Pipeline,
    FluxKontextPipeline,
    FluxPipeline,
    QwenImageEditPipeline,
    QwenImagePipeline,
    StableDiffusion3Pipeline,
)
from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3_img2img import retrieve_latents
from PIL import Image
from tiny_pipelines import RESOLUTION, build_tiny_flux, build_tiny_qwen_image, build_tiny_sd3
from typer.testing import CliRunner
from vgrpo_adapters.flux.impl import FluxAdapter
from vgrpo_adapters.qwen_image.impl import QwenImageAdapter
from vgrpo_adapters.sd3.impl import SD3Adapter

from vgrpo_platform.cli.anchor_images import encode_folder, read_image_folder
from vgrpo_platform.cli.app import app
from vgrpo_platform.errors import RecipeError
from vgrpo_platform.training.iteration.data_anchor import load_anchor_data

ROOT = Path(__file__).resolve().parents[1]


def _images(n: int, side: int = RESOLUTION, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.rand(3, side, side, generator=gen) for _ in range(n)]


def _pipe(pipeline_class: type, build, tmp_path: Path):
    return pipeline_class.from_pretrained(build(tmp_path / pipeline_class.__name__))


def _as_input(images: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(images) * 2 - 1  # [N, 3, H, W] in [-1, 1], what the pipelines' processors give


def test_sd3_and_flux_encode_as_the_pipelines_do(tmp_path) -> None:
    images = _images(3)
    sd3 = SD3Adapter(
        StableDiffusion3Pipeline.from_pretrained(build_tiny_sd3(tmp_path / "sd3")), resolution=32
    )
    vae = sd3.vae  # SD3's img2img encoding with the posterior's mode: (mode - shift) * scale
    mode = retrieve_latents(vae.encode(_as_input(images)), sample_mode="argmax")
    shift = vae.config.shift_factor or 0.0
    expected = (mode - shift) * vae.config.scaling_factor
    got = sd3.encode_images(images)
    assert got.shape == (3, *sd3.latent_shape())
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)

    flux = FluxAdapter(
        FluxPipeline.from_pretrained(build_tiny_flux(tmp_path / "flux")), resolution=RESOLUTION
    )
    kontext = types.SimpleNamespace(vae=flux.vae)  # FluxKontextPipeline's own encoder of a source image
    expected = FluxKontextPipeline._encode_vae_image(kontext, _as_input(images), generator=None)
    torch.testing.assert_close(flux.encode_images(images), expected, atol=1e-6, rtol=1e-6)


def test_qwen_image_encodes_as_its_edit_pipeline_does(tmp_path) -> None:
    images = _images(2)
    adapter = QwenImageAdapter(
        QwenImagePipeline.from_pretrained(build_tiny_qwen_image(tmp_path / "qwen")), resolution=RESOLUTION
    )
    edit = types.SimpleNamespace(vae=adapter.vae, latent_channels=adapter.vae.config.z_dim)
    expected = QwenImageEditPipeline._encode_vae_image(edit, _as_input(images)[:, :, None], generator=None)
    got = adapter.encode_images(images)
    assert got.shape == (2, *adapter.latent_shape())
    torch.testing.assert_close(got, expected[:, :, 0], atol=1e-5, rtol=1e-5)


def test_a_larger_image_is_resized_to_the_resolution(tmp_path) -> None:
    sd3 = SD3Adapter(
        StableDiffusion3Pipeline.from_pretrained(build_tiny_sd3(tmp_path / "sd3")), resolution=32
    )
    big = _images(1, side=48)
    assert sd3.encode_images(big).shape == (1, *sd3.latent_shape())


def _folder(root: Path, n: int = 3, side: int = 40) -> Path:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    lines = []
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(root / f"{i}.png")
        lines.append(json.dumps({"file_name": f"{i}.png", "text": f"caption {i}"}))
    (root / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    return root


@pytest.mark.parametrize(
    ("metadata", "fragment"),
    [
        (None, "has no metadata.jsonl"),
        ("not json\n", "line 1 is not JSON"),
        ('{"file_name": "0.png"}\n', 'needs "file_name" and "text"'),
        ('{"file_name": "missing.png", "text": "x"}\n', "is not a file inside"),
        ('{"file_name": "../outside.png", "text": "x"}\n', "is not a file inside"),
        ("\n", "lists no image"),
    ],
)
def test_a_broken_folder_is_one_line_naming_the_fix(tmp_path, metadata, fragment) -> None:
    folder = _folder(tmp_path / "data", n=1)
    (tmp_path / "outside.png").write_bytes((folder / "0.png").read_bytes())
    if metadata is None:
        (folder / "metadata.jsonl").unlink()
    else:
        (folder / "metadata.jsonl").write_text(metadata)
    with pytest.raises(RecipeError, match=fragment) as info:
        read_image_folder(folder)
    assert "\n" not in str(info.value)


def test_a_file_that_is_not_an_image_and_an_adapter_without_an_encoder_are_refused(tmp_path) -> None:
    folder = _folder(tmp_path / "data", n=2)
    (folder / "1.png").write_bytes(b"not a png")
    pixels = types.SimpleNamespace(
        encode_images=lambda ims: torch.stack(ims), latent_shape=lambda: (3, 40, 40)
    )
    with pytest.raises(RecipeError, match="1.png does not open as an image"):
        encode_folder(pixels, folder)
    with pytest.raises(RecipeError, match="no encode_images.*safetensors file"):
        encode_folder(types.SimpleNamespace(latent_shape=lambda: (3, 4, 4)), folder)


def test_anchor_data_command_writes_what_the_anchor_reads(tmp_path) -> None:
    """The shapes model is pixel space: its latents are the images resized to 32 and mapped to [-1, 1]."""
    folder = _folder(tmp_path / "data", n=3, side=32)
    out = tmp_path / "anchor.safetensors"
    recipe = ROOT / "recipes" / "quickstart.toml"
    result = CliRunner().invoke(app, ["anchor-data", str(recipe), "--images", str(folder), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote 3 encoded images (3, 32, 32)" in result.output
    latents, prompts = load_anchor_data(out)
    assert prompts == ["caption 0", "caption 1", "caption 2"]
    pixels = np.asarray(Image.open(folder / "1.png").convert("RGB"))
    expected = torch.from_numpy(pixels.copy()).permute(2, 0, 1).float() / 255 * 2 - 1
    torch.testing.assert_close(latents[1], expected)
    missing = CliRunner().invoke(
        app, ["anchor-data", str(recipe), "--images", str(tmp_path), "--out", str(out)]
    )
    assert missing.exit_code == 2 and "has no metadata.jsonl" in missing.output


def test_flux2_encodes_as_its_own_pipeline_encodes_a_reference_image(tmp_path) -> None:
    """FLUX.2's latents are patchified and batch-normalised: ``encode_images`` is the pipeline's own
    ``_encode_vae_image``, and decoding it gives back what decoding the pipeline's latents gives."""
    from tiny_flux2 import build_tiny_flux2
    from vgrpo_adapters.flux2.impl import Flux2Adapter

    images = _images(2)
    adapter = Flux2Adapter(
        Flux2Pipeline.from_pretrained(build_tiny_flux2(tmp_path / "flux2")), resolution=RESOLUTION
    )
    expected = Flux2Pipeline._encode_vae_image(adapter.pipe, _as_input(images), generator=None)
    got = adapter.encode_images(images)
    assert got.shape == (2, *adapter.latent_shape())
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_qwen_image_2_refuses_image_data_in_one_line() -> None:
    from vgrpo_adapters.qwen_image21.impl import QwenImage21Adapter

    bare = object.__new__(QwenImage21Adapter)  # the refusal comes before any weight is touched
    with pytest.raises(RecipeError, match="Qwen-Image 2.x has no image encoder.*safetensors file of latents"):
        bare._vae_encode(torch.zeros(1, 3, 8, 8))
