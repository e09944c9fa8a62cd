"""Launch the vgrpo CLI with accelerate's DeepSpeed ZeRO-2 forced on CPU processes (gloo), for tests.

accelerate turns DeepSpeed on only for accelerator devices (on CPU it falls back to DDP), yet
DeepSpeed's CPU accelerator runs ZeRO-2 on gloo. This entry point sets the distributed type and a
DeepSpeed plugin (ZeRO stage 2, the keys of ``recipes/accelerate/deepspeed_zero2_8gpu.yaml``) right
after each ``Accelerator`` is built, so the trainer's DeepSpeed path runs under ``torchrun`` on a
laptop:

    torchrun --nproc_per_node 2 tests/deepspeed_cpu.py run recipes/toy.toml

DeepSpeed's shared-memory all-reduce kernel serves only its inference engine; building it compiles
C++ for a minute on first use, so it is skipped here (training collectives stay on gloo).
"""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported

from accelerate import Accelerator, PartialState
from accelerate.utils import DeepSpeedPlugin, DistributedType

_build = Accelerator.__init__


def _build_with_deepspeed(self: Accelerator, *args: object, **kwargs: object) -> None:
    plugin = DeepSpeedPlugin(zero_stage=2, offload_optimizer_device="none", offload_param_device="none")
    _build(self, *args, deepspeed_plugin=plugin, **kwargs)
    if self.num_processes > 1:
        plugin.set_mixed_precision(self.mixed_precision)  # as accelerate does for a DeepSpeed launch
        plugin.select(_from_accelerator_state=True)
        # AcceleratorState copies PartialState's fields each time it is constructed: set both
        PartialState._shared_state["distributed_type"] = DistributedType.DEEPSPEED
        self.state.distributed_type = DistributedType.DEEPSPEED
        self.state.deepspeed_plugins = plugin


if __name__ == "__main__":
    import importlib

    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    Accelerator.__init__ = _build_with_deepspeed
    from vgrpo_platform.cli.app import main

    main()
