"""The data anchor (``[train.data_anchor]``): a flow-matching loss on real data beside the reward's loss.

Why: an RL objective rewards only what the reward model sees, so a policy can drift off the data
distribution (forget how to draw, collapse styles) while its reward keeps rising. DDRL ("Data-regularized
Reinforcement Learning for Diffusion Models at Scale") adds the pretraining loss on real samples to the
RL loss; here that is ``weight * L_fm`` with ``L_fm = mean_i mean_d (v_theta(z_t, t, c) - (eps - x0))^2``
on a batch of data ``(x0, c)`` drawn afresh at every optimiser step (docs/method.md section 7).

The velocity error is formed through the adapter's own schedule as ``|x_hat - x0|^2 / t^2``, the same
number for rectified flow (``x_hat - x0 = t (eps - x0 - v)``), as the AWM surrogate does, so nothing
here knows the model's parameterisation. ``t`` follows the adapter's warp, clamped off 0.

Data-parallel rule (docs/scaling.md): every rank draws the rows, ``t`` and ``eps`` of the whole anchor
batch from a generator seeded by ``(seed, optimiser step)`` and keeps its own block, so N processes see
what one does, and a resumed or replayed step draws the same batch without any saved RNG state.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open

from vgrpo_platform.algo.timesteps import DEFAULT_T_MAX, DEFAULT_T_MIN
from vgrpo_platform.conditions import encode_conditioned
from vgrpo_platform.errors import RecipeError
from vgrpo_platform.protocols import Adapter

if TYPE_CHECKING:
    from vgrpo_platform.config.schema import DataAnchorSection
    from vgrpo_platform.parallel.data_parallel import Shard

METRIC = "data_anchor/loss"
"""The logged key: the anchor's flow-matching loss (before ``weight``), averaged over the optimiser steps."""


def load_anchor_data(path: str | Path) -> tuple[torch.Tensor, list[str]]:
    """``(latents [N, *L], prompts)`` from a .safetensors file: tensor ``latents`` and metadata ``prompts``
    (a JSON list of ``N`` strings)."""
    where = f"train.data_anchor.source '{path}'"
    if not Path(path).is_file():
        raise RecipeError(f"{where} is not a file; give a .safetensors file with 'latents' and 'prompts'")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            if "latents" not in f.keys():
                raise RecipeError(f"{where} has no tensor 'latents'; save the data's latents under that name")
            latents = f.get_tensor("latents")
    except RecipeError:
        raise
    except Exception as exc:  # safetensors' own errors: not a safetensors file, truncated...
        raise RecipeError(
            f"{where} cannot be read as safetensors ({exc}); write it with safetensors"
        ) from None
    try:
        prompts = json.loads(metadata["prompts"])
    except (KeyError, json.JSONDecodeError):
        prompts = None
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise RecipeError(f"{where} needs metadata 'prompts': a JSON list of strings, one per latent")
    if len(prompts) != latents.shape[0] or not prompts:
        raise RecipeError(
            f"{where} holds {latents.shape[0]} latents but {len(prompts)} prompts; give one prompt per latent"
        )
    return latents, prompts


def write_anchor_data(path: str | Path, latents: torch.Tensor, prompts: list[str]) -> Path:
    """Write what ``load_anchor_data`` reads: tensor ``latents`` ``[N, *L]``, metadata ``prompts`` (JSON)."""
    from safetensors.torch import save_file

    if latents.shape[0] != len(prompts) or not prompts:
        raise ValueError(f"{latents.shape[0]} latents but {len(prompts)} prompts; give one prompt per latent")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"latents": latents.contiguous()}, str(path), metadata={"prompts": json.dumps(prompts)})
    return path


def anchor_generator(seed: int, step: int) -> torch.Generator:
    """The anchor's generator for optimiser step ``step``: a function of the two only."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def flow_matching_loss(
    adapter: Adapter, x0: torch.Tensor, t: torch.Tensor, eps: torch.Tensor, prompts: list[str]
) -> torch.Tensor:
    """``mean_i mean_d (v_theta(z_t, t, c_i) - (eps - x0))^2`` (a scalar), through the adapter's schedule."""
    schedule = adapter.schedule
    z_t = schedule.noise(x0, eps, t)  # [b, *L]
    x_hat = schedule.predict_x0(z_t, adapter.predict(z_t, t, encode_conditioned(adapter, prompts)), t)
    dims = tuple(range(1, x0.ndim))
    mse = (x_hat.float() - x0.float()).square().mean(dim=dims)  # [b]
    return (mse / t.float().square()).mean()


class DataAnchor:
    """The data and the draws of ``[train.data_anchor]``; ``loss(adapter, step)`` is this rank's share."""

    def __init__(self, config: DataAnchorSection, adapter: Adapter, shard: Shard | None = None) -> None:
        if config.source is None:
            raise RecipeError("train.data_anchor.weight > 0 needs train.data_anchor.source")
        self.config = config
        self.latents, self.prompts = load_anchor_data(config.source)
        shape = tuple(adapter.latent_shape())
        if tuple(self.latents.shape[1:]) != shape:
            raise RecipeError(
                f"train.data_anchor.source holds latents of shape {tuple(self.latents.shape[1:])} but the "
                f"adapter's latents are {shape}; encode the data with this model at its resolution"
            )
        world = shard.world if shard is not None else 1
        if config.batch_size % world:
            raise RecipeError(
                f"train.data_anchor.batch_size = {config.batch_size} does not split evenly over {world} "
                f"processes; set it to a multiple of {world}"
            )
        self.rows = shard.block(config.batch_size) if shard is not None else slice(0, config.batch_size)

    def draw(self, adapter: Adapter, step: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """This rank's ``(t [b], eps [b, *L], indices [b])`` of step ``step``'s global batch, drawn whole."""
        n = self.config.batch_size
        g = anchor_generator(self.config.seed, step)
        index = torch.randint(len(self.prompts), (n,), generator=g)  # [n]
        u = torch.rand(n, generator=g)
        t = adapter.schedule.warp(u).clamp(DEFAULT_T_MIN, DEFAULT_T_MAX)  # [n]
        eps = torch.randn((n, *self.latents.shape[1:]), generator=g)  # [n, *L]
        return t[self.rows], eps[self.rows], index[self.rows].tolist()

    def loss(self, adapter: Adapter, step: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The flow-matching loss of this rank's rows of step ``step``'s anchor batch (a scalar)."""
        t, eps, index = self.draw(adapter, step)
        x0 = self.latents[index].to(device=device, dtype=dtype)
        prompts = [self.prompts[i] for i in index]
        return flow_matching_loss(adapter, x0, t.to(device), eps.to(device=device, dtype=dtype), prompts)
