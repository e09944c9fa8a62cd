"""SIGKILL a toy ``vgrpo run`` at many points, ``--resume`` until it completes: the final
``metrics.jsonl`` equals an uninterrupted run's, bit for bit (timing fields aside).

Kill points, drawn from a seeded RNG: at a random moment of the first second (while the model
is built, or before the first checkpoint: the next ``--resume`` then says to start afresh, or, where the
killed run left records, starts it over); a
random fraction of an iteration after a new train record appears; just before a random executed
line of ``save_checkpoint`` (between two files, before the rename, while pruning), of anything in
``checkpoint.py`` (loading too) or of ``metrics.py``; and after half a record was written. After
every kill each checkpoint ``--resume`` could pick must load, and at the end only the last
``keep_last`` complete checkpoints remain (no temp folders, no half-deleted ones).

Why a fork server: a cold ``vgrpo run`` spends ~7 s importing torch and diffusers on 2 cores. The
server imports them once, then forks one fresh process per run that enters the real console entry
point (``cli.main`` with the argv a user types); the kill is a real SIGKILL of that process, and
nothing but the run directory carries state from one run to the next.

Measured on 2 busy cores: starting the server and the reference run ~9 s; the default test, 5 kill
points, ~7 s more; the slow one, 13 kill points, ~13 s more.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vgrpo_platform.training.observe.metrics import read_metrics, without_timing
from vgrpo_platform.training.recovery.checkpoint import checkpoint_dir, list_checkpoints, load_checkpoint
from vgrpo_platform.training.recovery.run_state import held_records

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "recipes" / "toy.toml"
ITERATIONS = 20  # enough that every planned kill lands before the run can finish
KEEP_LAST = 2
SETTINGS = [
    f"train.iterations={ITERATIONS}",
    "eval.every=4",
    "log.checkpoint_every=1",
    f"log.keep_last={KEEP_LAST}",
    "log.progress='none'",
    "log.save_grids=false",
    "rollout.group_size=4",
    "rollout.steps=4",
    "train.micro_batch_size=8",
]

SERVER = r"""
import collections, json, os, signal, sys, traceback
import torch
import vgrpo_platform.cli.app as cli, vgrpo_platform.training.loop
import vgrpo_platform.training.recovery.checkpoint, vgrpo_platform.training.observe.metrics
import vgrpo_adapters.toy.impl  # diffusers, transformers, peft

torch.set_num_threads(1)
WATCHED = {m.__file__: os.path.basename(m.__file__)
           for m in (vgrpo_platform.training.recovery.checkpoint, vgrpo_platform.training.observe.metrics)}


def child(job):
    fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    counts = collections.Counter()
    kill = job.get("kill_line")  # [file or function name, k]: SIGKILL just before its k-th executed line

    def line(frame, event, arg):
        if event == "line":
            name = WATCHED[frame.f_code.co_filename]
            for key in (name, frame.f_code.co_name):  # a file, or a function such as save_checkpoint
                counts[key] += 1
                if kill and key == kill[0] and counts[key] == kill[1]:
                    os.kill(os.getpid(), signal.SIGKILL)
        return line

    sys.settrace(lambda frame, event, arg: line if frame.f_code.co_filename in WATCHED else None)
    if job.get("tear_write"):  # the n-th record is cut in half, then SIGKILL
        writer = vgrpo_platform.training.observe.metrics.MetricsWriter
        original, calls = writer.write, [0]

        def tearing(self, record):
            calls[0] += 1
            if calls[0] == job["tear_write"]:
                text = json.dumps(record, sort_keys=True)
                with open(self.path, "a") as f:
                    f.write(text[: len(text) // 2])
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, record)

        writer.write = tearing
    sys.argv = ["vgrpo", *job["argv"]]
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.settrace(None)
    if job.get("count_out"):
        with open(job["count_out"], "w") as f:
            json.dump(dict(counts), f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


print("ready", flush=True)
for text in sys.stdin:
    job = json.loads(text)
    pid = os.fork()
    if pid == 0:
        child(job)
    print(pid, flush=True)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


class ForkServer:
    """Runs ``vgrpo`` commands in processes forked from one that imported torch and diffusers."""

    def __init__(self) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self.next_line(timeout=300) == "ready"

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            self.lines.put(line.strip())

    def next_line(self, timeout: float) -> str:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the fork server said nothing for {timeout} s") from None

    def start(self, **job) -> int:
        self.proc.stdin.write(json.dumps(job) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return int(self.next_line(timeout=60))

    def exit_code(self, timeout: float = 300) -> int:
        return int(self.next_line(timeout))

    def poll(self) -> int | None:
        try:
            return int(self.lines.get_nowait())
        except queue.Empty:
            return None

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the fork server needs fork() after torch")


@pytest.fixture(scope="module")
def server():
    forks = ForkServer()
    yield forks
    forks.close()


def run_args(out: Path, name: str, *extra: str) -> list[str]:
    sets = [*SETTINGS, f"run.output_dir={out.as_posix()!r}", f"run.name={name!r}"]
    return ["run", str(TOY), *(a for s in sets for a in ("--set", s)), *extra]


@pytest.fixture(scope="module")
def reference(server, tmp_path_factory):
    """An uninterrupted run's metrics, and how many lines of checkpoint.py / metrics.py one
    iteration executes (the ranges the line kills are drawn from)."""
    out = tmp_path_factory.mktemp("reference")
    counts = out / "counts.json"
    server.start(argv=run_args(out, "ref"), log=str(out / "log.txt"), count_out=str(counts))
    assert server.exit_code() == 0, (out / "log.txt").read_text()
    per_iteration = {k: v / ITERATIONS for k, v in json.loads(counts.read_text()).items()}
    return without_timing(read_metrics(out / "ref" / "metrics.jsonl")), per_iteration


def _train_iterations(metrics: Path) -> int:
    if not metrics.exists():
        return 0
    done = 0
    for line in metrics.read_text().splitlines():
        if '"kind": "train"' in line and line.endswith("}"):
            done = max(done, json.loads(line)["iteration"])
    return done


def _incomplete(run_dir: Path) -> set[Path]:
    root = checkpoint_dir(run_dir)
    return set(root.iterdir()) - set(list_checkpoints(run_dir)) if root.is_dir() else set()


def kill_and_resume(server, out: Path, plan: list[str], per_iteration: dict[str, float], seed: int) -> dict:
    """Start the run, then for each planned kill: (re)start, kill, check what is on disk. Then resume
    to the end. Returns counts of what happened."""
    rng = random.Random(seed)
    run_dir, log = out / "cut", out / "log.txt"
    stats = {"kills": 0, "partial_writes_left": 0, "fresh_starts": 0}
    started = False
    seen: set[Path] = set()

    def launch(**job) -> int:
        """Start the run (``--resume`` once it has run before) with ``job``'s kill; returns the pid."""
        nonlocal started
        resume = started
        if started and not list_checkpoints(run_dir):  # killed before its first checkpoint
            stats["fresh_starts"] += 1
            if not held_records(run_dir):  # a new run may start there: --resume has nothing to go on from
                server.start(argv=run_args(out, "cut", "--resume"), log=str(log))
                code = server.exit_code()
                assert code == 2 and "no complete checkpoint" in log.read_text().splitlines()[-1]
                resume = False  # what the error says to do
            # else a new run is refused (the records are kept) and --resume starts the run over
        started = True
        return server.start(argv=run_args(out, "cut", *(["--resume"] if resume else [])), log=str(log), **job)

    for point in plan:
        if point == "startup":  # while the model is built, or in the first iterations
            pid = launch()
            time.sleep(rng.uniform(0.0, 1.0))
            os.kill(pid, signal.SIGKILL)
            code = server.exit_code()
        elif point == "time":
            before = _train_iterations(run_dir / "metrics.jsonl")
            pid = launch()
            code = None
            while code is None and _train_iterations(run_dir / "metrics.jsonl") <= before:
                code = server.poll()
                time.sleep(0.01)
            if code is None:
                time.sleep(rng.uniform(0.0, 0.15))  # somewhere in the next iteration
                os.kill(pid, signal.SIGKILL)
                code = server.exit_code()
        elif point == "tear":
            launch(tear_write=rng.randint(1, 3))
            code = server.exit_code()
        else:  # a random executed line of "checkpoint.py", "metrics.py" or (any save) "save_checkpoint"
            k = rng.randint(1, max(1, int(1.5 * per_iteration[point])))
            launch(kill_line=[point, k])
            code = server.exit_code()
        assert code == -signal.SIGKILL, (
            f"{point}: the run ended with {code} before the kill\n{log.read_text()}"
        )
        stats["kills"] += 1
        # --resume must only ever see complete checkpoints
        for ckpt in list_checkpoints(run_dir):
            load_checkpoint(ckpt)
        leftovers = _incomplete(run_dir)
        stats["partial_writes_left"] += bool(leftovers - seen)  # this kill cut a checkpoint write
        seen |= leftovers

    launch()
    assert server.exit_code() == 0, log.read_text()
    left = sorted(p.name for p in checkpoint_dir(run_dir).iterdir())
    assert left == [f"iter_{i:06d}" for i in range(ITERATIONS - KEEP_LAST + 1, ITERATIONS + 1)], left
    stats["metrics"] = without_timing(read_metrics(run_dir / "metrics.jsonl"))
    return stats


def _summary(stats: dict) -> str:
    return (
        f"{stats['kills']} kill points, {stats['partial_writes_left']} inside a checkpoint write, "
        f"{stats['fresh_starts']} before the first checkpoint"
    )


def test_sigkill_at_random_points_then_resume_matches_the_uninterrupted_run(server, reference, tmp_path):
    expected, per_iteration = reference
    plan = ["startup", "time", "save_checkpoint", "tear", "checkpoint.py"]
    stats = kill_and_resume(server, tmp_path, plan, per_iteration, seed=0)
    print(f"\nkill/resume: {_summary(stats)}")
    assert stats["kills"] == len(plan)
    assert stats["partial_writes_left"] >= 1, "no kill landed inside a checkpoint write"
    assert stats["metrics"] == expected


@pytest.mark.slow
def test_many_sigkills_then_resume_matches_the_uninterrupted_run(server, reference, tmp_path):
    expected, per_iteration = reference
    plan = ["startup", "time", "save_checkpoint", "metrics.py", "tear", "time", "checkpoint.py"]
    plan += ["save_checkpoint", "metrics.py", "time", "tear", "save_checkpoint", "checkpoint.py"]
    stats = kill_and_resume(server, tmp_path, plan, per_iteration, seed=1)
    print(f"\nkill/resume: {_summary(stats)}")
    assert stats["kills"] == len(plan)
    assert stats["partial_writes_left"] >= 1, "no kill landed inside a checkpoint write"
    assert stats["metrics"] == expected
