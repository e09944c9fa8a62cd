"""Two gloo processes, the toy denoiser sharded by FSDP2 (one unit per transformer block and the root, as
``recipes/accelerate/fsdp2_8gpu.yaml`` wraps): how many all-gathers a rollout makes with and without
``sharded_state.gathered_while_generating``, and whether the samples are the same.

    torchrun --nproc_per_node 2 tests/fsdp2_generate_cpu.py OUT.json RUN_DIR
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard import _fsdp_param_group
from torch.distributed.tensor import DTensor

from vgrpo_platform.host.collect import default_registry
from vgrpo_platform.parallel.sharded_state import gathered_while_generating
from vgrpo_platform.protocols import BuildContext, SamplerSpec

GATHERS = [0]
_gather = _fsdp_param_group.foreach_all_gather


def _counted(*args: object, **kwargs: object) -> object:
    GATHERS[0] += 1
    return _gather(*args, **kwargs)


def measure(run_dir: Path) -> dict:
    """Three rollouts of the sharded toy model: per-step gathers, gathered once, per-step again."""
    _fsdp_param_group.foreach_all_gather = _counted
    torch.manual_seed(0)
    context = BuildContext(device=torch.device("cpu"), seed=0, run_dir=run_dir, recipe_dir=run_dir)
    spec = default_registry().get("adapter", "toy")
    if dist.get_rank() == 0:  # the first process builds and caches the tiny model, the other loads it
        adapter = spec.factory(spec.config(num_layers=2), context)
    dist.barrier()
    if dist.get_rank() != 0:
        adapter = spec.factory(spec.config(num_layers=2), context)
    denoiser = adapter.denoiser
    blocks = list(denoiser.transformer_blocks)
    for block in blocks:
        fully_shard(block)
    fully_shard(denoiser)
    cond = adapter.encode_prompts(["a red square", "a blue circle"])
    noise = torch.randn((2, *adapter.latent_shape()), generator=torch.Generator().manual_seed(1))
    sampler = SamplerSpec("dpmsolver++", 6)

    def generate() -> tuple[torch.Tensor, int]:
        GATHERS[0] = 0
        with torch.no_grad():
            sample = adapter.sample(noise, cond, sampler)
        return sample, GATHERS[0]

    plain, plain_gathers = generate()
    with gathered_while_generating(denoiser):
        once, once_gathers = generate()
    # every parameter is a slice again (a DTensor whose local part is smaller than the whole)
    resharded = all(isinstance(p, DTensor) for p in denoiser.parameters())
    resharded = resharded and sum(p.to_local().numel() for p in denoiser.parameters()) < sum(
        p.numel() for p in denoiser.parameters()
    )
    after, after_gathers = generate()  # the setting is back: every step gathers again
    return {
        "units": len(blocks) + 1,
        "steps": sampler.steps,
        "gathers_plain": plain_gathers,
        "gathers_once": once_gathers,
        "gathers_after": after_gathers,
        "same_samples": bool(torch.equal(plain, once)) and bool(torch.equal(plain, after)),
        "resharded": resharded,
    }


def main(out: Path, run_dir: Path) -> None:
    dist.init_process_group("gloo")
    record = measure(run_dir)
    if dist.get_rank() == 0:
        out.write_text(json.dumps(record))
    # Every rank waits here and drops the sharded model (and any gloo work it still holds) before the
    # group goes: a gloo group torn down with work alive, or left to interpreter exit, can abort a rank
    # ("terminate called without an active exception"), as it once did in CI.
    dist.barrier()
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
