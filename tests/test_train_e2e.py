"""End-to-end V-GRPO runs of the toy recipe: the reward rises, every trainable weight moves, runs resume
exactly after Ctrl-C or SIGKILL, gradient accumulation is exact, and bad resumes fail clearly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from toy_runs import crash_at

from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.errors import CheckpointError, RecipeError
from vgrpo_platform.training.loop import Trainer
from vgrpo_platform.training.observe.metrics import read_metrics, without_timing
from vgrpo_platform.training.recovery.checkpoint import list_checkpoints

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "recipes" / "toy.toml"


def toy(tmp_path: Path, name: str, *overrides: str):
    base = [f"run.output_dir={tmp_path.as_posix()!r}", f"run.name={name!r}", "log.progress='none'"]
    return resolve_recipe(TOY, [*base, *overrides])


def test_toy_run_raises_reward_and_changes_every_trainable_parameter(tmp_path):
    trainer = Trainer(toy(tmp_path, "e2e", "train.iterations=10", "eval.every=5"))
    before = {k: p.detach().clone() for k, p in trainer.session.trainable.items()}
    assert before, "LoRA should add trainable parameters"
    frozen = {
        k: p.detach().clone()
        for k, p in trainer.session.adapter.denoiser.named_parameters()
        if not p.requires_grad
    }
    run_dir = trainer.run()

    after = trainer.session.trainable
    unchanged = [k for k, p in after.items() if torch.equal(p.detach(), before[k])]
    assert not unchanged, f"trainable parameters that never changed: {unchanged}"
    for name, p in trainer.session.adapter.denoiser.named_parameters():
        if name in frozen:
            assert torch.equal(p.detach(), frozen[name]), f"frozen base weight {name} changed"

    records = read_metrics(run_dir / "metrics.jsonl")
    evals = [r for r in records if r["kind"] == "eval"]
    trains = [r for r in records if r["kind"] == "train"]
    assert [r["iteration"] for r in evals] == [0, 5, 10]
    assert len(trains) == 10
    assert evals[-1]["reward"] > evals[0]["reward"] + 0.05, (evals[0]["reward"], evals[-1]["reward"])
    assert (run_dir / "samples" / "before_after.png").is_file()
    for key in (
        "reward/brightness",
        "advantage_std",
        "ratio_mean",
        "kl",
        "surrogate",
        "grad_norm",
        "time_rollout",
        "time_reward",
        "time_train",
        "zero_std_fraction",
        "clip_fraction",
    ):
        assert key in trains[0], key
    assert all(r["ratio_mean"] == pytest.approx(1.0, abs=1e-6) for r in trains), (
        "one step per iteration is on-policy"
    )
    assert (run_dir / "resolved_recipe.json").is_file()
    assert (run_dir / "samples" / "eval_000010.png").is_file()
    assert [p.name for p in list_checkpoints(run_dir)] == ["iter_000010"]


def test_micro_batching_equals_the_full_batch(tmp_path):
    """Gradient accumulation over micro-batches gives the gradient of one big batch."""
    grads = []
    for micro in (16, 5):
        trainer = Trainer(
            toy(tmp_path, f"mb{micro}", "train.iterations=1", f"train.micro_batch_size={micro}")
        )
        captured: dict[str, torch.Tensor] = {}

        def capture(*args, trainer=trainer, captured=captured, **kwargs):
            captured.update({k: p.grad.clone() for k, p in trainer.session.trainable.items()})

        trainer.optimizer.step = capture
        assert trainer.session.surrogate.gradient_steps == 1  # planned: loss's forward is the old policy's
        trainer.iterate(1)
        grads.append(captured)
    scale = max(g.abs().max().item() for g in grads[0].values())
    assert scale > 0
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-3, atol=1e-5 * scale)


def test_several_gradient_steps_go_off_policy(tmp_path):
    trainer = Trainer(
        toy(
            tmp_path,
            "offp",
            "train.iterations=2",
            "eval.every=0",
            "train.gradient_steps_per_iteration=4",
            "train.micro_batch_size=4",
        )
    )
    assert trainer.session.surrogate.gradient_steps == 4  # planned: prepare stores the old policy
    trainer.run()
    trains = [r for r in read_metrics(trainer.run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert all(r["gradient_steps"] == 4 for r in trains)
    assert any(
        r["ratio_max"] != pytest.approx(1.0, abs=1e-7) or r["ratio_min"] != pytest.approx(1.0, abs=1e-7)
        for r in trains
    ), "after the first mini-batch the policy has moved"


def test_resume_after_a_crash_reproduces_the_uninterrupted_run(tmp_path, monkeypatch):
    settings = ("train.iterations=6", "eval.every=3", "log.checkpoint_every=2")
    reference = Trainer(toy(tmp_path, "ref", *settings)).run()

    crashing = Trainer(toy(tmp_path, "crash", *settings))
    crash_at(monkeypatch, 5, crashing.run)
    assert [p.name for p in list_checkpoints(crashing.run_dir)][-1] == "iter_000004"

    resumed_dir = Trainer(toy(tmp_path, "crash", *settings), resume=True).run()
    assert without_timing(read_metrics(resumed_dir / "metrics.jsonl")) == without_timing(
        read_metrics(reference / "metrics.jsonl")
    )


def test_a_new_run_refuses_to_overwrite_checkpoints_and_resume_needs_one(tmp_path):
    Trainer(toy(tmp_path, "once", "train.iterations=1", "eval.every=0")).run()
    with pytest.raises(RecipeError, match="--resume"):
        Trainer(toy(tmp_path, "once", "train.iterations=1"))
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        Trainer(toy(tmp_path, "never", "train.iterations=1"), resume=True)
    with pytest.raises(CheckpointError, match="different model or LoRA"):
        Trainer(toy(tmp_path, "once", "train.iterations=2", "train.lora_rank=4"), resume=True)


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys):
    run_dir = Trainer(
        toy(tmp_path, "dmg", "train.iterations=4", "eval.every=0", "log.checkpoint_every=2")
    ).run()
    newest = list_checkpoints(run_dir)[-1]
    (newest / "trainable.safetensors").write_bytes(b"not a safetensors file")
    trainer = Trainer(toy(tmp_path, "dmg", "train.iterations=4", "eval.every=0"), resume=True)
    assert "skipping checkpoint" in capsys.readouterr().err
    assert trainer.start_iteration == 2
    assert newest.exists(), "a damaged checkpoint is skipped, never deleted"


def test_full_finetune_trains_every_weight_and_resumes(tmp_path):
    trainer = Trainer(
        toy(
            tmp_path,
            "full",
            "train.finetune='full'",
            "train.lr=1e-3",
            "train.iterations=2",
            "eval.every=0",
            "surrogate.options.kl_beta=0.1",
            "surrogate.options.kl_anchor='reference'",
        )
    )
    denoiser_before = {k: p.detach().clone() for k, p in trainer.session.adapter.denoiser.named_parameters()}
    assert set(trainer.session.trainable) == set(denoiser_before)
    trainer.run()
    moved = [
        k
        for k, p in trainer.session.adapter.denoiser.named_parameters()
        if not torch.equal(p.detach(), denoiser_before[k])
    ]
    assert len(moved) > len(denoiser_before) // 2
    kls = [r["kl"] for r in read_metrics(trainer.run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert kls[0] == 0.0 and kls[1] > 0.0, "the reference KL is zero until the weights move"


def _wait_for_lines(path: Path, kind: str, count: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (
            path.exists()
            and sum(f'"kind": "{kind}"' in line for line in path.read_text().splitlines()) >= count
        ):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"{path} never reached {count} {kind} records")


def test_cli_run_interrupted_then_resumed_matches_uninterrupted(tmp_path):
    """Ctrl-C saves a checkpoint and exits 130; SIGKILL loses only the iterations since the last
    checkpoint. Either way ``--resume`` ends with the same metrics as a run never stopped."""
    settings = [
        "--set",
        "train.iterations=8",
        "--set",
        "eval.every=4",
        "--set",
        "log.checkpoint_every=2",
        "--set",
        f"run.output_dir={tmp_path.as_posix()!r}",
        "--set",
        "log.progress='plain'",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cli = [sys.executable, "-m", "vgrpo_platform", "run", str(TOY), *settings]
    subprocess.run([*cli, "--set", "run.name='ref'"], check=True, env=env, capture_output=True, timeout=600)
    reference = without_timing(read_metrics(tmp_path / "ref" / "metrics.jsonl"))

    for sig in (signal.SIGINT, signal.SIGKILL):
        name = f"cut_{sig.name}"
        proc = subprocess.Popen(
            [*cli, "--set", f"run.name={name!r}"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        metrics = tmp_path / name / "metrics.jsonl"
        _wait_for_lines(metrics, "train", 3, proc)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
        if sig == signal.SIGINT:
            assert proc.returncode == 130, err
            assert "--resume" in out + err
            saved = int(list_checkpoints(tmp_path / name)[-1].name.split("_")[1])
            done = [r for r in read_metrics(metrics) if r["kind"] == "train"]
            assert saved == done[-1]["iteration"], "Ctrl-C checkpoints the last finished iteration"
        else:
            assert proc.returncode == -signal.SIGKILL
        resumed = subprocess.run(
            [*cli, "--set", f"run.name={name!r}", "--resume"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert resumed.returncode == 0, resumed.stderr
        assert without_timing(read_metrics(metrics)) == reference, sig.name


def test_sample_writes_images_from_a_trained_run(tmp_path):
    from vgrpo_platform.cli.sample import sample_to_folder

    resolved = toy(tmp_path, "samp", "train.iterations=1", "eval.every=0")
    Trainer(resolved).run()
    out = tmp_path / "out"
    files = sample_to_folder(
        resolved,
        out_dir=out,
        checkpoint=tmp_path / "samp",
        prompts=["a bright image"],
        num_per_prompt=3,
        seed=7,
    )
    assert [f.suffix for f in files] == [".png"] * 3
    index = [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in index] == ["a bright image"] * 3
    with pytest.raises(CheckpointError, match="does not exist"):
        sample_to_folder(resolved, out_dir=out, checkpoint=tmp_path / "nope")
