"""The accelerate configs in ``recipes/accelerate/`` go through accelerate's own loader and the argument
handling of ``accelerate launch`` (everything before processes start): right distributed type, process
counts, launcher options. This proves they parse as documented; it does not run them on GPUs (DDP,
FSDP2 and DeepSpeed ZeRO-2 run in tests/test_distributed.py with torchrun on CPU processes)."""

from __future__ import annotations

from pathlib import Path

import pytest
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import DistributedType
from accelerate.utils.launch import prepare_multi_gpu_env

from vgrpo_platform.config.schema import TrainSection

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "recipes" / "accelerate"
# name -> (distributed type, processes in all, machines)
EXPECTED = {
    "ddp_1gpu.yaml": (DistributedType.NO, 1, 1),
    "ddp_8gpu.yaml": (DistributedType.MULTI_GPU, 8, 1),
    "multinode_2x8.yaml": (DistributedType.MULTI_GPU, 16, 2),
    "fsdp2_8gpu.yaml": (DistributedType.FSDP, 8, 1),
    "hsdp_2x8.yaml": (DistributedType.FSDP, 16, 2),
    "deepspeed_zero2_8gpu.yaml": (DistributedType.DEEPSPEED, 8, 1),
}


def launch_args(name: str):
    """What ``accelerate launch --config_file NAME -m vgrpo_platform.cli run recipe.toml`` resolves to."""
    argv = ["--config_file", str(CONFIGS / name), "-m", "vgrpo_platform.cli", "run", "recipe.toml"]
    args, defaults, _ = _validate_launch_command(launch_command_parser().parse_args(argv))
    return args, defaults


def test_the_shipped_configs_are_the_documented_ones():
    assert sorted(p.name for p in CONFIGS.glob("*.yaml")) == sorted(EXPECTED)
    doc = (ROOT / "docs" / "scaling.md").read_text()
    missing = [name for name in EXPECTED if f"recipes/accelerate/{name}" not in doc]
    assert not missing, f"not in docs/scaling.md: {missing}"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_loads_with_accelerates_own_loader(name):
    config = load_config_from_file(str(CONFIGS / name))
    kind, processes, machines = EXPECTED[name]
    assert isinstance(config, ClusterConfig)
    assert config.distributed_type == kind
    assert (config.num_processes, config.num_machines) == (processes, machines)
    # DeepSpeed's bf16 mode casts the whole model: vgrpo runs it in fp32 (distributed.configure_deepspeed)
    assert config.mixed_precision == ("no" if kind == DistributedType.DEEPSPEED else "bf16")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_accelerate_launch_accepts_it_and_knows_every_option(name):
    args, defaults = launch_args(name)
    assert args.module and args.training_script == "vgrpo_platform.cli"
    assert args.training_script_args == ["run", "recipe.toml"]
    assert (args.multi_gpu, args.use_fsdp, args.use_deepspeed) == (
        EXPECTED[name][0] == DistributedType.MULTI_GPU,
        EXPECTED[name][0] == DistributedType.FSDP,
        EXPECTED[name][0] == DistributedType.DEEPSPEED,
    )
    # accelerate copies fsdp_config / deepspeed_config keys onto launch options without checking them:
    # a misspelt key would be silently ignored, so check each is an option `accelerate launch` has
    options = {action.dest for action in launch_command_parser()._actions}
    copied = {**defaults.fsdp_config, **defaults.deepspeed_config, **defaults.parallelism_config}
    unknown = [k for k in copied if k not in options]
    assert not unknown, f"{name}: options accelerate launch does not have: {unknown}"


def test_multinode_runs_8_processes_on_each_of_2_machines():
    args, _ = launch_args("multinode_2x8.yaml")
    prepare_multi_gpu_env(args)  # sets torchrun's arguments on args
    assert (args.nproc_per_node, args.nnodes, args.node_rank) == ("8", "2", 0)
    assert args.rdzv_endpoint.endswith(":29500")


def test_the_fsdp_config_gives_fsdp2(monkeypatch):
    from accelerate.utils import FullyShardedDataParallelPlugin

    args, _ = launch_args("fsdp2_8gpu.yaml")
    env = prepare_multi_gpu_env(args)  # the environment each launched process gets
    for key, value in env.items():
        if key.startswith(("FSDP_", "ACCELERATE_")):
            monkeypatch.setenv(key, value)
    plugin = FullyShardedDataParallelPlugin()  # reads that environment, as the Accelerator would
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is True
    assert plugin.auto_wrap_policy is not None and plugin.activation_checkpointing is False


def test_the_hsdp_config_shards_within_a_machine_and_replicates_across_machines(monkeypatch):
    """FSDP2 with accelerate's parallelism config: a mesh of 2 replicas (machines) x 8 shards (GPUs)."""
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import FullyShardedDataParallelPlugin

    args, _ = launch_args("hsdp_2x8.yaml")
    assert args.use_parallelism_config
    env = prepare_multi_gpu_env(args)  # the environment each launched process gets
    assert (args.nproc_per_node, args.nnodes) == ("8", "2")  # 8 processes on each machine
    for key, value in env.items():
        if key.startswith(("FSDP_", "ACCELERATE_", "PARALLELISM_CONFIG_")):
            monkeypatch.setenv(key, value)
    assert env["ACCELERATE_USE_PARALLELISM_CONFIG"] == "true"  # the Accelerator then reads the sizes below
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2 and plugin.auto_wrap_policy is not None
    mesh = ParallelismConfig()  # reads that environment, as the Accelerator does
    assert (mesh.dp_replicate_size, mesh.dp_shard_size, mesh.tp_size, mesh.cp_size) == (2, 8, 1, 1)
    assert mesh.dp_replicate_enabled and mesh.dp_shard_enabled and mesh.total_size == 16
    assert mesh.fsdp_dim_names == ["dp_replicate", "dp_shard_cp"]  # what fully_shard gets: a 2-D (HSDP) mesh


def test_the_deepspeed_config_is_zero2_and_leaves_clipping_to_the_recipe(monkeypatch):
    from accelerate.utils import DeepSpeedPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    from vgrpo_platform.parallel.data_parallel import configure_deepspeed

    args, defaults = launch_args("deepspeed_zero2_8gpu.yaml")
    assert args.zero_stage == 2 and defaults.deepspeed_config["zero_stage"] == 2
    assert "gradient_clipping" not in defaults.deepspeed_config  # vgrpo sets it from train.grad_clip
    assert defaults.deepspeed_config["gradient_accumulation_steps"] == 1  # vgrpo accumulates itself
    args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)  # as launch does
    _, env = prepare_deepspeed_cmd_env(args)  # the environment each launched process gets
    for key, value in env.items():
        if key.startswith("ACCELERATE_"):
            monkeypatch.setenv(key, value)
    plugin = DeepSpeedPlugin()  # reads that environment, as the Accelerator would
    configure_deepspeed(plugin, TrainSection().grad_clip, micro_batch_size=TrainSection().micro_batch_size)
    config = plugin.deepspeed_config
    assert config["zero_optimization"]["stage"] == 2
    assert config["gradient_accumulation_steps"] == 1
    assert config["gradient_clipping"] == TrainSection().grad_clip
