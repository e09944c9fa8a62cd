"""DiffusionNFT and AWM against hand-written losses: NFT's gradient at the old policy is (2r - 1) A_max
times the self-normalised flow-matching gradient, its EMA follows the decay schedule, and AWM is an
advantage-weighted flow-matching loss on shared stratified timesteps with independent noise."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tiny_models import DT
from tiny_models import LinearVelocityAdapter as TinyAdapter
from toy_runs import surrogate_toy_run

from vgrpo_platform.algo.surrogates.awm import AWMSurrogate
from vgrpo_platform.algo.surrogates.configs import AWMConfig, DiffusionNFTConfig
from vgrpo_platform.algo.surrogates.nft import DiffusionNFTSurrogate, ema_decay, implicit_policies
from vgrpo_platform.noise_schedules import RectifiedFlowSchedule
from vgrpo_platform.protocols import RolloutBatch


def make_batch(advantages: list[float], group_ids: list[int] | None = None, seed: int = 0) -> RolloutBatch:
    g = torch.Generator().manual_seed(seed)
    b = len(advantages)
    return RolloutBatch(
        prompts=["p"] * b,
        group_ids=torch.tensor(group_ids if group_ids is not None else list(range(b))),
        cond={"emb": torch.randn(b, 2, generator=g, dtype=DT)},
        latents=torch.randn(b, 2, 3, generator=g, dtype=DT),
        rewards=torch.zeros(b, dtype=DT),
        advantages=torch.tensor(advantages, dtype=DT),
    )


def grads(loss: torch.Tensor, module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([g.flatten() for g in torch.autograd.grad(loss, list(module.parameters()))])


def per_pair(adapter: TinyAdapter, batch: RolloutBatch) -> Iterator[tuple]:
    """Each sample ``i`` and each of its timestep pairs, one at a time: ``(i, t, x0, eps, z, cond, v)`` with
    ``z = (1 - t) x0 + t eps`` and ``v`` the adapter's velocity at ``(z, t)``, for the written-out losses."""
    t, eps = batch.state.t, batch.state.eps
    b, k = t.shape
    for i in range(b):
        x0, cond = batch.latents[i], {"emb": batch.cond["emb"][i : i + 1]}
        for j in range(k):
            tj = t[i, j]
            z = (1 - tj) * x0 + tj * eps[i, j]
            yield i, tj, x0, eps[i, j], z, cond, adapter.predict(z[None], tj[None], cond)[0]


def manual_fm(
    adapter: TinyAdapter, batch: RolloutBatch, weights: torch.Tensor, *, normalised: bool, space: str
):
    """``mean_{i,k} w_i l_ik`` written out per sample and pair; ``l`` self-normalised x-space or plain FM."""
    total = 0.0
    b, k = batch.state.t.shape
    for i, tj, x0, eps, z, _, v in per_pair(adapter, batch):
        if space == "velocity":
            err = (v - (eps - x0)) ** 2
            total = total + weights[i] * err.mean() / (b * k)
        else:
            diff = z - tj * v - x0
            den = diff.detach().abs().mean() if normalised else 1.0
            total = total + weights[i] * (diff**2).mean() / den / (b * k)
    return total


def test_implicit_policies_mirror_around_the_old_policy():
    g = torch.Generator().manual_seed(0)
    v, v_old = torch.randn(5, generator=g, dtype=DT), torch.randn(5, generator=g, dtype=DT)
    pos, neg = implicit_policies(v, v_old, 0.3)
    assert torch.allclose(pos, 0.7 * v_old + 0.3 * v) and torch.allclose((pos + neg) / 2, v_old)
    pos1, _ = implicit_policies(v, v_old, 1.0)
    assert torch.equal(pos1, v)


@pytest.mark.parametrize("beta", [1.0, 0.3])
def test_nft_gradient_at_the_old_policy_is_the_signed_flow_matching_gradient(beta):
    adapter = TinyAdapter(shift=1.0)
    advantages = [7.0, 2.5, 0.0, -1.0, -9.0]
    batch = make_batch(advantages)
    surrogate = DiffusionNFTSurrogate(DiffusionNFTConfig(beta=beta, n_timesteps=3))
    surrogate.prepare(batch, adapter, torch.Generator().manual_seed(1))  # old policy = current weights
    loss, metrics = surrogate.loss(batch, adapter)
    assert metrics["old_deviation"] == 0.0
    r = 0.5 + 0.5 * torch.tensor(advantages, dtype=DT).div(5).clamp(-1, 1)
    want = manual_fm(adapter, batch, 5 * (2 * r - 1), normalised=True, space="x")
    assert torch.allclose(grads(loss, adapter.denoiser), grads(want, adapter.denoiser), rtol=1e-8, atol=1e-12)


def test_nft_moves_toward_positive_samples_and_away_from_negative_ones():
    for advantage, sign in ((3.0, -1), (-3.0, 1), (0.0, 0)):
        adapter = TinyAdapter(shift=1.0)
        batch = make_batch([advantage])
        surrogate = DiffusionNFTSurrogate(DiffusionNFTConfig(n_timesteps=2))
        surrogate.prepare(batch, adapter, torch.Generator().manual_seed(2))
        fm_before = float(
            manual_fm(adapter, batch, torch.ones(1), normalised=False, space="velocity").detach()
        )
        loss, _ = surrogate.loss(batch, adapter)
        step = torch.autograd.grad(loss, list(adapter.denoiser.parameters()))
        with torch.no_grad():
            for p, gr in zip(adapter.denoiser.parameters(), step, strict=True):
                p.sub_(1e-3 * gr)
        change = (
            float(manual_fm(adapter, batch, torch.ones(1), normalised=False, space="velocity").detach())
            - fm_before
        )
        if sign == 0:  # r = 1/2: no first-order push at the old policy
            assert all(float(gr.abs().max()) < 1e-12 for gr in step)
        else:
            assert change * sign > 0, (advantage, change)


def test_nft_ema_old_policy_follows_the_decay_schedule_and_is_used_by_the_loss():
    assert [ema_decay(s, 2, 0.25, 0.6) for s in range(6)] == [0.0, 0.0, 0.0, 0.25, 0.5, 0.6]
    adapter = TinyAdapter(shift=1.0)
    batch = make_batch([1.0, -1.0])
    cfg = DiffusionNFTConfig(n_timesteps=2, ema_flat=0, ema_rate=0.25, ema_max=0.9)
    surrogate = DiffusionNFTSurrogate(cfg)
    surrogate.prepare(batch, adapter, torch.Generator().manual_seed(3))
    w0 = adapter.denoiser.weight.detach().clone()
    with torch.no_grad():
        adapter.denoiser.weight.add_(0.1)
    surrogate.after_step(adapter)  # step 1: decay 0.25
    want_old = 0.25 * w0 + 0.75 * adapter.denoiser.weight.detach()
    assert torch.allclose(surrogate.old_policy.state["weight"], want_old)
    current = adapter.denoiser.weight.detach().clone()
    with surrogate.old_policy.applied(adapter.denoiser):
        assert torch.allclose(adapter.denoiser.weight, want_old)
    assert torch.equal(adapter.denoiser.weight.detach(), current)
    _, metrics = surrogate.loss(batch, adapter)
    t, eps, x0 = batch.state.t, batch.state.eps, batch.latents
    dev = []
    with torch.no_grad():
        old = TinyAdapter(shift=1.0)
        old.denoiser.weight.copy_(want_old)
        for k in range(2):
            z = (1 - t[:, k, None, None]) * x0 + t[:, k, None, None] * eps[:, k]
            dev.append((adapter.predict(z, t[:, k], batch.cond) - old.predict(z, t[:, k], batch.cond)) ** 2)
    assert metrics["old_deviation"] == pytest.approx(float(torch.stack(dev).mean()), rel=1e-9)
    assert metrics["old_deviation"] > 0


def test_awm_shares_stratified_timesteps_in_a_group_but_not_the_noise():
    adapter = TinyAdapter(shift=1.0)
    batch = make_batch([1.0, -1.0, 0.5, -0.5], group_ids=[0, 0, 1, 1])
    AWMSurrogate(AWMConfig(n_mc=4)).prepare(batch, adapter, torch.Generator().manual_seed(4))
    t, eps = batch.state.t, batch.state.eps
    assert torch.equal(t[0], t[1]) and torch.equal(t[2], t[3]) and not torch.equal(t[0], t[2])
    strata = torch.arange(4, dtype=DT)
    assert torch.all((t >= strata / 4 - 1e-3) & (t <= (strata + 1) / 4 + 1e-3))  # one per stratum (shift 1)
    assert not torch.allclose(eps[0], eps[1])


@pytest.mark.parametrize("space", ["velocity", "x"])
@pytest.mark.parametrize("ratio_mode", ["per_pair", "mean"])
def test_awm_on_policy_is_advantage_weighted_flow_matching(space, ratio_mode):
    adapter = TinyAdapter(shift=3.0)
    advantages = [1.2, -0.7, 0.3, -2.0]
    batch = make_batch(advantages, group_ids=[0, 0, 1, 1])
    surrogate = AWMSurrogate(AWMConfig(n_mc=3, space=space, ratio_mode=ratio_mode))
    surrogate.prepare(batch, adapter, torch.Generator().manual_seed(5))
    loss, metrics = surrogate.loss(batch, adapter)
    assert metrics["ratio_min"] == 1.0 and metrics["ratio_max"] == 1.0
    assert float(loss.detach()) == pytest.approx(-sum(advantages) / 4, abs=1e-12)
    want = manual_fm(adapter, batch, torch.tensor(advantages, dtype=DT), normalised=False, space=space)
    assert torch.allclose(grads(loss, adapter.denoiser), grads(want, adapter.denoiser), rtol=1e-8, atol=1e-12)
    fm = manual_fm(adapter, batch, torch.ones(4, dtype=DT) * 4 / 4, normalised=False, space=space)
    assert float(batch.state.old_loss.mean()) == pytest.approx(float(fm.detach()), rel=1e-9)


def tiny_toy_run(tmp_path: Path, surrogate: str, *overrides: str) -> tuple[list[dict], object]:
    """Two iterations of the toy recipe, two gradient steps each, through the real loop."""
    return surrogate_toy_run(
        tmp_path,
        surrogate,
        "log.diagnostics_every=1",
        "train.gradient_steps_per_iteration=2",
        "rollout.steps=3",
        *overrides,
    )


def test_nft_and_awm_train_through_the_loop_with_ema_updates_and_diagnostics(tmp_path):
    records, trainer = tiny_toy_run(tmp_path / "nft", "diffusion_nft", "surrogate.options.ema_rate=0.1")
    assert trainer.session.surrogate.steps_done == 4  # after_step after each of 2 x 2 optimiser steps
    assert records[-1]["ema_decay"] == pytest.approx(0.25)  # mean over the iteration's steps 2 and 3
    assert not any(k.startswith("diag/") for k in records[-1])  # no per-sample ELBO: no diagnostics
    records, _ = tiny_toy_run(tmp_path / "awm", "awm")
    for key in ("diag/cv", "diag/within_group_cv", "diag/grad_corr"):
        assert all(math.isfinite(r[key]) for r in records), key


def test_the_baselines_register_with_documented_options():
    from vgrpo_platform.algo.surrogates.configs import FlowGRPOConfig
    from vgrpo_platform.algo.surrogates.dpo import DGPOSurrogate, OnlineDPOSurrogate
    from vgrpo_platform.algo.surrogates.entry import register_components
    from vgrpo_platform.algo.surrogates.flow_grpo import FlowGRPOSurrogate

    seen = {c.name: (c.factory, c.config, c.summary) for c in register_components()}
    expected = {
        "flow_grpo": FlowGRPOSurrogate,
        "mixgrpo": FlowGRPOSurrogate,
        "dance_grpo": FlowGRPOSurrogate,
        "flow_grpo_fast": FlowGRPOSurrogate,
        "flow_grpo_cps": FlowGRPOSurrogate,
        "grpo_guard": FlowGRPOSurrogate,
        "flow_dppo": FlowGRPOSurrogate,
        "tree_grpo": FlowGRPOSurrogate,
        "branch_grpo": FlowGRPOSurrogate,
        "diffusion_nft": DiffusionNFTSurrogate,
        "awm": AWMSurrogate,
        "awm_authors": AWMSurrogate,
        "diffusion_dpo": OnlineDPOSurrogate,
        "dgpo": DGPOSurrogate,
    }
    for name, cls in expected.items():
        factory, config, summary = seen[name]
        assert summary and isinstance(factory(config(), None), cls)
        assert all(f.description for f in config.model_fields.values()), name
    assert FlowGRPOConfig().kl_beta == 0.04 and FlowGRPOConfig().clip_range == 1e-4


# ------------------------------------------------------------------ AWM as its authors ship it


def test_ghuber_is_awms_written_out_weighting_and_the_grid_is_diffusers_own():
    from diffusers import FlowMatchEulerDiscreteScheduler

    from vgrpo_platform.algo.surrogates.awm import diffusers_flow_grid, ghuber

    mse = torch.tensor([0.0, 1e-4, 0.3, 2.0], dtype=DT)
    t = torch.tensor([1.0, 0.7, 0.5, 0.36], dtype=DT)
    p = 0.25
    # scxue/advantage_weighted_matching compute_log_prob_awm, weighting 'ghuber' (log_prob = -that)
    log_prob = -(torch.pow(mse + 1e-10, p) - torch.pow(torch.tensor(1e-10, dtype=DT), p)) * t / p
    assert torch.allclose(ghuber(mse, t, p), -log_prob)
    assert ghuber(mse, t, p)[0] == 0.0
    assert torch.allclose(ghuber(mse, t, 1.0), t * mse)  # p = 1: back to the t-weighted error
    for shift in (1.0, 3.0):
        scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
        scheduler.set_timesteps(14)
        grid = diffusers_flow_grid(14, RectifiedFlowSchedule(shift=shift).warp)
        assert torch.allclose(grid.float(), scheduler.sigmas[:-1], atol=1e-6)
    sd3 = diffusers_flow_grid(14, RectifiedFlowSchedule(shift=3.0).warp)
    assert float(sd3[0]) == 1.0 and float(sd3[11]) == pytest.approx(0.357, abs=1e-3)  # AWM's first 90%


def test_awm_grid_timesteps_follow_the_authors_stratified_discrete_rule():
    from vgrpo_platform.algo.surrogates.awm import stratified_grid_indices

    for low in (0, 1):  # 'discrete' and 'discrete_wo_init' (boundaries from 1)
        idx = stratified_grid_indices(4000, 6, low, 12, torch.Generator().manual_seed(0))
        # the authors' boundaries: torch.linspace(low, 12, 7).long()
        bounds = torch.linspace(low, 12, 7).long()
        for k in range(6):
            lo, hi = int(bounds[k]), int(bounds[k + 1])
            col = idx[:, k]
            assert int(col.min()) == lo and int(col.max()) == max(hi - 1, lo), (low, k)
            counts = torch.bincount(col - lo, minlength=hi - lo).float() / len(col)
            assert torch.all((counts - 1 / (hi - lo)).abs() < 0.03)  # uniform within the stratum
    adapter = TinyAdapter(shift=3.0)
    batch = make_batch([1.0, -1.0, 0.5, -0.5], group_ids=[0, 0, 1, 1])
    from vgrpo_platform.algo.surrogates.configs import AWMAuthorsConfig

    AWMSurrogate(AWMAuthorsConfig()).prepare(batch, adapter, torch.Generator().manual_seed(1))
    t = batch.state.t
    assert t.shape == (4, 6) and float(t.max()) <= 1.0 and float(t.min()) >= 0.357 - 1e-3
    assert not torch.equal(t[0], t[1])  # pair_scope 'sample': AWM shares only inside a shuffled micro-batch


def authors_loss(adapter, batch, cfg, ref: TinyAdapter, ema: TinyAdapter):
    """AWM's loss on-policy written out per sample and pair in velocity space (ratio 1, exp_first)."""
    adv = batch.advantages.clamp(-5, 5) / 5
    b, k = batch.state.t.shape
    total = 0.0
    for i, tj, x0, eps, z, cond, v in per_pair(adapter, batch):
        with torch.no_grad():
            v_ref = ref.predict(z[None], tj[None], cond)[0]
            v_ema = ema.predict(z[None], tj[None], cond)[0]
        mse = ((v - (eps - x0)) ** 2).mean()
        log_prob = -(torch.pow(mse + 1e-10, 0.25) - 1e-10**0.25) * tj / 0.25
        ratio = torch.exp(log_prob - log_prob.detach())
        policy = torch.maximum(-adv[i] * ratio, -adv[i] * ratio.clamp(0.0, 2.0))
        kl = ((v - v_ref) ** 2).mean()
        ema_kl = ((v - v_ema) ** 2).mean()
        total = total + (policy + cfg.kl_beta * kl + cfg.ema_beta * ema_kl) / (b * k)
    return total


def test_awm_authors_gradient_is_the_authors_loss_with_its_ema_and_reference_penalties():
    from vgrpo_platform.algo.surrogates.configs import AWMAuthorsConfig
    from vgrpo_platform.finetune import enable_full_finetune

    adapter = TinyAdapter(shift=3.0)
    enable_full_finetune(adapter.denoiser)  # the reference = the initial weights
    ref = TinyAdapter(shift=3.0)
    cfg = AWMAuthorsConfig(n_mc=3)
    surrogate = AWMSurrogate(cfg)
    batch = make_batch([7.0, -0.7, 0.3, -2.0], group_ids=[0, 0, 1, 1])
    surrogate.prepare(batch, adapter, torch.Generator().manual_seed(2))  # EMA starts at these weights
    with torch.no_grad():
        adapter.denoiser.weight.add_(0.05)  # one optimiser step away from the EMA and the reference
    surrogate.after_step(adapter)
    surrogate.prepare(batch, adapter, torch.Generator().manual_seed(2))  # the EMA moves once: decay 0.001
    ema = TinyAdapter(shift=3.0)
    with torch.no_grad():
        ema.denoiser.weight.add_(0.05 * (1 - 0.001))
    assert surrogate.ema_decay() == pytest.approx(0.001)
    assert torch.allclose(surrogate.ema.state["weight"], ema.denoiser.weight)
    surrogate.prepare(batch, adapter, torch.Generator().manual_seed(2))  # no step since: no move
    assert torch.allclose(surrogate.ema.state["weight"], ema.denoiser.weight)
    loss, metrics = surrogate.loss(batch, adapter)
    want = authors_loss(adapter, batch, cfg, ref, ema)
    assert float(loss.detach()) == pytest.approx(float(want.detach()), rel=1e-9)
    assert torch.allclose(grads(loss, adapter.denoiser), grads(want, adapter.denoiser), rtol=1e-7, atol=1e-12)
    assert metrics["kl"] > 0 and metrics["ema_penalty"] > 0
    assert [surrogate.config.adv_clip, surrogate.config.adv_scale] == [5.0, 0.2]


def test_awm_ema_decay_is_min_of_point_three_and_a_thousandth_per_step():
    surrogate = AWMSurrogate(AWMConfig(ema_beta=1.0))
    decays = []
    for step in (1, 100, 299, 300, 1000):
        surrogate.steps_done = step
        decays.append(surrogate.ema_decay())
    assert decays == pytest.approx([0.001, 0.1, 0.299, 0.3, 0.3])


def test_awm_authors_trains_through_the_loop(tmp_path):
    records, trainer = tiny_toy_run(tmp_path / "awm_authors", "awm_authors", "surrogate.options.n_mc=2")
    assert trainer.session.surrogate.steps_done == 4
    assert all(r["ema_penalty"] >= 0 and math.isfinite(r["loss"]) for r in records)
    assert records[-1]["ema_decay"] == pytest.approx(0.0025)  # mean over steps 2 and 3 (0.002, 0.003)
