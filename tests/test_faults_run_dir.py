"""Run directories and checkpoints on a shared host (issue 41, findings 4-7 and 10): one live run per run
directory (a lock naming its holder), a previous run's records never overwritten, ``run.name`` a plain
name, checkpoints checked inside so that malformed contents fall back to an older one with a warning
naming the file, re-saves that a kill cannot lose, and a full disk as one line. Also the damage that was
already handled (truncated, zero-byte, corrupt-header and pickle-poisoned files), so it stays handled."""

from __future__ import annotations

import errno
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from vgrpo_platform.cli import app as cli
from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.errors import CheckpointError, RecipeError, RunFilesError
from vgrpo_platform.training.loop import Trainer
from vgrpo_platform.training.observe.metrics import MetricsWriter, read_metrics
from vgrpo_platform.training.recovery import checkpoint as checkpoint_module
from vgrpo_platform.training.recovery import disk_space, recipe_changes
from vgrpo_platform.training.recovery.checkpoint import (
    checkpoint_dir,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from vgrpo_platform.training.recovery.run_lock import LOCK_FILE

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "recipes" / "toy.toml"
SHORT = ("train.iterations=4", "eval.every=0", "log.checkpoint_every=2", "log.keep_last=2")


def toy(out: Path, name: str, *overrides: str):
    base = [f"run.output_dir={out.as_posix()!r}", f"run.name={name!r}", "log.progress='none'"]
    return resolve_recipe(TOY, [*base, *SHORT, "log.save_grids=false", *overrides])


@pytest.fixture
def runner(monkeypatch):
    monkeypatch.delenv("VGRPO_DEBUG", raising=False)
    monkeypatch.delenv(recipe_changes.CHECKED_ENV, raising=False)
    return CliRunner()


def invoke(runner, *args):
    return runner.invoke(cli.app, [str(a) for a in args], env={"COLUMNS": "200"})


def one_error_line(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), repr(result.stderr)
    return lines[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished toy run with checkpoints of iterations 2 and 4 (copied by each test that damages it)."""
    out = tmp_path_factory.mktemp("trained")
    return Trainer(toy(out, "r")).run()


def copy_of(trained: Path, tmp_path: Path) -> Path:
    shutil.copytree(trained, tmp_path / "r", ignore=shutil.ignore_patterns(LOCK_FILE))
    return tmp_path / "r"


HOLD = """
import sys, time
from vgrpo_platform.training.recovery.run_lock import RunLock
RunLock.acquire(sys.argv[1])
print("locked", flush=True)
time.sleep(120)
"""


@pytest.fixture
def holder(tmp_path):
    """Start a process that holds a run directory's lock: ``holder(run_dir)`` returns it."""
    started: list[subprocess.Popen] = []

    def start(run_dir: Path) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


# --------------------------------------------------------------------------- 4: one run per directory


def test_a_run_or_resume_in_a_live_run_directory_is_one_line_naming_the_holder(runner, tmp_path, holder):
    proc = holder(tmp_path / "live")
    where = ["--set", f"run.output_dir={tmp_path.as_posix()!r}", "--set", "run.name='live'"]
    for extra in ([], ["--resume"]):
        line = one_error_line(invoke(runner, "run", TOY, *where, "--set", "train.iterations=1", *extra))
        assert f"in use by process {proc.pid}" in line and "run.name=<new name>" in line
    assert not (tmp_path / "live" / "metrics.jsonl").exists(), "nothing of the live run was touched"


def test_the_lock_is_held_for_the_run_and_freed_when_it_ends(tmp_path):
    trainer = Trainer(toy(tmp_path, "mine", "train.iterations=1", "log.checkpoint_every=0"))
    probe = [sys.executable, "-c", HOLD.replace("time.sleep(120)", ""), str(trainer.run_dir)]
    blocked = subprocess.run(probe, capture_output=True, text=True, timeout=120)
    assert blocked.returncode != 0 and f"in use by process {os.getpid()}" in blocked.stderr
    trainer.run()
    assert subprocess.run(probe, capture_output=True, text=True, timeout=120).stdout.strip() == "locked"


def test_pruning_spares_a_live_processes_temp_folder(tmp_path, holder):
    live = holder(tmp_path / "other").pid
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    root = checkpoint_dir(tmp_path / "run")
    for pid in (live, dead.pid):
        (root / f".tmp_iter_000001_{pid}").mkdir(parents=True)
    _save(tmp_path / "run", 1)
    assert (root / f".tmp_iter_000001_{live}").is_dir(), "another live process's write is not ours to delete"
    assert not (root / f".tmp_iter_000001_{dead.pid}").exists(), "a dead process's leftovers are pruned"


def test_a_directory_with_records_but_no_checkpoint_is_not_overwritten(tmp_path, capsys):
    run_dir = tmp_path / "crashed"
    run_dir.mkdir()
    record = {"kind": "train", "iteration": 1, "reward": 0.5}
    (run_dir / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(RecipeError, match=r"already holds a run \(metrics.jsonl\).*--resume.*run.name"):
        Trainer(toy(tmp_path, "crashed"))
    assert read_metrics(run_dir / "metrics.jsonl") == [record]
    trainer = Trainer(toy(tmp_path, "crashed"), resume=True)  # what the error offers: start it over
    assert "--resume starts the run over from iteration 0" in capsys.readouterr().err
    assert trainer.start_iteration == 0 and read_metrics(run_dir / "metrics.jsonl") == []


@pytest.mark.parametrize("name", ["../../escaped", "a/b", "/abs", "..", ".", "", "a\\b"])
def test_run_name_is_a_plain_name(tmp_path, name):
    with pytest.raises(RecipeError) as info:
        toy(tmp_path, name)
    message = str(info.value)
    assert "run.name" in message and "plain folder name" in message and "run.output_dir" in message


# --------------------------------------------------------------------------- 5: checked contents


def _state(path: Path) -> dict:
    return json.loads((path / "state.json").read_text())


def _edit_state(key: str, value: object):
    def edit(path: Path) -> None:
        state = _state(path)
        if value is KeyError:
            del state[key]
        else:
            state[key] = value
        (path / "state.json").write_text(json.dumps(state))

    return edit


def _write(name: str, data: bytes):
    return lambda path: (path / name).write_bytes(data)


def _truncate(name: str):
    return lambda path: (path / name).write_bytes((path / name).read_bytes()[:40])


MARKER = Path(tempfile.gettempdir()) / f"vgrpo_poisoned_marker_{os.getpid()}"  # written if unpickled


class _Poison:
    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


DAMAGE = {  # what is wrong -> (how, the words the warning names it by)
    "state list": (_write("state.json", b"[]"), "state.json: holds a list"),
    "state empty": (_write("state.json", b"{}"), "state.json: has no 'iteration'"),
    "no prompt_sampler": (_edit_state("prompt_sampler", KeyError), "'prompt_sampler'"),
    "garbage prompt_sampler": (_edit_state("prompt_sampler", "garbage"), "'prompt_sampler'"),
    "iteration six": (_edit_state("iteration", "six"), "'iteration' is 'six'"),
    "iteration huge": (_edit_state("iteration", 1000000000), "'iteration' is 1000000000"),
    "rng other keys": (
        lambda p: save_file({"other": torch.zeros(3, dtype=torch.uint8)}, str(p / "rng.safetensors")),
        "rng.safetensors: holds ['other']",
    ),
    "optimizer empty": (lambda p: torch.save({}, p / "optimizer.pt"), "optimizer.pt: holds {}"),
    "weights renamed": (
        lambda p: save_file({"x": torch.zeros(2)}, str(p / "trainable.safetensors")),
        "trainable.safetensors: does not fit the model",
    ),
    # held before issue 41, kept: unreadable files
    "truncated weights": (_truncate("trainable.safetensors"), "unreadable"),
    "zero-byte optimizer": (_write("optimizer.pt", b""), "unreadable"),
    "corrupt header": (_write("rng.safetensors", b"\xff" * 8 + b"{garbage"), "unreadable"),
    "pickle-poisoned optimizer": (_write("optimizer.pt", pickle.dumps(_Poison())), "unreadable"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_resume_skips_a_malformed_newest_checkpoint_with_a_warning_naming_it(trained, tmp_path, capsys, case):
    run_dir = copy_of(trained, tmp_path)
    damage, words = DAMAGE[case]
    newest = list_checkpoints(run_dir)[-1]
    damage(newest)
    MARKER.unlink(missing_ok=True)
    trainer = Trainer(toy(tmp_path, "r"), resume=True)
    err = capsys.readouterr().err
    assert f"skipping checkpoint {newest}" in err and words in err, err
    assert trainer.start_iteration == 2, "the older checkpoint is the one resumed"
    assert newest.exists(), "a damaged checkpoint is skipped, never deleted"
    assert not MARKER.exists(), "nothing was unpickled"
    trainer.release()


def test_state_empty_object_is_not_called_another_models(trained, tmp_path):
    run_dir = copy_of(trained, tmp_path)
    for ckpt in list_checkpoints(run_dir):
        (ckpt / "state.json").write_text("{}")
    with pytest.raises(CheckpointError) as info:
        Trainer(toy(tmp_path, "r"), resume=True)
    assert "different model" not in str(info.value) and "no usable checkpoint" in str(info.value)


def test_eval_of_a_named_malformed_checkpoint_is_one_line(runner, trained, tmp_path):
    run_dir = copy_of(trained, tmp_path)
    newest = list_checkpoints(run_dir)[-1]
    (newest / "state.json").write_text("[]")
    line = one_error_line(invoke(runner, "eval", TOY, "--checkpoint", newest, "--out", tmp_path / "e"))
    assert f"checkpoint {newest} is unusable: state.json: holds a list" in line


def test_sample_says_which_checkpoint_it_used_and_why_not_the_newest(runner, trained, tmp_path):
    run_dir = copy_of(trained, tmp_path)
    newest = list_checkpoints(run_dir)[-1]
    (newest / "optimizer.pt").write_bytes(b"")
    result = invoke(runner, "sample", TOY, "--checkpoint", run_dir, "--out", tmp_path / "s", "--num", "1")
    assert result.exit_code == 0, result.output
    used = [line for line in result.stderr.splitlines() if line.startswith("checkpoint: ")]
    assert used == [
        f"checkpoint: {run_dir / 'checkpoints' / 'iter_000002'} (iteration 2), an older one: the newer "
        f"iter_000004: {load_error(newest)}"
    ]


def load_error(path: Path) -> str:
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    return info.value.reason  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- 6: atomic re-save


def _save(run_dir: Path, iteration: int, value: float = 0.0, keep_last: int = 1) -> Path:
    return save_checkpoint(
        run_dir,
        iteration,
        weights={"w": torch.full((2,), value)},
        optimizer={},
        rng={},
        state={"fingerprint": "f"},
        keep_last=keep_last,
    )


def test_a_kill_while_re_saving_an_iteration_leaves_a_complete_copy(tmp_path, monkeypatch):
    _save(tmp_path, 3, value=1.0)
    real_replace = os.replace

    def killed_at_rename_in(src, dst):
        if Path(src).name.startswith(".tmp_"):
            raise KeyboardInterrupt("simulated kill between moving the old copy aside and renaming in")
        real_replace(src, dst)

    monkeypatch.setattr(checkpoint_module.os, "replace", killed_at_rename_in)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 3, value=2.0)
    monkeypatch.setattr(checkpoint_module.os, "replace", real_replace)
    found = list_checkpoints(tmp_path)
    assert len(found) == 1, "the old copy of iteration 3 is still found"
    ckpt = load_checkpoint(found[0])
    assert ckpt.iteration == 3 and ckpt.weights["w"].tolist() == [1.0, 1.0]
    _save(tmp_path, 3, value=3.0)  # the next save puts things right: one folder per iteration
    assert [p.name for p in checkpoint_dir(tmp_path).iterdir()] == ["iter_000003"]
    assert load_checkpoint(list_checkpoints(tmp_path)[0]).weights["w"].tolist() == [3.0, 3.0]


def test_a_kill_after_the_new_copy_is_in_keeps_the_new_one(tmp_path, monkeypatch):
    _save(tmp_path, 3, value=1.0)
    monkeypatch.setattr(checkpoint_module.shutil, "rmtree", lambda *a, **k: None)  # never deletes the old
    _save(tmp_path, 3, value=2.0)
    monkeypatch.undo()
    assert [load_checkpoint(p).weights["w"].tolist() for p in list_checkpoints(tmp_path)] == [[2.0, 2.0]]


# --------------------------------------------------------------------------- 7: a full disk


def _full_disk(monkeypatch, free: int = 3 * 2**20) -> None:
    usage = shutil.disk_usage("/")
    monkeypatch.setattr(disk_space.shutil, "disk_usage", lambda path: usage._replace(free=free))


TORCH_FULL = RuntimeError(
    "[enforce fail at inline_container.cc:858] . PytorchStreamWriter failed writing file data/0: file "
    "write failed"
)


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"), TORCH_FULL])
def test_a_full_disk_while_checkpointing_is_one_line_and_keeps_what_was_saved(tmp_path, monkeypatch, error):
    before = _save(tmp_path, 1, value=1.0, keep_last=5)
    _full_disk(monkeypatch)

    def full(*args, **kwargs):
        raise error

    monkeypatch.setattr(checkpoint_module.torch, "save", full)
    with pytest.raises(RunFilesError) as info:
        _save(tmp_path, 2, keep_last=5)
    message = str(info.value)
    assert "No space left on device" in message and "3.0 MiB free" in message
    assert str(checkpoint_dir(tmp_path) / "iter_000002") in message and "--resume" in message
    assert list_checkpoints(tmp_path) == [before], "the saved checkpoint is intact"
    assert [p.name for p in checkpoint_dir(tmp_path).iterdir()] == ["iter_000001"], "no temp folder left"


def test_a_full_disk_while_writing_records_is_one_line(tmp_path, monkeypatch):
    writer = MetricsWriter(tmp_path / "metrics.jsonl")
    _full_disk(monkeypatch, free=0)

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "open", full)
    with pytest.raises(
        RunFilesError, match=r"could not write records .*metrics.jsonl: No space left on device"
    ):
        writer.write({"kind": "train", "iteration": 1})


def test_a_full_disk_in_a_run_is_one_line_from_the_cli(runner, tmp_path, monkeypatch):
    _full_disk(monkeypatch)

    def full(*args, **kwargs):
        raise TORCH_FULL

    monkeypatch.setattr(checkpoint_module.torch, "save", full)
    where = ["--set", f"run.output_dir={tmp_path.as_posix()!r}", "--set", "run.name='full'"]
    result = invoke(runner, "run", TOY, *where, "--set", "train.iterations=1", "--set", "eval.every=0")
    assert result.exit_code == 2 and "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and result.stderr.endswith(errors[0] + "\n"), (
        result.stderr
    )  # progress bars before
    line = errors[0]
    assert "could not write checkpoint" in line and "No space left on device" in line


# --------------------------------------------------------------------------- train.init_lora


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"\x00" * 16, "is unreadable"),
        (None, "header is not a JSON object"),  # an intact file whose LoRA options are garbage
    ],
)
def test_a_damaged_init_lora_file_is_one_line(tmp_path, content, words):
    from vgrpo_platform.lora_files import LORA_METADATA, read_lora

    path = tmp_path / "lora.safetensors"
    if content is None:
        save_file({"a.lora_A.weight": torch.zeros(2, 2)}, str(path), metadata={LORA_METADATA: "[1, 2"})
    else:
        path.write_bytes(content)
    with pytest.raises(CheckpointError, match=f"train.init_lora: .*{words}"):
        read_lora(str(path))
