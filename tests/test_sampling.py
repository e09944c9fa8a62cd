"""The ODE samplers against exact solutions and a fine-step reference.

Velocity fields are the exact marginal flows ``v(z, t) = E[eps - x0 | z_t = z]`` of known data
distributions under ``z_t = (1 - t) x0 + t eps`` (what a perfect model would predict):
- a point mass at ``x0``: every trajectory ends exactly at ``x0``;
- a Gaussian ``N(mu, s^2 I)``: the flow map is ``z_t = (1 - t) mu + sqrt((1 - t)^2 s^2 + t^2) eps``;
- a Gaussian mixture: nonlinear in ``z``; reference = 2000 float64 Euler steps on the same shifted grid.
"""

from __future__ import annotations

import math

import pytest
import torch

from vgrpo_platform.ode_solvers import SAMPLERS, solve_flow_ode
from vgrpo_platform.protocols import SamplerSpec

DIM = 4


def point_mass_velocity(x0: torch.Tensor):
    def v(z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return (z - x0) / t.view(-1, 1)  # eps_hat - x0 with eps_hat = (z - (1 - t) x0) / t

    return v


def mixture_velocity(means: torch.Tensor, std: float):
    """Exact flow of the mixture sum_k N(means[k], std^2 I) with equal weights, in float64."""

    def v(z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        z64, t64, m = z.double(), t.double().view(-1, 1, 1), means.double()[None]  # [B,D] [B,1,1] [1,K,D]
        alpha = 1 - t64
        var = alpha**2 * std**2 + t64**2  # [B, 1, 1] per-component marginal variance of z_t
        diff = z64[:, None, :] - alpha * m  # [B, K, D]
        weights = torch.softmax(-(diff**2).sum(-1) / (2 * var[..., 0]), dim=1)[..., None]  # [B, K, 1]
        e_eps = t64 / var * diff  # E[eps | z, k]
        e_x0 = m + alpha * std**2 / var * diff  # E[x0 | z, k]
        return (weights * (e_eps - e_x0)).sum(1).to(z.dtype)  # [B, D]

    return v


def shifted(u: torch.Tensor, shift: float) -> torch.Tensor:
    return shift * u / (1 + (shift - 1) * u)


def euler_reference(v, noise: torch.Tensor, shifts: tuple[float, ...], steps: int = 2000) -> torch.Tensor:
    """``[len(shifts), B, D]``: one float64 Euler run per shift, batched (the field takes per-row t)."""
    u = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)[:, None]  # [N+1, 1]
    grids = shifted(u, torch.tensor(shifts, dtype=torch.float64)).repeat_interleave(len(noise), 1)  # [N+1,SB]
    z = noise.double().repeat(len(shifts), 1)  # [S*B, D]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # thousands of tiny ops: threading only adds overhead
    try:
        for i in range(steps):
            z = z + (grids[i + 1] - grids[i])[:, None] * v(z, grids[i])
    finally:
        torch.set_num_threads(threads)
    return z.reshape(len(shifts), *noise.shape)


@pytest.fixture(scope="module")
def mixture():
    gen = torch.Generator().manual_seed(0)
    means = torch.randn(3, DIM, generator=gen)
    noise = torch.randn(64, DIM, generator=gen)
    v = mixture_velocity(means, std=0.5)
    refs = dict(zip((1.0, 3.0), euler_reference(v, noise, (1.0, 3.0)), strict=True))
    return v, noise, refs


def mean_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().mean().item()


@pytest.mark.parametrize("name", SAMPLERS)
@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_point_mass_is_reached_exactly(name: str, shift: float) -> None:
    # All three solvers are exact for a constant x0-prediction: the answer after 3 steps is x0.
    gen = torch.Generator().manual_seed(1)
    x0, noise = torch.randn(DIM, generator=gen), torch.randn(16, DIM, generator=gen)
    out = solve_flow_ode(point_mass_velocity(x0), noise, SamplerSpec(name, 3), shift=shift)
    torch.testing.assert_close(out, x0.expand_as(out), atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", SAMPLERS)
def test_gaussian_flow_matches_closed_form_and_converges(name: str) -> None:
    mu, std = torch.tensor([1.0, -2.0, 0.5, 0.0]), 0.3
    noise = torch.randn(64, DIM, generator=torch.Generator().manual_seed(2))
    exact = mu + std * noise  # z_0 of the flow map at t = 0
    v = mixture_velocity(mu[None], std)
    errors = [mean_error(solve_flow_ode(v, noise, SamplerSpec(name, n)), exact) for n in (5, 20, 80)]
    assert errors[0] > errors[1] > errors[2], errors
    assert errors[2] < 0.01, errors


@pytest.mark.parametrize("name", SAMPLERS)
@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_nonlinear_field_reaches_fine_reference(mixture, name: str, shift: float) -> None:
    v, noise, refs = mixture
    out = solve_flow_ode(v, noise, SamplerSpec(name, 64), shift=shift)
    # Euler is first order (measured 0.013 / 0.019 at 64 steps), the multistep solvers second order.
    assert mean_error(out, refs[shift]) < (0.03 if name == "euler" else 0.01)


@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_multistep_solvers_beat_euler_at_8_steps(mixture, shift: float) -> None:
    # Measured mean errors at 8 steps, shift 1: euler 0.10, dpmsolver++ 0.022, unipc 0.015;
    # shift 3: euler 0.14, dpmsolver++ 0.097, unipc 0.096.
    v, noise, refs = mixture
    err = {
        name: mean_error(solve_flow_ode(v, noise, SamplerSpec(name, 8), shift=shift), refs[shift])
        for name in SAMPLERS
    }
    assert err["dpmsolver++"] < 0.8 * err["euler"], err
    assert err["unipc"] < 0.8 * err["euler"], err


@pytest.mark.parametrize("name", SAMPLERS)
@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_predict_sees_the_shifted_sigma_grid(name: str, shift: float) -> None:
    seen: list[torch.Tensor] = []

    def v(z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        assert t.shape == (z.shape[0],) and t.dtype == torch.float32
        seen.append(t.clone())
        return torch.zeros_like(z)

    steps = 6
    solve_flow_ode(v, torch.zeros(2, DIM), SamplerSpec(name, steps), shift=shift)
    ts = torch.stack(seen)  # [steps, B]
    assert ts.shape == (steps, 2) and (ts[:, 0] == ts[:, 1]).all()
    u = torch.linspace(1.0, 1.0 / steps, steps, dtype=torch.float64)
    if name == "dpmsolver++":
        u = 0.999 * u  # diffusers' flow grid for DPM-Solver starts at 1 - 1/num_train_timesteps
    expected = shifted(u, shift).float()
    # UniPC moves its first point from 1 to 1 - 1e-6 to keep log(1 - t) finite.
    torch.testing.assert_close(ts[:, 0], expected, atol=2e-6, rtol=0)


@pytest.mark.parametrize("name", SAMPLERS)
def test_deterministic_and_dtype_preserving(mixture, name: str) -> None:
    v, noise, _ = mixture
    a = solve_flow_ode(v, noise, SamplerSpec(name, 7))
    b = solve_flow_ode(v, noise, SamplerSpec(name, 7))  # a fresh scheduler: no state carried over
    assert torch.equal(a, b) and a.dtype == noise.dtype and a.shape == noise.shape
    half = solve_flow_ode(v, noise.to(torch.bfloat16), SamplerSpec(name, 7))
    assert half.dtype == torch.bfloat16
    assert mean_error(half, a) < 0.05  # only input rounding differs: the solver state stays float32


def test_image_shaped_latents() -> None:
    x0 = torch.randn(3, 4, 4)
    noise = torch.randn(2, 3, 4, 4)
    out = solve_flow_ode(lambda z, t: (z - x0) / t.view(-1, 1, 1, 1), noise, SamplerSpec("unipc", 4))
    torch.testing.assert_close(out, x0.expand_as(out), atol=1e-4, rtol=0)


def test_unknown_sampler_lists_valid_names() -> None:
    with pytest.raises(ValueError, match=r"unknown sampler 'heun'.*euler, dpmsolver\+\+, unipc"):
        solve_flow_ode(lambda z, t: z, torch.zeros(1, 2), SamplerSpec("heun", 4))


def test_steps_must_be_positive() -> None:
    with pytest.raises(ValueError, match="steps"):
        solve_flow_ode(lambda z, t: z, torch.zeros(1, 2), SamplerSpec("euler", 0))


def test_shift_grid_helper_matches_schedule_warp() -> None:
    from vgrpo_platform.noise_schedules import RectifiedFlowSchedule

    u = torch.linspace(0, 1, 11)
    torch.testing.assert_close(shifted(u, 3.0), RectifiedFlowSchedule(3.0).warp(u))
    assert math.isclose(shifted(torch.tensor(0.5), 3.0).item(), 0.75)
