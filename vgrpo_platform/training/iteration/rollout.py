"""Rollouts: G samples per prompt from the current policy, with any ODE sampler, then their rewards."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal

import torch

from vgrpo_platform.conditions import encode_conditioned
from vgrpo_platform.protocols import Adapter, BatchState, Conditioning, SamplerSpec, Samples, SurrogateBase


def repeat_conditioning(cond: Conditioning, index: torch.Tensor) -> Conditioning:
    """Row ``index[i]`` of every conditioning tensor: how one prompt's encoding serves its whole group."""
    return {k: v[index.to(v.device)] for k, v in cond.items()}


def concat_samples(parts: Sequence[Samples]) -> Samples:
    return Samples.concat(parts)


NoiseScope = Literal["sample", "group"]


def share_within_groups(noise: torch.Tensor, group_size: int) -> torch.Tensor:
    """Every row takes the noise of its group's first row: ``[N, *L]`` -> ``[N, *L]``.

    Rows ``g * group_size ..`` form group ``g`` (the loop's layout), so the draw itself is unchanged:
    the generator yields the same numbers whichever scope a surrogate asks for, and one noise per group
    is the first draw of its block.
    """
    first = torch.arange(noise.shape[0]) // group_size * group_size  # [N]
    return noise[first]


RolloutState = BatchState | dict[str, torch.Tensor] | None
"""What a rollout leaves for the surrogate's ``prepare``: its own sampler's ``BatchState``, a dict of
``[B, ...]`` tensors (deprecated: a third-party surrogate not yet on ``BatchState``), or None."""

RolloutFn = Callable[
    [Adapter, torch.Tensor, Conditioning, SamplerSpec, torch.Generator],
    tuple[torch.Tensor, BatchState | dict[str, torch.Tensor]],
]
"""A surrogate's own sampler (``SurrogateBase.rollout``): ``(latents [B, *L], state [B, ...])``."""


def join_states(parts: Sequence[BatchState | dict[str, torch.Tensor]]) -> RolloutState:
    """The chunks' rollout states as one, joined along the batch; None without any."""
    if not parts:
        return None
    states = [p for p in parts if isinstance(p, BatchState)]
    if len(states) == len(parts):
        return type(states[0]).concat(states)
    dicts = [p for p in parts if isinstance(p, dict)]
    if len(dicts) != len(parts):
        kinds = sorted({type(p).__name__ for p in parts})
        raise TypeError(f"rollout() returned {kinds} across chunks: return one BatchState type")
    warnings.warn(
        "a rollout() returning a dict of extras is deprecated: return a BatchState (docs/hooks.md)",
        DeprecationWarning,
        stacklevel=2,
    )
    return {k: torch.cat([d[k] for d in dicts]) for k in dicts[0]}


ChunkSampler = Callable[[torch.Tensor, Conditioning, slice], torch.Tensor]
"""How a chunk's clean latents are made: ``(noise [b, *L], cond [b, ...], rows of the batch) -> [b, *L]``
(a rollout backend; ``adapter.sample`` by default)."""


@dataclass
class RolloutPlan:
    """What a rollout starts from, drawn before any sample exists: ``group_ids [B]``, ``cond [B, ...]`` and
    ``noise [B, *L]`` (a rollout backend may generate it in another process, or ahead of time)."""

    prompts: list[str]  # one per row, groups contiguous
    group_ids: torch.Tensor
    cond: Conditioning
    noise: torch.Tensor


@torch.no_grad()
def plan_rollout(
    adapter: Adapter,
    prompts: Sequence[str],
    *,
    group_size: int,
    generator: torch.Generator,
    device: torch.device | str,
    noise_window: tuple[int, int] | None = None,
    noise_scope: NoiseScope = "sample",
) -> RolloutPlan:
    """Encode the prompts and draw the initial noise (see ``generate_with_extras``)."""
    group_ids = torch.arange(len(prompts)).repeat_interleave(group_size)  # [B]
    cond = repeat_conditioning(encode_conditioned(adapter, prompts), group_ids)  # condition images too
    start, total = noise_window if noise_window is not None else (0, len(group_ids))
    noise = torch.randn((total, *adapter.latent_shape()), generator=generator)  # [N, *L]
    if noise_scope == "group":  # the window starts on a group boundary (whole groups per rank)
        noise = share_within_groups(noise, group_size)
    elif noise_scope != "sample":
        raise ValueError(f"unknown noise_scope {noise_scope!r}; expected 'sample' or 'group'")
    noise = noise[start : start + len(group_ids)]  # [B, *L]
    if len(noise) < len(group_ids):  # padding rows past the window (lockstep_rows): any noise will do
        noise = torch.cat([noise, noise.new_zeros((len(group_ids) - len(noise), *noise.shape[1:]))])
    flat = [p for p in prompts for _ in range(group_size)]
    return RolloutPlan(flat, group_ids, cond, noise.to(device))


@torch.no_grad()
def roll_out(
    adapter: Adapter,
    plan: RolloutPlan,
    *,
    sampler: SamplerSpec,
    generator: torch.Generator,
    chunk_size: int,
    rollout_fn: RolloutFn | None = None,
    sample_chunk: ChunkSampler | None = None,
    on_chunk: Callable[[Samples], None] | None = None,
) -> tuple[torch.Tensor, Samples, RolloutState]:
    """The plan's clean latents ``[B, *L]``, decoded samples and rollout state, chunk by chunk."""
    noise, cond = plan.noise, plan.cond
    latents, decoded = [], []
    states: list[BatchState | dict[str, torch.Tensor]] = []
    for start in range(0, len(plan.group_ids), chunk_size):
        part = slice(start, start + chunk_size)
        cond_part = {k: v[part] for k, v in cond.items()}
        if rollout_fn is not None:
            x0, chunk_state = rollout_fn(adapter, noise[part], cond_part, sampler, generator)
            states.append(chunk_state)
        elif sample_chunk is not None:
            x0 = sample_chunk(noise[part], cond_part, part)
        else:
            x0 = adapter.sample(noise[part], cond_part, sampler)
        latents.append(x0)
        decoded.append(adapter.decode(x0))
        if on_chunk is not None:
            on_chunk(decoded[-1])
    return torch.cat(latents), concat_samples(decoded), join_states(states)


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
    noise_scope: NoiseScope = "sample",
    on_chunk: Callable[[Samples], None] | None = None,
) -> tuple[torch.Tensor, Conditioning, torch.Tensor, torch.Tensor, Samples, RolloutState]:
    """Sample ``group_size`` outputs for each prompt, optionally with a surrogate's own sampler.

    Returns ``(group_ids [B], cond [B, ...], noise [B, *L], latents [B, *L], samples, state)`` with
    ``B = len(prompts) * group_size``; samples of one prompt are contiguous. Noise is drawn on the
    CPU generator so a seed gives the same rollout on any device. ``noise_window = (start, total)``
    (a data-parallel rank's share): draw noise for ``total`` samples and keep rows ``start ..
    start + B``, so every rank's generator stays in step and each sample gets its single-process noise.
    Rows past ``total`` (a rank padding its share to keep forwards in lockstep) get zero noise.

    With ``rollout_fn`` (an SDE that records per-step log-probs) each chunk is sampled by it instead of
    ``adapter.sample``, drawing its step noise from ``generator`` after the initial noise; its states
    are joined along the batch (``state`` is None without ``rollout_fn``).
    ``noise_scope = "group"`` gives every sample of a prompt the same initial noise (DanceGRPO,
    Flow-GRPO-Fast; a surrogate asks for it with ``initial_noise = "group"``), from the same draw.
    ``on_chunk`` receives each decoded chunk as soon as it exists (``[scoring] overlap`` scores it
    while the next chunk is generated).
    """
    plan = plan_rollout(
        adapter,
        prompts,
        group_size=group_size,
        generator=generator,
        device=device,
        noise_window=noise_window,
        noise_scope=noise_scope,
    )
    latents, samples, state = roll_out(
        adapter,
        plan,
        sampler=sampler,
        generator=generator,
        chunk_size=chunk_size,
        rollout_fn=rollout_fn,
        on_chunk=on_chunk,
    )
    return plan.group_ids, plan.cond, plan.noise, latents, samples, state


def surrogate_sampler(
    surrogate: SurrogateBase, autocast: Callable[[], AbstractContextManager[Any]]
) -> RolloutFn | None:
    """The surrogate's own sampler (MDP baselines sample their own SDE), None where it has none.

    It runs under ``autocast``, the autocast of the surrogate's ``loss``, so on-policy ratios are 1.
    """
    if not surrogate.owns_rollout:
        return None
    rollout = surrogate.rollout

    def autocast_rollout(*args: Any) -> Any:
        with autocast():
            return rollout(*args)

    return autocast_rollout
