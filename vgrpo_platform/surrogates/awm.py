"""AWM (advantage-weighted matching): a flow-matching loss on the clean samples, weighted by advantages.

``log pi ~ -l`` with ``l`` the plain (not self-normalised) flow-matching error on pairs ``(t, eps)``:
timesteps stratified and shared as V-GRPO's (``pair_scope``), noise drawn independently per sample.
It is V-GRPO minus the shared noise and the adaptive weighting (docs/method.md section 6). Fully
on-policy its gradient is that of ``mean_i A_i mean_j l_ij``: advantage-weighted flow matching.

Velocity space (default): ``l = mean_d (v - (eps - x0))^2``, computed as ``|x_hat - x0|^2 / t^2``
(the same number for rectified flow, where ``x_hat - x0 = t (eps - x0 - v)``), so it works through
the schedule's ``predict_x0`` like the other surrogates.

``batch.extras`` keys: ``"t"`` ``[B, K]``, ``"eps"`` ``[B, K, *L]``, ``"old_pair_loss"`` ``[B, K]``,
``"old_loss"`` ``[B]`` (the per-sample surrogate, read by the diagnostics), and with ``kl_beta > 0``
``"ref_x0"`` ``[B, K, *L]``.
"""

from __future__ import annotations

import torch

from vgrpo_platform.protocols import Adapter, RolloutBatch
from vgrpo_platform.surrogates import elbo
from vgrpo_platform.surrogates.plugin import AWMConfig
from vgrpo_platform.surrogates.vgrpo import predict_x0_on_pairs
from vgrpo_platform.timesteps import draw_pairs


def fm_pair_losses(x_hat: torch.Tensor, x0: torch.Tensor, t: torch.Tensor, space: str) -> torch.Tensor:
    """``[B, K]`` plain squared errors from ``x_hat`` ``[B, K, *L]``, ``x0`` ``[B, *L]``, ``t`` ``[B, K]``."""
    mse = elbo.pair_loss(x_hat, x0.unsqueeze(1), x0.ndim - 1, adaptive_weighting=False)  # [B, K]
    return mse / t.to(mse.dtype).square() if space == "velocity" else mse


class AWMSurrogate:
    """The ``awm`` surrogate; see ``AWMConfig``."""

    def __init__(self, config: AWMConfig | None = None) -> None:
        self.config = config if config is not None else AWMConfig()

    def prepare(self, batch: RolloutBatch, adapter: Adapter, generator: torch.Generator) -> None:
        """Shared stratified timesteps, independent noise; the old policy's per-pair losses."""
        cfg = self.config
        x0 = batch.latents
        latent_shape = tuple(x0.shape[1:])
        pair_dtype = torch.promote_types(x0.dtype, torch.float32)
        with torch.no_grad():
            t, _ = draw_pairs(
                batch.group_ids,
                cfg.n_mc,
                (1,),  # the shared noise is not used: only the shared timesteps
                generator=generator,
                scope=cfg.pair_scope,
                stratified=cfg.stratified,
                warp=adapter.schedule.warp,
                t_min=cfg.t_min,
                t_max=cfg.t_max,
                device=x0.device,
                dtype=pair_dtype,
                rows=batch.rows,
            )  # [B, K]
            n_rows = len(batch) if batch.rows is None else len(batch.rows.global_group_ids)
            eps = torch.randn(
                (n_rows, cfg.n_mc, *latent_shape),
                generator=generator,
                device=generator.device,
                dtype=pair_dtype,
            )  # [N, K, *L], one draw per sample of the global batch
            if batch.rows is not None:  # a data-parallel rank keeps its rows
                eps = batch.rows.local(eps, len(batch))
            eps = eps.to(x0.device, x0.dtype)  # [B, K, *L]
            x_hat = predict_x0_on_pairs(adapter, x0, t, eps, batch.cond)
            old = fm_pair_losses(x_hat, x0, t, cfg.space)  # [B, K]
            batch.extras.update(t=t, eps=eps, old_pair_loss=old, old_loss=old.mean(dim=1))
            if cfg.kl_beta > 0:
                from vgrpo_platform.finetune import reference_mode

                with reference_mode(adapter):
                    batch.extras["ref_x0"] = predict_x0_on_pairs(adapter, x0, t, eps, batch.cond)

    def loss(self, batch: RolloutBatch, adapter: Adapter) -> tuple[torch.Tensor, dict[str, float]]:
        """``-mean PPO-clip(rho, A)`` with per-pair or per-sample ratios, ``+ kl_beta KL``."""
        cfg = self.config
        if batch.advantages is None or "old_pair_loss" not in batch.extras:
            raise ValueError("AWMSurrogate.loss needs batch.advantages and the extras of prepare()")
        x0, t = batch.latents, batch.extras["t"]
        x_hat = predict_x0_on_pairs(adapter, x0, t, batch.extras["eps"], batch.cond)  # [B, K, *L]
        new = fm_pair_losses(x_hat, x0, t, cfg.space)  # [B, K]
        old = batch.extras["old_pair_loss"].to(new.dtype)
        adv = batch.advantages.to(new.dtype)  # [B]
        if cfg.ratio_mode == "per_pair":
            rho = elbo.ratio(old, new)  # [B, K]
            objective = elbo.ppo_clip_terms(rho, adv[:, None].expand_as(rho), cfg.clip_range).mean()
        else:
            rho = elbo.ratio(old.mean(dim=1), new.mean(dim=1))  # [B]
            objective = elbo.ppo_clip_objective(rho, adv, cfg.clip_range)
        loss = -objective
        kl = torch.zeros((), dtype=new.dtype, device=new.device)
        if cfg.kl_beta > 0:
            if "ref_x0" not in batch.extras:
                raise ValueError("kl_beta > 0 but batch.extras has no 'ref_x0'; was prepare() run?")
            # velocity distance |v - v_ref|^2 = |x_hat - x_ref|^2 / t^2 (rectified flow)
            sq = elbo.pair_loss(x_hat, batch.extras["ref_x0"], x0.ndim - 1, adaptive_weighting=False)
            kl = (sq / t.to(sq.dtype).square()).mean()
            loss = loss + cfg.kl_beta * kl
        with torch.no_grad():
            metrics = {
                "ratio_mean": float(rho.mean()),
                "ratio_min": float(rho.min()),
                "ratio_max": float(rho.max()),
                "kl": float(kl),
                "surrogate": float(new.mean()),
                "surrogate_old": float(old.mean()),
                "policy_objective": float(objective),
            }
        return loss, metrics
