"""The ``edit_clip`` reward on a tiny random CLIP saved like the real one: its formula against the
processor-and-model reference, the no-edit limit, the two ways a source arrives, and the one-line errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from tiny_clip import save_clip

from vgrpo_platform.errors import RewardError
from vgrpo_platform.host.collect import default_registry
from vgrpo_platform.protocols import BuildContext, Samples

PROMPTS = ["make it snowy", "turn the cat into a dog", "add a red hat"]


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    return save_clip(tmp_path_factory.mktemp("clip"))


def images(n: int, seed: int) -> np.ndarray:
    """``[n, 32, 32, 3]`` uint8 smooth colour fields."""
    low = torch.rand(n, 3, 4, 4, generator=torch.Generator().manual_seed(seed))
    x = F.interpolate(low, size=(32, 32), mode="bilinear", align_corners=False)
    return (x * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()


def tensors(arrays: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(arrays).permute(0, 3, 1, 2).float() / 255  # [B, 3, H, W]


def reference(clip_dir, results, sources, targets, captions, weight):
    """The formula with transformers' processor and model, as a user would write it."""
    from transformers import AutoProcessor, CLIPModel
    from vgrpo_rewards._clip_common import features

    processor, model = AutoProcessor.from_pretrained(clip_dir), CLIPModel.from_pretrained(clip_dir).eval()
    with torch.no_grad():

        def img(arrays):
            pix = processor(images=[Image.fromarray(a) for a in arrays], return_tensors="pt")["pixel_values"]
            return F.normalize(features(model.get_image_features(pixel_values=pix)), dim=-1)

        def txt(texts):
            tok = processor(text=texts, padding=True, truncation=True, max_length=77, return_tensors="pt")
            out = model.get_text_features(input_ids=tok["input_ids"], attention_mask=tok["attention_mask"])
            return F.normalize(features(out), dim=-1)

        r, s = img(results), img(sources)
        direction = (F.normalize(r - s, dim=-1) * F.normalize(txt(targets) - txt(captions), dim=-1)).sum(-1)
        return direction + weight * (r * s).sum(-1), direction


def build(clip_dir, **options):
    return default_registry().build(
        "reward", "edit_clip", {"model": str(clip_dir), **options}, BuildContext()
    )


def test_direction_and_preservation_match_the_reference(clip_dir):
    results, sources = images(3, seed=1), images(3, seed=2)
    metadata = [
        {"condition_image": tensors(sources)[0]},
        {"condition_image": tensors(sources)[1], "source_caption": "a cat", "target_caption": "a dog"},
        {"condition_image": tensors(sources)[2]},
    ]
    out = build(clip_dir, preservation_weight=0.5).score(
        Samples("image", tensors(results)), PROMPTS, metadata
    )
    targets, captions = [PROMPTS[0], "a dog", PROMPTS[2]], ["", "a cat", ""]
    want, direction = reference(clip_dir, results, sources, targets, captions, 0.5)
    torch.testing.assert_close(out["score"], want, atol=3e-3, rtol=0)
    torch.testing.assert_close(out["direction"], direction, atol=3e-3, rtol=0)
    torch.testing.assert_close(out["score"], out["direction"] + 0.5 * out["preservation"])
    assert out["direction"].std() > 1e-3


def test_an_unchanged_source_has_no_direction_and_full_preservation(clip_dir):
    same = tensors(images(2, seed=3))
    out = build(clip_dir).score(Samples("image", same), PROMPTS[:2], [{"condition_image": s} for s in same])
    torch.testing.assert_close(out["direction"], torch.zeros(2))
    torch.testing.assert_close(out["preservation"], torch.ones(2))


def test_a_source_path_scores_as_the_tensor_and_a_missing_one_is_one_line(clip_dir, tmp_path):
    results, sources = images(1, seed=4), images(1, seed=5)
    Image.fromarray(sources[0]).save(tmp_path / "source.png")
    reward, samples = build(clip_dir), Samples("image", tensors(results))
    by_path = reward.score(samples, PROMPTS[:1], [{"image": str(tmp_path / "source.png")}])
    by_tensor = reward.score(samples, PROMPTS[:1], [{"condition_image": tensors(sources)[0]}])
    for key in by_path:
        torch.testing.assert_close(by_path[key], by_tensor[key])
    with pytest.raises(RewardError, match="edit_clip: sample 0 has no source image"):
        reward.score(samples, PROMPTS[:1], [{}])
    with pytest.raises(RewardError, match="edit_clip CLIP weights not found"):
        build(tmp_path / "nothing")
