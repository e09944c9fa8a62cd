"""Video rewards on synthetic clips with known answers; the frame-wise wrapper against its inner reward."""

from __future__ import annotations

import pytest
import torch
from vgrpo_rewards import toy as toy_rewards
from vgrpo_rewards import video as video_rewards
from vgrpo_rewards.video.impl import MotionReward, TemporalConsistencyReward, frame_indices

from vgrpo_platform.host.collect import collect_components
from vgrpo_platform.host.manager import build_plugin_manager
from vgrpo_platform.protocols import BuildContext, Samples


def registry():
    return collect_components(
        build_plugin_manager(load_entry_points=False, extra_plugins=[video_rewards, toy_rewards])
    )


def moving_square(frames: int = 6, side: int = 16, step: int = 2) -> torch.Tensor:
    """A white 4x4 square moving ``step`` px right per frame on black: ``[F, 3, H, W]``."""
    clip = torch.zeros(frames, 3, side, side)
    for f in range(frames):
        clip[f, :, 4:8, f * step : f * step + 4] = 1.0
    return clip


def test_frame_indices_are_even_and_include_both_ends() -> None:
    assert frame_indices(9, 3) == [0, 4, 8] and frame_indices(5, 0) == list(range(5))
    assert frame_indices(4, 10) == [0, 1, 2, 3] and frame_indices(7, 1) == [3]


def test_framewise_brightness_equals_the_mean_of_the_selected_frames() -> None:
    torch.manual_seed(0)
    clips = torch.rand(2, 9, 3, 8, 8)
    reward = registry().build(
        "reward",
        "framewise",
        {"reward": "brightness", "frames": 3},
        BuildContext(extra={"registry": registry()}),
    )
    got = reward.score(Samples("video", clips), ["a", "b"], [{}, {}])
    expected = clips[:, [0, 4, 8]].flatten(2).mean(2).mean(1)  # per-frame means, averaged
    torch.testing.assert_close(got, expected)
    worst = registry().build(
        "reward",
        "framewise",
        {"reward": "brightness", "frames": 0, "aggregate": "min"},
        BuildContext(extra={"registry": registry()}),
    )
    torch.testing.assert_close(
        worst.score(Samples("video", clips), ["a", "b"], [{}, {}]), clips.flatten(2).mean(2).amin(1)
    )


def test_framewise_passes_each_frame_its_clips_prompt() -> None:
    seen = []

    class Spy:
        modalities = frozenset({"image"})

        def score(self, samples, prompts, metadata):
            seen.extend(prompts)
            return torch.zeros(len(samples))

    from vgrpo_rewards.video.impl import FramewiseReward

    FramewiseReward(Spy(), frames=2).score(Samples("video", torch.rand(2, 5, 3, 4, 4)), ["x", "y"], [])
    assert seen == ["x", "x", "y", "y"]


def test_identical_frames_are_maximally_consistent_and_static_clips_have_no_motion() -> None:
    static = moving_square(step=0)[None]  # [1, F, 3, H, W]
    moving = moving_square(step=2)[None]
    noisy = torch.rand(1, 6, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    clips = Samples("video", torch.cat([static, moving, noisy]))
    consistency = TemporalConsistencyReward(pool=16).score(clips, ["a"] * 3, [])
    assert consistency[0] == pytest.approx(1.0) and consistency[1] < 1.0 and consistency[2] < 1.0
    # the square overlaps half of itself between frames: cos = 8 / 16 on the unpooled pixels
    assert consistency[1] == pytest.approx(0.5, abs=1e-6)
    motion = MotionReward(pool=16).score(clips, ["a"] * 3, [])
    assert motion[0] == 0.0
    # each step changes 2 x 8 pixels (all channels) out of 16 x 16: 16 / 256
    assert motion[1] == pytest.approx(16 / 256)
    targeted = MotionReward(pool=16, target=16 / 256).score(clips, ["a"] * 3, [])
    assert targeted[1] == pytest.approx(0.0, abs=1e-7) and targeted[0] < 0 and targeted[2] < 0
    assert torch.equal(
        TemporalConsistencyReward().score(Samples("video", torch.zeros(1, 3, 3, 4, 4)), ["a"], []),
        torch.ones(1),
    )


def test_video_rewards_declare_their_modality_and_reject_images() -> None:
    from vgrpo_rewards.video import FramewiseConfig, MotionConfig

    assert FramewiseConfig.modalities == MotionConfig.modalities == frozenset({"video"})
    with pytest.raises(ValueError):
        MotionConfig(target=2.0)
    with pytest.raises(ValueError):
        TemporalConsistencyReward().score(Samples("image", torch.rand(1, 3, 4, 4)), ["a"], [])


def test_reference_similarity_reads_the_reference_with_decord_and_ranks_clips(tmp_path) -> None:
    """The reference mp4 is decoded by decord; the reference itself scores ~1, other clips lower."""
    pytest.importorskip("decord")
    from vgrpo_platform.errors import RewardError
    from vgrpo_platform.media import write_video

    reference = moving_square(frames=6, side=32, step=4)  # decord mis-reads very small frames
    write_video(reference, tmp_path / "ref.mp4", fps=8)
    context = BuildContext(recipe_dir=tmp_path)
    reward = registry().build("reward", "reference_similarity", {"path": "ref.mp4", "pool": 8}, context)
    other = torch.zeros(6, 3, 32, 32)
    other[:, 1, 16:24, 16:24] = 1.0  # a green square that stays put
    clips = torch.stack([reference, reference.flip(0), other])  # [3, F, 3, H, W]
    scores = reward.score(Samples("video", clips), ["x"] * 3, [{}] * 3)
    assert scores.shape == (3,)
    assert scores[0] > 0.95, "decoding is lossy (H.264) but the reference must match itself"
    assert scores[0] > scores[1] > scores[2], scores
    # a clip with more frames than the reference: frames are matched evenly, still maximal for itself
    longer = reference.repeat_interleave(2, dim=0)  # [12, 3, H, W]
    assert reward.score(Samples("video", longer[None]), ["x"], [{}])[0] > 0.9
    with pytest.raises(RewardError, match="not found"):
        registry().build("reward", "reference_similarity", {"path": "missing.mp4"}, context)
