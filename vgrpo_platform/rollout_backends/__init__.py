"""Rollout backends: where a training rollout's final latents come from (``[rollout] backend``).

V-GRPO, DiffusionNFT and AWM score and train on the final samples only, so those samples may come from
any engine: the trainer's own sampler (``in_process``), the same sampler with a diffusers cache over
its steps (``cached``), or a worker process holding its own copy of the denoiser (``worker``), which
may generate the next iteration's rollout while this one updates (``rollout.overlap``). A backend is
a plugin kind like adapters and rewards; ``contract.py`` is what a third-party backend implements.
"""
