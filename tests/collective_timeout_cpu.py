"""One of two gloo processes built the way a training run builds them, with ``train.collective_timeout_s``
from a recipe. Rank 1 pauses itself (SIGSTOP) as a stuck rank would; rank 0 waits for it at a barrier and
writes what happened, which must be an error after the recipe's timeout rather than torch's 30 minutes.

    RANK=r WORLD_SIZE=2 LOCAL_RANK=r MASTER_ADDR=127.0.0.1 MASTER_PORT=P \
        python collective_timeout_cpu.py RECIPE SECONDS OUT.json
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from vgrpo_platform.config.recipe import load_recipe
from vgrpo_platform.parallel import data_parallel as dp


def main(recipe_path: Path, seconds: str, out: Path) -> None:
    recipe = load_recipe(recipe_path, [f"train.collective_timeout_s={seconds}"])
    accelerator = dp.build_accelerator(
        torch.device("cpu"), "no", collective_timeout_s=recipe.train.collective_timeout_s
    )
    group = dist.distributed_c10d._get_default_group()
    timeout = group._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    report = {"processes": accelerator.num_processes, "timeout_s": timeout}
    if accelerator.process_index == 1:
        out.with_suffix(".rank1.json").write_text(json.dumps(report))
        os.kill(os.getpid(), signal.SIGSTOP)  # paused: the test kills it
        return
    try:
        dist.barrier()
        report["barrier"] = "passed"
    except Exception as exc:  # gloo's timeout error; its type differs across torch versions
        report["barrier"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    out.write_text(json.dumps(report))
    os._exit(0)  # the group cannot be torn down with a peer paused


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
