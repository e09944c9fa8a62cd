"""The V-GRPO surrogate against independent computations: finite differences, closed forms, loops."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import subprocess
import sys

import pytest
import torch
from tiny_models import DT
from tiny_models import LinearVelocityAdapter as TinyAdapter

from vgrpo_platform.algo.surrogates import vgrpo as vgrpo_module
from vgrpo_platform.algo.surrogates.configs import NaiveELBOConfig, VGRPOConfig
from vgrpo_platform.algo.surrogates.elbo import pair_loss
from vgrpo_platform.algo.surrogates.entry import register_components
from vgrpo_platform.algo.surrogates.vgrpo import VGRPOSurrogate
from vgrpo_platform.network import CoreCalledAdapter
from vgrpo_platform.noise_schedules import RectifiedFlowSchedule
from vgrpo_platform.protocols import RolloutBatch, Surrogate


def make_batch(adapter: TinyAdapter, group_ids: list[int], seed: int = 0) -> RolloutBatch:
    g = torch.Generator().manual_seed(seed)
    b = len(group_ids)
    return RolloutBatch(
        prompts=[f"p{i}" for i in group_ids],
        group_ids=torch.tensor(group_ids),
        cond={"emb": torch.randn(b, 2, generator=g, dtype=DT)},
        latents=torch.randn(b, *adapter.latent_shape(), generator=g, dtype=DT),
        rewards=torch.randn(b, generator=g, dtype=DT),
        advantages=torch.randn(b, generator=g, dtype=DT),
    )


def perturb(module: torch.nn.Module, scale: float = 0.05, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


def flat_grad(loss: torch.Tensor, module: torch.nn.Module) -> torch.Tensor:
    grads = torch.autograd.grad(loss, list(module.parameters()))
    return torch.cat([gr.flatten() for gr in grads])


def fields_set(state: object) -> set[str]:
    """The names of a prepared state's fields that hold a tensor (None = not written)."""
    return {f.name for f in dataclasses.fields(state) if getattr(state, f.name) is not None}


def finite_difference(fn, module: torch.nn.Module, h: float = 1e-6) -> torch.Tensor:
    """Central differences of the scalar ``fn()`` w.r.t. every parameter element of ``module``."""
    out = []
    with torch.no_grad():
        for p in module.parameters():
            flat = p.view(-1)
            for i in range(flat.numel()):
                old = float(flat[i])
                flat[i] = old + h
                up = float(fn())
                flat[i] = old - h
                down = float(fn())
                flat[i] = old
                out.append((up - down) / (2 * h))
    return torch.tensor(out, dtype=DT)


def manual_loss(adapter: TinyAdapter, batch: RolloutBatch, cfg: VGRPOConfig, denominators=None):
    """The objective written out per sample and per pair (no library loss functions).

    ``denominators`` ``[B][K]``: adaptive-weighting denominators frozen at given values (what the
    stop-gradient means); ``None`` = recomputed from the current parameters.
    Returns ``(loss, denominators_used)``.
    """
    t, eps = batch.state.t, batch.state.eps
    b, k = t.shape
    total_obj, total_kl, used = 0.0, 0.0, []
    for i in range(b):
        x0 = batch.latents[i]
        cond = {"emb": batch.cond["emb"][i : i + 1]}
        losses, row = [], []
        kl_i = 0.0
        for j in range(k):
            tj = t[i, j]
            z = (1 - tj) * x0 + tj * eps[i, j]
            v = adapter.predict(z[None], tj[None], cond)[0]
            x_hat = z - tj * v
            diff = x_hat - x0
            mse = (diff**2).mean()
            if cfg.adaptive_weighting:
                den = diff.abs().mean() if denominators is None else denominators[i][j]
                row.append(float(den))
                losses.append(mse / den)
            else:
                losses.append(mse)
            if cfg.kl_beta > 0:
                kl_i = kl_i + ((x_hat - batch.state.old_x0[i, j]) ** 2).mean() / k
        used.append(row)
        new = sum(losses) / k
        rho = torch.exp(batch.state.old_loss[i] - new)
        a = batch.advantages[i]
        if cfg.clip_range is None:
            obj = rho * a
        else:
            obj = torch.minimum(rho * a, rho.clamp(1 - cfg.clip_range, 1 + cfg.clip_range) * a)
        total_obj = total_obj + obj
        total_kl = total_kl + kl_i
    return -total_obj / b + cfg.kl_beta * total_kl / b, used


GROUPS = [0, 0, 0, 4, 4, 4, 9, 9]


def test_satisfies_the_protocol_and_prepare_stores_shapes() -> None:
    adapter = TinyAdapter()
    batch = make_batch(adapter, GROUPS)
    sur = VGRPOSurrogate(VGRPOConfig(n_mc=3, kl_beta=0.1))
    assert isinstance(sur, Surrogate)
    sur.prepare(batch, adapter, torch.Generator().manual_seed(0))
    assert batch.state.t.shape == (8, 3)
    assert batch.state.eps.shape == (8, 3, 2, 3)
    assert batch.state.old_loss.shape == (8,)
    assert batch.state.old_x0.shape == (8, 3, 2, 3)
    assert batch.state.ref_x0 is None
    assert not batch.state.old_loss.requires_grad
    t = batch.state.t
    assert torch.equal(t[0], t[2]) and torch.equal(t[3], t[5]) and not torch.equal(t[0], t[3])
    assert _prepared(VGRPOConfig(kl_beta=0.0)).state.old_x0 is None


def _prepared(cfg: VGRPOConfig, groups: list[int] = GROUPS, seed: int = 0) -> RolloutBatch:
    adapter = TinyAdapter()
    batch = make_batch(adapter, groups, seed)
    VGRPOSurrogate(cfg).prepare(batch, adapter, torch.Generator().manual_seed(seed))
    return batch


def test_naive_config_draws_independent_unstratified_pairs() -> None:
    batch = _prepared(NaiveELBOConfig(), groups=[0] * 64)
    t = batch.state.t
    assert not torch.equal(t[0], t[1]) and not torch.equal(batch.state.eps[0], batch.state.eps[1])
    assert float(t[:, 0].max()) > 0.5  # i.i.d.: the first column is not confined to the lowest stratum


def test_on_policy_ratio_is_exactly_one_and_kl_exactly_zero() -> None:
    adapter = TinyAdapter()
    batch = make_batch(adapter, GROUPS)
    sur = VGRPOSurrogate(VGRPOConfig(kl_beta=0.3))
    sur.prepare(batch, adapter, torch.Generator().manual_seed(0))
    loss, metrics = sur.loss(batch, adapter)
    assert metrics["ratio_min"] == 1.0 and metrics["ratio_max"] == 1.0
    assert metrics["kl"] == 0.0 and metrics["clip_fraction"] == 0.0
    assert metrics["surrogate"] == metrics["surrogate_old"]
    assert float(loss.detach()) == pytest.approx(-float(batch.advantages.mean()), rel=1e-14)


@pytest.mark.parametrize("adaptive", [False, True])
def test_gradient_matches_finite_differences(adaptive: bool) -> None:
    """No clip, KL on, parameters moved since prepare so that ratio and KL are not trivial.

    With adaptive weighting the reference is the finite difference of the loss with its
    denominators frozen at the current parameters: the stop-gradient's definition.
    """
    cfg = VGRPOConfig(n_mc=3, clip_range=None, kl_beta=0.3, adaptive_weighting=adaptive)
    adapter = TinyAdapter()
    batch = make_batch(adapter, GROUPS[:5])
    sur = VGRPOSurrogate(cfg)
    sur.prepare(batch, adapter, torch.Generator().manual_seed(0))
    perturb(adapter.denoiser)

    loss, metrics = sur.loss(batch, adapter)
    assert metrics["kl"] > 0 and abs(metrics["ratio_mean"] - 1) > 1e-4
    grad = flat_grad(loss, adapter.denoiser)

    with torch.no_grad():
        value, frozen = manual_loss(adapter, batch, cfg)
    torch.testing.assert_close(loss.detach(), value.detach(), rtol=1e-12, atol=1e-14)
    fd = finite_difference(
        lambda: manual_loss(adapter, batch, cfg, frozen if adaptive else None)[0], adapter.denoiser
    )
    torch.testing.assert_close(grad, fd, rtol=1e-6, atol=1e-8)
    if adaptive:  # the stop-gradient matters: differentiating through the denominator differs
        fd_through = finite_difference(lambda: manual_loss(adapter, batch, cfg)[0], adapter.denoiser)
        assert not torch.allclose(grad, fd_through, rtol=1e-3, atol=1e-6)


def test_adaptive_weighting_gradient_is_mse_gradient_over_constant_l1() -> None:
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(3, 4, 2, 5, generator=g, dtype=DT)
    x_hat = (x0 + 0.3 * torch.randn(3, 4, 2, 5, generator=g, dtype=DT)).requires_grad_(True)
    loss = pair_loss(x_hat, x0, latent_ndim=2)
    assert loss.shape == (3, 4)
    loss.sum().backward()
    diff = (x_hat - x0).detach()
    d = 10  # elements per latent
    l1 = diff.abs().sum(dim=(-2, -1), keepdim=True) / d
    torch.testing.assert_close(x_hat.grad, 2 * diff / d / l1)  # d/dx mean(diff^2) = 2 diff / d
    torch.testing.assert_close(loss.detach(), (diff**2).sum(dim=(-2, -1)) / d / l1[..., 0, 0])
    plain = pair_loss(x_hat, x0, latent_ndim=2, adaptive_weighting=False)
    torch.testing.assert_close(plain.detach(), (diff**2).sum(dim=(-2, -1)) / d)


def test_fully_clipped_batch_has_zero_gradient_and_clip_metric() -> None:
    cfg = VGRPOConfig(clip_range=1e-6, kl_beta=0.0)
    adapter = TinyAdapter()
    batch = make_batch(adapter, GROUPS)
    sur = VGRPOSurrogate(cfg)
    sur.prepare(batch, adapter, torch.Generator().manual_seed(0))
    perturb(adapter.denoiser)
    moved = make_batch(adapter, GROUPS)  # same pairs (same seed), surrogate at the moved parameters
    sur.prepare(moved, adapter, torch.Generator().manual_seed(0))
    assert torch.equal(moved.state.eps, batch.state.eps)
    new = moved.state.old_loss
    log_rho = batch.state.old_loss - new
    assert torch.all(log_rho.abs() > 1e-5)
    # half the samples pushed further out of the trust region (clipped), half pulled back (not)
    sign = torch.sign(log_rho)
    batch.advantages = torch.where(torch.arange(8) < 4, sign, -sign).to(DT)
    loss, metrics = sur.loss(batch, adapter)
    assert metrics["clip_fraction"] == 0.5
    assert torch.count_nonzero(flat_grad(loss, adapter.denoiser)) > 0
    batch.advantages = sign.to(DT)
    loss, metrics = sur.loss(batch, adapter)
    assert metrics["clip_fraction"] == 1.0
    assert torch.count_nonzero(flat_grad(loss, adapter.denoiser)) == 0


def test_micro_batches_weighted_by_size_reproduce_the_full_batch() -> None:
    cfg = VGRPOConfig(kl_beta=0.2, clip_range=0.05)
    adapter = TinyAdapter()
    batch = make_batch(adapter, GROUPS)
    sur = VGRPOSurrogate(cfg)
    sur.prepare(batch, adapter, torch.Generator().manual_seed(0))
    perturb(adapter.denoiser, scale=0.02)
    full_loss, _ = sur.loss(batch, adapter)
    full_grad = flat_grad(full_loss, adapter.denoiser)
    acc_loss, acc_grad = 0.0, torch.zeros_like(full_grad)
    for idx in (torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5, 6, 7])):
        part_loss, _ = sur.loss(batch.select(idx), adapter)
        acc_loss += float(part_loss.detach()) * len(idx) / len(batch)
        acc_grad += flat_grad(part_loss, adapter.denoiser) * len(idx) / len(batch)
    assert acc_loss == pytest.approx(float(full_loss.detach()), rel=1e-12)
    torch.testing.assert_close(acc_grad, full_grad, rtol=1e-10, atol=1e-12)


class ScaledVelocity:
    """``v = a * z_t``: the surrogate's expectation has a closed form in ``t``."""

    modality = "image"
    lora_target_modules = ()

    def __init__(self, a: float, shift: float) -> None:
        self.a = a
        self.denoiser = torch.nn.Identity()
        self.schedule = RectifiedFlowSchedule(shift=shift)

    def latent_shape(self) -> tuple[int, ...]:
        return (8,)

    def predict(self, z_t: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.a * z_t


@pytest.mark.parametrize(("stratified", "scope"), [(True, "group"), (False, "sample"), (True, "batch")])
def test_surrogate_is_unbiased_for_a_known_model(stratified: bool, scope: str) -> None:
    """E[L_hat] = E_t[(c(1-t) - 1)^2] mean_d(x0^2) + E_t[c^2 t^2], c = 1 - a t, t = clamp(warp(u)).

    The expectation over ``t`` is a dense midpoint quadrature over ``u``; the estimator is averaged
    over many independent draws (one group per sample, or repeated batches for ``batch`` scope).
    """
    a, shift, t_min, t_max = 0.6, 3.0, 0.05, 0.95
    adapter = ScaledVelocity(a, shift)
    cfg = VGRPOConfig(
        n_mc=4, stratified=stratified, pair_scope=scope, adaptive_weighting=False, t_min=t_min, t_max=t_max
    )
    n = 4000
    g = torch.Generator().manual_seed(11)
    x0 = torch.randn(n, 8, generator=g, dtype=DT) * 1.5
    m = x0.square().mean(dim=1)  # [n]
    u = (torch.arange(200_000, dtype=DT) + 0.5) / 200_000
    t = adapter.schedule.warp(u).clamp(t_min, t_max)
    c = 1 - a * t
    expected = ((c * (1 - t) - 1) ** 2).mean() * m + (c**2 * t**2).mean()  # [n]

    sur = VGRPOSurrogate(cfg)
    if scope == "batch":  # one set per batch: average over many small batches
        estimates = []
        for r in range(n // 8):
            batch = RolloutBatch(
                [""] * 8, torch.zeros(8, dtype=torch.long), {}, x0[8 * r : 8 * r + 8], torch.zeros(8)
            )
            sur.prepare(batch, adapter, g)
            estimates.append(batch.state.old_loss)
        est = torch.cat(estimates)
    else:
        batch = RolloutBatch([""] * n, torch.arange(n), {}, x0, torch.zeros(n))
        sur.prepare(batch, adapter, g)
        est = batch.state.old_loss
    err = est - expected
    if scope == "batch":
        err = err.view(-1, 8).mean(dim=1)  # samples within a batch are correlated: average first
    tolerance = 4 * float(err.std()) / math.sqrt(err.numel())
    assert abs(float(err.mean())) < tolerance


def test_reference_anchor_uses_the_frozen_base_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """``reference_mode`` (owned by ``vgrpo_platform.finetune``) is stood in for by a context that
    swaps the base weights in, so this test checks only the surrogate's side of that contract."""
    cfg = VGRPOConfig(kl_beta=0.5, kl_anchor="reference", clip_range=None)
    adapter = TinyAdapter()
    base = TinyAdapter()  # same seed: the same initial weights
    entered = []

    @contextlib.contextmanager
    def reference_mode(which: TinyAdapter):
        entered.append(which)
        saved = [p.detach().clone() for p in which.denoiser.parameters()]
        with torch.no_grad():
            for p, q in zip(which.denoiser.parameters(), base.denoiser.parameters(), strict=True):
                p.copy_(q)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, q in zip(which.denoiser.parameters(), saved, strict=True):
                    p.copy_(q)

    monkeypatch.setattr(vgrpo_module, "reference_mode", reference_mode)  # the name vgrpo.py imported
    batch = make_batch(adapter, GROUPS)
    perturb(adapter.denoiser)
    sur = VGRPOSurrogate(cfg)
    sur.prepare(batch, adapter, torch.Generator().manual_seed(0))
    assert entered == [adapter]
    assert batch.state.ref_x0 is not None and batch.state.old_x0 is None

    _, metrics = sur.loss(batch, adapter)
    assert metrics["ratio_max"] == 1.0  # on-policy...
    t, eps = batch.state.t, batch.state.eps
    kl = 0.0
    with torch.no_grad():
        for i in range(len(batch)):  # ...but away from the reference: KL = mean ||x_theta - x_ref||^2
            for j in range(cfg.n_mc):
                z = (1 - t[i, j]) * batch.latents[i] + t[i, j] * eps[i, j]
                cond = {"emb": batch.cond["emb"][i : i + 1]}
                x_cur = z - t[i, j] * adapter.predict(z[None], t[i, j][None], cond)[0]
                x_ref = z - t[i, j] * base.predict(z[None], t[i, j][None], cond)[0]
                kl += float(((x_cur - x_ref) ** 2).mean())
    assert metrics["kl"] == pytest.approx(kl / (len(batch) * cfg.n_mc), rel=1e-10)
    assert metrics["kl"] > 0


def test_loss_requires_advantages_and_prepared_state() -> None:
    adapter = TinyAdapter()
    batch = make_batch(adapter, GROUPS)
    sur = VGRPOSurrogate()
    with pytest.raises(ValueError, match="prepare"):
        sur.loss(batch, adapter)
    sur.prepare(batch, adapter, torch.Generator().manual_seed(0))
    batch.advantages = None
    with pytest.raises(ValueError, match="advantages"):
        sur.loss(batch, adapter)


def test_plugin_registers_both_surrogates_with_their_defaults() -> None:
    seen = {c.name: (c.factory, c.config, c.summary) for c in register_components()}
    assert {"vgrpo", "elbo_naive"} <= set(seen)  # the baselines register here too (test_nft_awm.py)
    factory, config, summary = seen["vgrpo"]
    assert summary
    built = factory(config(), None)
    assert isinstance(built, VGRPOSurrogate) and built.config.pair_scope == "group"
    naive = seen["elbo_naive"][1]()
    assert (naive.pair_scope, naive.stratified, naive.adaptive_weighting) == ("sample", False, False)
    for field in VGRPOConfig.model_fields.values():
        assert field.description
    with pytest.raises(ValueError):
        VGRPOConfig(t_min=0.5, t_max=0.4)
    with pytest.raises(ValueError):
        VGRPOConfig(n_mcc=4)


def test_plugin_module_does_not_import_torch() -> None:
    code = (
        "import sys, vgrpo_platform.algo.surrogates.entry; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


class CoreCalledTiny(CoreCalledAdapter, TinyAdapter):
    """The tiny linear model with its call made by the core (``vgrpo_platform.network``)."""

    def denoiser_inputs(self, z_t: torch.Tensor, t: torch.Tensor, cond: dict) -> dict:
        return {"input": torch.cat([z_t.flatten(1), t[:, None].to(z_t.dtype), cond["emb"]], dim=1)}

    def denoiser_output(self, output: torch.Tensor, z_t: torch.Tensor) -> torch.Tensor:
        return output.view_as(z_t)


@pytest.mark.parametrize("kl_anchor", ["old", "reference"])
def test_prepare_with_rows_capped_equals_the_whole_batch(kl_anchor: str) -> None:
    """The trainer runs ``prepare`` with the core's call capped at a micro-batch of rows per forward."""
    cfg = VGRPOConfig(n_mc=3, kl_beta=0.1, kl_anchor=kl_anchor)
    whole, sliced = CoreCalledTiny(), CoreCalledTiny()
    seen: list[int] = []
    sliced.denoiser.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["input"].shape[0]), with_kwargs=True
    )
    a, b = make_batch(whole, GROUPS), make_batch(sliced, GROUPS)
    VGRPOSurrogate(cfg).prepare(a, whole, torch.Generator().manual_seed(0))
    with sliced.network.rows_at_most(3):
        VGRPOSurrogate(cfg).prepare(b, sliced, torch.Generator().manual_seed(0))
    assert seen and max(seen) == 3 and sum(seen) % len(GROUPS) == 0  # 8 rows -> slices of 3, 3, 2
    assert sliced.network.max_rows is None  # the cap ends with its context
    assert set(fields_set(a.state)) == set(fields_set(b.state))
    for key in fields_set(a.state):
        torch.testing.assert_close(getattr(a.state, key), getattr(b.state, key))


@pytest.mark.parametrize("kl_beta", [0.0, 0.3])
def test_one_step_plan_skips_the_old_forward_and_gives_the_same_loss_and_gradient(kl_beta: float) -> None:
    """``plan_updates(1)``: ``loss`` runs on the old policy, so ``prepare`` needs no forward of its own."""
    cfg = VGRPOConfig(n_mc=3, kl_beta=kl_beta, kl_anchor="old")
    results = {}
    for planned in (0, 1):
        adapter = TinyAdapter()
        calls: list[int] = []
        inner = adapter.predict
        adapter.predict = lambda z, t, c, calls=calls, inner=inner: calls.append(z.shape[0]) or inner(z, t, c)
        batch = make_batch(adapter, GROUPS)
        sur = VGRPOSurrogate(cfg)
        sur.plan_updates(planned)
        sur.prepare(batch, adapter, torch.Generator().manual_seed(0))
        prepare_calls = len(calls)
        loss, metrics = sur.loss(batch, adapter)
        results[planned] = (
            prepare_calls,
            fields_set(batch.state),
            loss.detach(),
            metrics,
            flat_grad(loss, adapter.denoiser),
        )
    (calls0, keys0, loss0, m0, g0), (calls1, keys1, loss1, m1, g1) = results[0], results[1]
    assert calls0 == cfg.n_mc and calls1 == 0  # one forward per pair before, none now
    assert "old_loss" in keys0 and "old_loss" not in keys1
    assert m1["ratio_min"] == m1["ratio_max"] == 1.0 and m1["kl"] == 0.0
    assert m1["surrogate_old"] == m0["surrogate_old"]
    torch.testing.assert_close(loss1, loss0, rtol=0, atol=0)
    torch.testing.assert_close(g1, g0, rtol=1e-14, atol=1e-16)


def test_a_planned_step_count_above_one_keeps_the_old_forward() -> None:
    adapter = TinyAdapter()
    batch = make_batch(adapter, GROUPS)
    sur = VGRPOSurrogate(VGRPOConfig(kl_beta=0.3))
    sur.plan_updates(2)  # the second step's policy is no longer the old one: old_loss must be stored
    sur.prepare(batch, adapter, torch.Generator().manual_seed(0))
    assert {"old_loss", "old_x0"} <= fields_set(batch.state)
    perturb(adapter.denoiser)
    _, metrics = sur.loss(batch, adapter)
    assert metrics["ratio_max"] != 1.0 and metrics["kl"] > 0
