"""Context parallelism (``[parallel] context = N``, diffusers' context-parallel API): a group of processes
shares each clip's tokens and is one data-parallel rank. Split, the tiny Wan 2.1 / 2.2 policy gives the
single-process velocity, rollout and gradient; a 4-process run in two context groups of 2 equals the
single-process run; what cannot work is refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from test_distributed import _close, _free_port
from tiny_hunyuan_video import tiny_hunyuan_video15_transformer
from tiny_pipelines import (
    WAN_FRAMES,
    WAN_SIDE,
    WAN_TOKENS,
    _tiny_wan_transformer,
    build_tiny_wan,
    build_tiny_wan22,
)

from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.errors import RecipeError
from vgrpo_platform.parallel import context_parallel
from vgrpo_platform.parallel.data_parallel import Shard, gather_rows, shard_of
from vgrpo_platform.training.observe.metrics import is_timing, read_metrics
from vgrpo_platform.training.recovery.checkpoint import list_checkpoints

ROOT = Path(__file__).resolve().parents[1]


def _torchrun(processes: int, *entry: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={processes}",
        f"--master_port={_free_port()}",
        *entry,
    ]


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("build", [build_tiny_wan, build_tiny_wan22], ids=["wan2.1", "wan2.2-two-experts"])
def test_split_tokens_give_the_single_process_velocity_rollout_and_gradient(tmp_path, build) -> None:
    pipeline = build(tmp_path / "pipe")
    out = tmp_path / "out.json"
    entry = [str(ROOT / "tests" / "context_parallel_cpu.py"), str(pipeline), str(out)]
    launcher = _torchrun(2, *entry)
    done = subprocess.run(launcher, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(out.read_text())
    assert found["degree"] == 2
    assert found["tokens_alone"] == [8] and found["tokens_split"] == [4], "each process holds half the tokens"
    # Ulysses keeps every token-wise operation on whole rows: the forward is the same to the bit here
    assert found["velocity_rel"] < 1e-6 and found["sample_rel"] < 1e-6
    # each process's backward reaches its own tokens; scaled by 2 and averaged, the whole gradient
    assert found["grads_nonzero"] == found["grads_total"] > 0
    assert found["grad_rel_max"] < 1e-5


def _wan_run(tmp_path: Path, pipeline: Path, name: str, launcher: list[str], *extra: str) -> Path:
    sets = [
        f'adapter.options.model="{pipeline}"',
        f"adapter.options.resolution={WAN_SIDE}",
        f"adapter.options.num_frames={WAN_FRAMES}",
        f"adapter.options.max_sequence_length={WAN_TOKENS}",
        'rewards=[{name="brightness"}]',
        "run.device=cpu",
        "run.mixed_precision=no",
        f'run.output_dir="{tmp_path}"',
        f'run.name="{name}"',
        "log.progress=plain",
        "rollout.group_size=4",
        "rollout.prompts_per_iteration=2",  # one prompt per context group
        "rollout.steps=2",
        "train.iterations=2",
        "train.micro_batch_size=3",
        "train.lr=3e-2",
        "train.lora_rank=4",
        "eval.every=0",
        "eval.max_prompts=3",  # an uneven evaluation split over the two groups
        "eval.samples_per_prompt=2",
        "log.checkpoint_every=0",
        *extra,
    ]
    args = [*launcher, "run", str(ROOT / "recipes" / "wan_pickscore.toml")]
    for item in sets:
        args += ["--set", item]
    done = subprocess.run(args, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (tmp_path / name / "stdout.txt").write_text(done.stdout)
    return tmp_path / name


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> tuple[Path, Path]:
    """The tiny Wan pipeline (a VAE whose brightness varies) and its single-process run."""
    tmp_path = tmp_path_factory.mktemp("context")
    pipeline = build_tiny_wan(tmp_path / "pipe", responsive_vae=True)
    return pipeline, _wan_run(tmp_path, pipeline, "one", [sys.executable, "-m", "vgrpo_platform"])


# DDP on 4 processes = 2 context groups of 2 (the data-parallel ranks); FSDP2 (forced on CPU by
# tests/fsdp2_cpu.py) on 2 processes = 1 context group, its weights sharded over both
LAYOUTS = {
    "ddp-4-processes": (4, ["-m", "vgrpo_platform"], "2 data-parallel groups"),
    "fsdp2-2-processes": (2, [str(ROOT / "tests" / "fsdp2_cpu.py")], "1 data-parallel group"),
}


@pytest.mark.parametrize(
    "layout",
    # 4 processes on the 2 CI cores is the suite's heaviest case: in the slow set (pytest -m slow)
    [
        pytest.param(name, marks=pytest.mark.slow) if name.startswith("ddp-4") else name
        for name in sorted(LAYOUTS)
    ],
)
def test_context_groups_train_as_one_process(tmp_path, one_process, layout) -> None:
    processes, entry, groups = LAYOUTS[layout]
    pipeline, one = one_process
    split = _wan_run(tmp_path, pipeline, "split", _torchrun(processes, *entry), "parallel.context=2")
    printed = (split / "stdout.txt").read_text()
    assert f"context parallel: 2 processes per sample (ulysses), {groups}" in printed
    a, b = read_metrics(one / "metrics.jsonl"), read_metrics(split / "metrics.jsonl")
    assert [r["kind"] for r in a] == [r["kind"] for r in b] == ["eval", "train", "train", "eval"]
    for x, y in zip(a, b, strict=True):
        assert set(x) == set(y)
        for key in sorted(k for k in x if not is_timing(k) and not k.startswith("diag/")):
            assert _close(x[key], y[key]), (x["kind"], x["iteration"], key, x[key], y[key])
    w1 = load_file(list_checkpoints(one)[-1] / "trainable.safetensors")
    w2 = load_file(list_checkpoints(split)[-1] / "trainable.safetensors")
    assert max(float(w1[k].abs().max()) for k in w1 if "lora_B" in k) > 1e-3, "the update moved LoRA B"
    for key in w1:
        torch.testing.assert_close(w2[key], w1[key], rtol=1e-4, atol=1e-5)
    # the diffusers export, gathered from the shards under FSDP2
    lora = "final/pytorch_lora_weights.safetensors"
    e1, e2 = load_file(one / lora), load_file(split / lora)
    assert e1.keys() == e2.keys() and e1
    for key in e1:
        torch.testing.assert_close(e2[key], e1[key], rtol=1e-4, atol=1e-5)


def test_a_context_group_is_one_data_parallel_rank() -> None:
    def processes(n: int, i: int) -> SimpleNamespace:
        return SimpleNamespace(num_processes=n, process_index=i)

    assert [shard_of(processes(4, i), 2) for i in range(4)] == [
        Shard(0, 2, 2),
        Shard(0, 2, 2),
        Shard(1, 2, 2),
        Shard(1, 2, 2),
    ]
    assert shard_of(processes(8, 5), 4) == Shard(1, 2, 4)
    with pytest.raises(RecipeError, match=r"needs a multiple of 2 processes, but 3 were launched"):
        shard_of(processes(3, 0), 2)


def test_gathered_rows_keep_one_copy_per_context_group() -> None:
    rows = {0: torch.tensor([1.0, 2.0]), 1: torch.tensor([5.0, 6.0])}  # each group's rows

    def gather(tensor: torch.Tensor) -> torch.Tensor:  # what 4 processes in 2 groups would all-gather
        return torch.cat([rows[0], rows[0], rows[1], rows[1]])

    accelerator = SimpleNamespace(num_processes=4, device=torch.device("cpu"), gather=gather)
    assert gather_rows(accelerator, rows[0], context=2).tolist() == [1.0, 2.0, 5.0, 6.0]
    assert gather_rows(accelerator, rows[0]).tolist() == [1.0, 2.0, 1.0, 2.0, 5.0, 6.0, 5.0, 6.0]


def test_the_recipe_check_refuses_rollouts_made_outside_the_groups(tmp_path) -> None:
    from vgrpo_platform.host.collect import default_registry

    toy = ROOT / "recipes" / "toy.toml"
    registry = default_registry()
    resolve_recipe(toy, ["parallel.context=2"], registry=registry)  # the core's sampler: accepted
    with pytest.raises(RecipeError, match=r"parallel.context = 2 .* rollout.backend = 'worker'"):
        resolve_recipe(toy, ["parallel.context=2", "rollout.backend='worker'"], registry=registry)
    with pytest.raises(RecipeError, match="context_split"):
        resolve_recipe(toy, ["parallel.context_split='stripes'"], registry=registry)


def test_a_single_process_run_asks_for_more_processes(tmp_path) -> None:
    from vgrpo_platform.host.collect import default_registry
    from vgrpo_platform.training.loop import Trainer

    toy = ROOT / "recipes" / "toy.toml"
    sets = ["parallel.context=2", f'run.output_dir="{tmp_path}"']
    with pytest.raises(RecipeError, match=r"needs a multiple of 2 processes, but 1 were launched"):
        Trainer(resolve_recipe(toy, sets, registry=default_registry()))
    assert not (tmp_path / "run").exists(), "refused before anything was written"


def test_what_cannot_split_is_refused_in_one_line() -> None:
    wan = _tiny_wan_transformer()  # 2 attention heads
    with pytest.raises(RecipeError, match=r"splits the 2 attention heads over 4 processes"):
        context_parallel.enable(wan, 4, "ulysses", "wan")
    with pytest.raises(RecipeError, match=r"ring .* log-sum-exp, which 'native' does not"):
        context_parallel.enable(wan, 2, "ring", "wan")
    with pytest.raises(RecipeError, match=r"needs 2 or more processes"):
        context_parallel.enable(wan, 2, "ulysses", "wan")
    hunyuan = tiny_hunyuan_video15_transformer()
    with pytest.raises(RecipeError, match=r"no context-parallel plan for HunyuanVideo15Transformer3DModel"):
        context_parallel.enable(hunyuan, 2, "ulysses", "hunyuan_video")
    plain = torch.nn.Linear(2, 2)
    with pytest.raises(RecipeError, match=r"no context-parallel plan for Linear"):
        context_parallel.enable(plain, 2, "ulysses", "toy")
    assert context_parallel.degree_of(wan) == 1 and context_parallel.gradient_scale(wan) == 1.0
