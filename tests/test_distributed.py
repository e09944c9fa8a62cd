"""Data parallelism: a 2-process run (torchrun, gloo on CPU, DDP through accelerate) equals the
single-process run on the same global batch: same rewards, losses and evaluations, same weights."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vgrpo_platform.checkpoint import list_checkpoints
from vgrpo_platform.distributed import RowsOf, Shard
from vgrpo_platform.errors import RecipeError
from vgrpo_platform.metrics import read_metrics
from vgrpo_platform.timesteps import draw_pairs

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "recipes" / "toy.toml"
TIMING_KEYS = {"time_rollout", "time_reward", "time_train", "time_iteration", "wall_seconds"}
SETTINGS = [
    "train.iterations=3",
    "rollout.prompts_per_iteration=4",
    "rollout.group_size=4",
    "train.micro_batch_size=3",  # 8 rows per rank: micro-batches of 3, 3, 2 (no_sync on the first two)
    "eval.every=0",
    "eval.max_prompts=3",  # an uneven eval split: 2 prompts on rank 0, 1 on rank 1
    "eval.samples_per_prompt=2",
    "log.checkpoint_every=0",
    "log.diagnostics_every=2",
    "log.progress='none'",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(tmp_path: Path, name: str, launcher: list[str], extra: tuple[str, ...] = ()) -> Path:
    sets = [f"run.output_dir={tmp_path.as_posix()!r}", f"run.name={name!r}", *SETTINGS, *extra]
    args = [*launcher, "-m", "vgrpo_platform", "run", str(TOY)]
    for item in sets:
        args += ["--set", item]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp_path / name


def _final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    ckpt = list_checkpoints(run_dir)[-1]
    return load_file(ckpt / "trainable.safetensors")


def _close(a: float | str, b: float | str) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return abs(a - b) <= 1e-5 * max(1.0, abs(a), abs(b))


def test_two_processes_equal_one_process_on_the_same_global_batch(tmp_path):
    single = _run(tmp_path, "single", [sys.executable])
    torchrun = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
    ]
    ddp = _run(tmp_path, "ddp", torchrun)

    one, two = read_metrics(single / "metrics.jsonl"), read_metrics(ddp / "metrics.jsonl")
    assert [r["kind"] for r in one] == [r["kind"] for r in two] == ["eval", "train", "train", "train", "eval"]
    for a, b in zip(one, two, strict=True):
        assert set(a) == set(b)
        # diagnostics are estimated per rank and averaged: close to, not equal to, the global figure
        for key in sorted(k for k in set(a) - TIMING_KEYS if not k.startswith("diag/")):
            assert _close(a[key], b[key]), (a["kind"], a["iteration"], key, a[key], b[key])
    assert "diag/cv" in one[2] and "diag/cv" in two[2], "the diagnostics ran (under no_sync) in both runs"
    # the update moved the weights, identically
    w1, w2 = _final_weights(single), _final_weights(ddp)
    assert w1.keys() == w2.keys()
    moved = 0.0
    for key in w1:
        torch.testing.assert_close(w1[key], w2[key], rtol=1e-5, atol=1e-6)
        moved += float(w1[key].abs().sum())
    assert moved > 0
    # one writer: a single metrics file with one line per record, no duplicates from rank 1
    assert len((ddp / "metrics.jsonl").read_text().splitlines()) == len(two)


def test_an_uneven_prompt_split_fails_before_training():
    with pytest.raises(RecipeError, match="multiple of 2"):
        Shard(rank=0, world=2).prompt_block(3)
    assert [Shard(r, 2).block(3) for r in (0, 1)] == [slice(0, 1), slice(1, 3)]


@pytest.mark.parametrize("scope", ["group", "sample", "batch"])
def test_pairs_drawn_by_a_rank_are_its_rows_of_the_global_draw(scope):
    """Each rank draws for the global batch and keeps its rows: the pieces equal the whole draw."""
    ids = torch.arange(4).repeat_interleave(3)  # 4 prompts x 3 samples
    whole = draw_pairs(ids, 2, (2, 2), generator=torch.Generator().manual_seed(5), scope=scope)
    for start, stop in ((0, 6), (6, 12)):
        part = draw_pairs(
            ids[start:stop], 2, (2, 2), generator=torch.Generator().manual_seed(5), scope=scope,
            rows=RowsOf(ids, start),
        )
        assert torch.equal(part[0], whole[0][start:stop]) and torch.equal(part[1], whole[1][start:stop])
