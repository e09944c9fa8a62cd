"""Video and audio in sample grids (filmstrips, spectrograms), the playable clips kept beside an
evaluation's grid, and ``vgrpo report`` embedding them; image grids stay as they were."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vgrpo_platform.media import read_audio
from vgrpo_platform.protocols import Samples
from vgrpo_platform.training.observe import clips
from vgrpo_platform.training.observe.clips import clip_folder, save_clips
from vgrpo_platform.training.observe.grids import BORDER, RIGHT, WRONG, GridSpec, read_layout, save_grid
from vgrpo_platform.training.observe.pictures import STRIP_GAP, strip_indices

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REFERENCE = Path(__file__).parent / "data" / "image_grid_reference.png"


def test_an_image_grid_is_pixel_identical_to_one_made_before_video_and_audio_pictures(tmp_path: Path) -> None:
    """``tests/data/image_grid_reference.png`` was written by ``save_grid`` before video and audio got
    pictures (no text on it, so no font version can change it)."""
    samples = Samples("image", torch.rand(6, 3, 8, 12, generator=torch.Generator().manual_seed(0)))
    path = save_grid(samples, tmp_path / "g.png", group_size=3, prompts=["", ""])
    assert np.array_equal(np.asarray(Image.open(path)), np.asarray(Image.open(REFERENCE)))


def test_strip_indices_are_evenly_spaced_with_the_first_and_last_frame() -> None:
    assert strip_indices(9, 4) == [0, 3, 5, 8]
    assert strip_indices(2, 4) == [0, 1]  # fewer frames than the strip: all of them
    assert strip_indices(7, 1) == [3]


def test_a_video_sample_is_a_filmstrip_inside_one_verdict_border(tmp_path: Path) -> None:
    frames, h, w = 9, 16, 24
    shade = torch.arange(frames).float() / (frames - 1)  # each frame one grey level: which one is shown
    video = shade.view(1, frames, 1, 1, 1).expand(4, frames, 3, h, w).clone()
    samples = Samples("video", video, fps=8.0)
    details = {"moving_shapes/correct": [1.0, 0.0, 0.0, 1.0]}
    path = save_grid(samples, tmp_path / "v.png", group_size=2, prompts=["a", "b"], details=details)
    layout = read_layout(path)
    pixels = np.asarray(Image.open(path).convert("RGB"))
    frame_w = 64 * w // h  # each frame 64 px high (the frame side), its width to scale
    marks = []
    for tile in layout["tiles"]:
        assert len(tile["frames"]) == 2
        for x, y, bw, bh in tile["frames"]:
            assert (bw, bh) == (4 * frame_w + 3 * STRIP_GAP + 2 * BORDER, 64 + 2 * BORDER)
            marks.append(tuple(int(c) for c in pixels[y, x]))
            assert tuple(pixels[y + bh - 1, x + bw - 1]) == marks[-1]  # the border wraps the whole strip
            for k, f in enumerate(strip_indices(frames, 4)):  # the strip's frames, left to right
                cx = x + BORDER + k * (frame_w + STRIP_GAP) + frame_w // 2
                assert int(pixels[y + bh // 2, cx, 0]) == round(float(shade[f]) * 255)
    assert marks == [RIGHT, WRONG, WRONG, RIGHT]


def test_strip_frames_is_a_grid_option(tmp_path: Path) -> None:
    samples = Samples("video", torch.rand(2, 5, 3, 8, 8, generator=torch.Generator().manual_seed(1)))
    path = save_grid(samples, tmp_path / "v.png", group_size=2, spec=GridSpec(strip_frames=2))
    (box,) = {tuple(b[2:]) for b in read_layout(path)["tiles"][0]["frames"]}
    assert box == (2 * 64 + STRIP_GAP + 2 * BORDER, 64 + 2 * BORDER)


def tones(freqs: list[float], rate: int = 8000, seconds: float = 0.5) -> torch.Tensor:
    """``[len(freqs), 1, samples]`` sine tones."""
    t = torch.arange(int(rate * seconds)) / rate
    return torch.stack([0.5 * torch.sin(2 * torch.pi * f * t) for f in freqs])[:, None]


def test_an_audio_grid_has_one_spectrogram_per_sample_with_its_pitch(tmp_path: Path) -> None:
    samples = Samples("audio", tones([3000.0, 3000.0, 300.0, 300.0]), sample_rate=8000)
    path = save_grid(samples, tmp_path / "a.png", group_size=2, prompts=["high", "low"])
    assert path is not None
    layout = read_layout(path)
    pixels = np.asarray(Image.open(path).convert("RGB")).astype(int)
    loudest_rows = []
    for tile in layout["tiles"]:
        assert len(tile["frames"]) == 2
        for x, y, bw, bh in tile["frames"]:
            assert (bw, bh) == (2 * 64 + 2 * BORDER, 64 + 2 * BORDER)  # twice as wide as high
            inner = pixels[y + BORDER : y + bh - BORDER, x + BORDER : x + bw - BORDER].sum(-1)
            loudest_rows.append(int(inner.mean(1).argmax()))  # the brightest row: the tone's pitch
    high, low = loudest_rows[:2], loudest_rows[2:]
    assert high[0] == high[1] and low[0] == low[1]
    assert high[0] < low[0] - 20  # the high tone sits well above the low one (low pitches at the bottom)


def test_audio_clips_are_bounded_wavs_that_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clips, "PROMPTS_WITH_CLIPS", 3)
    monkeypatch.setattr(clips, "MAX_SECONDS", 0.25)
    waves = tones([200.0 * (i + 1) for i in range(4 * 3)], rate=4000)  # 4 prompts of 3, 0.5 s each
    samples = Samples("audio", waves, sample_rate=4000)
    written = save_clips(samples, tmp_path / "eval_000002", group_size=3)
    names = sorted(p.name for p in written)
    assert names == sorted(f"{p}_{k}.wav" for p in range(3) for k in range(2))  # 3 prompts, 2 samples each
    wave, rate = read_audio(tmp_path / "eval_000002" / "1_1.wav")
    assert rate == 4000 and wave.shape == (1, 1000)  # cut to MAX_SECONDS
    assert torch.allclose(wave, waves[4][:, :1000], atol=1e-4)  # prompt 1, sample 1 = row 1 * 3 + 1
    assert save_clips(Samples("image", torch.zeros(2, 3, 4, 4)), tmp_path / "img", group_size=1) == []
    assert not (tmp_path / "img").exists()


def test_video_clips_are_the_first_sample_of_each_prompt_as_mp4(tmp_path: Path) -> None:
    video = torch.rand(4, 3, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    written = save_clips(Samples("video", video, fps=4.0), tmp_path / "eval", group_size=2)
    assert [p.name for p in written] == ["0_0.mp4", "1_0.mp4"]
    assert all(p.read_bytes()[4:8] == b"ftyp" for p in written)  # an MP4 container


def test_an_audio_run_keeps_wavs_beside_its_grids_and_the_report_plays_them(tmp_path: Path) -> None:
    """A one-iteration LoRA run of a tiny random tones model, evaluated before and after: spectrogram
    grids, a before/after picture, WAVs at the model's rate and length, and ``<audio>`` in the report;
    ``vgrpo sample`` of the run writes a WAV per sample and their spectrogram grid."""
    import adapter_checks as checks
    from vgrpo_adapters import tones as tones_entry
    from vgrpo_adapters.tones.build import ModelSize, build_tones_model
    from vgrpo_adapters.tones.codec import N_SAMPLES, SAMPLE_RATE
    from vgrpo_adapters.tones.pretrain import world_words
    from vgrpo_rewards import audio as audio_rewards
    from vgrpo_rewards.tones import world as w

    from vgrpo_platform.algo.surrogates import entry as surrogates
    from vgrpo_platform.cli.report import write_report
    from vgrpo_platform.cli.sample import sample_to_folder
    from vgrpo_platform.config.recipe import resolve_recipe
    from vgrpo_platform.training.loop import Trainer

    size = ModelSize(dit_dim=32, dit_depth=1, dit_heads=2, text_dim=16, text_layers=1, text_heads=2)
    model = build_tones_model(tmp_path / "model", size, words=tuple(world_words()))
    recipe = tmp_path / "tones.toml"
    recipe.write_text(
        f'[run]\nname = "tones"\n\n[adapter]\nname = "tones"\n\n[adapter.options]\nmodel_path = "{model}"\n\n'
        '[[rewards]]\nname = "loudness"\n\n[surrogate]\nname = "vgrpo"\n\n'
        f'[prompts]\ntrain = {json.dumps(w.train_prompts()[:2])}\n\n[train]\nfinetune = "lora"\n'
    )
    overrides = [
        *checks.cpu_run(tmp_path),
        *checks.lora_iterations(1, group_size=2, steps=2, micro_batch_size=4),
        "eval.every=0",
        "eval.max_prompts=2",
        "eval.samples_per_prompt=3",
        "log.save_grids=true",
    ]
    registry = checks.registry_of(tones_entry, audio_rewards, surrogates)
    resolved = resolve_recipe(recipe, overrides, registry=registry)
    run_dir = Trainer(resolved).run()
    samples = run_dir / "samples"
    for it in (0, 1):
        grid = samples / f"eval_{it:06d}.png"
        assert [len(t["frames"]) for t in read_layout(grid)["tiles"]] == [3, 3]  # a spectrogram per sample
        wavs = sorted(p.name for p in clip_folder(grid).iterdir())
        assert wavs == ["0_0.wav", "0_1.wav", "1_0.wav", "1_1.wav"]
        wave, rate = read_audio(clip_folder(grid) / "0_0.wav")
        assert rate == SAMPLE_RATE and wave.shape[-1] == N_SAMPLES
    assert (samples / "before_after.png").is_file()
    text = write_report(run_dir).read_text()
    sources = re.findall(r'<audio controls preload="none" src="([^"]+)"', text)
    assert "samples/eval_000001/1_1.wav" in sources
    for src in sources:  # relative, and copied into the report folder
        assert (run_dir / "report" / src).read_bytes() == (run_dir / src).read_bytes()
    files = sample_to_folder(resolved, out_dir=tmp_path / "sampled", checkpoint=run_dir, num_per_prompt=2)
    assert [p.suffix for p in files] == [".wav"] * 4
    assert [len(t["frames"]) for t in read_layout(tmp_path / "sampled" / "grid.png")["tiles"]] == [2, 2]


def test_the_report_plays_videos_and_sounds_under_their_grid_captioned_with_prompts(tmp_path: Path) -> None:
    from vgrpo_platform.cli.report import _clips_html, clips_of

    grid = tmp_path / "samples" / "eval_000003.png"
    grid.parent.mkdir()
    layout = {"tiles": [{"prompt": "a <red> square"}, {"prompt": "a blue circle"}]}
    grid.with_suffix(".json").write_text(json.dumps(layout))
    copied = tmp_path / "report" / "samples" / "eval_000003"
    copied.mkdir(parents=True)
    for name in ("1_0.mp4", "0_0.wav", "0_0.mp4", "notes.txt"):
        (copied / name).write_bytes(b"x")
    assert [p.name for _, _, p in clips_of(tmp_path / "report" / "samples" / "eval_000003.png")] == [
        "0_0.mp4",
        "0_0.wav",
        "1_0.mp4",
    ]
    text = _clips_html(tmp_path, "samples/eval_000003.png")
    assert re.findall(r'<(video|audio) controls preload="none" src="([^"]+)"', text) == [
        ("video", "samples/eval_000003/0_0.mp4"),
        ("audio", "samples/eval_000003/0_0.wav"),
        ("video", "samples/eval_000003/1_0.mp4"),
    ]
    assert "a &lt;red&gt; square (sample 1)" in text and "a blue circle (sample 1)" in text
    assert _clips_html(tmp_path, "samples/eval_000009.png") == ""  # no clips: nothing under the grid


def test_clips_that_cannot_be_written_cost_a_warning_not_the_grid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from vgrpo_platform.protocols import SamplerSpec
    from vgrpo_platform.training.observe.evaluation import Evaluation, Protocol

    def no_ffmpeg(*args: object, **kwargs: object) -> Path:
        raise RuntimeError("no ffmpeg binary")

    monkeypatch.setattr(clips.media, "write_video", no_ffmpeg)
    protocol = Protocol(("a", "b"), 2, 0, SamplerSpec("euler", 2), 4)
    total = torch.zeros(4)
    video = Samples("video", torch.rand(4, 3, 3, 8, 8, generator=torch.Generator().manual_seed(3)), fps=4.0)
    result = Evaluation(protocol, {}, {}, total, None, None, samples=video)
    grid = result.save_grid(tmp_path / "eval_000001.png", title="t")
    assert grid is not None and grid.is_file() and read_layout(grid)["tiles"]
    assert "warning: no playable clips beside" in capsys.readouterr().err
