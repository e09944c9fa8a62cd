"""Dense step rewards (DenseGRPO): reward gains and per-step advantages against hand-computed numbers, the
completions scored against an independent Euler integration, the loss against a hand-written per-step
objective, and two iterations of the toy recipe through the real loop."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_models import DT
from tiny_models import LinearVelocityAdapter as TinyAdapter
from toy_runs import surrogate_toy_run

from vgrpo_platform.algo import sde, step_rewards
from vgrpo_platform.algo.surrogates.configs import FlowGRPOConfig
from vgrpo_platform.algo.surrogates.flow_grpo import FlowGRPOSurrogate
from vgrpo_platform.errors import RecipeError
from vgrpo_platform.finetune import enable_full_finetune
from vgrpo_platform.protocols import RolloutBatch, SamplerSpec


def test_gains_and_advantages_on_hand_computed_numbers():
    # 2 groups of 2 rows, 3 steps, steps 0 and 2 scored: the latents 0, 1, 2 and 3 are needed
    assert step_rewards.latent_indices([0, 2]) == [0, 1, 2, 3]
    rewards = torch.tensor([[0, 1, 1, 3], [0, 2, 2, 2], [1, 1, 1, 1], [0, 0, 1, 1]], dtype=DT)
    gains = step_rewards.reward_gains(rewards, [0, 1, 2, 3], [0, 2], 3)
    assert gains.tolist() == [[1, 0, 2], [2, 0, 0], [0, 0, 0], [0, 0, 0]]
    groups = torch.tensor([0, 0, 1, 1])
    adv = step_rewards.step_advantages(gains, torch.tensor([True, False, True]), groups)
    # step 0, group 0: gains {1, 2}, mean 1.5, population std 0.5; step 2: {2, 0}, std 1; group 1: no spread
    want = torch.tensor(
        [[-0.5 / 0.5001, 0, 1 / 1.0001], [0.5 / 0.5001, 0, -1 / 1.0001], [0, 0, 0], [0, 0, 0]], dtype=DT
    )
    assert torch.allclose(adv, want)


def rollout(cfg: FlowGRPOConfig, steps: int = 4, seed: int = 0):
    adapter = TinyAdapter()
    surrogate = FlowGRPOSurrogate(cfg)
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(4, 2, 3, generator=gen, dtype=DT)
    cond = {"emb": torch.randn(2, 2, generator=gen, dtype=DT).repeat_interleave(2, 0)}
    latents, state = surrogate.rollout(adapter, noise, cond, SamplerSpec("euler", steps), gen)
    groups = torch.tensor([0, 0, 1, 1])
    total = reward_of(latents)
    batch = RolloutBatch(
        ["a", "a", "b", "b"], groups, cond, latents, total, {}, advantages=total, state=state
    )
    return adapter, surrogate, batch, state


def reward_of(latents: torch.Tensor) -> torch.Tensor:
    """A reward with a spread: minus the distance of the sample to a fixed point."""
    return -(latents - 0.3).square().flatten(1).mean(dim=1)


def euler_completion(adapter, z, grid, i, cond):
    """Independent: Euler ODE steps ``z + v dt`` from grid point ``i`` to the end."""
    for k in range(i, grid.shape[0] - 1):
        v = adapter.predict(z, grid[k].expand(z.shape[0]), cond)
        z = z + v * (grid[k + 1] - grid[k])
    return z


@pytest.mark.parametrize("target", ["ode", "x0"])
def test_each_latent_is_completed_and_scored_and_each_step_gets_its_gain(target):
    cfg = FlowGRPOConfig(step_rewards=True, step_reward_target=target, kl_beta=0.0)
    adapter, surrogate, batch, state = rollout(cfg)
    seen: list[torch.Tensor] = []

    def score(latents: torch.Tensor) -> torch.Tensor:
        seen.append(latents)
        return reward_of(latents)

    surrogate.score_steps(batch, adapter, score)
    traj, grid = state.trajectory, state.timesteps[0]
    assert len(seen) == 4  # latents 0..3; latent 4 is the sample, whose reward the batch has
    for i, got in enumerate(seen):
        if target == "ode":
            want = euler_completion(adapter, traj[:, i], grid, i, batch.cond)
        else:
            t = grid[i].expand(4)
            want = traj[:, i] - grid[i] * adapter.predict(traj[:, i], t, batch.cond)
        assert torch.allclose(got, want, atol=1e-12)
    completed = [reward_of(x) for x in seen] + [batch.rewards]
    for j in range(4):
        assert torch.allclose(state.step_reward[:, j], (completed[j + 1] - completed[j]).float())
    assert torch.equal(state.step_scored, torch.ones(4, 4))


def test_only_the_scored_steps_train_with_their_own_advantage():
    cfg = FlowGRPOConfig(step_rewards=True, step_reward_steps=[1, 3], kl_beta=0.0)
    adapter, surrogate, batch, state = rollout(cfg)
    surrogate.score_steps(batch, adapter, reward_of)
    enable_full_finetune(adapter.denoiser)
    surrogate.prepare(batch, adapter, torch.Generator())
    assert state.train_mask.tolist() == [[0, 1, 0, 1]] * 4
    for j in (1, 3):
        gains = state.step_reward[:, j].double()
        centred = gains - gains.view(2, 2).mean(dim=1).repeat_interleave(2)
        std = centred.view(2, 2).square().mean(dim=1).sqrt().repeat_interleave(2)
        assert torch.allclose(state.step_advantage[:, j].double(), centred / (std + 1e-4), atol=1e-6)
    loss, _ = surrogate.loss(batch, adapter)
    # the per-step objective written out: mean over the scored (row, step) pairs of -A_ij rho_ij
    terms = []
    traj, grid = state.trajectory, state.timesteps
    for j in (1, 3):
        t, tn = grid[:, j], grid[:, j + 1]
        v = adapter.predict(traj[:, j], t, batch.cond)
        s = sde.sde_diffusion(t, 0.7, t_cap=grid[:, 1])
        mean = sde.sde_step_mean(traj[:, j], v, t, tn, s)
        lp = sde.gaussian_log_prob(traj[:, j + 1], mean, sde.step_std(s, t, tn), 2)
        adv = state.step_advantage[:, j].float().clamp(-5, 5)
        terms.append(-adv * torch.exp(lp - state.old_log_prob[:, j]))
    want = torch.cat(terms).mean()
    params = list(adapter.denoiser.parameters())
    got_grad = torch.autograd.grad(loss, params)
    want_grad = torch.autograd.grad(want, params)
    assert loss.item() == pytest.approx(want.item(), abs=1e-7)
    assert any(float(g.abs().max()) > 1e-3 for g in want_grad)
    for a, b in zip(got_grad, want_grad, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-8)


def test_bad_step_reward_settings_are_refused():
    with pytest.raises(ValueError, match="needs step_rewards"):
        FlowGRPOConfig(step_reward_steps=[1])
    with pytest.raises(ValueError, match="choose one"):
        FlowGRPOConfig(step_rewards=True, tree_branch_steps=[1])
    cfg = FlowGRPOConfig(step_rewards=True, step_reward_steps=[5], kl_beta=0.0)
    adapter, surrogate, batch, _ = rollout(cfg)
    with pytest.raises(RecipeError, match="past rollout.steps"):
        surrogate.score_steps(batch, adapter, reward_of)
    cfg = FlowGRPOConfig(step_rewards=True, step_reward_steps=[3], window_size=2, kl_beta=0.0)
    adapter, surrogate, batch, _ = rollout(cfg)  # the window holds steps 0 and 1
    with pytest.raises(RecipeError, match="no trainable SDE step"):
        surrogate.score_steps(batch, adapter, reward_of)


def test_step_rewards_train_through_the_loop(tmp_path):
    records, trainer = surrogate_toy_run(
        tmp_path,
        "dance_grpo",
        "surrogate.options={step_rewards=true, step_reward_target='x0'}",
        "rollout.steps=4",
    )
    state = trainer.session.surrogate
    assert state.config.step_rewards and len(records) == 2
    for r in records:  # the loop scored the steps: their mean absolute gain is logged
        assert math.isfinite(r["loss"]) and r["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
        assert r["step_reward_abs_gain"] > 0
