"""The toy rewards against direct computations on hand-made images and videos."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from vgrpo_rewards import toy as toy_entry
from vgrpo_rewards.toy import BrightnessConfig, TargetColorConfig

from vgrpo_platform.host.collect import collect_components
from vgrpo_platform.host.manager import build_plugin_manager
from vgrpo_platform.protocols import BuildContext, Reward, Samples


@pytest.fixture(scope="module")
def registry():
    return collect_components(build_plugin_manager(load_entry_points=False, extra_plugins=[toy_entry]))


def build(registry, name: str, **options):
    reward = registry.build("reward", name, options, BuildContext())
    assert isinstance(reward, Reward) and reward.modalities == frozenset({"image", "video"})
    return reward


def image(*rgb: float, size: int = 4) -> torch.Tensor:
    """A uniform ``[3, size, size]`` image of colour ``rgb``."""
    return torch.tensor(rgb).view(3, 1, 1).expand(3, size, size).clone()


def score(reward, data: torch.Tensor, modality: str = "image") -> torch.Tensor:
    out = reward.score(Samples(modality, data), [""] * len(data), [{}] * len(data))
    assert out.shape == (len(data),) and out.dtype == torch.float32 and out.device == data.device
    return out


def test_registered_with_documented_options(registry) -> None:
    assert registry.get("reward", "brightness").config is BrightnessConfig
    assert registry.get("reward", "target_color").config is TargetColorConfig
    for config in (BrightnessConfig, TargetColorConfig):
        assert all(field.description for field in config.model_fields.values())


def test_entry_module_does_not_import_torch() -> None:
    code = "import vgrpo_rewards.toy, sys; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_options_are_validated() -> None:
    with pytest.raises(ValueError):
        BrightnessConfig(target=1.5)
    with pytest.raises(ValueError):
        TargetColorConfig(rgb=(1.0, 0.0))
    with pytest.raises(ValueError):
        TargetColorConfig(rgb=(0.0, -0.1, 0.0))


@pytest.mark.parametrize("value", [0.0, 0.25, 0.7, 1.0])
def test_brightness_of_a_constant_image_is_the_constant(registry, value: float) -> None:
    data = torch.full((2, 3, 5, 5), value)
    torch.testing.assert_close(score(build(registry, "brightness"), data), torch.full((2,), value))


def test_brightness_is_the_pixel_mean_and_target_distance(registry) -> None:
    data = torch.rand(6, 3, 5, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    means = data.double().reshape(6, -1).mean(1)
    torch.testing.assert_close(score(build(registry, "brightness"), data), means.float())
    targeted = score(build(registry, "brightness", target=0.4), data)
    torch.testing.assert_close(targeted, -(means - 0.4).abs().float())


def test_target_color_is_maximal_at_target_and_orders_by_distance(registry) -> None:
    target = (0.9, 0.2, 0.1)
    reward = build(registry, "target_color", rgb=list(target))
    away = torch.tensor([0.1, 0.8, 0.9]) - torch.tensor(target)  # a direction away from the target
    steps = [0.0, 0.2, 0.5, 1.0]
    data = torch.stack([image(*(torch.tensor(target) + s * away).tolist()) for s in steps])
    out = score(reward, data)
    assert out[0].item() == pytest.approx(0.0, abs=1e-7)  # the maximum: a bounded score in [-1, 0]
    assert torch.all(out[:-1] > out[1:])  # monotone in the distance
    expected = torch.tensor([-s * away.norm().item() / math.sqrt(3) for s in steps])
    torch.testing.assert_close(out, expected)
    assert out.min() >= -1
    extremes = torch.stack([image(0.0, 1.0, 1.0), image(1.0, 0.0, 0.0)])  # red target: opposite corner
    torch.testing.assert_close(score(build(registry, "target_color"), extremes), torch.tensor([-1.0, 0.0]))


def test_target_color_averages_per_pixel_distances(registry) -> None:
    mixed = image(1.0, 0.0, 0.0)
    mixed[:, :, 2:] = 0.0  # left half red, right half black
    out = score(build(registry, "target_color", rgb=(1.0, 0.0, 0.0)), mixed[None])
    torch.testing.assert_close(out, torch.tensor([-0.5 / math.sqrt(3)]))  # mean of 0 and 1/sqrt(3)


def test_video_scores_average_over_frames(registry) -> None:
    frames = torch.rand(2, 5, 3, 4, 4, generator=torch.Generator().manual_seed(1))  # [B, F, 3, H, W]
    for name in ("brightness", "target_color"):
        reward = build(registry, name)
        per_frame = torch.stack([score(reward, frames[:, f]) for f in range(5)], dim=1)  # [B, F]
        torch.testing.assert_close(score(reward, frames, "video"), per_frame.mean(1))
    # brightness with a target is -|mean over frames - target|, not a mean of per-frame distances
    reward = build(registry, "brightness", target=0.3)
    expected = -(frames.reshape(2, -1).mean(1) - 0.3).abs()
    torch.testing.assert_close(score(reward, frames, "video"), expected)


def test_wrong_modality_or_shape_is_refused(registry) -> None:
    reward = build(registry, "brightness")
    with pytest.raises(ValueError, match="modality 'audio'"):
        reward.score(Samples("audio", torch.zeros(1, 1, 100), sample_rate=16000), [""], [{}])
    with pytest.raises(ValueError, match=r"\[B, F, 3, H, W\]"):
        reward.score(Samples("video", torch.zeros(1, 3, 4, 4)), [""], [{}])
