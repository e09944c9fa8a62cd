"""Rollouts: G samples per prompt from the current policy, with any ODE sampler, then their rewards."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from vgrpo_platform.protocols import Adapter, Conditioning, SamplerSpec, Samples


def repeat_conditioning(cond: Conditioning, index: torch.Tensor) -> Conditioning:
    """Row ``index[i]`` of every conditioning tensor: how one prompt's encoding serves its whole group."""
    return {k: v[index.to(v.device)] for k, v in cond.items()}


def concat_samples(parts: Sequence[Samples]) -> Samples:
    first = parts[0]
    return Samples(
        modality=first.modality,
        data=torch.cat([p.data for p in parts]),
        sample_rate=first.sample_rate,
        fps=first.fps,
    )


RolloutFn = Callable[
    [Adapter, torch.Tensor, Conditioning, SamplerSpec, torch.Generator],
    tuple[torch.Tensor, dict[str, torch.Tensor]],
]
"""A surrogate's own sampler (``Surrogate.rollout``): ``(latents [B, *L], extras {key: [B, ...]})``."""


@torch.no_grad()
def generate(
    adapter: Adapter,
    prompts: Sequence[str],
    *,
    group_size: int,
    sampler: SamplerSpec,
    generator: torch.Generator,
    chunk_size: int,
    device: torch.device | str,
    noise_window: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, Conditioning, torch.Tensor, torch.Tensor, Samples]:
    """Sample ``group_size`` outputs for each prompt.

    Returns ``(group_ids [B], cond [B, ...], noise [B, *L], latents [B, *L], samples)`` with
    ``B = len(prompts) * group_size``; samples of one prompt are contiguous. Noise is drawn on the
    CPU generator so a seed gives the same rollout on any device. ``noise_window = (start, total)``
    (a data-parallel rank's share): draw noise for ``total`` samples and keep rows ``start ..
    start + B``, so every rank's generator stays in step and each sample gets its single-process noise.
    Rows past ``total`` (a rank padding its share to keep forwards in lockstep) get zero noise.
    """
    return generate_with_extras(
        adapter,
        prompts,
        group_size=group_size,
        sampler=sampler,
        generator=generator,
        chunk_size=chunk_size,
        device=device,
        noise_window=noise_window,
    )[:5]


@torch.no_grad()
def generate_with_extras(
    adapter: Adapter,
    prompts: Sequence[str],
    *,
    group_size: int,
    sampler: SamplerSpec,
    generator: torch.Generator,
    chunk_size: int,
    device: torch.device | str,
    rollout_fn: RolloutFn | None = None,
    noise_window: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, Conditioning, torch.Tensor, torch.Tensor, Samples, dict[str, torch.Tensor]]:
    """``generate`` with an optional surrogate sampler (an SDE that records per-step log-probs).

    With ``rollout_fn`` each chunk is sampled by it instead of ``adapter.sample``, drawing its step
    noise from ``generator`` after the initial noise; its extras are concatenated along the batch.
    Returns ``generate``'s tuple plus ``extras`` (empty without ``rollout_fn``).
    """
    group_ids = torch.arange(len(prompts)).repeat_interleave(group_size)  # [B]
    cond = repeat_conditioning(adapter.encode_prompts(list(prompts)), group_ids)
    start, total = noise_window if noise_window is not None else (0, len(group_ids))
    noise = torch.randn((total, *adapter.latent_shape()), generator=generator)  # [N, *L]
    noise = noise[start : start + len(group_ids)]  # [B, *L]
    if len(noise) < len(group_ids):  # padding rows past the window (lockstep_rows): any noise will do
        noise = torch.cat([noise, noise.new_zeros((len(group_ids) - len(noise), *noise.shape[1:]))])
    noise = noise.to(device)
    latents, decoded, extras = [], [], []
    for start in range(0, len(group_ids), chunk_size):
        part = slice(start, start + chunk_size)
        cond_part = {k: v[part] for k, v in cond.items()}
        if rollout_fn is None:
            x0 = adapter.sample(noise[part], cond_part, sampler)
        else:
            x0, chunk_extras = rollout_fn(adapter, noise[part], cond_part, sampler, generator)
            extras.append(chunk_extras)
        latents.append(x0)
        decoded.append(adapter.decode(x0))
    merged = {k: torch.cat([e[k] for e in extras]) for k in extras[0]} if extras else {}
    return group_ids, cond, noise, torch.cat(latents), concat_samples(decoded), merged
