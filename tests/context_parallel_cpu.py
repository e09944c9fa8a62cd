"""Two gloo processes share each clip's tokens (``[parallel] context = 2``, Ulysses) of a tiny Wan 2.1 or
Wan 2.2 (two experts) LoRA policy: the velocity, the rollout and the gradient (the loss scaled by the
context degree, then averaged over processes as DDP does) against the same process before the split.

    torchrun --nproc_per_node 2 tests/context_parallel_cpu.py PIPELINE_DIR OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from tiny_pipelines import WAN_FRAMES, WAN_SIDE, WAN_TOKENS

from vgrpo_platform.config.schema import TrainSection
from vgrpo_platform.finetune import make_trainable
from vgrpo_platform.host.collect import default_registry
from vgrpo_platform.parallel import context_parallel
from vgrpo_platform.protocols import BuildContext, SamplerSpec


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def main(pipeline: Path, out: Path) -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    spec = default_registry().get("adapter", "wan")
    config = spec.config(
        model=str(pipeline), resolution=WAN_SIDE, num_frames=WAN_FRAMES, max_sequence_length=WAN_TOKENS
    )
    adapter = spec.factory(config, BuildContext(device=torch.device("cpu"), seed=0))
    trainable = make_trainable(adapter, TrainSection(finetune="lora", lora_rank=4))
    with torch.no_grad():  # LoRA B starts at zero: give it values, so A's gradients are not all zero
        for name, p in trainable.items():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.1)
    cond = adapter.encode_prompts(["a red car", "a cat on a wall"])
    gen = torch.Generator().manual_seed(1)
    z = torch.randn((2, *adapter.latent_shape()), generator=gen)
    t = torch.tensor([0.9, 0.3])  # one row on each expert of Wan 2.2 (boundary 0.7)
    weights = torch.randn((2, *adapter.latent_shape()), generator=gen)
    sampler = SamplerSpec("euler", 3)

    tokens: list[int] = []  # what the second transformer block of each forward sees (the first splits)
    second_blocks = [m.blocks[1] for m in context_parallel.parallel_models(adapter.denoiser)]
    for block in second_blocks:
        block.register_forward_pre_hook(lambda _m, args: tokens.append(args[0].shape[1]))

    def velocity_and_grads() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        for p in trainable.values():
            p.grad = None
        v = adapter.predict(z, t, cond)
        loss = (v * weights).sum() * context_parallel.gradient_scale(adapter.denoiser)
        loss.backward()
        grads = {}
        for name, p in trainable.items():
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            dist.all_reduce(g, op=dist.ReduceOp.AVG)  # what DDP does with every process's gradient
            grads[name] = g
        return v.detach(), grads

    with torch.no_grad():
        sample_alone = adapter.sample(z, cond, sampler)
    v_alone, g_alone = velocity_and_grads()
    tokens_alone, tokens[:] = sorted(set(tokens)), []
    line = context_parallel.enable(adapter.denoiser, 2, "ulysses", "wan")
    with torch.no_grad():
        sample_split = adapter.sample(z, cond, sampler)
    v_split, g_split = velocity_and_grads()
    moved = [n for n in g_alone if g_alone[n].abs().max() > 0]
    result = {
        "line": line,
        "degree": context_parallel.degree_of(adapter.denoiser),
        "tokens_alone": tokens_alone,
        "tokens_split": sorted(set(tokens)),
        "velocity_rel": _relative(v_split, v_alone),
        "sample_rel": _relative(sample_split, sample_alone),
        "grad_rel_max": max(_relative(g_split[n], g_alone[n]) for n in moved),
        "grads_nonzero": len(moved),
        "grads_total": len(g_alone),
    }
    if dist.get_rank() == 0:
        out.write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
