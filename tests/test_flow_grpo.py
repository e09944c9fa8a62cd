"""Flow-GRPO / MixGRPO against independent computations: the SDE keeps the true marginals of a Gaussian
flow, step log-probs and KLs equal torch.distributions', the on-policy ratio is 1, and the gradient
equals that of a hand-written per-step objective."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_models import DT
from tiny_models import LinearVelocityAdapter as TinyAdapter
from torch.distributions import Independent, Normal, kl_divergence
from toy_runs import surrogate_toy_run

from vgrpo_platform.algo import sde
from vgrpo_platform.algo.surrogates.configs import FlowGRPOConfig
from vgrpo_platform.algo.surrogates.flow_grpo import FlowGRPOSurrogate, euler_grid, window_mask, window_start
from vgrpo_platform.finetune import enable_full_finetune
from vgrpo_platform.protocols import RolloutBatch, SamplerSpec


def gaussian_velocity(z: torch.Tensor, t: torch.Tensor, m: float, c: float) -> torch.Tensor:
    """Exact ``E[eps - x0 | z_t = z]`` for data ``x0 ~ N(m, c^2)`` per element."""
    var = (1 - t) ** 2 * c**2 + t**2
    cov = t - (1 - t) * c**2
    return -m + cov / var * (z - (1 - t) * m)


def integrate(z, t0, t1, steps, m, c, a, g, *, corrected=True):
    grid = torch.linspace(t0, t1, steps + 1, dtype=DT)
    for i in range(steps):
        t, tn = grid[i].expand(z.shape[0]), grid[i + 1].expand(z.shape[0])
        v = gaussian_velocity(z, t[:, None], m, c)
        s = sde.sde_diffusion(t, a)
        mean = sde.sde_step_mean(z, v, t, tn, s) if corrected else sde.ode_step(z, v, t, tn)
        z = mean + sde.step_std(s, t, tn)[:, None] * torch.randn(z.shape, generator=g, dtype=DT)
    return z


def test_sde_keeps_the_true_marginals_of_a_gaussian_flow_and_a_wrong_drift_does_not():
    m, c, t0, t1, n = 0.7, 0.5, 0.8, 0.15, 40_000
    g = torch.Generator().manual_seed(0)
    std0 = math.sqrt((1 - t0) ** 2 * c**2 + t0**2)
    z0 = (1 - t0) * m + std0 * torch.randn(n, 2, generator=g, dtype=DT)
    mean1, var1 = (1 - t1) * m, (1 - t1) ** 2 * c**2 + t1**2  # the true marginal at t1
    # tolerances: Monte-Carlo (var ratio sd ~0.005) plus Euler's O(dt) error (~0.02 for the ODE)
    z1 = integrate(z0, t0, t1, 80, m, c, 0.7, g)
    assert abs(float(z1.mean()) - mean1) < 0.015
    assert abs(float(z1.var()) / var1 - 1) < 0.04
    ode = integrate(z0, t0, t1, 80, m, c, 0.0, g)  # a = 0: the ODE, deterministic
    assert abs(float(ode.var()) / var1 - 1) < 0.04
    wrong = integrate(z0, t0, t1, 80, m, c, 0.7, g, corrected=False)  # noise without the score term
    assert abs(float(wrong.var()) / var1 - 1) > 0.3


def test_one_step_mean_and_variance_match_the_flow_grpo_formula_written_out():
    g = torch.Generator().manual_seed(1)
    z, v = torch.randn(3, 2, 3, generator=g, dtype=DT), torch.randn(3, 2, 3, generator=g, dtype=DT)
    t, tn = torch.tensor([0.9, 0.5, 0.2], dtype=DT), torch.tensor([0.8, 0.4, 0.0], dtype=DT)
    s = sde.sde_diffusion(t, 0.7)
    assert torch.allclose(s, 0.7 * torch.sqrt(t / (1 - t)))
    mean = sde.sde_step_mean(z, v, t, tn, s)
    for i in range(3):
        sig, dt, si = float(t[i]), float(tn[i] - t[i]), float(s[i])
        # flow_grpo's sde_step_with_logprob, term by term
        want = z[i] * (1 + si**2 / (2 * sig) * dt) + v[i] * (1 + si**2 * (1 - sig) / (2 * sig)) * dt
        assert torch.allclose(mean[i], want)
    assert torch.allclose(sde.step_std(s, t, tn), s * torch.sqrt(t - tn))
    capped = sde.sde_diffusion(torch.ones(2, dtype=DT), 0.7, t_cap=0.9)
    assert torch.allclose(capped, torch.full((2,), 0.7 * math.sqrt(1 / 0.1), dtype=DT))


def test_log_prob_and_kl_equal_torch_distributions():
    g = torch.Generator().manual_seed(2)
    x, mu, mu_ref = (torch.randn(4, 2, 3, generator=g, dtype=DT) for _ in range(3))
    t, tn = torch.tensor([0.9, 0.6, 0.3, 0.1], dtype=DT), torch.tensor([0.8, 0.5, 0.2, 0.0], dtype=DT)
    s = sde.sde_diffusion(t, 0.7)
    std = sde.step_std(s, t, tn)
    want_lp = Normal(mu, std[:, None, None]).log_prob(x).mean(dim=(1, 2))
    assert torch.allclose(sde.gaussian_log_prob(x, mu, std, 2), want_lp)
    step = lambda mean: Independent(Normal(mean, std[:, None, None].expand_as(mean)), 2)  # noqa: E731
    true_kl = kl_divergence(step(mu), step(mu_ref)) / 6  # per latent element
    assert torch.allclose(sde.mean_kl(mu, mu_ref, s, t, tn, 2), true_kl)
    flow_grpo_kl = sde.mean_kl(mu, mu_ref, s, t, tn, 2, include_dt=False)
    assert torch.allclose(flow_grpo_kl, true_kl * (t - tn))


def make_batch(
    adapter: TinyAdapter, surrogate: FlowGRPOSurrogate, steps: int = 4, seed: int = 0
) -> RolloutBatch:
    g = torch.Generator().manual_seed(seed)
    b = 4
    cond = {"emb": torch.randn(b, 2, generator=g, dtype=DT)}
    noise = torch.randn(b, 2, 3, generator=g, dtype=DT)
    latents, state = surrogate.rollout(adapter, noise, cond, SamplerSpec("euler", steps), g)
    return RolloutBatch(
        prompts=["p"] * b,
        group_ids=torch.tensor([0, 0, 1, 1]),
        cond=cond,
        latents=latents,
        rewards=torch.zeros(b, dtype=DT),
        advantages=torch.tensor([1.5, -0.5, 7.0, -2.0], dtype=DT),
        state=state,
    )


def test_rollout_records_a_trajectory_whose_log_probs_are_the_step_gaussians():
    adapter = TinyAdapter()
    surrogate = FlowGRPOSurrogate(FlowGRPOConfig(kl_beta=0.0))
    batch = make_batch(adapter, surrogate)
    traj, grid, old = batch.state.trajectory, batch.state.timesteps, batch.state.old_log_prob
    assert traj.shape == (4, 5, 2, 3) and old.shape == (4, 4) and torch.equal(traj[:, -1], batch.latents)
    assert torch.allclose(grid[0], euler_grid(adapter, 4, "cpu").to(grid.dtype))
    with torch.no_grad():
        for j in range(4):
            t, tn = grid[:, j].to(DT), grid[:, j + 1].to(DT)
            v = adapter.predict(traj[:, j], t, batch.cond)
            s = 0.7 * torch.sqrt(t / (1 - t.clamp_max(grid[0, 1].to(DT))))
            mean = (
                traj[:, j]
                + (
                    v
                    + s[:, None, None] ** 2
                    / (2 * t[:, None, None])
                    * (traj[:, j] + (1 - t[:, None, None]) * v)
                )
                * (tn - t)[:, None, None]
            )
            std = s * torch.sqrt(t - tn)
            want = Normal(mean, std[:, None, None]).log_prob(traj[:, j + 1]).mean(dim=(1, 2))
            assert torch.allclose(old[:, j], want, atol=1e-5), j


def test_on_policy_ratio_is_exactly_one_and_the_gradient_is_the_per_step_policy_gradient():
    adapter = TinyAdapter()
    surrogate = FlowGRPOSurrogate(FlowGRPOConfig(kl_beta=0.0))
    batch = make_batch(adapter, surrogate)
    loss, metrics = surrogate.loss(batch, adapter)
    assert metrics["ratio_min"] == pytest.approx(1.0, abs=1e-12)
    assert metrics["ratio_max"] == pytest.approx(1.0, abs=1e-12)
    assert metrics["clip_fraction"] == 0.0
    params = list(adapter.denoiser.parameters())
    got = torch.autograd.grad(loss, params)
    # independent: -mean_{i,j} clamp(A_i) log N(x_{j+1}; mu_theta, std) with torch.distributions
    traj, grid = batch.state.trajectory, batch.state.timesteps.to(DT)
    adv = batch.advantages.clamp(-5, 5)
    total = 0.0
    for j in range(4):
        t, tn = grid[:, j], grid[:, j + 1]
        v = adapter.predict(traj[:, j], t, batch.cond)
        s = sde.sde_diffusion(t, 0.7, t_cap=grid[:, 1])
        mean = sde.sde_step_mean(traj[:, j], v, t, tn, s)
        lp = Normal(mean, (s * torch.sqrt(t - tn))[:, None, None]).log_prob(traj[:, j + 1]).mean(dim=(1, 2))
        total = total - (adv * lp).mean() / 4
    want = torch.autograd.grad(total, params)
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-9)


def test_kl_term_equals_the_gaussian_kl_to_the_reference():
    adapter = TinyAdapter()
    enable_full_finetune(adapter.denoiser)  # the reference = these initial weights
    surrogate = FlowGRPOSurrogate(FlowGRPOConfig(kl_beta=0.5))
    batch = make_batch(adapter, surrogate)
    with torch.no_grad():
        for p in adapter.denoiser.parameters():
            p.add_(0.05)
    ref_adapter = TinyAdapter()  # same seed: the initial weights
    surrogate.prepare(batch, adapter, torch.Generator())
    _, metrics = surrogate.loss(batch, adapter)
    traj, grid = batch.state.trajectory, batch.state.timesteps.to(DT)
    kls = []
    with torch.no_grad():
        for j in range(4):
            t, tn = grid[:, j], grid[:, j + 1]
            s = sde.sde_diffusion(t, 0.7, t_cap=grid[:, 1])
            std = (s * torch.sqrt(t - tn))[:, None, None].expand(4, 2, 3)
            means = [
                sde.sde_step_mean(traj[:, j], a.predict(traj[:, j], t, batch.cond), t, tn, s)
                for a in (adapter, ref_adapter)
            ]
            kls.append(
                kl_divergence(Independent(Normal(means[0], std), 2), Independent(Normal(means[1], std), 2))
                / 6
            )
    want = float(torch.stack(kls).mean())
    assert want > 1e-6
    assert metrics["kl"] == pytest.approx(want, rel=1e-6)


def test_mixgrpo_window_moves_and_only_window_steps_are_stochastic_and_trained():
    cfg = FlowGRPOConfig(window_size=3, window_shift_every=2, window_stride=1, kl_beta=0.0)
    assert [window_start(i, 6, cfg) for i in range(1, 11)] == [0, 0, 1, 1, 2, 2, 3, 3, 0, 0]
    assert window_mask(6, 3, 2).tolist() == [False, False, True, True, True, False]
    assert window_mask(6, None, 0).all()
    adapter = TinyAdapter()
    surrogate = FlowGRPOSurrogate(cfg)
    surrogate.begin_iteration(5)  # window = steps 2, 3, 4
    a, b = make_batch(adapter, surrogate, steps=6, seed=0), make_batch(adapter, surrogate, steps=6, seed=0)
    assert torch.equal(a.state.trajectory, b.state.trajectory)  # same seed, same rollout
    g = torch.Generator().manual_seed(9)
    noise, cond = a.state.trajectory[:, 0], a.cond
    _, other = surrogate.rollout(adapter, noise, cond, SamplerSpec("euler", 6), g)
    ta, tb = a.state.trajectory, other.trajectory
    assert torch.equal(ta[:, :3], tb[:, :3])  # ODE steps 0, 1 ignore the step noise
    assert not torch.allclose(ta[:, 3], tb[:, 3])  # step 2 is an SDE step
    assert a.state.sde_mask[0].tolist() == [0, 0, 1, 1, 1, 0]
    assert torch.all(a.state.old_log_prob[:, [0, 1, 5]] == 0)
    _, metrics = surrogate.loss(a, adapter)
    assert metrics["sde_steps"] == 3.0


def test_flow_grpo_trains_through_the_loop_with_its_own_sde_rollout(tmp_path):
    records, _ = surrogate_toy_run(
        tmp_path,
        "flow_grpo",
        "surrogate.options.window_size=2",
        "log.diagnostics_every=1",
        "train.gradient_steps_per_iteration=2",
        "rollout.steps=3",
    )
    assert [r["sde_steps"] for r in records] == [2.0, 2.0]  # MixGRPO window of 2 of the 3 steps
    assert all(r["kl"] >= 0 and math.isfinite(r["loss"]) for r in records)
    assert not any(k.startswith("diag/") for k in records[-1])  # MDP: no ELBO diagnostics


# ------------------------------------------------------------------ DanceGRPO and Flow-GRPO-Fast


def dance_flux_step(z, v, sigma, sigma_next, eta):
    """DanceGRPO's ``flux_step`` (XueZeyue/DanceGRPO, fastvideo/train_grpo_flux.py), term by term."""
    dsigma = sigma_next - sigma
    mean = z + dsigma * v
    x0 = z - sigma * v
    score = -(z - x0 * (1 - sigma)) / sigma**2
    mean = mean + (-0.5 * eta**2 * score) * dsigma
    return mean, eta * math.sqrt(sigma - sigma_next)


def test_dance_grpo_step_is_its_flux_step_and_its_rollout_log_probs_are_those_gaussians():
    from vgrpo_platform.algo.surrogates.configs import DanceGRPOConfig

    adapter = TinyAdapter()
    surrogate = FlowGRPOSurrogate(DanceGRPOConfig())
    assert surrogate.config.noise_level == 0.3 and surrogate.initial_noise == "group"
    batch = make_batch(adapter, surrogate, steps=5)
    traj, grid, old = batch.state.trajectory, batch.state.timesteps, batch.state.old_log_prob
    with torch.no_grad():
        for j in range(5):
            sigma, sigma_next = float(grid[0, j]), float(grid[0, j + 1])
            v = adapter.predict(traj[:, j], grid[:, j].to(DT), batch.cond)
            mean, std = dance_flux_step(traj[:, j], v, sigma, sigma_next, 0.3)
            want = Normal(mean, std).log_prob(traj[:, j + 1]).mean(dim=(1, 2))
            assert torch.allclose(old[:, j], want, atol=1e-6), j


def test_dance_grpo_trains_a_random_subset_of_the_steps_but_the_last_per_sample():
    from vgrpo_platform.algo.surrogates.configs import DanceGRPOConfig

    adapter = TinyAdapter()
    steps = 11
    surrogate = FlowGRPOSurrogate(DanceGRPOConfig())
    batch = make_batch(adapter, surrogate, steps=steps)
    surrogate.prepare(batch, adapter, torch.Generator().manual_seed(3))
    mask = batch.state.train_mask > 0  # [4, 11]
    assert mask.sum(dim=1).tolist() == [6] * 4  # int(0.6 * 10): DanceGRPO's int(len(steps) * fraction)
    assert not mask[:, -1].any()  # the last step is never trained
    assert len({tuple(row.tolist()) for row in mask}) > 1  # each sample draws its own subset
    # the subsets are uniform: over many draws every one of the 10 steps is trained 60% of the time
    from vgrpo_platform.algo.surrogates.flow_grpo import random_step_subset

    candidates = torch.ones(20_000, steps, dtype=torch.bool)
    candidates[:, -1] = False
    draws = random_step_subset(candidates, 0.6, torch.Generator().manual_seed(0))
    freq = draws[:, :-1].float().mean(dim=0)
    assert torch.all((freq - 0.6).abs() < 0.015), freq
    assert torch.all(draws.sum(dim=1) == 6)


def test_dance_grpo_gradient_is_the_mean_over_each_samples_own_steps():
    from vgrpo_platform.algo.surrogates.configs import DanceGRPOConfig

    adapter = TinyAdapter()
    surrogate = FlowGRPOSurrogate(DanceGRPOConfig())
    batch = make_batch(adapter, surrogate, steps=6)
    surrogate.prepare(batch, adapter, torch.Generator().manual_seed(4))
    loss, metrics = surrogate.loss(batch, adapter)
    assert metrics["sde_steps"] == 3.0 and metrics["ratio_min"] == pytest.approx(1.0, abs=1e-12)
    params = list(adapter.denoiser.parameters())
    got = torch.autograd.grad(loss, params)
    # independent: DanceGRPO's loop, one sample at a time, loss / train_timesteps summed over its steps
    traj, grid = batch.state.trajectory, batch.state.timesteps.to(DT)
    mask = batch.state.train_mask > 0
    adv = batch.advantages.clamp(-5, 5)
    total = 0.0
    for i in range(4):
        for j in torch.nonzero(mask[i]).flatten().tolist():
            sigma, sigma_next = float(grid[i, j]), float(grid[i, j + 1])
            v = adapter.predict(traj[i : i + 1, j], grid[i : i + 1, j], {"emb": batch.cond["emb"][i : i + 1]})
            mean, std = dance_flux_step(traj[i : i + 1, j], v, sigma, sigma_next, 0.3)
            lp = Normal(mean, std).log_prob(traj[i : i + 1, j + 1]).mean()
            total = total - adv[i] * lp / 3 / 4
    want = torch.autograd.grad(total, params)
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-9)


def test_group_shared_initial_noise_copies_each_groups_first_draw_and_leaves_other_draws_alone():
    from vgrpo_platform.training.iteration.rollout import generate_with_extras, share_within_groups

    noise = torch.randn(6, 2, generator=torch.Generator().manual_seed(0))
    shared = share_within_groups(noise, 3)
    assert torch.equal(shared[:3], noise[0].expand(3, 2)) and torch.equal(shared[3:], noise[3].expand(3, 2))

    class Toy:  # what generate_with_extras needs: the sampled latents are the initial noise itself
        def latent_shape(self):
            return (2, 3)

        def encode_prompts(self, prompts):
            return {"emb": torch.zeros(len(prompts), 2)}

        def sample(self, noise, cond, sampler):
            return noise

        def decode(self, latents):
            from vgrpo_platform.protocols import Samples

            return Samples("image", latents)

    def run(scope, window=None):
        g = torch.Generator().manual_seed(7)
        out = generate_with_extras(
            Toy(),
            ["a", "b", "c"],
            group_size=4,
            sampler=SamplerSpec(),
            generator=g,
            chunk_size=5,
            device="cpu",
            noise_scope=scope,
            noise_window=window,
        )
        return out[3], g.get_state()

    per_sample, state_a = run("sample")
    per_group, state_b = run("group")
    assert torch.equal(state_a, state_b)  # the same numbers are drawn whatever the scope
    assert torch.equal(per_group, per_sample[[0] * 4 + [4] * 4 + [8] * 4])
    assert len({tuple(x.flatten().tolist()) for x in per_group}) == 3
    # a data-parallel rank holding groups 1-2 of 3 gets exactly the single-process rows
    part, _ = run("group", window=(4, 12))
    assert torch.equal(part[:8], per_group[4:])


def test_flow_grpo_fast_branches_once_per_iteration_at_a_uniform_early_step():
    from vgrpo_platform.algo.surrogates.configs import FlowGRPOFastConfig
    from vgrpo_platform.algo.surrogates.flow_grpo import random_window_start

    cfg = FlowGRPOFastConfig()
    assert cfg.window_size == 2 and cfg.kl_beta == 0 and cfg.shared_initial_noise
    g = torch.Generator().manual_seed(0)
    starts = torch.tensor([random_window_start(10, cfg, g) for _ in range(6000)])
    # Flow-GRPO's random.randint(0, 10 // 2 - 2): uniform on {0, 1, 2, 3}
    counts = torch.bincount(starts, minlength=4).float() / len(starts)
    assert starts.max() == 3 and torch.all((counts - 0.25).abs() < 0.03), counts
    adapter = TinyAdapter()
    surrogate = FlowGRPOSurrogate(cfg)
    surrogate.begin_iteration(1)
    a = make_batch(adapter, surrogate, steps=8, seed=1)
    b = make_batch(adapter, surrogate, steps=8, seed=2)
    assert torch.equal(a.state.sde_mask, b.state.sde_mask)  # one branch per iteration
    (window,) = {tuple(torch.nonzero(row).flatten().tolist()) for row in a.state.sde_mask}
    assert len(window) == 2 and window[0] <= 2 and window[1] == window[0] + 1  # inside the first half
    surrogate.prepare(a, adapter, torch.Generator())
    _, metrics = surrogate.loss(a, adapter)
    assert metrics["sde_steps"] == 2.0
    seen = set()
    for it in range(2, 40):
        surrogate.begin_iteration(it)
        seen.add(int(make_batch(adapter, surrogate, steps=8, seed=it).state.sde_mask[0].argmax()))
    assert seen == {0, 1, 2}  # a new branch each iteration: every start in [0, 8 // 2 - 2]


def test_flow_grpo_leaves_the_last_step_out_when_asked_and_masks_its_kl_too():
    adapter = TinyAdapter()
    enable_full_finetune(adapter.denoiser)
    surrogate = FlowGRPOSurrogate(FlowGRPOConfig(train_last_step=False, kl_beta=0.5))
    batch = make_batch(adapter, surrogate)
    surrogate.prepare(batch, adapter, torch.Generator())
    assert batch.state.train_mask[0].tolist() == [1, 1, 1, 0]
    assert torch.all(batch.state.ref_mean[:, 3] == 0)  # no reference forward on the untrained step
    _, metrics = surrogate.loss(batch, adapter)
    assert metrics["sde_steps"] == 3.0


@pytest.mark.parametrize("name", ["dance_grpo", "flow_grpo_fast"])
def test_the_flow_grpo_presets_train_through_the_loop(tmp_path, name):
    records, _ = surrogate_toy_run(tmp_path, name, "rollout.steps=6")
    want = 3.0 if name == "dance_grpo" else 2.0  # int(0.6 * 5) random steps; a 2-step branch
    assert [r["sde_steps"] for r in records] == [want, want]
    assert all(math.isfinite(r["loss"]) for r in records)


# ------------------------------------------------------------------ CPS (coefficients-preserving sampling)


def test_cps_step_is_the_papers_formula_written_out():
    g = torch.Generator().manual_seed(11)
    z, v = torch.randn(3, 2, 3, generator=g, dtype=DT), torch.randn(3, 2, 3, generator=g, dtype=DT)
    t, tn = torch.tensor([1.0, 0.5, 0.2], dtype=DT), torch.tensor([0.8, 0.4, 0.0], dtype=DT)
    mean, std = sde.cps_step(z, v, t, tn, 0.8)
    for i in range(3):
        sig, sig_next = float(t[i]), float(tn[i])
        want_std = sig_next * math.sin(0.8 * math.pi / 2)
        x0_hat, x1_hat = z[i] - sig * v[i], z[i] + v[i] * (1 - sig)
        want = x0_hat * (1 - sig_next) + x1_hat * math.sqrt(max(sig_next**2 - want_std**2, 0.0))
        assert float(std[i]) == pytest.approx(want_std, abs=1e-15)
        assert torch.allclose(mean[i], want)


def test_cps_keeps_the_noise_coefficient_of_the_marginal_for_an_exact_model():
    """For data at one point x0, the exact velocity is (z - x0) / t; a CPS step from any z_t then lands
    exactly on the noising law at t_next, N((1 - t_next) x0, t_next^2), in one step; the Flow-GRPO SDE
    step does not (its excess noise is what CPS removes)."""
    g = torch.Generator().manual_seed(12)
    n, x0, t, tn = 200_000, 0.6, 0.7, 0.3
    z = (1 - t) * x0 + t * torch.randn(n, 1, generator=g, dtype=DT)
    v = (z - x0) / t
    tt, ttn = torch.full((n,), t, dtype=DT), torch.full((n,), tn, dtype=DT)
    mean, std = sde.cps_step(z, v, tt, ttn, 0.8)
    z_next = mean + std[:, None] * torch.randn(n, 1, generator=g, dtype=DT)
    assert float(z_next.mean()) == pytest.approx((1 - tn) * x0, abs=3e-3)
    assert float(z_next.std()) == pytest.approx(tn, rel=5e-3)
    s = sde.sde_diffusion(tt, 0.7)
    sde_next = sde.sde_step_mean(z, v, tt, ttn, s) + sde.step_std(s, tt, ttn)[:, None] * torch.randn(
        n, 1, generator=g, dtype=DT
    )
    assert abs(float(sde_next.std()) / tn - 1) > 0.05


@pytest.mark.parametrize("log_prob", ["gaussian", "constant_free"])
def test_cps_rollout_log_probs_and_deterministic_last_step(log_prob):
    adapter = TinyAdapter()
    surrogate = FlowGRPOSurrogate(
        FlowGRPOConfig(sde_kind="cps", noise_level=0.8, cps_log_prob=log_prob, kl_beta=0.0)
    )
    batch = make_batch(adapter, surrogate, steps=4)
    traj, grid, old = batch.state.trajectory, batch.state.timesteps.to(DT), batch.state.old_log_prob
    assert batch.state.sde_mask[0].tolist() == [1, 1, 1, 0]  # the step to t = 0 has std 0
    assert torch.all(old[:, 3] == 0)
    with torch.no_grad():
        for j in range(4):
            t, tn = grid[:, j], grid[:, j + 1]
            v = adapter.predict(traj[:, j], t, batch.cond)
            ang = 0.8 * math.pi / 2
            x0_hat, x1_hat = traj[:, j] - t[:, None, None] * v, traj[:, j] + (1 - t[:, None, None]) * v
            mean = (1 - tn)[:, None, None] * x0_hat + (tn * math.cos(ang))[:, None, None] * x1_hat
            if j == 3:
                assert torch.allclose(traj[:, 4], mean)  # x0_hat: the Euler step to 0
                continue
            std = (tn * math.sin(ang))[:, None, None]
            if log_prob == "gaussian":
                want = Normal(mean, std).log_prob(traj[:, j + 1]).mean(dim=(1, 2))
            else:
                want = -(traj[:, j + 1] - mean).square().mean(dim=(1, 2))
            assert torch.allclose(old[:, j], want, atol=1e-10), j
    loss, metrics = surrogate.loss(batch, adapter)
    assert metrics["ratio_min"] == pytest.approx(1.0, abs=1e-12) and metrics["sde_steps"] == 3.0
    assert loss.requires_grad


def test_cps_kl_is_the_gaussian_kl_of_its_steps_and_its_noise_level_is_checked():
    g = torch.Generator().manual_seed(13)
    mu, mu_ref = torch.randn(4, 2, 3, generator=g, dtype=DT), torch.randn(4, 2, 3, generator=g, dtype=DT)
    std = torch.tensor([0.3, 0.2, 0.1, 0.05], dtype=DT)
    step = lambda mean: Independent(Normal(mean, std[:, None, None].expand_as(mean)), 2)  # noqa: E731
    assert torch.allclose(sde.std_kl(mu, mu_ref, std, 2), kl_divergence(step(mu), step(mu_ref)) / 6)
    with pytest.raises(ValueError, match="noise_level in"):
        FlowGRPOConfig(sde_kind="cps", noise_level=1.5)


def test_cps_trains_through_the_loop_as_an_option_and_as_its_preset(tmp_path):
    records, _ = surrogate_toy_run(
        tmp_path / "a", "flow_grpo", "surrogate.options.sde_kind='cps'", "surrogate.options.noise_level=0.8"
    )
    assert all(math.isfinite(r["loss"]) and r["kl"] >= 0 for r in records)
    records, trainer = surrogate_toy_run(tmp_path / "b", "flow_grpo_cps", "rollout.steps=6")
    assert [r["sde_steps"] for r in records] == [3.0, 3.0]  # its 3-step branch in the first half
    assert trainer.session.surrogate.needs_exact_rollouts


# ------------------------------------------------------------------ GRPO-Guard


def test_ratio_normalisation_centres_the_log_ratio_that_plain_ratios_shift_left():
    g = torch.Generator().manual_seed(21)
    n, std = 400_000, torch.tensor([0.2], dtype=DT)
    mu_old, mu_new = torch.zeros(1, 1, dtype=DT), torch.full((1, 1), 0.1, dtype=DT)
    x = mu_old + std * torch.randn(n, 1, generator=g, dtype=DT)  # samples of the rollout policy
    raw = sde.gaussian_log_prob(x, mu_new.expand_as(x), std.expand(n), 1) - sde.gaussian_log_prob(
        x, mu_old.expand_as(x), std.expand(n), 1
    )
    bias = sde.std_kl(mu_new, mu_old, std, 1)  # 0.1^2 / (2 0.2^2) = 0.125
    assert float(bias) == pytest.approx(0.125)
    assert float(raw.mean()) == pytest.approx(-0.125, abs=3e-3)  # E[log rho] = -KL < 0: shifted left
    assert float((raw + bias).mean()) == pytest.approx(0.0, abs=3e-3)


def test_grpo_guard_loss_is_its_formula_written_out_off_policy():
    from vgrpo_platform.algo.surrogates.configs import GRPOGuardConfig

    adapter = TinyAdapter()
    cfg = GRPOGuardConfig(kl_beta=0.0, clip_range=0.05)
    surrogate = FlowGRPOSurrogate(cfg)
    batch = make_batch(adapter, surrogate, steps=4)
    assert batch.state.old_mean is not None
    with torch.no_grad():
        for p in adapter.denoiser.parameters():
            p.add_(0.02)
    old_adapter = TinyAdapter()  # same seed: the rollout weights
    params = list(adapter.denoiser.parameters())
    loss, metrics = surrogate.loss(batch, adapter)
    traj, grid = batch.state.trajectory, batch.state.timesteps.to(DT)
    adv = batch.advantages.clamp(-5, 5)
    terms = []
    for j in range(4):
        t, tn = grid[:, j], grid[:, j + 1]
        s = 0.7 * torch.sqrt(t / (1 - t.clamp_max(grid[:, 1])))
        std = s * torch.sqrt(t - tn)

        def step_mean(model, j=j, t=t, tn=tn, s=s):
            z = traj[:, j]
            v = model.predict(z, t, batch.cond)
            c = (s**2 / (2 * t))[:, None, None]
            return z + (v + c * (z + (1 - t)[:, None, None] * v)) * (tn - t)[:, None, None]

        mu, mu_old = step_mean(adapter), step_mean(old_adapter).detach()
        lp_new = Normal(mu, std[:, None, None]).log_prob(traj[:, j + 1]).mean(dim=(1, 2))
        lp_old = Normal(mu_old, std[:, None, None]).log_prob(traj[:, j + 1]).mean(dim=(1, 2))
        b = (mu - mu_old).square().mean(dim=(1, 2)) / (2 * std**2)
        rho = torch.exp((lp_new - lp_old + b) * std)
        term = torch.maximum(-adv * rho, -adv * rho.clamp(0.95, 1.05)) / (t - tn)
        terms.append(term)
    want = torch.stack(terms).mean()
    assert float(loss.detach()) == pytest.approx(float(want.detach()), rel=1e-9)
    assert metrics["ratio_min"] != pytest.approx(1.0, abs=1e-9)  # off policy: the ratio moved
    for a, b in zip(torch.autograd.grad(loss, params), torch.autograd.grad(want, params), strict=True):
        assert torch.allclose(a, b, rtol=1e-7, atol=1e-12)


def test_grpo_guard_trains_through_the_loop_and_refuses_the_constant_free_log_prob(tmp_path):
    from vgrpo_platform.algo.surrogates.configs import GRPOGuardConfig

    with pytest.raises(ValueError, match="ratio_norm needs Gaussian"):
        GRPOGuardConfig(sde_kind="cps", noise_level=0.8, cps_log_prob="constant_free")
    records, _ = surrogate_toy_run(
        tmp_path, "grpo_guard", "rollout.steps=3", "train.gradient_steps_per_iteration=2"
    )
    assert all(math.isfinite(r["loss"]) and r["sde_steps"] == 3.0 for r in records)


# ------------------------------------------------------------------ Flow-DPPO


def independent_step_terms(adapter, old_adapter, batch, steps):
    """Per (step, sample): ``rho``, the exact step KL to the rollout policy, and ``-A rho``, from
    torch.distributions and the Flow-GRPO step written out."""
    traj, grid = batch.state.trajectory, batch.state.timesteps.to(DT)
    adv = batch.advantages.clamp(-5, 5)
    rhos, kls = [], []
    for j in range(steps):
        t, tn = grid[:, j], grid[:, j + 1]
        s = 0.7 * torch.sqrt(t / (1 - t.clamp_max(grid[:, 1])))
        std = s * torch.sqrt(t - tn)
        c = (s**2 / (2 * t))[:, None, None]
        z = traj[:, j]
        mus = []
        for model in (adapter, old_adapter):
            v = model.predict(z, t, batch.cond)
            mus.append(z + (v + c * (z + (1 - t)[:, None, None] * v)) * (tn - t)[:, None, None])
        mu, mu_old = mus[0], mus[1].detach()
        new = Independent(Normal(mu, std[:, None, None].expand_as(mu)), 2)
        old = Independent(Normal(mu_old, std[:, None, None].expand_as(mu)), 2)
        rhos.append(torch.exp((new.log_prob(traj[:, j + 1]) - old.log_prob(traj[:, j + 1])) / 6))
        kls.append(kl_divergence(new, old) / 6)  # per latent element
    return torch.stack(rhos), torch.stack(kls), adv


def test_flow_dppo_masks_exactly_the_far_and_further_pushing_steps():
    from vgrpo_platform.algo.surrogates.configs import FlowDPPOConfig

    adapter = TinyAdapter()
    probe = FlowGRPOSurrogate(FlowGRPOConfig(kl_beta=0.0, trust_region="kl_mask"))
    batch = make_batch(adapter, probe, steps=4)
    with torch.no_grad():
        for p in adapter.denoiser.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(5), dtype=DT))
    rho, kl, adv = independent_step_terms(adapter, TinyAdapter(), batch, 4)
    tau = float(kl.detach().median())
    cfg = FlowDPPOConfig(window_size=None, kl_mask_threshold=tau)
    surrogate = FlowGRPOSurrogate(cfg)
    loss, metrics = surrogate.loss(batch, adapter)
    pushing = ((rho > 1) & (adv > 0)) | ((rho < 1) & (adv < 0))
    drop = (kl >= tau) & pushing
    assert 0 < int(drop.sum()) < drop.numel()  # the check sees both kinds
    want = torch.where(drop, torch.zeros_like(rho), -adv * rho).mean()
    assert float(loss.detach()) == pytest.approx(float(want.detach()), rel=1e-9)
    assert metrics["masked_fraction"] == pytest.approx(float(drop.float().mean()))
    assert metrics["kl_old_mean"] == pytest.approx(float(kl.detach().mean()), rel=1e-9)
    params = list(adapter.denoiser.parameters())
    for a, b in zip(torch.autograd.grad(loss, params), torch.autograd.grad(want, params), strict=True):
        assert torch.allclose(a, b, rtol=1e-7, atol=1e-12)


def test_flow_dppo_trains_through_the_loop(tmp_path):
    records, trainer = surrogate_toy_run(
        tmp_path, "flow_dppo", "rollout.steps=6", "train.gradient_steps_per_iteration=2"
    )
    assert [r["sde_steps"] for r in records] == [3.0, 3.0]
    assert all(0 <= r["masked_fraction"] <= 1 and math.isfinite(r["loss"]) for r in records)
    assert trainer.session.surrogate.needs_exact_rollouts
