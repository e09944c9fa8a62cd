"""Flow-GRPO (and MixGRPO): the denoising chain as an MDP, one Gaussian action per SDE step.

``rollout`` replaces the adapter's ODE sampler: it integrates the SDE of ``vgrpo_platform.sde`` on
the Euler grid of the adapter's shifted schedule and records the trajectory and each step's
log-probability under the rollout (old) policy. ``loss`` recomputes the step means with gradients on
the stored trajectory and takes a per-step PPO-clip objective, plus the KL of each step to the frozen
(LoRA-disabled) reference. With ``window_size`` set (MixGRPO) only a window of consecutive steps is
stochastic and trained; the window moves every ``window_shift_every`` iterations.

``batch.extras`` keys (batch-first): ``"trajectory"`` ``[B, T+1, *L]`` (at least float32), ``"timesteps"``
``[B, T+1]``, ``"old_log_prob"`` ``[B, T]``, ``"sde_mask"`` ``[B, T]`` (1 where the step is an SDE
step, trained), and with ``kl_beta > 0`` ``"ref_mean"`` ``[B, T, *L]`` (written by ``prepare``).

Memory: ``loss`` keeps the graph of every trained step of the micro-batch at once (one backward per
micro-batch, as the surrogate contract has it); MixGRPO's window bounds that to ``window_size``.
"""

from __future__ import annotations

import torch

from vgrpo_platform import sde
from vgrpo_platform.protocols import Adapter, Conditioning, RolloutBatch, SamplerSpec
from vgrpo_platform.surrogates.plugin import FlowGRPOConfig


def euler_grid(
    adapter: Adapter, steps: int, device: torch.device | str, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``[T+1]`` times from 1 to 0: the shifted Euler grid of ``vgrpo_platform.sampling``."""
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


class FlowGRPOSurrogate:
    """The ``flow_grpo`` surrogate; see ``FlowGRPOConfig``."""

    def __init__(self, config: FlowGRPOConfig | None = None) -> None:
        self.config = config if config is not None else FlowGRPOConfig()
        self.iteration = 1

    def begin_iteration(self, iteration: int) -> None:
        """Called by the loop before each rollout: places MixGRPO's window (resume-exact)."""
        self.iteration = iteration

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
        """``(mean [B, *L], step std [B], s [B])`` of one SDE step from ``z`` ``[B, *L]`` (float32)."""
        v = adapter.predict(z.to(model_dtype), t, cond).to(z.dtype)  # [B, *L]
        s = sde.sde_diffusion(t, self.config.noise_level, t_cap=t_cap)  # [B]
        mean = sde.sde_step_mean(z, v, t, t_next, s)
        return mean, sde.step_std(s, t, t_next), s

    @torch.no_grad()
    def rollout(
        self,
        adapter: Adapter,
        noise: torch.Tensor,
        cond: Conditioning,
        sampler: SamplerSpec,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """SDE rollout from ``noise`` ``[B, *L]``: ``(clean latents [B, *L], extras)``.

        Step noise is drawn on ``generator``'s device and moved, so a seed reproduces a rollout anywhere.
        """
        b, steps, device = noise.shape[0], sampler.steps, noise.device
        latent_ndim = noise.ndim - 1
        z = noise.to(torch.promote_types(noise.dtype, torch.float32))  # [B, *L], float32 at least
        grid = euler_grid(adapter, steps, device, z.dtype)  # [T+1]
        t_cap = grid[1].expand(b)  # Flow-GRPO's stand-in for t = 1 in s(t)
        mask = window_mask(steps, self.config.window_size, window_start(self.iteration, steps, self.config))
        trajectory, log_probs = [z], []
        for i in range(steps):
            t, t_next = grid[i].expand(b), grid[i + 1].expand(b)
            if mask[i]:
                mean, std, _ = self._step_stats(adapter, z, t, t_next, t_cap, cond, noise.dtype)
                eps = torch.randn(z.shape, generator=generator, device=generator.device).to(device, z.dtype)
                z = mean + std.reshape(b, *(1,) * latent_ndim) * eps
                log_probs.append(sde.gaussian_log_prob(z, mean, std, latent_ndim))
            else:
                v = adapter.predict(z.to(noise.dtype), t, cond).to(z.dtype)
                z = sde.ode_step(z, v, t, t_next)
                log_probs.append(torch.zeros(b, device=device, dtype=z.dtype))
            trajectory.append(z)
        extras = {
            "trajectory": torch.stack(trajectory, dim=1),  # [B, T+1, *L]
            "timesteps": grid.expand(b, steps + 1).clone(),  # [B, T+1]
            "old_log_prob": torch.stack(log_probs, dim=1),  # [B, T]
            "sde_mask": mask.to(device=device, dtype=torch.float32).expand(b, steps).clone(),  # [B, T]
        }
        return z.to(noise.dtype), extras

    def prepare(self, batch: RolloutBatch, adapter: Adapter, generator: torch.Generator) -> None:
        """Checks the rollout's extras; with ``kl_beta > 0`` stores the reference's step means."""
        missing = {"trajectory", "timesteps", "old_log_prob", "sde_mask"} - set(batch.extras)
        if missing:
            raise ValueError(
                f"flow_grpo needs its own SDE rollout (extras {sorted(missing)} missing): "
                "the loop must call the surrogate's rollout() instead of adapter.sample"
            )
        if self.config.kl_beta <= 0:
            return
        from vgrpo_platform.finetune import reference_mode

        traj, grid = batch.extras["trajectory"], batch.extras["timesteps"]
        means = torch.zeros_like(traj[:, :-1])  # [B, T, *L]
        with torch.no_grad(), reference_mode(adapter):
            for j in self._trained_steps(batch):
                means[:, j] = self._step_stats(
                    adapter,
                    traj[:, j],
                    grid[:, j],
                    grid[:, j + 1],
                    grid[:, 1],
                    batch.cond,
                    batch.latents.dtype,
                )[0]
        batch.extras["ref_mean"] = means

    @staticmethod
    def _trained_steps(batch: RolloutBatch) -> list[int]:
        return [int(j) for j in torch.nonzero(batch.extras["sde_mask"].amax(dim=0) > 0).flatten()]

    def loss(self, batch: RolloutBatch, adapter: Adapter) -> tuple[torch.Tensor, dict[str, float]]:
        """Mean over samples and trained steps of ``max(-A rho, -A clip(rho))`` ``+ beta KL``."""
        cfg = self.config
        if batch.advantages is None:
            raise ValueError("FlowGRPOSurrogate.loss needs batch.advantages")
        if "trajectory" not in batch.extras:
            raise ValueError("FlowGRPOSurrogate.loss needs the extras of its rollout()")
        traj, grid = batch.extras["trajectory"], batch.extras["timesteps"]  # [B, T+1, *L], [B, T+1]
        old_lp = batch.extras["old_log_prob"]  # [B, T]
        latent_ndim = traj.ndim - 2
        adv = batch.advantages.float().clamp(-cfg.adv_clip, cfg.adv_clip)  # [B]
        policy_terms, kls, ratios, log_ratios = [], [], [], []
        for j in self._trained_steps(batch):
            t, t_next = grid[:, j], grid[:, j + 1]
            mean, std, s = self._step_stats(
                adapter, traj[:, j], t, t_next, grid[:, 1], batch.cond, batch.latents.dtype
            )
            log_prob = sde.gaussian_log_prob(traj[:, j + 1], mean, std, latent_ndim)  # [B]
            log_ratio = log_prob - old_lp[:, j]
            rho = torch.exp(log_ratio)
            unclipped = -adv * rho
            clipped = -adv * rho.clamp(1.0 - cfg.clip_range, 1.0 + cfg.clip_range)
            policy_terms.append(torch.maximum(unclipped, clipped))  # [B]
            ratios.append(rho.detach())
            log_ratios.append(log_ratio.detach())
            if cfg.kl_beta > 0:
                if "ref_mean" not in batch.extras:
                    raise ValueError("kl_beta > 0 but batch.extras has no 'ref_mean'; was prepare() run?")
                ref = batch.extras["ref_mean"][:, j]
                kls.append(sde.mean_kl(mean, ref, s, t, t_next, latent_ndim, include_dt=cfg.kl_include_dt))
        if not policy_terms:
            raise ValueError("no SDE step to train: the rollout recorded none (sde_mask is all zero)")
        policy = torch.stack(policy_terms, dim=1).mean()  # mean over samples and steps
        kl = torch.stack(kls, dim=1).mean() if kls else torch.zeros((), device=policy.device)
        loss = policy + cfg.kl_beta * kl
        with torch.no_grad():
            rho = torch.stack(ratios, dim=1)  # [B, S]
            lr = torch.stack(log_ratios, dim=1)
            clip_frac = ((rho - 1).abs() > cfg.clip_range).float().mean()
            metrics = {
                "ratio_mean": float(rho.mean()),
                "ratio_min": float(rho.min()),
                "ratio_max": float(rho.max()),
                "clip_fraction": float(clip_frac),
                "approx_kl": float(0.5 * lr.square().mean()),
                "kl": float(kl),
                "policy_objective": float(-policy),
                "sde_steps": float(len(policy_terms)),
            }
        return loss, metrics
