"""Launch the vgrpo CLI with accelerate's hybrid sharding (HSDP) forced on 4 CPU processes (gloo), for tests.

As ``tests/fsdp2_cpu.py`` does for FSDP2: accelerate turns FSDP on only for accelerator devices, so right
after each ``Accelerator`` is built this sets the distributed type, an FSDP2 plugin and the parallelism
config of ``recipes/accelerate/hsdp_2x8.yaml`` at 2 x 2 (2 replicas, each sharded over 2 processes), with
its device mesh, as accelerate builds them from that config on GPUs. Everything after that is the code a
multi-node launch runs: ``fully_shard`` on the ``(dp_replicate, dp_shard)`` mesh.

    torchrun --nproc_per_node 4 tests/hsdp_cpu.py run recipes/toy.toml
"""

from __future__ import annotations

from accelerate import Accelerator
from accelerate.parallelism_config import ParallelismConfig
from fsdp2_cpu import force_fsdp2

_build = Accelerator.__init__
REPLICAS = 2  # "machines"; the shards of each replica are the other factor of the world size


def _build_with_hsdp(self: Accelerator, *args: object, **kwargs: object) -> None:
    _build(self, *args, **kwargs)
    if self.num_processes > 1:
        force_fsdp2(self)
        mesh = ParallelismConfig(dp_replicate_size=REPLICAS, dp_shard_size=self.num_processes // REPLICAS)
        self.state.parallelism_config = mesh
        self.state.device_mesh = mesh.get_device_mesh("cpu")


if __name__ == "__main__":
    Accelerator.__init__ = _build_with_hsdp
    from vgrpo_platform.cli.app import main

    main()
