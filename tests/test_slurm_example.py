"""examples/slurm/vgrpo_multinode.sbatch under a fake SLURM job: stubs of ``scontrol``, ``srun`` (one task
per node, each with its SLURM_NODEID, as SLURM runs them) and ``accelerate`` (prints its arguments) on PATH.
Checked: the script parses, and each node gets the accelerate command line that docs/scaling.md shows, with
the rank, addresses and counts read from the job's environment; the command line itself is then accepted by
``accelerate launch``'s own argument handling."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "slurm" / "vgrpo_multinode.sbatch"

STUBS = {
    "scontrol": '[ "$1 $2" = "show hostnames" ] || exit 3\nprintf "%s\\n" gpu-a17 gpu-a18 gpu-b02\n',
    # srun: drop its options, run the command once per node with that node's SLURM_NODEID / SLURM_PROCID
    "srun": (
        'while [[ "$1" == --* ]]; do shift; done\n'
        'for ((i = 0; i < SLURM_NNODES; i++)); do SLURM_NODEID=$i SLURM_PROCID=$i "$@" || exit $?; done\n'
    ),
    "accelerate": 'echo "node=$SLURM_NODEID accelerate $*" >> "$STUB_LOG"\n',
}


@pytest.fixture
def fake_job(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        stub = bin_dir / name
        stub.write_text("#!/bin/bash\n" + body)
        stub.chmod(0o755)
    log = tmp_path / "accelerate.log"
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "STUB_LOG": str(log),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "gpu-a[17-18],gpu-b02",
        "SLURM_NNODES": "3",
        "SLURM_GPUS_ON_NODE": "4",
        "SLURM_NODEID": "0",  # the batch step runs on the first node
        "SLURM_PROCID": "0",
    }

    def run(*args: str, **extra: str) -> tuple[subprocess.CompletedProcess, list[str]]:
        result = subprocess.run(
            ["bash", str(SCRIPT), *args], cwd=ROOT, env={**env, **extra}, capture_output=True, text=True
        )
        return result, log.read_text().splitlines() if log.exists() else []

    return run


def test_the_script_parses() -> None:
    assert shutil.which("bash")
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def expected_line(rank: int, config: str, shape: str) -> str:
    return (
        f"node={rank} accelerate launch --config_file {config} --num_machines 3 --num_processes 12 "
        f"--machine_rank {rank} --main_process_ip gpu-a17 --main_process_port 29500 {shape}"
        "-m vgrpo_platform.cli run recipes/flux_pickscore.toml --set rollout.prompts_per_iteration=24"
    )


def test_each_node_launches_with_its_rank_and_the_jobs_shape(fake_job) -> None:
    result, lines = fake_job("recipes/flux_pickscore.toml", "--set", "rollout.prompts_per_iteration=24")
    assert result.returncode == 0, result.stderr
    shape = "--parallelism_config_dp_replicate_size 3 --parallelism_config_dp_shard_size 4 "
    config = "recipes/accelerate/hsdp_2x8.yaml"
    assert lines == [expected_line(rank, config, shape) for rank in range(3)]
    assert "3 nodes x 4 processes = 12, main gpu-a17:29500" in result.stdout


def test_a_ddp_config_gets_no_sharding_shape_and_the_port_is_the_users(fake_job) -> None:
    config = "recipes/accelerate/multinode_2x8.yaml"
    result, lines = fake_job(
        "recipes/flux_pickscore.toml",
        "--set",
        "rollout.prompts_per_iteration=24",
        VGRPO_ACCELERATE_CONFIG=config,
        MASTER_PORT="31337",
    )
    assert result.returncode == 0, result.stderr
    assert lines == [expected_line(r, config, "").replace("29500", "31337") for r in range(3)]


def test_outside_a_job_or_without_a_recipe_it_says_so(fake_job) -> None:
    result, lines = fake_job()
    assert result.returncode == 2 and "usage:" in result.stderr and not lines
    result, lines = fake_job("recipe.toml", SLURM_JOB_NODELIST="")
    assert result.returncode != 0 and "submit with sbatch" in result.stderr and not lines


def test_accelerate_launch_accepts_the_command_line(fake_job, monkeypatch) -> None:
    """The printed arguments, parsed by accelerate's own launcher: an HSDP mesh of 3 replicas x 4 shards."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    monkeypatch.chdir(ROOT)  # the job starts in the repository folder: the config path is relative to it
    _, lines = fake_job("recipes/flux_pickscore.toml")
    argv = lines[1].split(" accelerate launch ", 1)[1].split()
    args, defaults, _ = _validate_launch_command(launch_command_parser().parse_args(argv))
    assert args.use_fsdp and int(args.fsdp_version) == 2 and args.use_parallelism_config
    assert (args.num_machines, args.num_processes, args.machine_rank) == (3, 12, 1)
    assert (args.parallelism_config_dp_replicate_size, args.parallelism_config_dp_shard_size) == (3, 4)
    assert args.main_process_ip == "gpu-a17" and args.training_script == "vgrpo_platform.cli"
