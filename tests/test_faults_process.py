"""Faults of the processes around a run (issue 41): hangs that must time out, files a recipe must not
reach, signals that must say what they were, weights that must not be unpickled unasked.

Each test fails on the code before the fix it covers. Slow ones are marked ``slow``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import crashing_reward
import pytest

from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.errors import RewardError
from vgrpo_platform.host.collect import collect_components
from vgrpo_platform.host.manager import build_plugin_manager
from vgrpo_platform.training.loop import Trainer
from vgrpo_platform.training.observe.metrics import read_metrics, without_timing
from vgrpo_platform.training.recovery.checkpoint import list_checkpoints

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "recipes" / "toy.toml"
BASE = ("train.iterations=3", "eval.every=2", "log.checkpoint_every=0", "log.diagnostics_every=0")


@pytest.fixture(scope="module")
def registry():
    return collect_components(build_plugin_manager(extra_plugins=[crashing_reward]))


def toy(tmp_path: Path, name: str, *overrides: str, registry=None):
    base = [f"run.output_dir={tmp_path.as_posix()!r}", f"run.name={name!r}", "log.progress='none'"]
    return resolve_recipe(TOY, [*base, *BASE, *overrides], registry=registry)


def comparable(run_dir: Path) -> list[dict]:
    return [
        r
        for r in without_timing(read_metrics(run_dir / "metrics.jsonl"))
        if r["kind"] != "reward_worker_restarted"
    ]


# ------------------------------------------------------------------ 8a: a paused reward worker times out
def _reward(tmp_path: Path) -> list[str]:
    return [
        "rewards.0.name='crashing_brightness'",
        f"rewards.0.options.die_file={(tmp_path / 'never').as_posix()!r}",
    ]


def test_a_paused_reward_worker_times_out_and_is_restarted_with_identical_metrics(tmp_path, registry):
    """SIGSTOP on the worker (a paused process) used to freeze the collect for ever."""
    reference = Trainer(toy(tmp_path, "ref", *_reward(tmp_path), registry=registry)).run()
    worker = ["scoring.isolation='process'", "scoring.timeout_s=3"]
    trainer = Trainer(toy(tmp_path, "paused", *_reward(tmp_path), *worker, registry=registry))
    original, paused = trainer.iterate, []

    def iterate(iteration: int):
        if iteration == 2:
            for process in trainer.scorer._pool._processes.values():
                os.kill(process.pid, signal.SIGSTOP)
                paused.append(process)
        return original(iteration)

    trainer.iterate = iterate
    try:
        run_dir = trainer.run()
    finally:
        for process in paused:  # never leave a stopped child behind, whatever happened
            if process.is_alive():
                process.kill()
    assert paused and not any(p.is_alive() for p in paused)
    restarts = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "reward_worker_restarted"]
    assert len(restarts) == 1 and restarts[0]["iteration"] == 2
    assert "scoring.timeout_s = 3 s at iteration 2" in restarts[0]["reason"]
    assert comparable(run_dir) == comparable(reference)


@pytest.mark.slow
def test_a_worker_that_hangs_twice_stops_in_one_line_with_a_resumable_checkpoint(tmp_path, registry):
    hang = tmp_path / "hang"
    worker = [
        *_reward(tmp_path),
        f"rewards.0.options.hang_file={hang.as_posix()!r}",
        "rewards.0.options.once=false",
        "scoring.isolation='process'",
        "scoring.timeout_s=2",
        "scoring.max_restarts=1",
    ]
    trainer = Trainer(toy(tmp_path, "hangs", *worker, registry=registry))
    original = trainer.iterate

    def iterate(iteration: int):
        if iteration == 3:
            hang.touch()
        return original(iteration)

    trainer.iterate = iterate
    with pytest.raises(RewardError) as info:
        trainer.run()
    message = str(info.value)
    assert "\n" not in message
    assert "did not answer within scoring.timeout_s = 2 s at iteration 3" in message
    assert "checkpoint of iteration 2 saved" in message
    assert [p.name for p in list_checkpoints(trainer.run_dir)] == ["iter_000002"]

    hang.unlink()  # the reward answers again: --resume ends as a run that never hung
    resumed = Trainer(toy(tmp_path, "hangs", *worker, registry=registry), resume=True).run()
    reference = Trainer(toy(tmp_path, "ref", *_reward(tmp_path), registry=registry)).run()
    assert comparable(resumed) == comparable(reference)


# ------------------------------------------------------------------ 8b: a paused rank fails the others soon
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_paused_rank_fails_the_others_collectives_after_train_collective_timeout_s(tmp_path):
    """Two gloo processes built as a run builds them: the recipe's timeout reaches the process group, and
    rank 0's barrier ends in an error once rank 1 has been paused that long (torch's default: 30 min)."""
    import subprocess
    import sys

    out, port = tmp_path / "report.json", _free_port()
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    script = [sys.executable, str(ROOT / "tests" / "collective_timeout_cpu.py"), str(TOY), "3", str(out)]
    ranks = [
        subprocess.Popen(
            script,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    try:
        _, err = ranks[0].communicate(timeout=240)
        assert ranks[0].returncode == 0, err
    finally:
        for proc in ranks:  # rank 1 is stopped: SIGKILL ends it
            proc.kill()
            proc.communicate()
    report, rank1 = json.loads(out.read_text()), json.loads(out.with_suffix(".rank1.json").read_text())
    assert report["processes"] == rank1["processes"] == 2
    assert report["timeout_s"] == rank1["timeout_s"] == 3.0
    # it returned at all, with gloo's timeout: the paused rank did not hold it for 30 minutes
    assert "timed out" in report["barrier"].lower(), report["barrier"]


def test_the_trainer_hands_train_collective_timeout_s_to_the_process_group(tmp_path, monkeypatch):
    from vgrpo_platform.parallel import data_parallel as dp

    seen = {}

    class Built(Exception):
        pass

    def build_accelerator(device, mixed_precision, **kwargs):
        seen.update(kwargs)
        raise Built  # the wiring is what is checked: no model is loaded

    monkeypatch.setattr(dp, "build_accelerator", build_accelerator)
    with pytest.raises(Built):
        Trainer(toy(tmp_path, "pg", "train.collective_timeout_s=42"))
    assert seen["collective_timeout_s"] == 42.0
    handlers = dp.process_group_kwargs(42.0)
    assert [h.timeout.total_seconds() for h in handlers] == [42.0]
    assert dp.process_group_kwargs(None) == []


# ------------------------------------------------------------------ 11: signals say what they were
def _cli(tmp_path: Path, *args: str) -> list[str]:
    import sys

    return [sys.executable, *args, "--set", f"run.output_dir={tmp_path.as_posix()!r}"]


@pytest.mark.parametrize(
    "when, what", [("reporting", "Ctrl-C"), ("exiting", "Ctrl-C"), ("sigterm", "SIGTERM")]
)
def test_a_second_quick_ctrl_c_still_exits_130_in_one_line(tmp_path, when, what):
    """A second Ctrl-C while vgrpo reports the first one used to end the process killed by SIGINT (-2);
    one while it exits, with a traceback. A stop by SIGTERM was reported as a Ctrl-C."""
    import subprocess

    script = str(ROOT / "tests" / "interrupt_cli.py")
    done = subprocess.run(
        [*_cli(tmp_path, script, when, str(TOY))], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 130, done.stderr
    assert done.stderr.splitlines()[-1:] == [
        f"error: interrupted ({what}); a run resumes from its last checkpoint with --resume"
    ]
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr


@pytest.mark.slow
def test_sigterm_saves_and_says_sigterm_not_ctrl_c(tmp_path):
    """A scheduler's SIGTERM was reported as "interrupted (Ctrl-C)": the whole way, a real run."""
    import subprocess

    settings = [
        "run.name='run'",
        "train.iterations=200",
        "eval.every=0",
        "log.checkpoint_every=0",
        "log.progress='plain'",
    ]
    cli = _cli(
        tmp_path, "-m", "vgrpo_platform", "run", str(TOY), *[a for s in settings for a in ("--set", s)]
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cli, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "run" / "metrics.jsonl"
    try:
        for _ in range(2400):  # up to two minutes for the first iteration's record
            if metrics.exists() and '"kind": "train"' in metrics.read_text():
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert (
        err.splitlines()[-1]
        == "error: interrupted (SIGTERM); a run resumes from its last checkpoint with --resume"
    )
    assert "SIGTERM: saved iteration" in out + err
    assert list_checkpoints(tmp_path / "run"), "SIGTERM saves a checkpoint"


# ------------------------------------------------------------------ 10: a recipe's files stay in its folder
def _recipe_folder(tmp_path: Path) -> tuple[Path, Path]:
    """A recipe folder beside a private file outside it."""
    folder, secret = tmp_path / "recipes", tmp_path / "private" / "secret.txt"
    folder.mkdir()
    secret.parent.mkdir()
    secret.write_text("the contents of a file the recipe must not reach\n")
    return folder, secret


def test_a_prompt_file_symlinked_outside_the_recipes_folder_is_refused_in_one_line(tmp_path):
    from vgrpo_platform.config.recipe import load_prompts
    from vgrpo_platform.config.schema import PromptsSection
    from vgrpo_platform.errors import RecipeError

    folder, secret = _recipe_folder(tmp_path)
    (folder / "prompts.txt").symlink_to(secret)
    with pytest.raises(RecipeError) as info:
        load_prompts(PromptsSection(train_file="prompts.txt"), folder)
    message = str(info.value)
    assert "\n" not in message and message.startswith("prompts.train_file 'prompts.txt': a symlink")
    assert "prompts.allow_outside = true" in message
    # the recipe may say it trusts the link
    train, _ = load_prompts(PromptsSection(train_file="prompts.txt", allow_outside=True), folder)
    assert train == ["the contents of a file the recipe must not reach"]


def test_a_symlinked_folder_followed_by_dotdot_cannot_hide_where_a_prompt_file_lands(tmp_path):
    from vgrpo_platform.config.recipe import load_prompts
    from vgrpo_platform.config.schema import PromptsSection
    from vgrpo_platform.errors import RecipeError

    folder, secret = _recipe_folder(tmp_path)
    deep = tmp_path / "private" / "a"
    deep.mkdir()
    (folder / "data").symlink_to(deep)  # data/.. is private/, not the recipe folder's parent
    with pytest.raises(RecipeError, match="a symlink takes it outside"):
        load_prompts(PromptsSection(eval_file="data/../secret.txt"), folder)


def test_prompt_files_inside_the_folder_or_written_outside_it_are_still_read(tmp_path):
    from vgrpo_platform.config.recipe import load_prompts
    from vgrpo_platform.config.schema import PromptsSection

    folder, secret = _recipe_folder(tmp_path)
    (folder / "real.txt").write_text("inside\n")
    (folder / "link.txt").symlink_to(folder / "real.txt")  # a link that stays inside
    train, evals = load_prompts(
        PromptsSection(train_file="link.txt", eval_file="../private/secret.txt"), folder
    )
    assert train == ["inside"]  # and a path written to leave the folder (as benchmarks/worlds do) is read
    assert evals == ["the contents of a file the recipe must not reach"]


def test_vgrpo_check_refuses_the_symlinked_prompt_file_with_exit_2(tmp_path):
    from typer.testing import CliRunner

    from vgrpo_platform.cli.app import app

    folder, secret = _recipe_folder(tmp_path)
    recipe = folder / "toy.toml"
    recipe.write_text(TOY.read_text())
    (folder / "prompts.txt").symlink_to(secret)
    result = CliRunner().invoke(app, ["check", str(recipe), "--set", "prompts.train_file='prompts.txt'"])
    assert result.exit_code == 2
    [line] = result.stderr.splitlines()
    assert "prompts.train_file 'prompts.txt': a symlink takes it outside the recipe's folder" in line


# ------------------------------------------------------------------ 11: pickles need the recipe's trust
class _Poisoned:
    """Unpickling it calls a function: what a hostile .bin does (here a harmless one)."""

    def __reduce__(self):
        return (os.getcwd, ())


def _toy_with_pickled_transformer(tmp_path: Path, poisoned: bool) -> Path:
    """A toy model folder whose transformer weights are a pickle ``.bin`` instead of safetensors."""
    import pickle

    import torch
    from safetensors.torch import load_file

    from vgrpo_platform.host.collect import default_registry
    from vgrpo_platform.protocols import BuildContext

    spec = default_registry().get("adapter", "toy")
    spec.factory(spec.config(), BuildContext(device=torch.device("cpu"), seed=0, run_dir=tmp_path))
    transformer = tmp_path / "toy_model" / "transformer"
    [weights] = transformer.glob("*.safetensors")
    target = transformer / "diffusion_pytorch_model.bin"
    if poisoned:
        target.write_bytes(pickle.dumps(_Poisoned()))
    else:
        torch.save(load_file(weights), target)
    weights.unlink()
    return tmp_path / "toy_model"


def _load_toy(folder: Path, **options):
    import torch

    from vgrpo_platform.host.collect import default_registry
    from vgrpo_platform.protocols import BuildContext

    spec = default_registry().get("adapter", "toy")
    context = BuildContext(device=torch.device("cpu"), seed=0)
    return spec.factory(spec.config(model_path=str(folder), **options), context)


@pytest.mark.parametrize("poisoned", [False, True])
def test_pickle_weights_in_a_model_folder_are_refused_in_one_line_naming_the_file(tmp_path, poisoned):
    from vgrpo_platform.errors import VgrpoError

    folder = _toy_with_pickled_transformer(tmp_path, poisoned)
    with pytest.raises(VgrpoError) as info:  # a poisoned pickle used to end in an UnpicklingError traceback
        _load_toy(folder)
    message = str(info.value)
    assert "\n" not in message
    assert f"'{folder / 'transformer' / 'diffusion_pytorch_model.bin'}' holds pickle weights" in message
    assert (
        "convert them to safetensors" in message and "adapter.options.allow_pickle_weights = true" in message
    )


def test_allow_pickle_weights_loads_a_trusted_pickle(tmp_path):
    import torch

    folder = _toy_with_pickled_transformer(tmp_path, poisoned=False)
    adapter = _load_toy(folder, allow_pickle_weights=True)
    expected = torch.load(folder / "transformer" / "diffusion_pytorch_model.bin", weights_only=True)
    got = adapter.denoiser.state_dict()
    assert expected and all(torch.equal(got[k], v) for k, v in expected.items())
