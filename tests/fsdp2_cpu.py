"""Launch the vgrpo CLI with accelerate's FSDP2 forced on CPU processes (gloo), for tests.

accelerate switches FSDP on only for accelerator devices (on CPU it falls back to DDP), yet
``fully_shard`` itself runs on gloo. This entry point sets the distributed type and an FSDP2 plugin
(one unit per transformer block, as ``recipes/accelerate/fsdp2_8gpu.yaml``) right after each
``Accelerator`` is built, so the trainer's FSDP2 path runs under ``torchrun`` on a laptop:

    torchrun --nproc_per_node 2 tests/fsdp2_cpu.py run recipes/toy.toml
"""

from __future__ import annotations

from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

_build = Accelerator.__init__


def force_fsdp2(accelerator: Accelerator) -> None:
    """FSDP2, one unit per transformer block, on a built accelerator of several CPU processes."""
    # AcceleratorState copies PartialState's fields each time it is constructed: set both
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    accelerator.state.distributed_type = DistributedType.FSDP
    accelerator.state.fsdp_plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap", reshard_after_forward=True
    )


def _build_with_fsdp2(self: Accelerator, *args: object, **kwargs: object) -> None:
    _build(self, *args, **kwargs)
    if self.num_processes > 1:
        force_fsdp2(self)


if __name__ == "__main__":
    Accelerator.__init__ = _build_with_fsdp2
    from vgrpo_platform.cli.app import main

    main()
