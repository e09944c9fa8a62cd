"""The model-based image rewards on tiny random models of their real classes, saved to disk and loaded
through the rewards' real loading code, checked against the reference computations (HF processor on
PIL images, the formula of each paper's code); JPEG and OCR on images with known content."""

from __future__ import annotations

import io
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from tiny_clip import (
    TINY_OPEN_CLIP,
    render_text,
    save_aesthetic_head,
    save_clip,
    save_imagereward,
    save_open_clip_hps,
)
from vgrpo_rewards import aesthetic, clipscore, hpsv2, imagereward, jpeg, ocr, pickscore

from vgrpo_platform.errors import RewardError
from vgrpo_platform.host.collect import collect_components
from vgrpo_platform.host.manager import build_plugin_manager
from vgrpo_platform.protocols import BuildContext, Reward, Samples

ENTRY_MODULES = (pickscore, clipscore, aesthetic, jpeg, hpsv2, imagereward, ocr)
NAMES = ("pickscore", "clipscore", "aesthetic", "jpeg", "hpsv2", "imagereward", "ocr")
PROMPTS = ["a red cat", "a dog", "cat", "a blue dog", "red"]


@pytest.fixture(scope="module")
def registry():
    return collect_components(
        build_plugin_manager(load_entry_points=False, extra_plugins=list(ENTRY_MODULES))
    )


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory) -> Path:
    return save_clip(tmp_path_factory.mktemp("clip"))


def build(registry, name: str, **options):
    reward = registry.build("reward", name, options, BuildContext())
    assert isinstance(reward, Reward) and reward.modalities == frozenset({"image"})
    return reward


def uint8_images(n: int, h: int, w: int, seed: int = 0) -> np.ndarray:
    """``[n, h, w, 3]`` uint8: smooth random colour fields (JPEG-like content, not white noise)."""
    g = torch.Generator().manual_seed(seed)
    low = torch.rand(n, 3, 4, 4, generator=g)
    x = F.interpolate(low, size=(h, w), mode="bilinear", align_corners=False)
    return (x * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()


def as_samples(arrays: np.ndarray) -> Samples:
    return Samples("image", torch.from_numpy(arrays).permute(0, 3, 1, 2).float() / 255)  # [B, 3, H, W]


def score(reward, arrays: np.ndarray, prompts: list[str]) -> torch.Tensor:
    out = reward.score(as_samples(arrays), prompts, [{}] * len(prompts))
    assert out.shape == (len(arrays),) and out.dtype == torch.float32 and torch.isfinite(out).all()
    return out


# ----------------------------------------------------------------------------------------------- plumbing


def test_entry_modules_import_no_torch() -> None:
    code = (
        "import sys\nimport vgrpo_rewards."
        + ", vgrpo_rewards.".join(m.__name__.split(".")[-1] for m in ENTRY_MODULES)
        + "\nheavy = {'torch', 'transformers', 'open_clip', 'pytesseract', 'rapidocr_onnxruntime',"
        " 'onnxruntime', 'cv2'} & set(sys.modules)\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_registered_with_documented_options(registry) -> None:
    for name, module in zip(NAMES, ENTRY_MODULES, strict=True):
        spec = registry.get("reward", name)
        assert spec.config is module.Config and spec.summary
        assert all(field.description for field in module.Config.model_fields.values()), name


def test_clip_preprocess_matches_hf_processor(clip_dir) -> None:
    """Torch-side resize/crop/normalise against CLIPImageProcessor on the same PIL images."""
    from transformers import AutoProcessor
    from vgrpo_rewards._clip_common import ImageTransform, clip_preprocess

    processor = AutoProcessor.from_pretrained(clip_dir).image_processor
    transform = ImageTransform.from_hf_processor(processor)
    assert (transform.size, transform.crop) == (32, 32)
    for h, w in ((32, 32), (48, 48), (40, 56), (71, 45)):
        arrays = uint8_images(2, h, w, seed=h)
        ours = clip_preprocess(as_samples(arrays).data, transform, torch.float32)
        ref = processor(images=[Image.fromarray(a) for a in arrays], return_tensors="pt")["pixel_values"]
        assert ours.shape == ref.shape == (2, 3, 32, 32)
        err = (ours - ref).abs()  # normalised units: 1/255 of a pixel is about 0.015
        assert err.mean() < 0.006 and err.max() < 0.03, (h, w, err.mean().item(), err.max().item())


# ----------------------------------------------------------------------------------------- CLIP-based ones


def reference_clip_cos(clip_dir: Path, arrays: np.ndarray, prompts: list[str]) -> tuple[torch.Tensor, float]:
    """PickScore's README computation: processor on PIL images, unit embeddings, their dot product."""
    from transformers import AutoProcessor, CLIPModel
    from vgrpo_rewards._clip_common import features

    processor, model = AutoProcessor.from_pretrained(clip_dir), CLIPModel.from_pretrained(clip_dir).eval()
    with torch.no_grad():
        pix = processor(images=[Image.fromarray(a) for a in arrays], return_tensors="pt")["pixel_values"]
        txt = processor(text=prompts, padding=True, truncation=True, max_length=77, return_tensors="pt")
        img_e = features(model.get_image_features(pixel_values=pix))
        txt_e = features(
            model.get_text_features(input_ids=txt["input_ids"], attention_mask=txt["attention_mask"])
        )
    img_e = img_e / img_e.norm(dim=-1, keepdim=True)
    txt_e = txt_e / txt_e.norm(dim=-1, keepdim=True)
    return (img_e * txt_e).sum(-1), float(model.logit_scale.detach().exp())


def test_pickscore_matches_reference_and_responds(registry, clip_dir) -> None:
    arrays = uint8_images(5, 40, 48, seed=1)
    reward = build(registry, "pickscore", model=str(clip_dir), processor=str(clip_dir), batch_size=2)
    got = score(reward, arrays, PROMPTS)
    cos, scale = reference_clip_cos(clip_dir, arrays, PROMPTS)
    torch.testing.assert_close(got, scale * cos, atol=0.005 * scale, rtol=0)
    # different prompts and different images change the score
    assert (score(reward, arrays, PROMPTS[::-1]) - got).abs().max() > 1e-3
    assert (score(reward, arrays[::-1].copy(), PROMPTS) - got).abs().max() > 1e-3
    divided = build(registry, "pickscore", model=str(clip_dir), processor=str(clip_dir), divisor=100.0)
    torch.testing.assert_close(score(divided, arrays, PROMPTS), got / 100)


def test_clipscore_clamps_the_cosine(registry, clip_dir) -> None:
    arrays = uint8_images(5, 32, 32, seed=2)
    cos, _ = reference_clip_cos(clip_dir, arrays, PROMPTS)
    plain = score(build(registry, "clipscore", model=str(clip_dir), clamp=False), arrays, PROMPTS)
    torch.testing.assert_close(plain, cos, atol=2e-3, rtol=0)
    clamped = score(build(registry, "clipscore", model=str(clip_dir), scale=2.5), arrays, PROMPTS)
    torch.testing.assert_close(clamped, 2.5 * plain.clamp_min(0), atol=1e-5, rtol=0)
    assert plain.std() > 1e-4


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_aesthetic_head_on_normalised_clip_embedding(registry, clip_dir, tmp_path, suffix) -> None:
    from transformers import AutoProcessor, CLIPModel
    from vgrpo_rewards._clip_common import features
    from vgrpo_rewards.aesthetic.impl import MLPHead

    head_path = save_aesthetic_head(tmp_path / f"head{suffix}", in_dim=16)
    reward = build(registry, "aesthetic", model=str(clip_dir), head=str(head_path))
    arrays = uint8_images(4, 32, 32, seed=3)
    got = score(reward, arrays, [""] * 4)
    # DDPO's aesthetic scorer: processor -> get_image_features -> unit norm -> MLP
    processor, model = AutoProcessor.from_pretrained(clip_dir), CLIPModel.from_pretrained(clip_dir).eval()
    head = MLPHead(16).eval()
    head.load_state_dict(
        torch.load(head_path, weights_only=True)
        if suffix == ".pth"
        else __import__("safetensors.torch", fromlist=["load_file"]).load_file(head_path)
    )
    with torch.no_grad():
        pix = processor(images=[Image.fromarray(a) for a in arrays], return_tensors="pt")["pixel_values"]
        emb = features(model.get_image_features(pixel_values=pix))
        ref = head(emb / emb.norm(dim=-1, keepdim=True)).squeeze(-1)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-3)
    assert got.std() > 0


def test_aesthetic_head_of_the_wrong_width_is_refused(registry, clip_dir, tmp_path) -> None:
    head_path = save_aesthetic_head(tmp_path / "head768.pth", in_dim=768)
    with pytest.raises(RewardError, match="expects 768-d embeddings but the CLIP model gives 16"):
        build(registry, "aesthetic", model=str(clip_dir), head=str(head_path))


@pytest.mark.parametrize(
    ("name", "options", "needle", "fix"),
    [
        (
            "pickscore",
            {},
            "PickScore weights not found at 'yuvalkirstain/PickScore_v1' (offline)",
            "huggingface-cli download yuvalkirstain/PickScore_v1",
        ),
        (
            "clipscore",
            {"model": "/nonexistent/clip"},
            "CLIPScore weights not found at '/nonexistent/clip'",
            "huggingface-cli download openai/clip-vit-large-patch14",
        ),
        (
            "aesthetic",
            {"head": "/nonexistent/head.pth"},
            "Aesthetic head weights not found at '/nonexistent/head.pth'",
            "improved-aesthetic-predictor/raw/main/sac+logos+ava1-l14-linearMSE.pth",
        ),
        (
            "hpsv2",
            {"model": "/nonexistent/hps"},
            "HPSv2 weights not found at '/nonexistent/hps'",
            "huggingface-cli download xswu/HPSv2 HPS_v2.1_compressed.pt",
        ),
        (
            "imagereward",
            {},
            "ImageReward weights not found at 'THUDM/ImageReward/ImageReward.pt' (offline)",
            "huggingface-cli download THUDM/ImageReward ImageReward.pt med_config.json",
        ),
    ],
)
def test_missing_weights_is_one_line_naming_the_fix(
    registry, monkeypatch, name, options, needle, fix
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if name == "aesthetic":
        options = {"model": "/nonexistent/clip", **options}
    with pytest.raises(RewardError) as info:
        build(registry, name, **options)
    message = str(info.value)
    if name == "aesthetic":  # the CLIP is missing too and is loaded first
        needle, fix = (
            "Aesthetic CLIP weights not found at '/nonexistent/clip'",
            "openai/clip-vit-large-patch14",
        )
    assert "\n" not in message and needle in message and fix in message, message


def test_missing_aesthetic_head_is_one_line(registry, clip_dir) -> None:
    with pytest.raises(RewardError) as info:
        build(registry, "aesthetic", model=str(clip_dir), head="/nonexistent/head.pth")
    message = str(info.value)
    assert message.startswith("Aesthetic head weights not found at '/nonexistent/head.pth'"), message
    assert "improved-aesthetic-predictor/raw/main/sac+logos+ava1-l14-linearMSE.pth" in message


# ----------------------------------------------------------------------------------------------- HPSv2


def test_hpsv2_matches_open_clip_reference(registry, tmp_path) -> None:
    open_clip = pytest.importorskip("open_clip", reason="open_clip_torch is not installed")
    from vgrpo_rewards._clip_common import clip_preprocess

    folder = save_open_clip_hps(tmp_path / "hps")
    reward = build(registry, "hpsv2", model=str(folder), arch=TINY_OPEN_CLIP, batch_size=2)
    arrays = uint8_images(3, 40, 48, seed=4)
    prompts = PROMPTS[:3]
    got = score(reward, arrays, prompts)
    # hpsv2/img_score.py: preprocess_val on PIL, model(image, text), diag(image_features @ text_features.T)
    model, _, preprocess_val = open_clip.create_model_and_transforms(
        TINY_OPEN_CLIP, pretrained=str(folder / "HPS_v2.1_compressed.pt"), output_dict=True
    )
    model.eval()
    with torch.no_grad():
        pix = torch.stack([preprocess_val(Image.fromarray(a)) for a in arrays])
        ours_pix = clip_preprocess(as_samples(arrays).data, reward.transform, torch.float32)
        assert (ours_pix - pix).abs().mean() < 0.01
        out = model(pix, open_clip.get_tokenizer(TINY_OPEN_CLIP)(prompts))
        ref = (out["image_features"] * out["text_features"]).sum(-1)
    torch.testing.assert_close(got, ref, atol=2e-3, rtol=0)
    assert (score(reward, arrays, PROMPTS[2::-1][:3]) - got).abs().max() > 1e-4


# ------------------------------------------------------------------------------------------- ImageReward


@pytest.fixture(scope="module")
def imagereward_dir(tmp_path_factory) -> Path:
    return save_imagereward(tmp_path_factory.mktemp("imagereward"))


def test_imagereward_loads_original_checkpoint_and_responds(registry, imagereward_dir) -> None:
    reward = build(
        registry,
        "imagereward",
        model=str(imagereward_dir),
        tokenizer=str(imagereward_dir / "tokenizer"),
        batch_size=2,
    )
    arrays = uint8_images(4, 48, 40, seed=5)
    prompts = ["a red cat", "a dog", "cat", "red dog"]
    got = score(reward, arrays, prompts)
    assert (score(reward, arrays, prompts[::-1]) - got).abs().max() > 1e-4
    assert (score(reward, arrays[::-1].copy(), prompts) - got).abs().max() > 1e-4
    # the .pt file itself works as `model` too (med_config.json beside it)
    same = build(
        registry,
        "imagereward",
        model=str(imagereward_dir / "ImageReward.pt"),
        tokenizer=str(imagereward_dir / "tokenizer"),
    )
    torch.testing.assert_close(score(same, arrays, prompts), got)


def test_imagereward_vision_block_matches_blip_vit_math(registry, imagereward_dir) -> None:
    """Recompute BLIP's ViT (vit.py: patch embed + cls + pos, pre-norm attention and MLP blocks, final
    norm) from the original checkpoint tensors and compare with the converted transformers model."""
    reward = build(
        registry, "imagereward", model=str(imagereward_dir), tokenizer=str(imagereward_dir / "tokenizer")
    )
    sd = torch.load(imagereward_dir / "ImageReward.pt", weights_only=True)
    p = {
        k.removeprefix("blip.visual_encoder."): v
        for k, v in sd.items()
        if k.startswith("blip.visual_encoder.")
    }
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    d = p["cls_token"].shape[-1]
    tokens = (
        F.conv2d(x, p["patch_embed.proj.weight"], p["patch_embed.proj.bias"], stride=8)
        .flatten(2)
        .transpose(1, 2)
    )
    h = torch.cat([p["cls_token"].expand(2, -1, -1), tokens], dim=1) + p["pos_embed"]  # [2, 17, d]
    heads = max(1, d // 64)
    for i in range(1 + max(int(k.split(".")[1]) for k in p if k.startswith("blocks."))):
        b = {k.removeprefix(f"blocks.{i}."): v for k, v in p.items() if k.startswith(f"blocks.{i}.")}
        y = F.layer_norm(h, (d,), b["norm1.weight"], b["norm1.bias"], eps=1e-6)
        q, k, v = (
            F.linear(y, b["attn.qkv.weight"], b["attn.qkv.bias"]).view(2, -1, 3, heads, d // heads).unbind(2)
        )
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        h = h + F.linear(att.transpose(1, 2).reshape(2, -1, d), b["attn.proj.weight"], b["attn.proj.bias"])
        y = F.layer_norm(h, (d,), b["norm2.weight"], b["norm2.bias"], eps=1e-6)
        h = h + F.linear(
            F.gelu(F.linear(y, b["mlp.fc1.weight"], b["mlp.fc1.bias"])),
            b["mlp.fc2.weight"],
            b["mlp.fc2.bias"],
        )
    ref = F.layer_norm(h, (d,), p["norm.weight"], p["norm.bias"], eps=1e-6)
    with torch.no_grad():
        got = reward.model.vision_model(pixel_values=x).last_hidden_state
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4)


# -------------------------------------------------------------------------------------------------- JPEG


def test_jpeg_sizes_match_pil_and_rank_flat_above_noise(registry) -> None:
    rng = np.random.default_rng(0)
    flat = np.full((64, 64, 3), 120, np.uint8)
    noise = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    arrays = np.stack([flat, noise])
    compress = score(build(registry, "jpeg"), arrays, ["", ""])
    sizes = []
    for a in arrays:
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, format="JPEG", quality=95)
        sizes.append(len(buf.getvalue()) / 1000)
    torch.testing.assert_close(compress, -torch.tensor(sizes))
    assert compress[0] > compress[1]  # the flat image is the more compressible
    incompress = score(build(registry, "jpeg", incompressibility=True), arrays, ["", ""])
    torch.testing.assert_close(incompress, -compress)


# --------------------------------------------------------------------------------------------------- OCR


def brute_levenshtein(a: str, b: str) -> int:
    if not a or not b:
        return len(a) + len(b)
    return min(
        brute_levenshtein(a[1:], b) + 1,
        brute_levenshtein(a, b[1:]) + 1,
        brute_levenshtein(a[1:], b[1:]) + (a[0] != b[0]),
    )


def test_levenshtein_and_flow_grpo_rule() -> None:
    from vgrpo_rewards.ocr.impl import levenshtein, text_reward

    rnd = random.Random(0)
    for _ in range(200):
        a = "".join(rnd.choices("abc", k=rnd.randint(0, 6)))
        b = "".join(rnd.choices("abc", k=rnd.randint(0, 6)))
        assert levenshtein(a, b) == brute_levenshtein(a, b), (a, b)
    assert text_reward("Open Late", "open late") == 1.0
    assert text_reward("xx open late!!", "open late") == 1.0  # contained: no penalty (Flow-GRPO)
    assert text_reward("opem late", "open late") == pytest.approx(1 - 1 / 8)  # spaces removed: 8 chars
    assert text_reward("", "open") == 0.0
    assert text_reward("zzzzzzzzzzzzzzzzzz", "open") == 0.0  # capped at len(target)


def ocr_engine(registry, engine: str):
    """The ``ocr`` reward on ``engine``; Tesseract (an optional system binary) skips when it is absent."""
    if engine == "tesseract":
        pytest.importorskip("pytesseract", reason="pytesseract is not installed")
        import shutil

        if shutil.which("tesseract") is None:
            pytest.skip("the tesseract binary is not installed (apt-get install tesseract-ocr)")
    return build(registry, "ocr", engine=engine)


@pytest.mark.parametrize("engine", ["rapidocr", "tesseract"])
def test_ocr_reads_rendered_text(registry, engine) -> None:
    reward = ocr_engine(registry, engine)
    arrays = np.stack(
        [
            render_text("open late"),
            render_text("opem lale"),
            render_text("closed"),
            np.full((96, 256, 3), 255, np.uint8),
        ]
    )
    prompts = ['a neon sign that says "open late"'] * 4
    got = score(reward, arrays, prompts)
    assert got[0] == 1.0 and got[3] == 0.0
    assert got[0] > got[1] > got[2] >= 0.0, got
    # the right prompt scores above a wrong one on the same image
    wrong = score(reward, arrays[:1], ['a neon sign that says "closed"'])
    assert wrong[0] < got[0], (wrong, got)
    # the target may come from metadata instead of quotes
    meta = reward.score(as_samples(arrays[:1]), ["a sign"], [{"text": "open late"}])
    assert meta.tolist() == [1.0]
    with pytest.raises(RewardError, match="no text to check"):
        reward.score(as_samples(arrays[:1]), ["a sign"], [{}])


def test_ocr_rapidocr_reads_exactly(registry) -> None:
    """The default engine reads rendered words exactly (case, digits), one score per image."""
    from vgrpo_rewards.ocr.impl import RapidOcrEngine

    engine = RapidOcrEngine(workers=1)
    for text in ("open late", "closed", "Hello 42"):
        assert engine(Image.fromarray(render_text(text))).replace(" ", "") == text.replace(" ", "")
    assert engine(Image.new("RGB", (256, 96), "white")) == ""
    reward = build(registry, "ocr")  # the default engine, several workers
    words = ["open late", "closed", "Hello 42", "vgrpo"]
    got = score(reward, np.stack([render_text(w) for w in words]), [f'a sign that says "{w}"' for w in words])
    assert got.tolist() == [1.0] * 4


def test_ocr_absent_engine_says_how_to_fix(registry, monkeypatch) -> None:
    import pytesseract

    monkeypatch.setattr(pytesseract.pytesseract, "tesseract_cmd", "no-such-tesseract-binary")
    with pytest.raises(RewardError, match=r'apt-get install tesseract-ocr\) or use engine = "rapidocr"'):
        build(registry, "ocr", engine="tesseract")
    monkeypatch.setitem(sys.modules, "rapidocr_onnxruntime", None)  # import fails as if not installed
    with pytest.raises(RewardError, match='rapidocr-onnxruntime is not installed.*engine = "tesseract"'):
        build(registry, "ocr")


def test_batch_size_does_not_change_scores(registry, clip_dir) -> None:
    arrays = uint8_images(5, 32, 32, seed=6)
    one = build(registry, "clipscore", model=str(clip_dir), clamp=False, batch_size=1)
    all_ = build(registry, "clipscore", model=str(clip_dir), clamp=False, batch_size=8)
    torch.testing.assert_close(score(one, arrays, PROMPTS), score(all_, arrays, PROMPTS), atol=1e-5, rtol=0)


def test_wrong_layout_is_a_reward_error(registry) -> None:
    reward = build(registry, "jpeg")
    with pytest.raises(RewardError, match="scores images"):
        reward.score(Samples("video", torch.zeros(1, 2, 3, 8, 8)), [""], [{}])


def test_bfloat16_scores_track_float32(registry, clip_dir, imagereward_dir) -> None:
    arrays = uint8_images(4, 32, 32, seed=7)
    prompts = PROMPTS[:4]
    tok = str(imagereward_dir / "tokenizer")
    for name, options, atol in (
        ("clipscore", {"model": str(clip_dir), "clamp": False}, 0.02),
        ("imagereward", {"model": str(imagereward_dir), "tokenizer": tok}, 0.05),
    ):
        full = score(build(registry, name, **options), arrays, prompts)
        half = score(build(registry, name, dtype="bfloat16", **options), arrays, prompts)
        torch.testing.assert_close(half, full, atol=atol * (1 + full.abs().max().item()), rtol=0)
