"""Network evaluations (NFE) per training iteration, per method: the benchmark's common x axis.

One NFE is one denoiser forward on one sample. An iteration costs every sample's rollout steps plus
the forwards its surrogate makes in ``prepare`` and ``loss``; evaluations and the optional
diagnostics are not part of a method's cost. Each sample sits in exactly one mini-batch per
iteration (``train.gradient_steps_per_iteration`` splits the batch), so ``loss`` forwards it once
whatever the number of optimiser steps. tests/test_benchmark.py checks these counts against the
forwards a real run makes.
"""

from __future__ import annotations

from typing import Any

from vgrpo_platform.algo import step_rewards, tree
from vgrpo_platform.algo.surrogates.flow_grpo import window_mask, window_start

TREE_FAMILY = ("tree_grpo", "branch_grpo")
FLOW_GRPO_FAMILY = (
    "flow_grpo",
    "mixgrpo",
    "dance_grpo",
    "flow_grpo_fast",
    "flow_grpo_cps",
    "grpo_guard",
    "flow_dppo",
)


def trained_sde_steps(config: Any, steps: int, iteration: int) -> int:
    """Steps each sample trains in ``iteration`` (1-based) under a ``FlowGRPOConfig``."""
    size = config.window_size
    if config.window_placement == "sliding":
        mask = window_mask(steps, size, window_start(iteration, steps, config))
        last_in_window = bool(mask[-1])
        candidates = int(mask.sum())
    else:  # a random branch: its size is fixed, whether it holds the last step is not known here
        candidates = steps if size is None or size >= steps else size
        last_in_window = candidates == steps
    # the last step is left out by train_last_step = false, and a CPS step to t = 0 is deterministic
    if last_in_window and (not config.train_last_step or config.sde_kind == "cps"):
        candidates -= 1
    return int(candidates * config.train_fraction) if config.train_fraction < 1 else candidates


def scored_steps(config: Any, steps: int) -> list[int]:
    """The steps ``step_rewards`` (DenseGRPO) scores and trains (docs/method.md section 9)."""
    if (config.window_size is not None and config.window_size < steps) or config.train_fraction < 1:
        raise KeyError("no NFE count for step_rewards on an SDE window or a step subset; add it to nfe.py")
    trainable = [j for j in range(steps) if config.train_last_step or j < steps - 1]
    wanted = config.step_reward_steps if config.step_reward_steps is not None else range(steps)
    return [j for j in wanted if j in trainable]


def step_reward_forwards(config: Any, steps: int) -> int:
    """Forwards per sample that ``step_rewards`` adds: one ODE completion (or x-prediction) of each latent
    its scored steps need, the final one excepted."""
    needed = step_rewards.latent_indices(scored_steps(config, steps))
    return sum((steps - i) if config.step_reward_target == "ode" else 1 for i in needed if i < steps)


def surrogate_forwards(
    name: str, config: Any, steps: int, gradient_steps: int, iteration: int, group_size: int = 1
) -> float:
    """Denoiser forwards per sample that the surrogate ``name`` makes in one iteration.

    ``diffusion_dpo`` forwards only each group's best and worst sample (policy and reference in
    ``prepare``, policy in ``loss``): counted as if every group formed its pair, which it does unless its
    rewards are all equal (within ``min_reward_gap``), so this is its count's upper bound."""
    if name in ("vgrpo", "elbo_naive"):
        k = config.n_mc
        old = 0 if gradient_steps == 1 else k  # one step: the loss's own forward is the old policy's
        anchor = k if config.kl_beta > 0 and config.kl_anchor == "reference" else 0
        return k + old + anchor
    if name in ("awm", "awm_authors"):
        k = config.n_mc
        return 2 * k + (k if config.kl_beta > 0 else 0) + (k if config.ema_beta > 0 else 0)
    if name == "diffusion_nft":
        k = config.n_timesteps
        return 2 * k + (k if config.kl_beta > 0 else 0)  # trained + EMA old policy (+ reference)
    if name == "diffusion_dpo":
        return 2 * 3 * config.n_mc / group_size
    if name == "dgpo":
        return 3 * config.n_mc  # policy and reference in prepare, policy in loss
    if name in FLOW_GRPO_FAMILY:
        if config.step_rewards:  # only the scored steps train; + their latents' completions
            trained = len(scored_steps(config, steps))
            return trained * (2 if config.kl_beta > 0 else 1) + step_reward_forwards(config, steps)
        trained = trained_sde_steps(config, steps, iteration)
        return trained * (2 if config.kl_beta > 0 else 1)  # + the reference's step means
    raise KeyError(f"no NFE count for surrogate {name!r}; add it to benchmarks/nfe.py")


def tree_forwards(config: Any, steps: int) -> float:
    """Forwards per tree (one prompt group) of a tree rollout and its update (docs/method.md section 8):
    one per node at each step of the rollout, one per trained edge (twice with a KL) in the loss."""
    branches = config.tree_branch_steps
    nodes = (tree.node_ids(steps, branches, config.tree_branching).amax(dim=0) + 1).tolist()  # after step j
    rollout = sum([1, *nodes[:-1]])  # step j runs on the nodes made before it
    trained = [
        j
        for j in range(steps)
        if (config.tree_sde == "all" or j in branches)
        and j not in config.tree_prune_steps
        and (config.train_last_step or j < steps - 1)
        and not (config.sde_kind == "cps" and j == steps - 1)
    ]
    return float(rollout + sum(nodes[j] for j in trained) * (2 if config.kl_beta > 0 else 1))


def nfe_per_iteration(resolved: Any, iteration: int) -> float:
    """NFE of training ``iteration`` (1-based) of a resolved recipe: samples x (rollout + surrogate)."""
    recipe = resolved.recipe
    samples = recipe.rollout.group_size * recipe.rollout.prompts_per_iteration
    steps = recipe.rollout.steps
    gradient_steps = min(recipe.train.gradient_steps_per_iteration, samples)
    name, config = recipe.surrogate.name, resolved.surrogate.config
    if name in TREE_FAMILY:  # shared prefixes: counted per tree, not per sample
        return recipe.rollout.prompts_per_iteration * tree_forwards(config, steps)
    group = recipe.rollout.group_size
    train = surrogate_forwards(name, config, steps, gradient_steps, iteration, group)
    return float(samples * (steps + train))


def cumulative_nfe(resolved: Any, iterations: int) -> list[float]:
    """``[iterations + 1]``: NFE spent before each iteration boundary (index 0 = before training)."""
    total, out = 0.0, [0.0]
    for i in range(1, iterations + 1):
        total += nfe_per_iteration(resolved, i)
        out.append(total)
    return out
