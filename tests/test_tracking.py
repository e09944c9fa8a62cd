"""``log.trackers``: toy runs logged to TensorBoard (read back with its own reader) and to W&B in
offline mode, both continuing the same tracker run on resume; a missing package stops at start-up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.errors import TrackerError
from vgrpo_platform.training import loop as train
from vgrpo_platform.training.loop import Trainer
from vgrpo_platform.training.observe import tracking
from vgrpo_platform.training.observe.metrics import read_metrics
from vgrpo_platform.training.observe.tracking import flatten, metrics_of
from vgrpo_platform.training.recovery.checkpoint import list_checkpoints

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "recipes" / "toy.toml"
EVERYTHING = {"images": 0, "scalars": 0}  # EventAccumulator keeps every event (0 = no sampling)
TINY = ["rollout.group_size=4", "eval.every=2", "log.checkpoint_every=2", "log.diagnostics_every=0"]


def toy(tmp_path: Path, name: str, *overrides: str):
    base = [f"run.output_dir={tmp_path.as_posix()!r}", f"run.name={name!r}", "log.progress='none'"]
    return resolve_recipe(TOY, [*base, *TINY, *overrides])


def test_records_become_tracker_metrics_and_the_recipe_flat_scalars():
    train_record = {"kind": "train", "iteration": 3, "reward": 0.5, "epoch": 1, "flag": True, "reason": "x"}
    assert metrics_of(train_record) == {"reward": 0.5, "epoch": 1.0}
    assert metrics_of({"kind": "eval", "iteration": 3, "reward": 0.25}) == {"eval/reward": 0.25}
    assert metrics_of({"kind": "skipped", "iteration": 3, "reason": "NaN"}) == {}
    nested = {
        "train": {"lr": 0.01, "adam_betas": [0.9, 0.999], "grad_clip": None},
        "rewards": [{"name": 1}],
    }
    assert flatten(nested) == {
        "train.lr": 0.01,
        "train.adam_betas": "[0.9, 0.999]",
        "train.grad_clip": "none",
        "rewards.0.name": 1,
    }


def test_a_missing_tracker_package_stops_before_any_model_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(tracking, "installed", lambda name: name != "wandb")

    def no_models(*args, **kwargs):
        raise AssertionError("a model was built before the tracker check")

    monkeypatch.setattr(train, "build_session", no_models)
    with pytest.raises(TrackerError) as caught:
        Trainer(toy(tmp_path, "missing", 'log.trackers=["tensorboard", "wandb"]'))
    message = str(caught.value)
    assert message == (
        "log.trackers: 'wandb' is not installed; pip install \"vgrpo[wandb]\", or remove it from log.trackers"
    )
    assert not (tmp_path / "missing").exists()


def test_tensorboard_holds_every_reward_at_its_iteration_and_a_resume_continues_it(tmp_path):
    pytest.importorskip("tensorboard", reason='pip install "vgrpo[tensorboard]"')
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sets = ('log.trackers=["tensorboard"]', "log.project='proj'")
    run_dir = Trainer(toy(tmp_path, "tb", "train.iterations=3", *sets)).run()
    # as if killed after iteration 3's events were written but before its checkpoint
    newest = list_checkpoints(run_dir)[-1]
    assert newest.name == "iter_000003"
    for path in sorted(newest.iterdir()):
        path.unlink()
    newest.rmdir()
    Trainer(toy(tmp_path, "tb", "train.iterations=4", *sets), resume=True).run()

    events = EventAccumulator(
        str(run_dir / "tensorboard" / "proj"), size_guidance={"images": 0, "scalars": 0}
    )
    events.Reload()
    records = read_metrics(run_dir / "metrics.jsonl")
    for kind, tag in (("train", "reward"), ("eval", "eval/reward")):
        logged = [r for r in records if r["kind"] == kind]
        scalars = events.Scalars(tag)
        assert [s.step for s in scalars] == [r["iteration"] for r in logged], tag  # once each, in order
        for s, r in zip(scalars, logged, strict=True):
            assert s.value == pytest.approx(r["reward"], rel=1e-6), (tag, s.step)
    assert [s.step for s in events.Scalars("eval/reward")] == [0, 2, 4]
    assert [s.step for s in events.Scalars("reward/brightness")] == [1, 2, 3, 4]
    assert "eval/monitor/diversity" in events.Tags()["scalars"]
    images = events.Images("eval/samples")
    assert [i.step for i in images] == [0, 2, 4]
    assert images[0].width > 16 and images[0].height > 16  # the labelled grid, not one sample
    configs = [p.read_text() for p in (run_dir / "tensorboard" / "proj").rglob("hparams.yml")]
    assert len(configs) == 1 and "train.lr: 0.01" in configs[0]  # the resolved recipe, logged once


def test_wandb_offline_writes_its_run_and_a_resume_continues_the_same_run(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason='pip install "vgrpo[wandb]"')
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    sets = ('log.trackers=["wandb"]',)
    run_dir = Trainer(toy(tmp_path, "wb", "train.iterations=2", *sets)).run()
    run_id = json.loads((run_dir / "trackers.json").read_text())["wandb_id"]
    Trainer(toy(tmp_path, "wb", "train.iterations=3", *sets), resume=True).run()
    wandb.teardown()  # finish() returns before W&B's service has written everything (process exit waits)
    assert json.loads((run_dir / "trackers.json").read_text())["wandb_id"] == run_id
    # one W&B run, resumed: offline-run-<time>-<id>, with "-1" appended when both started in one second
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(f"-{run_id}" in r.name for r in runs), runs
    for r in runs:
        (data,) = r.glob("*.wandb")
        assert data.stat().st_size > 1000
    # each evaluation grid as a wandb.Image at its step: evaluations 0 and 2, then 3 after the resume
    steps = [
        sorted(int(p.name.split("_")[1]) for p in r.glob("files/media/images/eval/samples_*.png"))
        for r in runs
    ]
    assert steps == [[0, 2], [3]]


def test_the_cli_prints_the_install_command_on_one_line(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from vgrpo_platform.cli import app as cli

    monkeypatch.setattr(tracking, "installed", lambda name: False)
    monkeypatch.delenv("VGRPO_DEBUG", raising=False)
    args = [
        "run",
        str(TOY),
        "--set",
        f"run.output_dir={tmp_path.as_posix()!r}",
        "--set",
        'log.trackers=["mlflow"]',
    ]
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        "error: log.trackers: 'mlflow' is not installed; pip install \"vgrpo[mlflow]\", "
        "or remove it from log.trackers"
    ]


def test_audio_evaluations_log_a_clip_of_each_first_prompt(tmp_path):
    pytest.importorskip("tensorboard", reason='pip install "vgrpo[tensorboard]"')
    import torch
    from accelerate import Accelerator
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from vgrpo_platform.protocols import Samples
    from vgrpo_platform.training.observe.tracking import Tracking

    accelerator = Accelerator(cpu=True, **Tracking.accelerator_kwargs(["tensorboard"], tmp_path))
    logged = Tracking(accelerator, ["tensorboard"], "audio", tmp_path)
    logged.start(run_name="a", config={"x": 1}, resumed_at=None)
    waves = torch.linspace(-0.5, 0.5, 6 * 2 * 800).reshape(6, 2, 800)  # 3 prompts x 2 samples, stereo
    logged.log_samples(7, None, Samples("audio", waves, sample_rate=8000), group_size=2)
    logged.finish()
    events = EventAccumulator(str(tmp_path / "tensorboard" / "audio"), size_guidance={"audio": 0})
    events.Reload()
    assert sorted(events.Tags()["audio"]) == ["eval/clip_0", "eval/clip_1", "eval/clip_2"]
    (clip,) = events.Audio("eval/clip_1")
    assert clip.step == 7 and clip.sample_rate == 8000 and clip.length_frames == 800


def test_a_videos_soundtrack_is_logged_as_audio(tmp_path):
    """A joint audio-video model's clips (``Samples.audio``, ``ltx2``): the soundtrack is logged as audio."""
    pytest.importorskip("tensorboard", reason='pip install "vgrpo[tensorboard]"')
    import torch
    from accelerate import Accelerator
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from vgrpo_platform.protocols import Samples
    from vgrpo_platform.training.observe.tracking import Tracking

    accelerator = Accelerator(cpu=True, **Tracking.accelerator_kwargs(["tensorboard"], tmp_path))
    logged = Tracking(accelerator, ["tensorboard"], "av", tmp_path)
    logged.start(run_name="a", config={"x": 1}, resumed_at=None)
    frames = torch.rand(4, 3, 3, 8, 8, generator=torch.Generator().manual_seed(0))  # [B, F, 3, H, W]
    waves = torch.linspace(-0.5, 0.5, 4 * 2 * 400).reshape(4, 2, 400)  # 2 prompts x 2 samples, stereo
    logged.log_samples(
        3, None, Samples("video", frames, fps=8.0, sample_rate=8000, audio=waves), group_size=2
    )
    logged.finish()
    events = EventAccumulator(str(tmp_path / "tensorboard" / "av"), size_guidance={"audio": 0})
    events.Reload()
    assert sorted(events.Tags()["audio"]) == ["eval/clip_0", "eval/clip_1"]
    (clip,) = events.Audio("eval/clip_1")
    assert clip.step == 3 and clip.sample_rate == 8000 and clip.length_frames == 400


def _image_samples(n_prompts: int, group: int) -> object:
    import torch

    from vgrpo_platform.protocols import Samples

    shades = torch.arange(n_prompts * group, dtype=torch.float32) / (n_prompts * group)
    return Samples("image", shades[:, None, None, None].expand(-1, 3, 4, 6).clone())  # [B, 3, H, W]


def test_single_samples_go_to_tensorboard_with_prompt_and_reward_captions(tmp_path):
    pytest.importorskip("tensorboard", reason='pip install "vgrpo[tensorboard]"')
    from accelerate import Accelerator
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from vgrpo_platform.training.observe.tracking import Tracking

    accelerator = Accelerator(cpu=True, **Tracking.accelerator_kwargs(["tensorboard"], tmp_path))
    logged = Tracking(accelerator, ["tensorboard"], "images", tmp_path)
    logged.start(run_name="i", config={"x": 1}, resumed_at=None)
    prompts = ["a red circle", "a blue square", "a green triangle"]
    rewards = [0.25, 0.5, 0.75, 1.0, 0.0, 0.125]  # two samples per prompt
    logged.log_samples(5, None, _image_samples(3, 2), 2, prompts=prompts, rewards=rewards)
    logged.finish()
    events = EventAccumulator(
        str(tmp_path / "tensorboard" / "images"), size_guidance={"images": 0, "tensors": 0}
    )
    events.Reload()
    assert sorted(events.Tags()["images"]) == ["eval/sample_00", "eval/sample_01", "eval/sample_02"]
    (image,) = events.Images("eval/sample_01")
    assert image.step == 5 and (image.width, image.height) == (6, 4)  # one sample, not a grid
    (text,) = events.Tensors("eval/sample_captions/text_summary")
    captions = text.tensor_proto.string_val[0].decode()
    # the first sample of each prompt: samples 0, 2 and 4
    assert captions.split("  \n") == [
        "sample_00: a red circle | 0.25",
        "sample_01: a blue square | 0.75",
        "sample_02: a green triangle | 0",
    ]


def test_wandb_gets_a_captioned_image_per_prompt_as_flow_grpo_logs_them(tmp_path, monkeypatch):
    import sys
    from types import SimpleNamespace

    from vgrpo_platform.training.observe.tracking import MAX_IMAGES, Tracking

    class Image:  # what the code under test builds: wandb.Image(pixels, caption=...)
        def __init__(self, data: object, caption: str | None = None) -> None:
            self.data, self.caption = data, caption

    logged_media: list[tuple[dict, int]] = []
    run = SimpleNamespace(log=lambda media, step: logged_media.append((media, step)))
    monkeypatch.setitem(sys.modules, "wandb", SimpleNamespace(Image=Image))
    accelerator = SimpleNamespace(is_main_process=True, get_tracker=lambda name, unwrap=False: run)
    tracking = Tracking(accelerator, ["wandb"], "p", tmp_path)
    tracking.started = True
    prompts = [f"prompt {i} " + "x" * 200 for i in range(20)]
    rewards = [float(i) / 40 for i in range(40)]
    tracking.log_samples(3, None, _image_samples(20, 2), 2, prompts=prompts, rewards=rewards)
    ((media, step),) = logged_media
    images = media["eval/sample_images"]
    assert step == 3 and len(images) == MAX_IMAGES == 16
    assert images[1].caption == f"{prompts[1][:100]} | 0.05"  # sample 2: prompt 1's first, reward 2/40
    assert images[0].data.shape == (4, 6, 3) and images[0].data.dtype.name == "uint8"
    assert int(images[1].data[0, 0, 0]) == round(2 / 40 * 255)
