"""Data parallelism: a 2-process run (torchrun, gloo on CPU; DDP, FSDP2 or DeepSpeed ZeRO-2 through
accelerate), and a 4-process hybrid-sharded one (HSDP: 2 replicas x 2 shards), equal the single-process
run on the same global batch: same rewards, losses and evaluations, same weights; a sharded run stopped
and resumed equals one that ran through."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vgrpo_platform.algo.timesteps import draw_pairs
from vgrpo_platform.errors import RecipeError
from vgrpo_platform.parallel.data_parallel import RowsOf, Shard, lockstep_rows
from vgrpo_platform.training.observe.metrics import is_timing, read_metrics
from vgrpo_platform.training.recovery.checkpoint import list_checkpoints

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "recipes" / "toy.toml"
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
    "train.ema_decay=0.5",  # the final eval sees the moving average (FSDP2: each rank averages its slice)
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(
    tmp_path: Path, name: str, launcher: list[str], extra: tuple[str, ...] = (), flags: tuple[str, ...] = ()
) -> Path:
    sets = [f"run.output_dir={tmp_path.as_posix()!r}", f"run.name={name!r}", *SETTINGS, *extra]
    args = [*launcher, "run", str(TOY), *flags]
    for item in sets:
        args += ["--set", item]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (tmp_path / name / "stdout.txt").write_text(done.stdout)
    return tmp_path / name


def _torchrun(*entry: str) -> list[str]:
    port = f"--master_port={_free_port()}"
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", port, *entry]


# DDP through accelerate's own launch path; FSDP2 (parameters sharded as DTensors, one unit per
# transformer block) and DeepSpeed ZeRO-2 (gradients and optimiser state partitioned) forced on CPU
# by tests/fsdp2_cpu.py and tests/deepspeed_cpu.py, since accelerate enables both only on GPUs.
# Keys are what the run prints: "data parallel: 2 processes, <key>".
ZERO2 = "DeepSpeed ZeRO-2"
LAUNCHERS = {
    "DDP": lambda: _torchrun("-m", "vgrpo_platform"),
    "FSDP2": lambda: _torchrun(str(ROOT / "tests" / "fsdp2_cpu.py")),
    ZERO2: lambda: _torchrun(str(ROOT / "tests" / "deepspeed_cpu.py")),
}


def _launcher(kind: str) -> list[str]:
    if kind == ZERO2:
        pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install -e '.[test]')")
    return LAUNCHERS[kind]()


def _dir_name(kind: str) -> str:
    return kind.lower().replace(" ", "_")


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("single"), "single", [sys.executable, "-m", "vgrpo_platform"])


def _final_weights(run_dir: Path, file: str = "trainable.safetensors") -> dict[str, torch.Tensor]:
    ckpt = list_checkpoints(run_dir)[-1]
    return load_file(ckpt / file)


def _close(a: float | str, b: float | str) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return abs(a - b) <= 1e-5 * max(1.0, abs(a), abs(b))


@pytest.mark.parametrize("kind", sorted(LAUNCHERS))
def test_two_processes_equal_one_process_on_the_same_global_batch(tmp_path, single, kind):
    ranks = _run(tmp_path, _dir_name(kind), _launcher(kind), ("log.progress='plain'",))
    assert f"data parallel: 2 processes, {kind}" in (ranks / "stdout.txt").read_text()
    _assert_same_run(single, ranks)


def test_hybrid_sharding_on_four_processes_equals_one_process(tmp_path, single):
    """HSDP (recipes/accelerate/hsdp_2x8.yaml's FSDP2 + parallelism_config) at 2 replicas x 2 shards,
    forced on CPU by tests/hsdp_cpu.py: one prompt per process, the same run as one process."""
    launcher = _torchrun(str(ROOT / "tests" / "hsdp_cpu.py"))
    launcher[launcher.index("--nproc_per_node=2")] = "--nproc_per_node=4"
    ranks = _run(tmp_path, "hsdp", launcher, ("log.progress='plain'",))
    assert (
        "data parallel: 4 processes, HSDP (FSDP2, 2 replicas x 2 shards)"
        in (ranks / "stdout.txt").read_text()
    )
    _assert_same_run(single, ranks)


def _assert_same_run(single: Path, ranks: Path) -> None:
    """The multi-process run in ``ranks`` equals the single-process run: metrics, weights, optimiser state."""
    one, two = read_metrics(single / "metrics.jsonl"), read_metrics(ranks / "metrics.jsonl")
    assert [r["kind"] for r in one] == [r["kind"] for r in two] == ["eval", "train", "train", "train", "eval"]
    for a, b in zip(one, two, strict=True):
        assert set(a) == set(b)
        # diagnostics are estimated per rank and averaged: close to, not equal to, the global figure
        for key in sorted(k for k in set(a) if not is_timing(k) and not k.startswith("diag/")):
            assert _close(a[key], b[key]), (a["kind"], a["iteration"], key, a[key], b[key])
    assert "diag/cv" in one[2] and "diag/cv" in two[2], "the diagnostics ran in both runs"
    # the update moved the weights, identically (FSDP2: gathered from the shards into full tensors;
    # ZeRO-2: the fp32 master copies, gathered from their partitions)
    w1, w2 = _final_weights(single), _final_weights(ranks)
    assert w1.keys() == w2.keys()
    moved = 0.0
    for key in w1:
        # atol: Adam divides by sqrt(v), so where a gradient is ~0 the float-order noise of the
        # single run's and the ranks' different slicing shows up as ~1e-6 (an update is ~1e-2)
        torch.testing.assert_close(w1[key], w2[key], rtol=1e-5, atol=5e-6)
        moved += float(w1[key].abs().sum())
    assert moved > 0
    a1, a2 = (_final_weights(r, "averaged.safetensors") for r in (single, ranks))
    for key in w1:  # the moving average, gathered whole like the weights
        torch.testing.assert_close(a1[key], a2[key], rtol=1e-5, atol=5e-6)
        assert not torch.equal(a1[key], w1[key]) or not w1[key].any()
    # the optimiser state is stored whole, in the single-process layout
    o1, o2 = (
        torch.load(list_checkpoints(r)[-1] / "optimizer.pt", weights_only=True) for r in (single, ranks)
    )
    for index, state in o1["optimizer"]["state"].items():
        torch.testing.assert_close(state["exp_avg_sq"], o2["optimizer"]["state"][index]["exp_avg_sq"])
    # one writer: a single metrics file with one line per record, no duplicates from rank 1
    assert len((ranks / "metrics.jsonl").read_text().splitlines()) == len(two)


@pytest.mark.parametrize("kind", ["FSDP2", ZERO2])
def test_a_sharded_run_resumes_from_its_full_checkpoint(tmp_path, single, kind):
    """A sharded run stops after iteration 2 and resumes: FSDP2's shards, ZeRO-2's partitioned
    optimiser state and fp32 master weights are rebuilt from the full tensors of the checkpoint.
    The same checkpoint resumed by one process also ends where the single-process run ends."""
    first = _run(tmp_path, _dir_name(kind), _launcher(kind), ("train.iterations=2",))
    assert [p.name for p in list_checkpoints(first)] == ["iter_000002"]
    shutil.copytree(first, tmp_path / "alone")
    _run(tmp_path, _dir_name(kind), _launcher(kind), flags=("--resume",))
    alone = _run(tmp_path, "alone", [sys.executable, "-m", "vgrpo_platform"], flags=("--resume",))
    one, resumed = read_metrics(single / "metrics.jsonl"), read_metrics(first / "metrics.jsonl")
    train_one = [r for r in one if r["kind"] == "train"]
    train_resumed = [r for r in resumed if r["kind"] == "train"]
    assert [r["iteration"] for r in train_resumed] == [1, 2, 3]
    for a, b in zip(train_one, train_resumed, strict=True):
        shuffled = {"diag/cv", "diag/within_group_cv", "diag/grad_corr"}
        for key in sorted(k for k in set(a) - shuffled if not is_timing(k)):
            assert _close(a[key], b[key]), (a["iteration"], key, a[key], b[key])
    for key, value in _final_weights(single).items():
        torch.testing.assert_close(value, _final_weights(first)[key], rtol=1e-5, atol=5e-6)
        torch.testing.assert_close(value, _final_weights(alone)[key], rtol=1e-5, atol=5e-6)
    for key, value in _final_weights(single, "averaged.safetensors").items():  # restored, then averaged on
        for resumed_run in (first, alone):
            averaged = _final_weights(resumed_run, "averaged.safetensors")[key]
            torch.testing.assert_close(value, averaged, rtol=1e-5, atol=5e-6)


def test_an_fsdp2_rollout_gathers_each_unit_once_and_samples_the_same(tmp_path):
    """Without the context every denoising step all-gathers every block again; inside it each unit is
    gathered at most once per rollout, the samples are bit-identical, and afterwards the weights are
    slices again and the old per-step behaviour is back (training's resharding is untouched)."""
    out = tmp_path / "gathers.json"
    entry = [str(ROOT / "tests" / "fsdp2_generate_cpu.py"), str(out), str(tmp_path)]
    done = subprocess.run(_torchrun(*entry), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(out.read_text())
    blocks = found["units"] - 1  # the root is never resharded after forward by FSDP2 itself
    assert found["gathers_plain"] == 1 + blocks * found["steps"]
    assert found["gathers_once"] <= found["units"]
    assert found["gathers_after"] == found["gathers_plain"]
    assert found["same_samples"] and found["resharded"]


def test_an_uneven_prompt_split_fails_before_training():
    with pytest.raises(RecipeError, match="multiple of 2"):
        Shard(rank=0, world=2).prompt_block(3)
    assert [Shard(r, 2).block(3) for r in (0, 1)] == [slice(0, 1), slice(1, 3)]
    # evaluation pads the smaller share to the largest, so sharded models forward in lockstep
    assert [lockstep_rows(Shard(0, w), n) for w, n in ((2, 3), (2, 4), (4, 3), (3, 10))] == [2, 2, 1, 4]
    assert all(
        lockstep_rows(Shard(0, w), n) >= len(range(n)[Shard(r, w).block(n)])
        for w in (2, 3, 5)
        for n in range(12)
        for r in range(w)
    )


@pytest.mark.parametrize("scope", ["group", "sample", "batch"])
def test_pairs_drawn_by_a_rank_are_its_rows_of_the_global_draw(scope):
    """Each rank draws for the global batch and keeps its rows: the pieces equal the whole draw."""
    ids = torch.arange(4).repeat_interleave(3)  # 4 prompts x 3 samples
    whole = draw_pairs(ids, 2, (2, 2), generator=torch.Generator().manual_seed(5), scope=scope)
    for start, stop in ((0, 6), (6, 12)):
        part = draw_pairs(
            ids[start:stop],
            2,
            (2, 2),
            generator=torch.Generator().manual_seed(5),
            scope=scope,
            rows=RowsOf(ids, start),
        )
        assert torch.equal(part[0], whole[0][start:stop]) and torch.equal(part[1], whole[1][start:stop])


def test_full_state_helpers_pass_plain_tensors_through_unchanged():
    """Without FSDP the checkpoint helpers are the identity (the sharded path runs in the FSDP2 tests)."""
    from vgrpo_platform.parallel import sharded_state as sharding

    params = {"b": torch.nn.Parameter(torch.randn(3)), "a": torch.nn.Parameter(torch.randn(2, 2))}
    optimizer = torch.optim.AdamW(params.values(), lr=0.1)
    sum(p.square().sum() for p in params.values()).backward()
    optimizer.step()
    state = optimizer.state_dict()
    full = sharding.full_optimizer_state(state)
    again = sharding.shard_optimizer_state(full, optimizer)
    for index, entry in state["state"].items():
        for key, value in entry.items():
            torch.testing.assert_close(again["state"][index][key], value)
    weights = sharding.full_weights(params)
    assert list(weights) == ["a", "b"] and all(torch.equal(weights[k], params[k]) for k in params)
    sharding.load_weights(params, {k: torch.zeros_like(v) for k, v in weights.items()})
    assert all(float(p.abs().sum()) == 0 for p in params.values())
    with sharding.unsharded(torch.nn.Linear(2, 2)):  # no FSDP unit inside: nothing to gather
        pass


def _zero(stage: int = 2, **config: object) -> object:
    """A stand-in for accelerate's ``DeepSpeedPlugin`` as a launch config fills it."""
    from types import SimpleNamespace

    base = {"zero_optimization": {"stage": stage}, "gradient_accumulation_steps": "auto"}
    return SimpleNamespace(zero_stage=stage, deepspeed_config={**base, **config})


@pytest.mark.parametrize(
    ("kind", "plugin", "message"),
    [
        ("FSDP", None, "fsdp_version: 2"),
        ("DEEPSPEED", _zero(3), "zero_stage: 2"),
        ("DEEPSPEED", _zero(zero_optimization={"offload_optimizer": {"device": "cpu"}}), "device: none"),
        ("DEEPSPEED", _zero(gradient_accumulation_steps=4), "gradient_accumulation_steps.*set it to 1"),
        ("DEEPSPEED", _zero(gradient_clipping=1.0), "remove gradient_clipping"),
        ("DEEPSPEED", _zero(bf16={"enabled": True}), "run.mixed_precision = 'no'"),
    ],
)
def test_unsupported_launches_stop_with_the_fix(kind, plugin, message):
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from vgrpo_platform.network import DenoiserCall
    from vgrpo_platform.parallel.data_parallel import configure_launch, prepare_for_data_parallel

    accelerator = SimpleNamespace(
        num_processes=2,
        distributed_type=DistributedType[kind],
        is_fsdp2=False,
        state=SimpleNamespace(deepspeed_plugin=plugin),
    )
    model = torch.nn.Linear(2, 2)
    with pytest.raises(RecipeError, match=message):  # DeepSpeed: before any model is built
        configure_launch(accelerator, grad_clip=0.5, micro_batch_size=2)
        prepare_for_data_parallel(
            accelerator, DenoiserCall(model), torch.optim.SGD(model.parameters(), lr=0.1)
        )


def test_the_recipe_fills_the_deepspeed_keys_it_owns():
    """Accumulation is vgrpo's (1 for DeepSpeed), clipping is train.grad_clip (None: 0, DeepSpeed's off)."""
    from vgrpo_platform.parallel.data_parallel import configure_deepspeed

    plugin = _zero(gradient_clipping="auto", train_micro_batch_size_per_gpu="auto")
    configure_deepspeed(plugin, 0.5, micro_batch_size=6)
    config = plugin.deepspeed_config
    assert (config["gradient_accumulation_steps"], config["gradient_clipping"]) == (1, 0.5)
    assert config["train_micro_batch_size_per_gpu"] == 6
    unclipped = _zero(gradient_accumulation_steps=1, gradient_clipping=0.0)
    configure_deepspeed(unclipped, None, micro_batch_size=2)
    assert unclipped.deepspeed_config["gradient_clipping"] == 0.0
