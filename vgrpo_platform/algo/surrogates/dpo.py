"""Online Diffusion-DPO (each prompt group's best and worst sample form one preference pair) and DGPO
(the whole group, advantage-weighted, forms one preference).

Diffusion-DPO (Wallace et al., "Diffusion Model Alignment Using Direct Preference Optimization")
replaces the sequence log-likelihood of DPO by the ELBO: with ``e(x) = |v_theta(x_t, t) - (eps - x)|^2``
the flow-matching error of a clean sample ``x`` on a draw ``(t, eps)`` and ``e_ref`` the frozen
reference's, and ``D(x) = e(x) - e_ref(x)``, the loss of a pair (winner ``w``, loser ``l``) is

    L = -log sigmoid(-beta * (D(w) - D(l)))

(``beta`` is the paper's ``beta T``; a lower error than the reference's is a higher likelihood). The
pair shares its ``(t, eps)`` (drawn per group, ``pair_scope = "group"``), as Diffusion-DPO noises both
images alike. Online: the pairs are the group's highest- and lowest-reward samples of each rollout.

Micro-batching may split a pair, so each row carries its half of the pair's gradient: the winner row
takes ``-log sigmoid(-beta (D(w) - sg D_l))`` and the loser row ``-log sigmoid(-beta (sg D_w - D(l)))``,
with the partner's ``D`` stored by ``prepare`` (rollout weights). The two gradients sum to the pair
loss's exactly while the weights are the rollout's (the first optimiser step of a batch); on later
steps the partner's term is the rollout-time one. Rows outside a pair carry no loss. Per-row weights
``n_rows / n_pairs`` make the full batch's gradient that of the mean pair loss.

DGPO (Luo et al., "Reinforcing Diffusion Models by Direct Group Preference Optimization") compares
a group's samples weighted by their advantages ``A_i``: with ``S_g = beta / G sum_{i in g} A_i D(x_i)``
the group loss is ``L_g = -log sigmoid(-S_g)``, whose gradient ``sigmoid(S_g) beta / G sum_i A_i grad e(x_i)``
needs no pairing. As the authors' code does, the loss is ``mean_i sg(sigmoid(S_g)) A_i e(x_i)``: the
group weight is a stop-gradient constant (computed by ``prepare`` at the rollout weights), so micro-
batches can split groups, and the batch's gradient is ``1 / (beta P)`` times that of ``sum_g L_g``
(``P`` groups).

``prepare`` writes a ``DPOState``: ``t`` ``[B, K]``, ``eps`` ``[B, K, *L]``, ``role`` ``[B]`` (+1
winner, -1 loser, 0 unpaired), ``weight`` ``[B]``, ``ref_err`` ``[B]`` and ``partner_delta`` ``[B]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vgrpo_platform.algo.surrogates.configs import DGPOConfig, OnlineDPOConfig
from vgrpo_platform.algo.surrogates.pairs import PairScheme, draw_batch_pairs, predict_x0_on_pairs
from vgrpo_platform.finetune import reference_mode
from vgrpo_platform.protocols import Adapter, BatchState, Conditioning, RolloutBatch, SurrogateBase


@dataclass
class DPOState(BatchState):
    """The pair draws, who plays which part, and the reference's (and the partner's) statistics."""

    t: torch.Tensor  # [B, K]
    eps: torch.Tensor  # [B, K, *L]
    role: torch.Tensor  # [B] float: +1 winner, -1 loser, 0 unpaired
    weight: torch.Tensor  # [B] float: n_rows / n_pairs on paired rows, 0 elsewhere
    ref_err: torch.Tensor  # [B]: the reference's flow-matching error (0 on unpaired rows)
    partner_delta: torch.Tensor  # [B]: the partner's D = e - e_ref at the rollout weights


def best_worst_pairs(rewards: torch.Tensor, group_ids: torch.Tensor, min_gap: float) -> torch.Tensor:
    """``[B]`` roles: +1 for each group's first highest-reward row, -1 for its first lowest, 0 elsewhere.

    A group whose reward range is ``<= min_gap`` (all tied, or a single row) makes no pair.
    """
    role = torch.zeros(rewards.shape[0], dtype=torch.float32, device=rewards.device)
    for g in torch.unique(group_ids).tolist():
        rows = torch.nonzero(group_ids == g).flatten()
        r = rewards[rows]
        if rows.numel() < 2 or float(r.max() - r.min()) <= min_gap:
            continue
        role[rows[int(r.argmax())]] = 1.0
        role[rows[int(r.argmin())]] = -1.0
    return role


def flow_matching_error(
    adapter: Adapter, x0: torch.Tensor, t: torch.Tensor, eps: torch.Tensor, cond: Conditioning
) -> torch.Tensor:
    """``mean_k mean_d |v - (eps - x0)|^2`` ``[B]``, computed as ``|x_hat - x0|^2 / t^2`` (rectified flow)."""
    x_hat = predict_x0_on_pairs(adapter, x0, t, eps, cond)  # [B, K, *L]
    dims = tuple(range(2, x_hat.ndim))
    dtype = torch.promote_types(x_hat.dtype, torch.float32)
    sq = (x_hat.to(dtype) - x0.unsqueeze(1).to(dtype)).square().mean(dim=dims)  # [B, K]
    return (sq / t.to(dtype).square()).mean(dim=1)


class OnlineDPOSurrogate(SurrogateBase):
    """The ``diffusion_dpo`` surrogate; see ``OnlineDPOConfig`` and the module docstring."""

    def __init__(self, config: OnlineDPOConfig | None = None) -> None:
        self.config = config if config is not None else OnlineDPOConfig()

    def prepare(self, batch: RolloutBatch, adapter: Adapter, generator: torch.Generator) -> None:
        """Pick the pairs, draw the group-shared ``(t, eps)``, store the reference's errors and each
        row's partner's ``D`` at the rollout weights."""
        cfg = self.config
        x0 = batch.latents
        scheme = PairScheme(cfg.n_mc, "group", cfg.stratified, cfg.t_min, cfg.t_max)
        with torch.no_grad():
            t, eps = draw_batch_pairs(batch, adapter, generator, scheme, tuple(x0.shape[1:]))
            eps = eps.to(x0.dtype)
            role = best_worst_pairs(
                batch.rewards.to(x0.device), batch.group_ids.to(x0.device), cfg.min_reward_gap
            )
            n_pairs = int((role > 0).sum())
            weight = (role != 0).to(torch.float32) * (len(batch) / max(n_pairs, 1))
            ref_err = torch.zeros(
                len(batch), dtype=torch.promote_types(x0.dtype, torch.float32), device=x0.device
            )
            partner = torch.zeros_like(ref_err)
            paired = torch.nonzero(role != 0).flatten()
            if n_pairs:
                cond = {k: v[paired.to(v.device)] for k, v in batch.cond.items()}
                with reference_mode(adapter):
                    ref = flow_matching_error(adapter, x0[paired], t[paired], eps[paired], cond)
                own = flow_matching_error(adapter, x0[paired], t[paired], eps[paired], cond)
                ref_err[paired] = ref
                delta = torch.zeros_like(ref_err)
                delta[paired] = own - ref
                for g in torch.unique(batch.group_ids[paired.to(batch.group_ids.device)]).tolist():
                    rows = paired[(batch.group_ids.to(x0.device)[paired] == g)]
                    w, lo = (rows[role[rows] > 0][0], rows[role[rows] < 0][0])
                    partner[w], partner[lo] = delta[lo], delta[w]
        batch.state = DPOState(t=t, eps=eps, role=role, weight=weight, ref_err=ref_err, partner_delta=partner)

    def loss(self, batch: RolloutBatch, adapter: Adapter) -> tuple[torch.Tensor, dict[str, float]]:
        """``sum_rows weight * (half-pair loss) / rows``: the mean pair loss's gradient over the batch."""
        state = batch.state_as(DPOState, "OnlineDPOSurrogate.loss")
        beta = self.config.beta
        paired = torch.nonzero(state.role != 0).flatten()
        if paired.numel() == 0:  # no pair in this micro-batch: a zero loss that still reaches the graph
            x0 = batch.latents[:1]
            err = flow_matching_error(adapter, x0, state.t[:1], state.eps[:1], _rows(batch.cond, slice(0, 1)))
            zero = 0.0 * err.sum()
            return zero, {"dpo_loss": 0.0, "pair_accuracy": 0.0, "pairs": 0.0, "kl": 0.0}
        x0 = batch.latents[paired]
        err = flow_matching_error(adapter, x0, state.t[paired], state.eps[paired], _rows(batch.cond, paired))
        delta = err - state.ref_err[paired].to(err.dtype)  # [P]
        role, partner = state.role[paired].to(err.dtype), state.partner_delta[paired].to(err.dtype)
        # winner: D(w) - D_l; loser: D_w - D(l), i.e. role * (own - partner)
        margin = role * (delta - partner)
        half = -F.logsigmoid(-beta * margin)  # [P]
        loss = (state.weight[paired].to(err.dtype) * half).sum() / len(batch)
        with torch.no_grad():
            metrics = {
                "dpo_loss": float(half.mean()),
                "pair_accuracy": float((margin < 0).to(torch.float32).mean()),
                "pairs": float(paired.numel() / 2),
                "implicit_margin": float((-beta * margin).mean()),
                "kl": 0.0,
            }
        return loss, metrics


@dataclass
class DGPOState(BatchState):
    """The group-shared draws, the reference's errors and each row's (stop-gradient) group weight."""

    t: torch.Tensor  # [B, K]
    eps: torch.Tensor  # [B, K, *L]
    group_weight: torch.Tensor  # [B]: sigmoid(S_g) of the row's group, at the rollout weights
    group_term: torch.Tensor  # [B]: S_g of the row's group (for the metrics)


def group_preference_logits(
    delta: torch.Tensor, advantages: torch.Tensor, group_ids: torch.Tensor, beta: float
) -> torch.Tensor:
    """``[B]``: ``S_g = beta / |g| sum_{i in g} A_i D_i`` of each row's group ``g``."""
    out = torch.zeros_like(delta)
    for g in torch.unique(group_ids).tolist():
        rows = group_ids == g
        out[rows] = beta * (advantages[rows] * delta[rows]).sum() / int(rows.sum())
    return out


class DGPOSurrogate(SurrogateBase):
    """The ``dgpo`` surrogate; see ``DGPOConfig`` and the module docstring."""

    def __init__(self, config: DGPOConfig | None = None) -> None:
        self.config = config if config is not None else DGPOConfig()

    def prepare(self, batch: RolloutBatch, adapter: Adapter, generator: torch.Generator) -> None:
        """Draw the group-shared ``(t, eps)``, and each group's weight ``sigmoid(S_g)`` at the rollout
        weights (a policy and a reference forward per row)."""
        cfg = self.config
        if batch.advantages is None:
            raise ValueError("DGPOSurrogate.prepare needs batch.advantages (compute them before prepare)")
        x0 = batch.latents
        scheme = PairScheme(cfg.n_mc, "group", cfg.stratified, cfg.t_min, cfg.t_max)
        with torch.no_grad():
            t, eps = draw_batch_pairs(batch, adapter, generator, scheme, tuple(x0.shape[1:]))
            eps = eps.to(x0.dtype)
            with reference_mode(adapter):
                ref = flow_matching_error(adapter, x0, t, eps, batch.cond)
            own = flow_matching_error(adapter, x0, t, eps, batch.cond)
            adv = batch.advantages.to(own.device, own.dtype)
            s = group_preference_logits(own - ref, adv, batch.group_ids.to(own.device), cfg.beta)
        batch.state = DGPOState(t=t, eps=eps, group_weight=torch.sigmoid(s), group_term=s)

    def loss(self, batch: RolloutBatch, adapter: Adapter) -> tuple[torch.Tensor, dict[str, float]]:
        """``mean_i sg(sigmoid(S_g)) A_i e(x_i)`` over the (micro-)batch."""
        if batch.advantages is None:
            raise ValueError("DGPOSurrogate.loss needs batch.advantages")
        state = batch.state_as(DGPOState, "DGPOSurrogate.loss")
        err = flow_matching_error(adapter, batch.latents, state.t, state.eps, batch.cond)  # [B]
        adv = batch.advantages.to(err.dtype)
        loss = (state.group_weight.to(err.dtype) * adv * err).mean()
        with torch.no_grad():
            metrics = {
                "group_weight": float(state.group_weight.mean()),
                "dgpo_group_loss": float(F.softplus(state.group_term).mean()),
                "flow_matching_error": float(err.mean()),
                "kl": 0.0,
            }
        return loss, metrics


def _rows(cond: Conditioning, rows: torch.Tensor | slice) -> Conditioning:
    if isinstance(rows, slice):
        return {k: v[rows] for k, v in cond.items()}
    return {k: v[rows.to(v.device)] for k, v in cond.items()}
