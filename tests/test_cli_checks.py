"""What the command line checks for a user: help texts keep their words, ``--version``, ``--resume`` with
changed settings, a checkpoint that belongs to another recipe or is not a checkpoint, and ``--gpus N``
(the accelerate command it builds, the config it picks, and a real 2-process run on the CPU)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from benchmarks.throughput_models import FLUX_DEV
from vgrpo_platform.cli import app as cli
from vgrpo_platform.cli import launch
from vgrpo_platform.cli import sample as sample_module
from vgrpo_platform.config.recipe import resolve_recipe, save_resolved
from vgrpo_platform.errors import CheckpointError, RecipeError
from vgrpo_platform.training.recovery import recipe_changes
from vgrpo_platform.training.recovery.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from vgrpo_platform.training.session import fingerprint

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "recipes" / "toy.toml"
QUICKSTART = ROOT / "recipes" / "quickstart.toml"
ACCELERATE = ROOT / "recipes" / "accelerate"


@pytest.fixture
def runner(monkeypatch):
    monkeypatch.delenv("VGRPO_DEBUG", raising=False)
    monkeypatch.delenv(recipe_changes.CHECKED_ENV, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return CliRunner()


def invoke(runner, *args):
    return runner.invoke(cli.app, [str(a) for a in args], env={"COLUMNS": "200"})


def one_error_line(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# --------------------------------------------------------------------------- help texts and --version


def _commands(command, path=()):
    """Every command and group under ``command`` with its path (typer ships its own click)."""
    found = [(path, command)]
    for name, sub in getattr(command, "commands", {}).items():
        found += _commands(sub, (*path, name))
    return found


def _texts(command) -> list[str]:
    """What a command's --help is made of: its help and each parameter's help."""
    return [command.help or "", *(getattr(p, "help", None) or "" for p in command.params)]


BRACKETED = re.compile(r"\[+[A-Za-z_][\w.]*\]+(?:\.\w+)?")


def test_every_help_text_keeps_its_table_names_and_words(runner, monkeypatch):
    """Every command's --help, the plugins' commands and `vgrpo new`'s included, shows each bracketed
    table name (``[eval]``, ``[[rewards]].options``) and each word of its help texts."""
    monkeypatch.setattr(cli.app, "registered_commands", list(cli.app.registered_commands))
    cli._plugin_manager().hook.register_commands(app=cli.app)  # on this copy of the list only
    bracketed_seen = set()
    for path, command in _commands(typer.main.get_command(cli.app)):
        result = invoke(runner, *path, "--help")
        assert result.exit_code == 0, (path, result.output)
        shown = " ".join(result.stdout.split())
        for text in _texts(command):
            for name in BRACKETED.findall(text):
                bracketed_seen.add(name)
                assert name in shown, (path, name)
            for word in re.findall(r"[A-Za-z0-9]+", text):
                assert word in shown, (path, word)
    assert {"[eval]", "[[rewards]].options", "[[eval.rewards]]", "[rewards.options]"} <= bracketed_seen


def test_version_prints_the_installed_version(runner):
    result = invoke(runner, "--version")
    assert result.exit_code == 0
    assert result.stdout == f"vgrpo {importlib.metadata.version('vgrpo')}\n"


# --------------------------------------------------------------------------- --resume with changed settings


def _toy(tmp_path: Path, *overrides: str):
    return resolve_recipe(TOY, [f"run.output_dir={tmp_path.as_posix()!r}", "run.name='r'", *overrides])


def _started(tmp_path: Path, *overrides: str) -> Path:
    """A run directory as a started run leaves it: the recipe it ran with."""
    resolved = _toy(tmp_path, *overrides)
    save_resolved(resolved, tmp_path / "r")
    return tmp_path / "r"


def test_resume_accepts_safe_changes_with_a_note(tmp_path):
    run_dir = _started(tmp_path)
    new = _toy(tmp_path, "train.iterations=60", "log.progress='plain'", "eval.every=5")
    notes = recipe_changes.check_resume(new, run_dir, force=False)
    assert notes == [
        "note: resuming with changed settings: train.iterations 30 -> 60, eval.every 10 -> 5, "
        "log.progress 'auto' -> 'plain'"
    ]
    assert recipe_changes.check_resume(_toy(tmp_path), run_dir, force=False) == []


def test_resume_accepts_a_reward_served_elsewhere(tmp_path):
    """A restarted reward server on another port, scored in a worker process: the same scores."""
    remote = ["rewards.0.name='remote'", "rewards.0.options.url='http://127.0.0.1:8001'"]
    run_dir = _started(tmp_path, *remote)
    moved = _toy(
        tmp_path, *remote, "rewards.0.options.url='http://127.0.0.1:8002'", "scoring.isolation='process'"
    )
    assert recipe_changes.check_resume(moved, run_dir, force=False) == [
        "note: resuming with changed settings: rewards.0.options.url 'http://127.0.0.1:8001' -> "
        "'http://127.0.0.1:8002', scoring.isolation 'inline' -> 'process'"
    ]


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("train.lr=0.5", "train.lr 0.01 -> 0.5"),
        ("run.seed=3", "run.seed 0 -> 3"),
        ("rollout.group_size=4", "rollout.group_size 8 -> 4"),
        ("eval.seed=5", "eval.seed 1234 -> 5"),  # the evaluations before and after would not compare
        ("rewards.0.weight=2", "rewards.0.weight 1.0 -> 2.0"),
    ],
)
def test_resume_refuses_a_change_that_breaks_exact_resume_unless_forced(tmp_path, setting, named):
    run_dir = _started(tmp_path)
    new = _toy(tmp_path, setting, "train.iterations=40")
    with pytest.raises(RecipeError) as info:
        recipe_changes.check_resume(new, run_dir, force=False)
    message = str(info.value)
    assert named in message and "--force" in message
    assert "(also changed, safe: train.iterations 30 -> 40)" in message
    notes = recipe_changes.check_resume(new, run_dir, force=True)
    assert notes == [
        f"warning: resuming with changed settings (--force): {named}",
        "note: resuming with changed settings: train.iterations 30 -> 40",
    ]


def test_more_iterations_break_a_cosine_schedule_only(tmp_path):
    run_dir = _started(tmp_path, "train.lr_schedule='cosine'")
    with pytest.raises(RecipeError, match=r"train.iterations 30 -> 60; they break"):
        recipe_changes.check_resume(
            _toy(tmp_path, "train.lr_schedule='cosine'", "train.iterations=60"), run_dir, force=False
        )


def test_a_model_change_is_refused_even_with_force(tmp_path):
    run_dir = _started(tmp_path)
    with pytest.raises(CheckpointError, match=r"different model or LoRA setup.*train.lora_rank 8 -> 4"):
        recipe_changes.check_resume(_toy(tmp_path, "train.lora_rank=4"), run_dir, force=True)


def test_the_keys_a_checkpoint_is_refused_for_are_the_fingerprints(tmp_path):
    """Each model key changes ``session.fingerprint`` (what --resume compares); a safe key does not."""
    base = fingerprint(_toy(tmp_path).recipe)
    for setting in (
        "adapter.options.resolution=8",
        "train.finetune='full'",
        "train.lora_rank=4",
        "train.lora_alpha=4",
        "train.lora_targets=['to_q']",
    ):
        assert fingerprint(_toy(tmp_path, setting).recipe) != base, setting
    for setting in ("train.iterations=5", "eval.every=2", "log.keep_last=1", "train.lr=0.5"):
        assert fingerprint(_toy(tmp_path, setting).recipe) == base, setting


def _fake_training(monkeypatch):
    calls = []
    module = type(sys)("vgrpo_platform.training.loop")
    module.run = lambda *a, **k: calls.append((a, k))
    monkeypatch.setitem(sys.modules, "vgrpo_platform.training.loop", module)
    return calls


def test_cli_resume_with_a_changed_lr_is_one_line_and_force_goes_on(runner, tmp_path, monkeypatch):
    calls = _fake_training(monkeypatch)
    _started(tmp_path)
    where = ["--set", f"run.output_dir={tmp_path.as_posix()!r}", "--set", "run.name='r'"]
    line = one_error_line(invoke(runner, "run", TOY, *where, "--set", "train.lr=0.5", "--resume"))
    assert "train.lr 0.01 -> 0.5" in line and "--force" in line
    assert calls == []
    result = invoke(runner, "run", TOY, *where, "--set", "train.lr=0.5", "--resume", "--force")
    assert result.exit_code == 0, result.output
    assert result.stderr == "warning: resuming with changed settings (--force): train.lr 0.01 -> 0.5\n"
    assert calls[-1][1] == {"resume": True}
    line = one_error_line(invoke(runner, "run", TOY, *where, "--force"))
    assert "--force only applies with --resume" in line


# --------------------------------------------------------------------------- sample / eval --checkpoint


def _checkpoint(tmp_path: Path, *run_overrides: str, weights: dict | None = None) -> Path:
    """A run directory with one checkpoint of the toy recipe under ``run_overrides``."""
    run_dir = _started(tmp_path, *run_overrides)
    state = {"fingerprint": fingerprint(_toy(tmp_path, *run_overrides).recipe), "prompt_sampler": {}}
    save_checkpoint(run_dir, 2, weights=weights or {}, optimizer={}, rng={}, state=state, keep_last=1)
    return run_dir


def _no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the checkpoint should have been refused before any model loads")

    monkeypatch.setattr(sample_module, "build_session", refuse)


def test_sample_names_the_lora_key_that_differs_before_loading_a_model(tmp_path, monkeypatch):
    run_dir = _checkpoint(tmp_path, "train.lora_rank=4")
    _no_model(monkeypatch)
    with pytest.raises(CheckpointError) as info:
        sample_module.sample_to_folder(_toy(tmp_path), out_dir=tmp_path / "out", checkpoint=run_dir)
    message = str(info.value)
    assert "train.lora_rank 4 -> 8" in message and str(run_dir / "recipe.toml") in message


def test_sample_with_another_adapters_recipe_is_one_line(runner, tmp_path, monkeypatch):
    """The issue's case: a toy run sampled with the quickstart's recipe (another adapter)."""
    run_dir = _checkpoint(tmp_path)
    _no_model(monkeypatch)
    line = one_error_line(
        invoke(runner, "sample", QUICKSTART, "--checkpoint", run_dir, "--out", tmp_path / "o")
    )
    assert "adapter.name 'toy' -> 'shapes'" in line and "Traceback" not in line


def test_weights_of_another_shape_are_one_error_naming_the_option(tmp_path, capsys):
    """An adapter option that is not refused up front (here the toy's depth) but changes the weights:
    the note names it, and loading stops with an error instead of a RuntimeError from copy_."""
    from vgrpo_platform.protocols import BuildContext

    run = _toy(tmp_path, "adapter.options.num_layers=2")
    session = sample_module.build_session(run, BuildContext(device="cpu"))
    weights = {k: p.detach().clone() for k, p in session.trainable.items()}
    run_dir = _checkpoint(tmp_path, "adapter.options.num_layers=2", weights=weights)
    with pytest.raises(CheckpointError) as info:
        sample_module.trained_session(_toy(tmp_path), BuildContext(device="cpu"), run_dir)
    assert "adapter.options.num_layers 2 -> None" in capsys.readouterr().err
    message = str(info.value)
    assert "does not fit this recipe's model" in message and "adapter.options.num_layers 2 -> None" in message


def test_a_matching_checkpoint_loads_its_weights(tmp_path):
    from vgrpo_platform.protocols import BuildContext

    session = sample_module.build_session(_toy(tmp_path), BuildContext(device="cpu"))
    weights = {k: p.detach() + 1.0 for k, p in session.trainable.items()}
    run_dir = _checkpoint(tmp_path, weights=weights)
    loaded, ckpt = sample_module.trained_session(_toy(tmp_path), BuildContext(device="cpu"), run_dir)
    assert ckpt is not None and ckpt.path == list_checkpoints(run_dir)[-1]
    assert all((p.detach() == weights[k]).all() for k, p in loaded.trainable.items())


def test_an_empty_or_foreign_folder_says_what_is_missing_and_never_to_delete(runner, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    line = one_error_line(invoke(runner, "eval", TOY, "--checkpoint", empty))
    assert "neither a run directory" in line and "trainable.safetensors" in line
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "state.json").write_text("{}")
    line2 = one_error_line(invoke(runner, "sample", TOY, "--checkpoint", partial, "--out", tmp_path / "o"))
    assert "is incomplete: it lacks trainable.safetensors, optimizer.pt, rng.safetensors" in line2
    assert "delete" not in line + line2


def test_a_damaged_checkpoint_names_the_alternatives_not_deletion(tmp_path):
    run_dir = _checkpoint(tmp_path)
    ckpt = list_checkpoints(run_dir)[-1]
    (ckpt / "state.json").write_text("{not json")
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(ckpt)
    assert "unreadable" in str(info.value) and "delete" not in str(info.value)
    assert str(run_dir) in str(info.value)


# --------------------------------------------------------------------------- --gpus N

# FLUX.1-dev's published transformer config: built on the meta device, nothing downloaded
FLUX_CONFIG = {"_class_name": "FluxTransformer2DModel", **FLUX_DEV}

FLUX_RECIPE = """
[adapter]
name = "flux"
[adapter.options]
model = "{model}"
[[rewards]]
name = "brightness"
[prompts]
train = ["a prompt"]
[rollout]
prompts_per_iteration = 2
[train]
finetune = "{finetune}"
micro_batch_size = 1
gradient_checkpointing = true
"""

GIB = 2**30


def _flux(tmp_path: Path, finetune: str):
    folder = tmp_path / "flux" / "transformer"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(FLUX_CONFIG))
    path = tmp_path / f"{finetune}.toml"
    path.write_text(FLUX_RECIPE.format(model=(tmp_path / "flux").as_posix(), finetune=finetune))
    return cli._resolve(path, None)


@pytest.fixture
def hub_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_lora_on_two_80gib_gpus_takes_ddp_and_full_finetuning_a_sharded_config(tmp_path, hub_offline):
    lora = launch.choose(_flux(tmp_path, "lora"), 2, ACCELERATE, 80 * GIB)
    assert lora.config == ACCELERATE / "ddp_8gpu.yaml" and "ddp_8gpu.yaml" in lora.why
    full = _flux(tmp_path, "full")
    chosen = launch.choose(full, 2, ACCELERATE, 80 * GIB)
    # 12 B bf16 weights: DDP's weights + grads + AdamW (about 89 GiB) do not fit; ZeRO-2 shards the rest
    assert chosen.config == ACCELERATE / "deepspeed_zero2_8gpu.yaml"
    with pytest.MonkeyPatch.context() as patch:  # without DeepSpeed installed: FSDP2
        patch.setattr(launch, "_usable", lambda sharding: sharding != "zero2")
        assert launch.choose(full, 2, ACCELERATE, 80 * GIB).config == ACCELERATE / "fsdp2_8gpu.yaml"
    with pytest.raises(RecipeError, match="does not fit 2 GPUs of 16 GiB under any shipped config"):
        launch.choose(full, 2, ACCELERATE, 16 * GIB)


def test_without_a_gpu_the_processes_run_on_the_cpu_under_ddp(tmp_path):
    chosen = launch.choose(_toy(tmp_path, "train.finetune='full'"), 2, ACCELERATE, None)
    assert chosen.config == ACCELERATE / "ddp_8gpu.yaml" and "CPU processes (gloo)" in chosen.why


def test_the_accelerate_command_runs_vgrpo_run_with_the_other_options(runner, tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(launch, "start", lambda command: started.append(command) or 0)
    calls = _fake_training(monkeypatch)
    sets = ["--set", f"run.output_dir={tmp_path.as_posix()!r}", "--set", "train.iterations=2"]
    result = invoke(runner, "run", TOY, "--gpus", 2, *sets, "--debug")
    assert result.exit_code == 0, result.output
    assert started == [
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(ACCELERATE / "ddp_8gpu.yaml"),
            "--num_processes",
            "2",
            "--main_process_port",
            "0",
            "-m",
            "vgrpo_platform.cli",
            "run",
            str(TOY),
            *sets,
            "--debug",
        ]
    ]
    assert calls == [] and result.stdout.startswith("launch: 2 CPU processes (gloo), ddp_8gpu.yaml")
    result = invoke(runner, "run", TOY, "--gpus", 1, *sets)  # one process: this one, no launcher
    assert result.exit_code == 0 and len(started) == 1 and calls[-1][1] == {"resume": False}


def test_launch_problems_are_one_line_before_any_process_starts(runner, tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "start", lambda command: pytest.fail("nothing should start"))
    where = ["--set", f"run.output_dir={tmp_path.as_posix()!r}"]
    line = one_error_line(invoke(runner, "run", TOY, "--gpus", 3, *where))  # 2 prompts per iteration
    assert "does not split evenly over 3 processes" in line
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert "under accelerate launch or torchrun leave it out" in one_error_line(
        invoke(runner, "run", TOY, "--gpus", 2, *where)
    )


def test_gpus_2_on_the_cpu_starts_two_processes_that_finish(tmp_path):
    sets = [
        f"run.output_dir={tmp_path.as_posix()!r}",
        "run.name='two'",
        "train.iterations=2",
        "rollout.group_size=2",
        "eval.every=0",
        "eval.max_prompts=2",
        "eval.samples_per_prompt=1",
        "log.progress='plain'",
        "log.save_grids=false",
    ]
    args = [sys.executable, "-m", "vgrpo_platform", "run", str(TOY), "--gpus", "2"]
    for item in sets:
        args += ["--set", item]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "launch: 2 CPU processes (gloo)" in done.stdout
    assert "data parallel: 2 processes, DDP" in done.stdout
    assert [p.name for p in list_checkpoints(tmp_path / "two")] == ["iter_000002"]
