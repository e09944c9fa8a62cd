"""The 2026 final-sample methods against direct recomputations: online Diffusion-DPO's pair loss and
DGPO's group preference, and their gradients, split over micro-batches that cut pairs and groups apart."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from tiny_models import DT
from tiny_models import LinearVelocityAdapter as TinyAdapter
from toy_runs import surrogate_toy_run

from vgrpo_platform.algo.surrogates.configs import DGPOConfig, OnlineDPOConfig
from vgrpo_platform.algo.surrogates.dpo import DGPOSurrogate, OnlineDPOSurrogate, best_worst_pairs
from vgrpo_platform.finetune import enable_full_finetune
from vgrpo_platform.protocols import RolloutBatch


def make_batch(rewards: list[float], group_ids: list[int], seed: int = 0) -> RolloutBatch:
    g = torch.Generator().manual_seed(seed)
    b = len(rewards)
    return RolloutBatch(
        prompts=["p"] * b,
        group_ids=torch.tensor(group_ids),
        cond={"emb": torch.randn(b, 2, generator=g, dtype=DT)},
        latents=torch.randn(b, 2, 3, generator=g, dtype=DT),
        rewards=torch.tensor(rewards, dtype=DT),
        advantages=torch.zeros(b, dtype=DT),
    )


def test_pairs_are_each_groups_best_and_worst_and_tied_groups_make_none():
    rewards = torch.tensor([0.2, 0.9, 0.1, 0.5, 0.3, 0.3, 0.3, 0.7, 0.7])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2])
    role = best_worst_pairs(rewards, groups, 0.0)
    assert role.tolist() == [0, 1, -1, 0, 0, 0, 0, 0, 0]  # group 1 and 2 are tied
    assert best_worst_pairs(rewards, groups, 0.85).tolist() == [0] * 9  # gap 0.8 <= 0.85


def fm_error(model, batch, t, eps, i):
    """``mean_k mean_d |v(z_t) - (eps - x)|^2`` of row ``i``, written out."""
    x, e = batch.latents[i : i + 1], eps[i : i + 1]
    total = 0.0
    for k in range(t.shape[1]):
        tk = t[i : i + 1, k]
        z = (1 - tk)[:, None, None] * x + tk[:, None, None] * e[:, k]
        v = model.predict(z, tk, {"emb": batch.cond["emb"][i : i + 1]})
        total = total + (v - (e[:, k] - x)).square().mean()
    return total / t.shape[1]


def direct_pair_loss(policy, ref, batch, t, eps, w, lo, beta):
    """-log sigmoid(-beta [(e(w) - e_ref(w)) - (e(l) - e_ref(l))]) with e = |v - (eps - x)|^2 written out."""

    def err(model, i):
        return fm_error(model, batch, t, eps, i)

    with torch.no_grad():
        ref_w, ref_l = err(ref, w), err(ref, lo)
    return -F.logsigmoid(-beta * ((err(policy, w) - ref_w) - (err(policy, lo) - ref_l)))


@pytest.mark.parametrize("micro", [[[0, 1, 2, 3, 4, 5]], [[0, 1], [2, 3], [4, 5]], [[0, 3, 4], [1, 2, 5]]])
def test_dpo_loss_and_gradient_equal_the_mean_pair_loss_however_micro_batches_split_pairs(micro):
    policy = TinyAdapter()
    enable_full_finetune(policy.denoiser)  # the reference = the initial weights
    with torch.no_grad():
        for p in policy.denoiser.parameters():
            p.add_(0.05)
    ref = TinyAdapter()
    surrogate = OnlineDPOSurrogate(OnlineDPOConfig(beta=3.0, n_mc=2))
    batch = make_batch([0.1, 0.8, 0.4, 0.9, 0.2, 0.5], [0, 0, 0, 1, 1, 1])
    surrogate.prepare(batch, policy, torch.Generator().manual_seed(3))
    state = batch.state
    assert state.role.tolist() == [-1, 1, 0, 1, -1, 0]
    assert torch.equal(state.t[0], state.t[1]) and torch.equal(
        state.eps[3], state.eps[4]
    )  # pairs share draws
    params = list(policy.denoiser.parameters())
    want_loss = (
        direct_pair_loss(policy, ref, batch, state.t, state.eps, 1, 0, 3.0)
        + direct_pair_loss(policy, ref, batch, state.t, state.eps, 3, 4, 3.0)
    ) / 2
    want = torch.autograd.grad(want_loss, params)
    total, seen = 0.0, []
    for rows in micro:
        part = batch.select(torch.tensor(rows))
        loss, metrics = surrogate.loss(part, policy)
        total = total + loss * len(rows) / len(batch)  # the loop's micro-batch weighting
        seen.append(metrics)
    got = torch.autograd.grad(total, params)
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, rtol=1e-8, atol=1e-12)
    if len(micro) == 1:
        assert seen[0]["dpo_loss"] == pytest.approx(float(want_loss.detach()), rel=1e-9)
        assert seen[0]["pairs"] == 2.0


def test_a_batch_without_pairs_gives_a_zero_loss_with_a_graph():
    policy = TinyAdapter()
    surrogate = OnlineDPOSurrogate(OnlineDPOConfig())
    batch = make_batch([0.5, 0.5], [0, 0])
    surrogate.prepare(batch, policy, torch.Generator().manual_seed(0))
    loss, metrics = surrogate.loss(batch, policy)
    assert float(loss.detach()) == 0.0 and loss.requires_grad and metrics["pairs"] == 0.0


def test_diffusion_dpo_trains_through_the_loop(tmp_path):
    records, trainer = surrogate_toy_run(tmp_path, "diffusion_dpo", "surrogate.options.beta=50.0")
    assert all(math.isfinite(r["loss"]) and r["pairs"] >= 0 for r in records)
    assert not trainer.session.surrogate.needs_exact_rollouts  # a final-sample method: any sampler


def moved_policy() -> tuple[TinyAdapter, TinyAdapter]:
    policy = TinyAdapter()
    enable_full_finetune(policy.denoiser)  # the reference = the initial weights
    with torch.no_grad():
        for p in policy.denoiser.parameters():
            p.add_(0.05)
    return policy, TinyAdapter()


@pytest.mark.parametrize("micro", [[[0, 1, 2, 3, 4, 5]], [[0, 4], [1, 2, 3, 5]]])
def test_dgpo_gradient_is_that_of_the_group_preference_loss(micro):
    policy, ref = moved_policy()
    beta = 7.0
    surrogate = DGPOSurrogate(DGPOConfig(beta=beta, n_mc=2))
    batch = make_batch([0.0] * 6, [0, 0, 0, 1, 1, 1])
    batch.advantages = torch.tensor([1.2, -0.3, -0.9, 0.5, 0.8, -1.3], dtype=DT)
    surrogate.prepare(batch, policy, torch.Generator().manual_seed(4))
    t, eps = batch.state.t, batch.state.eps
    assert torch.equal(t[0], t[2]) and not torch.equal(t[0], t[3])  # the group shares its draws
    params = list(policy.denoiser.parameters())
    # independent: sum_g softplus(beta / G sum_i A_i (e(x_i) - e_ref(x_i))), scaled by 1 / (beta P)
    total = 0.0
    for rows in ([0, 1, 2], [3, 4, 5]):
        s = 0.0
        for i in rows:
            with torch.no_grad():
                e_ref = fm_error(ref, batch, t, eps, i)
            s = s + batch.advantages[i] * (fm_error(policy, batch, t, eps, i) - e_ref)
        total = total + F.softplus(beta * s / 3)
    want = torch.autograd.grad(total / (beta * 2), params)
    got_loss = 0.0
    for rows in micro:
        loss, metrics = surrogate.loss(batch.select(torch.tensor(rows)), policy)
        got_loss = got_loss + loss * len(rows) / 6
    got = torch.autograd.grad(got_loss, params)
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, rtol=1e-8, atol=1e-12)
    assert 0 < metrics["group_weight"] < 1


def test_dgpo_needs_advantages_and_trains_through_the_loop(tmp_path):
    batch = make_batch([0.0, 1.0], [0, 0])
    batch.advantages = None
    with pytest.raises(ValueError, match="advantages"):
        DGPOSurrogate().prepare(batch, TinyAdapter(), torch.Generator())
    records, trainer = surrogate_toy_run(tmp_path, "dgpo")
    assert all(math.isfinite(r["loss"]) and 0 < r["group_weight"] < 1 for r in records)
    assert not trainer.session.surrogate.needs_exact_rollouts
