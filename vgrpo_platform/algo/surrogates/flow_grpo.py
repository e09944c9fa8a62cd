"""Flow-GRPO (and MixGRPO): the denoising chain as an MDP, one Gaussian action per SDE step.

``rollout`` replaces the adapter's ODE sampler: it integrates the SDE of ``vgrpo_platform.algo.sde`` on
the Euler grid of the adapter's shifted schedule and records the trajectory and each step's
log-probability under the rollout (old) policy. ``loss`` recomputes the step means with gradients on
the stored trajectory and takes a per-step PPO-clip objective, plus the KL of each step to the frozen
(LoRA-disabled) reference. With ``window_size`` set (MixGRPO) only a window of consecutive steps is
stochastic and trained; the window moves every ``window_shift_every`` iterations. The same options
give DanceGRPO (``diffusion = "constant"``, ``shared_initial_noise``, ``train_fraction``: each sample
trains its own random subset of the steps) and Flow-GRPO-Fast (``window_placement = "random"``: a
short SDE branch at a random early step); ``sde_kind = "cps"`` swaps the SDE step for CPS's
coefficients-preserving one (``sde.cps_step``); ``ratio_norm`` and ``step_reweight`` are GRPO-Guard's
normalised ratio and ``1 / |dt|`` step weights, ``trust_region = "kl_mask"`` Flow-DPPO's KL-masked
update; see ``surrogates/entry.py`` and docs/method.md section 6.

``rollout`` returns a ``FlowGRPOState`` (batch-first; the loop joins the chunks' into ``batch.state``):
``trajectory`` ``[B, T+1, *L]`` (at least float32), ``timesteps`` ``[B, T+1]``, ``old_log_prob``
``[B, T]``, ``sde_mask`` ``[B, T]`` (1 where the step is an SDE step); ``prepare`` completes it with
``train_mask`` ``[B, T]`` (1 where the sample trains the step) and with ``kl_beta > 0`` ``ref_mean``
``[B, T, *L]``. With ``ratio_norm`` or ``trust_region = "kl_mask"`` the rollout also keeps its step means,
``old_mean`` ``[B, T, *L]`` (as much memory again as the trajectory).

Memory: ``loss`` keeps the graph of every trained step of the micro-batch at once (one backward per
micro-batch, as the surrogate contract has it); MixGRPO's window bounds that to ``window_size``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vgrpo_platform.algo import sde, step_rewards, tree
from vgrpo_platform.algo.surrogates.configs import FlowGRPOConfig
from vgrpo_platform.errors import RecipeError
from vgrpo_platform.finetune import reference_mode
from vgrpo_platform.protocols import (
    Adapter,
    BatchState,
    Conditioning,
    RolloutBatch,
    SamplerSpec,
    SurrogateBase,
)


@dataclass
class FlowGRPOState(BatchState):
    """The SDE rollout's record (the old policy's per-step log-probs), completed by ``prepare``."""

    trajectory: torch.Tensor  # [B, T+1, *L], at least float32
    timesteps: torch.Tensor  # [B, T+1]
    old_log_prob: torch.Tensor  # [B, T]
    sde_mask: torch.Tensor  # [B, T] float, 1 where the step is an SDE step
    train_mask: torch.Tensor | None = None  # [B, T] float, 1 where the sample trains the step (prepare)
    ref_mean: torch.Tensor | None = None  # [B, T, *L], the reference's step means (kl_beta > 0)
    old_mean: torch.Tensor | None = None  # [B, T, *L], the rollout's step means (ratio_norm)
    node_id: torch.Tensor | None = None  # [B, T] long, tree rollouts: each step's node (algo/tree.py)
    step_advantage: torch.Tensor | None = None  # [B, T], tree rollouts: each edge's node advantage (prepare)
    edge_weight: torch.Tensor | None = None  # [B], tree rollouts: G / (trained edges of the tree) (prepare)
    step_reward: torch.Tensor | None = (
        None  # [B, T], step_rewards: each scored step's reward gain (score_steps)
    )
    step_scored: torch.Tensor | None = None  # [B, T] float, step_rewards: 1 where the step was scored


def euler_grid(
    adapter: Adapter, steps: int, device: torch.device | str, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``[T+1]`` times from 1 to 0: the shifted Euler grid of ``vgrpo_platform.ode_solvers``."""
    u = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    return adapter.schedule.warp(u).to(device=device, dtype=dtype)


def window_mask(steps: int, window_size: int | None, start: int) -> torch.Tensor:
    """``[T]`` bool: which steps are SDE steps. ``None`` = all of them (Flow-GRPO)."""
    mask = torch.zeros(steps, dtype=torch.bool)
    if window_size is None or window_size >= steps:
        mask[:] = True
    else:
        mask[start : start + window_size] = True
    return mask


def window_start(iteration: int, steps: int, cfg: FlowGRPOConfig) -> int:
    """MixGRPO: the window's first step at (1-based) ``iteration``; it wraps back to step 0 at the end."""
    if cfg.window_size is None or cfg.window_size >= steps:
        return 0
    positions = steps - cfg.window_size + 1
    return ((max(iteration, 1) - 1) // cfg.window_shift_every * cfg.window_stride) % positions


def random_window_start(steps: int, cfg: FlowGRPOConfig, generator: torch.Generator) -> int:
    """Flow-GRPO-Fast: a uniform start in ``[0, end - window_size]``, ``end = int(window_range * steps)``.

    Flow-GRPO's ``random.randint(range[0], range[1] - size)`` with ``range = (0, end)``; ``end`` is
    raised to ``window_size`` when the range is shorter than the window.
    """
    if cfg.window_size is None or cfg.window_size >= steps:
        return 0
    end = min(max(int(cfg.window_range * steps), cfg.window_size), steps)
    return int(torch.randint(0, end - cfg.window_size + 1, (), generator=generator))


def trainable_steps(sde_mask: torch.Tensor, train_last_step: bool) -> torch.Tensor:
    """``[..., T]`` bool: the SDE steps a sample may train (the last step of the chain left out if asked)."""
    mask = sde_mask > 0
    if not train_last_step:
        mask = mask.clone()
        mask[..., -1] = False
    return mask


def random_step_subset(candidates: torch.Tensor, fraction: float, generator: torch.Generator) -> torch.Tensor:
    """DanceGRPO: per row, a uniform random subset of ``int(fraction * n)`` of its ``n`` candidate steps.

    ``candidates`` ``[N, T]`` bool -> ``[N, T]`` bool. DanceGRPO permutes each sample's steps and trains
    the first ``int(n * timestep_fraction)``; ranking uniform keys is the same law, in one draw.
    """
    keys = torch.rand(candidates.shape, generator=generator, device=generator.device).to(candidates.device)
    keys = keys.masked_fill(~candidates, 2.0)  # non-candidates rank last
    n = candidates.sum(dim=1)  # [N]
    keep = (n.to(torch.float64) * fraction).floor().long()  # [N]
    rank = keys.argsort(dim=1).argsort(dim=1)  # [N, T], 0 = smallest key
    return rank < keep[:, None]


class FlowGRPOSurrogate(SurrogateBase):
    """The ``flow_grpo`` surrogate; see ``FlowGRPOConfig``."""

    owns_rollout = True  # its SDE rollout records the per-step log-probs the loss needs
    needs_exact_rollouts = True  # ... so its samples are its own sampler's, never another engine's

    def __init__(self, config: FlowGRPOConfig | None = None) -> None:
        self.config = config if config is not None else FlowGRPOConfig()
        self.iteration = 1
        self._random_start: int | None = None  # Flow-GRPO-Fast's branch step of this iteration
        # "group": one initial noise per prompt group (``rollout.generate_with_extras`` noise_scope)
        self.initial_noise = "group" if self.config.shared_initial_noise else "sample"
        if self.config.tree_branch_steps is not None:  # a tree's root is its group's one noise
            self.initial_noise = "group"
            self.rollout_block = tree.leaf_count(self.config.tree_branching, self.config.tree_branch_steps)

    def begin_iteration(self, iteration: int) -> None:
        """Called by the loop before each rollout: places MixGRPO's window (resume-exact)."""
        self.iteration = iteration
        self._random_start = None

    def _window(self, steps: int, generator: torch.Generator) -> torch.Tensor:
        """``[T]`` bool SDE steps of this rollout; a random branch is drawn once per iteration."""
        cfg = self.config
        if cfg.window_placement == "random":
            if self._random_start is None:
                self._random_start = random_window_start(steps, cfg, generator)
            start = self._random_start
        else:
            start = window_start(self.iteration, steps, cfg)
        return window_mask(steps, cfg.window_size, start)

    def _step_stats(
        self,
        adapter: Adapter,
        z: torch.Tensor,
        t: torch.Tensor,
        t_next: torch.Tensor,
        t_cap: torch.Tensor,
        cond: Conditioning,
        model_dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(mean [B, *L], step std [B], s [B])`` of one SDE step from ``z`` ``[B, *L]`` (float32).

        A CPS step (``sde_kind = "cps"``) has no diffusion ``s``: its third entry is the step std again.
        """
        v = adapter.predict(z.to(model_dtype), t, cond).to(z.dtype)  # [B, *L]
        if self.config.sde_kind == "cps":
            mean, std = sde.cps_step(z, v, t, t_next, self.config.noise_level)
            return mean, std, std
        if self.config.diffusion == "constant":
            s = sde.constant_diffusion(t, self.config.noise_level)  # [B], DanceGRPO
        else:
            s = sde.sde_diffusion(t, self.config.noise_level, t_cap=t_cap)  # [B]
        mean = sde.sde_step_mean(z, v, t, t_next, s)
        return mean, sde.step_std(s, t, t_next), s

    @property
    def _needs_old_mean(self) -> bool:
        """GRPO-Guard's bias and Flow-DPPO's KL mask compare the step means with the rollout's."""
        return self.config.ratio_norm or self.config.trust_region == "kl_mask"

    def _log_prob(
        self, x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, latent_ndim: int
    ) -> torch.Tensor:
        """One step's log-prob ``[B]``: the Gaussian's, or the CPS authors' constant-free form."""
        if self.config.sde_kind == "cps" and self.config.cps_log_prob == "constant_free":
            return sde.constant_free_log_prob(x, mean, latent_ndim)
        return sde.gaussian_log_prob(x, mean, std, latent_ndim)

    @torch.no_grad()
    def rollout(
        self,
        adapter: Adapter,
        noise: torch.Tensor,
        cond: Conditioning,
        sampler: SamplerSpec,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, FlowGRPOState]:
        """SDE rollout from ``noise`` ``[B, *L]``: ``(clean latents [B, *L], state)``.

        Step noise is drawn on ``generator``'s device and moved, so a seed reproduces a rollout anywhere.
        """
        if self.config.tree_branch_steps is not None:
            return self._tree_rollout(adapter, noise, cond, sampler, generator)
        b, steps, device = noise.shape[0], sampler.steps, noise.device
        latent_ndim = noise.ndim - 1
        z = noise.to(torch.promote_types(noise.dtype, torch.float32))  # [B, *L], float32 at least
        grid = euler_grid(adapter, steps, device, z.dtype)  # [T+1]
        t_cap = grid[1].expand(b)  # Flow-GRPO's stand-in for t = 1 in s(t)
        mask = self._window(steps, generator)
        if self.config.sde_kind == "cps":  # the CPS step to t = 0 has std 0: deterministic, never trained
            mask = mask & (grid[1:] > 0).cpu()
        trajectory, log_probs, means = [z], [], []
        for i in range(steps):
            t, t_next = grid[i].expand(b), grid[i + 1].expand(b)
            if mask[i]:
                mean, std, _ = self._step_stats(adapter, z, t, t_next, t_cap, cond, noise.dtype)
                eps = torch.randn(z.shape, generator=generator, device=generator.device).to(device, z.dtype)
                z = mean + std.reshape(b, *(1,) * latent_ndim) * eps
                log_probs.append(self._log_prob(z, mean, std, latent_ndim))
                means.append(mean)
            else:
                v = adapter.predict(z.to(noise.dtype), t, cond).to(z.dtype)
                z = sde.ode_step(z, v, t, t_next)
                log_probs.append(torch.zeros(b, device=device, dtype=z.dtype))
                means.append(z)
            trajectory.append(z)
        state = FlowGRPOState(
            trajectory=torch.stack(trajectory, dim=1),  # [B, T+1, *L]
            timesteps=grid.expand(b, steps + 1).clone(),  # [B, T+1]
            old_log_prob=torch.stack(log_probs, dim=1),  # [B, T]
            sde_mask=mask.to(device=device, dtype=torch.float32).expand(b, steps).clone(),  # [B, T]
            old_mean=torch.stack(means, dim=1) if self._needs_old_mean else None,  # [B, T, *L]
        )
        return z.to(noise.dtype), state

    @torch.no_grad()
    def _tree_rollout(
        self,
        adapter: Adapter,
        noise: torch.Tensor,
        cond: Conditioning,
        sampler: SamplerSpec,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, FlowGRPOState]:
        """TreeGRPO / BranchGRPO: each block of ``G`` rows is one tree (``algo/tree.py``), rooted at the
        block's first noise. Every step runs once per node, not per leaf: a shared prefix is computed
        once and its latents, noise and log-probs are copied to the leaves below it."""
        cfg = self.config
        assert cfg.tree_branch_steps is not None
        b, steps, device = noise.shape[0], sampler.steps, noise.device
        k, branches = cfg.tree_branching, cfg.tree_branch_steps
        leaves = tree.leaf_count(k, branches)
        if b % leaves:
            raise RecipeError(
                f"a tree rollout of {leaves} leaves got {b} rows: set rollout.group_size = {leaves} "
                f"(tree_branching ** len(tree_branch_steps))"
            )
        if branches[-1] >= steps:
            raise RecipeError(
                f"tree_branch_steps {branches} reach past rollout.steps = {steps}: branch at steps < {steps}"
            )
        latent_ndim = noise.ndim - 1
        grid = euler_grid(adapter, steps, device, torch.promote_types(noise.dtype, torch.float32))
        stochastic = torch.zeros(steps, dtype=torch.bool)
        stochastic[branches] = True
        if cfg.tree_sde == "all":
            stochastic[:] = True
        if cfg.sde_kind == "cps":  # the CPS step to t = 0 is deterministic
            if branches[-1] == steps - 1:
                raise RecipeError("CPS steps cannot branch at the last step (its std is 0): move it earlier")
            stochastic &= (grid[1:] > 0).cpu()
        ids = tree.node_ids(steps, branches, k).to(device)  # [G, T]
        rows = torch.arange(b, device=device)
        trees, leaf = rows // leaves, rows % leaves  # [B] each
        z = noise[::leaves].to(grid.dtype)  # [n_trees, *L]: the roots, one per tree
        owner = torch.arange(z.shape[0], device=device) * leaves  # a row of each node's tree, for its cond
        per_step: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (z, log-prob, mean) per node
        start = z
        for i in range(steps):
            n = z.shape[0]
            t, t_next = grid[i].expand(n), grid[i + 1].expand(n)
            node_cond = {key: v[owner.to(v.device)] for key, v in cond.items()}
            if stochastic[i]:
                mean, std, _ = self._step_stats(
                    adapter, z, t, t_next, grid[1].expand(n), node_cond, noise.dtype
                )
                copies = k if i in branches else 1
                mean = mean.repeat_interleave(copies, dim=0)
                std = std.repeat_interleave(copies)
                owner = owner.repeat_interleave(copies)
                eps = torch.randn(mean.shape, generator=generator, device=generator.device).to(
                    device, z.dtype
                )
                z = mean + std.reshape(-1, *(1,) * latent_ndim) * eps
                per_step.append((z, self._log_prob(z, mean, std, latent_ndim), mean))
            else:
                v = adapter.predict(z.to(noise.dtype), t, node_cond).to(z.dtype)
                z = sde.ode_step(z, v, t, t_next)
                per_step.append((z, torch.zeros(n, device=device, dtype=z.dtype), z))
        # leaf row -> its node in each step's node array (tree-major, a node's children contiguous)
        nodes_per_tree = ids.max(dim=0).values + 1  # [T]
        node_index = trees[:, None] * nodes_per_tree[None, :] + ids[leaf]  # [B, T]
        trajectory = [start[trees]] + [per_step[i][0][node_index[:, i]] for i in range(steps)]
        state = FlowGRPOState(
            trajectory=torch.stack(trajectory, dim=1),  # [B, T+1, *L]
            timesteps=grid.expand(b, steps + 1).clone(),
            old_log_prob=torch.stack([per_step[i][1][node_index[:, i]] for i in range(steps)], dim=1),
            sde_mask=stochastic.to(device=device, dtype=torch.float32).expand(b, steps).clone(),
            old_mean=(
                torch.stack([per_step[i][2][node_index[:, i]] for i in range(steps)], dim=1)
                if self._needs_old_mean
                else None
            ),
            node_id=ids[leaf],  # [B, T], within each tree
        )
        return state.trajectory[:, -1].to(noise.dtype), state

    def prepare(self, batch: RolloutBatch, adapter: Adapter, generator: torch.Generator) -> None:
        """Checks the rollout's state, picks the steps each sample trains (``train_mask``) and, with
        ``kl_beta > 0``, stores the reference's step means on them (both in ``batch.state``).

        With ``train_fraction < 1`` the subsets are drawn for the global batch (a data-parallel rank keeps
        its rows), so every rank's generator stays in step; otherwise nothing is drawn.
        """
        if batch.state is None:
            raise ValueError(
                "flow_grpo needs its own SDE rollout (batch.state is empty): "
                "the loop must call the surrogate's rollout() instead of adapter.sample"
            )
        state = batch.state_as(FlowGRPOState, "FlowGRPOSurrogate.prepare", written_by="its rollout()")
        cfg = self.config
        candidates = trainable_steps(state.sde_mask, cfg.train_last_step)  # [B, T]
        if cfg.train_fraction < 1.0:
            n_rows = len(batch) if batch.rows is None else len(batch.rows.global_group_ids)
            every = candidates[:1].expand(n_rows, -1)  # the SDE steps are the same for every row
            chosen = random_step_subset(every, cfg.train_fraction, generator)  # [N, T]
            candidates = chosen if batch.rows is None else batch.rows.local(chosen, len(batch))
        state.train_mask = candidates.to(torch.float32)
        if state.node_id is not None:
            self._prepare_tree(batch, state)
        if state.step_reward is not None and state.step_scored is not None:  # DenseGRPO: scored steps only
            state.train_mask = state.train_mask * state.step_scored
            state.step_advantage = step_rewards.step_advantages(
                state.step_reward, state.step_scored[0] > 0, batch.group_ids.to(state.step_reward.device)
            )
        if cfg.kl_beta <= 0:
            return
        traj, grid = state.trajectory, state.timesteps
        means = torch.zeros_like(traj[:, :-1])  # [B, T, *L]
        with torch.no_grad(), reference_mode(adapter):
            for j, rows in self._trained_rows(state):
                means[rows, j] = self._step_stats(
                    adapter,
                    traj[rows, j],
                    grid[rows, j],
                    grid[rows, j + 1],
                    grid[rows, 1],
                    _rows_of(batch.cond, rows),
                    batch.latents.dtype,
                )[0]
        state.ref_mean = means

    @torch.no_grad()
    def score_steps(
        self, batch: RolloutBatch, adapter: Adapter, score: Callable[[torch.Tensor], torch.Tensor]
    ) -> None:
        """DenseGRPO (``step_rewards``): the reward of the clean sample each needed latent leads to, and
        each scored step's gain ``R_{j+1} - R_j`` (``algo/step_rewards.py``), in ``batch.state``.

        ``score`` maps clean latents ``[B, *L]`` (the batch's rows, in order) to their total reward ``[B]``;
        the final latents' reward is the batch's own (``batch.rewards``), not scored again.
        """
        cfg = self.config
        if not cfg.step_rewards:
            return
        state = batch.state_as(FlowGRPOState, "FlowGRPOSurrogate.score_steps", written_by="its rollout()")
        traj, grid = state.trajectory, state.timesteps
        steps = traj.shape[1] - 1
        trainable = trainable_steps(state.sde_mask, cfg.train_last_step).any(dim=0)  # [T]
        wanted = cfg.step_reward_steps if cfg.step_reward_steps is not None else range(steps)
        late = [j for j in wanted if j >= steps]
        if late:
            raise RecipeError(
                f"step_reward_steps {late} are past rollout.steps = {steps}: use steps < {steps}"
            )
        chosen = [j for j in wanted if bool(trainable[j])]
        if not chosen:
            raise RecipeError("step_rewards scores no trainable SDE step: pick step_reward_steps among them")
        indices = step_rewards.latent_indices(chosen)
        device = traj.device
        rewards = []
        for i in indices:
            if i == steps:  # the sample itself
                rewards.append(batch.rewards.to(device, torch.float32))
            else:
                clean = self._completion(adapter, traj[:, i], grid, i, batch.cond, batch.latents.dtype)
                rewards.append(score(clean).to(device, torch.float32))
        state.step_reward = step_rewards.reward_gains(torch.stack(rewards, dim=1), indices, chosen, steps)
        scored = torch.zeros(steps, device=device)
        scored[chosen] = 1.0
        state.step_scored = scored.expand(len(batch), steps).clone()

    def _completion(
        self,
        adapter: Adapter,
        z: torch.Tensor,
        grid: torch.Tensor,
        i: int,
        cond: Conditioning,
        model_dtype: torch.dtype,
    ) -> torch.Tensor:
        """The clean sample latent ``z_i`` ``[B, *L]`` leads to: Euler ODE steps over the rest of the grid
        (``step_reward_target = "ode"``) or the one-step x-prediction ``z - t v`` (``"x0"``)."""
        last = grid.shape[1] - 1 if self.config.step_reward_target == "ode" else i + 1
        for k in range(i, last):
            t = grid[:, k]
            v = adapter.predict(z.to(model_dtype), t, cond).to(z.dtype)
            t_next = grid[:, k + 1] if self.config.step_reward_target == "ode" else torch.zeros_like(t)
            z = sde.ode_step(z, v, t, t_next)  # to t_next = 0: z - t v, the x-prediction
        return z.to(model_dtype)

    def _prepare_tree(self, batch: RolloutBatch, state: FlowGRPOState) -> None:
        """Tree rollouts: each edge trained once (by the first leaf below it), with its node's advantage
        (``step_advantage``), and ``edge_weight`` making the loss the mean over the tree's trained edges."""
        cfg, node_id = self.config, state.node_id
        assert node_id is not None
        if batch.advantages is None:
            raise ValueError("a tree rollout's prepare needs batch.advantages (the leaves' advantages)")
        group_ids = batch.group_ids.to(node_id.device)
        sizes = torch.unique(group_ids, return_counts=True)[1]
        if bool((sizes != self.rollout_block).any()):
            raise RecipeError(
                f"a tree rollout has {self.rollout_block} leaves per group but the batch holds groups of "
                f"{sorted(set(sizes.tolist()))}: set rollout.group_size = {self.rollout_block}"
            )
        assert state.train_mask is not None  # prepare sets it first
        mask = (state.train_mask > 0) & tree.first_of_node(group_ids, node_id)
        pruned = [j for j in cfg.tree_prune_steps if j < mask.shape[1]]
        mask[:, pruned] = False
        state.train_mask = mask.to(torch.float32)
        state.step_advantage = tree.node_advantages(
            batch.advantages.to(node_id.device), group_ids, node_id, cfg.tree_advantage
        )
        _, inverse = torch.unique(group_ids, return_inverse=True)
        edges = torch.zeros(int(inverse.max()) + 1, device=mask.device).index_add_(
            0, inverse, mask.sum(dim=1).to(torch.float32)
        )[inverse]  # [B], trained edges of each row's tree
        if bool((edges == 0).any()):
            raise RecipeError(
                "a tree rollout has no edge left to train: prune fewer steps (tree_prune_steps)"
            )
        state.edge_weight = self.rollout_block / edges

    def _train_mask(self, state: FlowGRPOState) -> torch.Tensor:
        """``[B, T]`` bool; without ``prepare`` (direct calls) every trainable SDE step."""
        if state.train_mask is not None:
            return state.train_mask > 0
        return trainable_steps(state.sde_mask, self.config.train_last_step)

    def _trained_rows(self, state: FlowGRPOState) -> list[tuple[int, torch.Tensor | slice]]:
        """``(step j, rows that train it)`` for every step some row trains; ``slice(None)`` = all rows."""
        mask = self._train_mask(state)
        out: list[tuple[int, torch.Tensor | slice]] = []
        for j in torch.nonzero(mask.any(dim=0)).flatten().tolist():
            column = mask[:, j]
            out.append((j, slice(None) if bool(column.all()) else torch.nonzero(column).flatten()))
        return out

    def loss(self, batch: RolloutBatch, adapter: Adapter) -> tuple[torch.Tensor, dict[str, float]]:
        """Mean over trained (sample, step) pairs of ``max(-A rho, -A clip(rho))`` ``+ beta KL``.

        Every sample trains the same number of steps, so this is Flow-GRPO's mean over samples and
        steps (their loss is averaged over the timesteps by gradient accumulation), and DanceGRPO's
        ``mean / train_timesteps`` summed over its random steps.
        """
        cfg = self.config
        if batch.advantages is None:
            raise ValueError("FlowGRPOSurrogate.loss needs batch.advantages")
        state = batch.state_as(FlowGRPOState, "FlowGRPOSurrogate.loss", written_by="its rollout()")
        traj, grid = state.trajectory, state.timesteps  # [B, T+1, *L], [B, T+1]
        old_lp = state.old_log_prob  # [B, T]
        latent_ndim = traj.ndim - 2
        adv_all = batch.advantages.float().clamp(-cfg.adv_clip, cfg.adv_clip)  # [B]
        policy_terms, kls, ratios, log_ratios = [], [], [], []
        weights: list[torch.Tensor] = []  # tree rollouts: each trained edge's weight (edge_weight)
        kl_olds: list[torch.Tensor] = []  # exact step KL to the rollout policy (ratio_norm, kl_mask)
        dropped: list[torch.Tensor] = []  # Flow-DPPO's masked (sample, step) pairs
        for j, rows in self._trained_rows(state):
            t, t_next = grid[rows, j], grid[rows, j + 1]
            cond = _rows_of(batch.cond, rows)
            mean, std, s = self._step_stats(
                adapter, traj[rows, j], t, t_next, grid[rows, 1], cond, batch.latents.dtype
            )
            log_prob = self._log_prob(traj[rows, j + 1], mean, std, latent_ndim)  # [b_j]
            log_ratio = log_prob - old_lp[rows, j]
            old_kl = None
            if self._needs_old_mean:
                if state.old_mean is None:
                    raise ValueError(
                        "ratio_norm / kl_mask need the rollout's step means (old_mean): rerun its rollout()"
                    )
                old_kl = sde.std_kl(mean, state.old_mean[rows, j], std, latent_ndim)  # [b_j]
                kl_olds.append(old_kl.detach())
            if cfg.ratio_norm:  # GRPO-Guard: centre the log-ratio at 0 and scale it by the step std
                assert old_kl is not None
                log_ratio = (log_ratio + old_kl) * std.to(log_ratio.dtype)
            rho = torch.exp(log_ratio)
            if state.step_advantage is None:
                adv = adv_all[rows]
            else:  # tree rollouts: the advantage of the node this step's edge leads to
                adv = state.step_advantage[rows, j].float().clamp(-cfg.adv_clip, cfg.adv_clip)
            if state.edge_weight is not None:
                weights.append(state.edge_weight[rows])
            unclipped = -adv * rho
            if cfg.trust_region == "kl_mask":  # Flow-DPPO: drop far, further-pushing steps; no clip
                assert old_kl is not None
                pushing = ((rho > 1) & (adv > 0)) | ((rho < 1) & (adv < 0))
                drop = (old_kl >= cfg.kl_mask_threshold) & pushing
                dropped.append(drop.detach())
                term = torch.where(drop, torch.zeros_like(unclipped), unclipped)
            else:
                clipped = -adv * rho.clamp(1.0 - cfg.clip_range, 1.0 + cfg.clip_range)
                term = torch.maximum(unclipped, clipped)  # [b_j]
            if cfg.step_reweight:  # GRPO-Guard: equalise the steps' gradient scale
                term = term / (t - t_next).to(term.dtype)
            policy_terms.append(term)
            ratios.append(rho.detach())
            log_ratios.append(log_ratio.detach())
            if cfg.kl_beta > 0:
                if state.ref_mean is None:
                    raise ValueError("kl_beta > 0 but batch.state has no ref_mean; was prepare() run?")
                ref = state.ref_mean[rows, j]
                if cfg.sde_kind == "cps":  # the true Gaussian KL of the CPS step (s is its std)
                    kls.append(sde.std_kl(mean, ref, s, latent_ndim))
                else:
                    kl = sde.mean_kl(mean, ref, s, t, t_next, latent_ndim, include_dt=cfg.kl_include_dt)
                    kls.append(kl)
        if not policy_terms:
            raise ValueError("no SDE step to train: the rollout recorded none (sde_mask is all zero)")
        if weights:  # tree rollouts: the mean over the trees' trained edges, linear in the rows
            weight = torch.cat(weights)
            policy = (torch.cat(policy_terms) * weight).sum() / len(batch)
            kl = (
                (torch.cat(kls) * weight).sum() / len(batch) if kls else torch.zeros((), device=policy.device)
            )
        else:
            policy = torch.cat(policy_terms).mean()  # mean over trained (sample, step) pairs
            kl = torch.cat(kls).mean() if kls else torch.zeros((), device=policy.device)
        loss = policy + cfg.kl_beta * kl
        with torch.no_grad():
            rho = torch.cat(ratios)
            lr = torch.cat(log_ratios)
            clip_frac = ((rho - 1).abs() > cfg.clip_range).float().mean()
            metrics = {
                "ratio_mean": float(rho.mean()),
                "ratio_min": float(rho.min()),
                "ratio_max": float(rho.max()),
                "clip_fraction": float(clip_frac),
                "approx_kl": float(0.5 * lr.square().mean()),
                "kl": float(kl),
                "policy_objective": float(-policy),
                "sde_steps": float(len(rho) / len(batch)),  # trained steps per sample
            }
            if kl_olds:
                metrics["kl_old_mean"] = float(torch.cat(kl_olds).mean())
            if dropped:
                metrics["masked_fraction"] = float(torch.cat(dropped).float().mean())
            if state.step_reward is not None and state.step_scored is not None:  # DenseGRPO's gains
                scored = state.step_scored > 0
                metrics["step_reward_abs_gain"] = float(state.step_reward[scored].abs().mean())
        return loss, metrics


def _rows_of(cond: Conditioning, rows: torch.Tensor | slice) -> Conditioning:
    return cond if isinstance(rows, slice) else {k: v[rows.to(v.device)] for k, v in cond.items()}
