"""``vgrpo run RECIPE --gpus N``: start ``accelerate launch`` with the shipped config that fits.

Why a launcher of our own: a multi-GPU run otherwise needs ``accelerate launch --config_file ... -m
vgrpo_platform.cli run ...`` and a choice among the shipped configs that ``vgrpo plan`` can make. The
choice uses ``plan``'s estimate on this machine's GPUs: the least sharding that fits (DDP, then
DeepSpeed ZeRO-2 where DeepSpeed is installed, then FSDP2). Without a visible GPU, or with
``run.device = "cpu"``, the N processes run on the CPU over gloo with the DDP config (the memory question
does not arise; accelerate enables FSDP2 and DeepSpeed only on GPUs). The processes run ``python -m
accelerate.commands.launch``, the command behind ``accelerate launch``, so both routes are one route.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vgrpo_platform.cli.memory_estimate import GIB, HEADROOM, SHARDING
from vgrpo_platform.cli.plan import accelerate_configs, peaks_at
from vgrpo_platform.config.recipe import ResolvedRecipe
from vgrpo_platform.errors import RecipeError
from vgrpo_platform.parallel.data_parallel import Shard
from vgrpo_platform.training.recovery.recipe_changes import CHECKED_ENV

PREFERENCE = ("none", "zero2", "fsdp2")  # least sharding first: fewer collectives, the same run
LAUNCHED_ENV = ("WORLD_SIZE", "LOCAL_RANK")  # set inside a process that torchrun or accelerate started


@dataclass(frozen=True)
class Launch:
    """What ``--gpus`` starts: ``processes`` copies of the run under ``config``; ``why`` is said first."""

    config: Path
    processes: int
    why: str


def _usable(sharding: str) -> bool:
    return sharding != "zero2" or importlib.util.find_spec("deepspeed") is not None


def choose(resolved: ResolvedRecipe, gpus: int, accelerate_dir: Path, gpu_memory: int | None) -> Launch:
    """The shipped config for ``gpus`` processes: on GPUs of ``gpu_memory`` bytes the least sharding whose
    estimated peak fits; ``gpu_memory = None``: CPU processes, DDP."""
    configs: dict[str, str] = {}  # sharding -> the first such config file
    for name, sharding, processes in accelerate_configs(accelerate_dir, one_machine=True):
        if processes > 1 and _usable(sharding):
            configs.setdefault(sharding, name)
    if "none" not in configs:
        raise RecipeError(
            f"no multi-process accelerate config in {accelerate_dir}; pass --accelerate-config FILE "
            "(the vgrpo repository ships them in recipes/accelerate)"
        )
    if gpu_memory is None:
        return Launch(
            accelerate_dir / configs["none"],
            gpus,
            f"{gpus} CPU processes (gloo), {configs['none']}: no GPU here, or run.device = 'cpu'",
        )
    shardings = [k for k in PREFERENCE if k in configs]
    peaks = peaks_at(resolved, gpus, shardings)
    budget = HEADROOM * gpu_memory
    for sharding in shardings:
        if peaks[sharding] <= budget:
            return Launch(
                accelerate_dir / configs[sharding],
                gpus,
                f"{gpus} GPUs, {configs[sharding]} ({SHARDING[sharding]}): an estimated "
                f"{peaks[sharding] / GIB:.1f} GiB per GPU of {gpu_memory / GIB:.0f} GiB (vgrpo plan)",
            )
    least = min(peaks, key=lambda k: peaks[k])
    raise RecipeError(
        f"{resolved.path or 'the recipe'} does not fit {gpus} GPUs of {gpu_memory / GIB:.0f} GiB under any "
        f"shipped config (least: {configs[least]}, an estimated {peaks[least] / GIB:.1f} GiB per GPU); use "
        "more GPUs, train.finetune = 'lora' or train.gradient_checkpointing = true (vgrpo plan RECIPE "
        f"--gpus {gpus} shows the terms), or pass --accelerate-config"
    )


def given(config: Path, gpus: int) -> Launch:
    """``--accelerate-config FILE``: the user's config, at ``gpus`` processes."""
    if not config.is_file():
        raise RecipeError(f"accelerate config {config} not found; check the path")
    return Launch(config, gpus, f"{gpus} processes, {config}")


def argv(launch: Launch, recipe: Path, forwarded: Sequence[str]) -> list[str]:
    """The command that starts the run: ``accelerate launch`` with the config, the process count and a
    free port, running ``vgrpo run RECIPE`` with the user's other options."""
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(launch.config),
        "--num_processes",
        str(launch.processes),
        "--main_process_port",
        "0",  # accelerate picks a free one: two runs on one machine do not collide
        "-m",
        "vgrpo_platform.cli",
        "run",
        str(recipe),
        *forwarded,
    ]


def visible_gpus(resolved: ResolvedRecipe, gpus: int) -> int | None:
    """The memory of one GPU in bytes, ``None`` for CPU processes; a one-line error if fewer GPUs are
    visible than asked for, or if this is already a launched process."""
    if any(os.environ.get(k) for k in LAUNCHED_ENV):
        raise RecipeError(
            "--gpus starts the processes itself; under accelerate launch or torchrun leave it out"
        )
    Shard(0, gpus).prompt_block(resolved.recipe.rollout.prompts_per_iteration)  # an uneven split stops here
    import torch

    if resolved.recipe.run.device == "cpu" or not torch.cuda.is_available():
        return None
    found = torch.cuda.device_count()
    if found < gpus:
        raise RecipeError(
            f"--gpus {gpus} but {found} GPU{'s' if found != 1 else ''} visible; ask for at most {found}"
        )
    return int(torch.cuda.get_device_properties(0).total_memory)


def start(command: list[str]) -> int:
    """Run the launcher to its end and return its exit code. Ctrl-C reaches the processes too (one
    process group): they save a checkpoint and stop, and this waits for them."""
    env = {**os.environ, CHECKED_ENV: "1"}
    process = subprocess.Popen(command, env=env)
    while True:
        try:
            return process.wait()
        except KeyboardInterrupt:
            continue


def launch_run(
    resolved: ResolvedRecipe,
    recipe: Path,
    gpus: int,
    accelerate_config: Path | None,
    accelerate_dir: Path,
    flags: dict[str, bool],
) -> int:
    """``vgrpo run --gpus``: check once, here, what every process would stop on (the split, the run
    directory, the GPUs), choose the config, say what starts and run it with the user's ``--set``
    overrides and the ``flags`` that are on (``--resume``, ``--force``, ``--debug``); the exit code."""
    from vgrpo_platform.training.recovery.run_state import check_run_dir
    from vgrpo_platform.training.session import run_dir_of

    memory = visible_gpus(resolved, gpus)
    check_run_dir(run_dir_of(resolved.recipe), flags.get("--resume", False))
    launch = (
        given(accelerate_config, gpus)
        if accelerate_config
        else choose(resolved, gpus, accelerate_dir, memory)
    )
    forwarded = [a for o in resolved.overrides for a in ("--set", o)] + [f for f, on in flags.items() if on]
    command = argv(launch, recipe, forwarded)
    print(f"launch: {launch.why}\n  {shlex.join(command)}", flush=True)
    return start(command)
