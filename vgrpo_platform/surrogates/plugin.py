"""Entry module of the built-in surrogates: configs and registration only, no torch at import time.

``vgrpo`` is the method; ``elbo_naive`` is the same estimator with the three variance-reduction
techniques off (independent pairs per sample, i.i.d. timesteps, plain MSE), the paper's baseline
that oscillates or diverges. ``flow_grpo`` (with MixGRPO's window as an option), ``diffusion_nft``
and ``awm`` are the baselines of docs/method.md section 6, behind the same interfaces.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import PluginConfig


class VGRPOConfig(PluginConfig):
    """Options of the V-GRPO ELBO surrogate (docs/method.md sections 2-4)."""

    n_mc: int = Field(
        4, ge=1, description="Monte-Carlo (t, eps) pairs per sample; each costs one forward pass (paper: 4)."
    )
    pair_scope: Literal["group", "batch", "sample"] = Field(
        "group",
        description="Who shares the (t, eps) pairs: 'group' = all samples of a prompt (the method), "
        "'batch' = the whole batch, 'sample' = nobody (ablation).",
    )
    stratified: bool = Field(
        True,
        description="One timestep in each of n_mc equal strata of the (shifted) schedule; False = i.i.d.",
    )
    adaptive_weighting: bool = Field(
        True,
        description="Self-normalised x-space loss MSE / sg(L1), equalising gradient scale across t; "
        "False = plain MSE.",
    )
    clip_range: float | None = Field(
        0.01,
        gt=0,
        description="PPO ratio clip e: rho is clipped to [1 - e, 1 + e]; null = no clipping "
        "(paper: 6e-3..1e-2).",
    )
    kl_beta: float = Field(
        0.0, ge=0, description="Weight of the x-prediction KL penalty; 0 = off (paper: 0.3 where used)."
    )
    kl_anchor: Literal["old", "reference"] = Field(
        "old",
        description="What the KL penalty anchors to: 'old' = the rollout (behaviour) policy (the method), "
        "'reference' = the frozen base model.",
    )
    t_min: float = Field(
        1e-3, ge=0, lt=1, description="Lower clamp of drawn timesteps (t = 0 makes the weighted loss 0/0)."
    )
    t_max: float = Field(1.0 - 1e-3, gt=0, le=1, description="Upper clamp of drawn timesteps.")

    @model_validator(mode="after")
    def _check_t_range(self) -> VGRPOConfig:
        if self.t_min >= self.t_max:
            raise ValueError(f"t_min ({self.t_min}) must be below t_max ({self.t_max})")
        return self


class NaiveELBOConfig(VGRPOConfig):
    """The same surrogate with the variance-reduction techniques off by default (the ablation)."""

    pair_scope: Literal["group", "batch", "sample"] = Field(
        "sample", description="Who shares the (t, eps) pairs; default 'sample' = independent per sample."
    )
    stratified: bool = Field(False, description="Stratified timesteps; default False = i.i.d. uniform.")
    adaptive_weighting: bool = Field(
        False, description="Self-normalised x-space loss; default False = plain MSE."
    )


def build_vgrpo(config: VGRPOConfig, context: Any = None) -> Any:
    """Factory: imports the torch implementation only when a run actually builds it."""
    from vgrpo_platform.surrogates.vgrpo import VGRPOSurrogate

    return VGRPOSurrogate(config)


@hookimpl
def register_surrogates(register):  # noqa: ANN001 - the host's Register callable
    register(
        "vgrpo",
        build_vgrpo,
        VGRPOConfig,
        summary="V-GRPO: ELBO surrogate with group-shared stratified pairs and adaptive x-space weighting.",
    )
    register(
        "elbo_naive",
        build_vgrpo,
        NaiveELBOConfig,
        summary="Naive ELBO surrogate (V-GRPO without its three variance-reduction techniques).",
    )
    _register_baselines(register)


class FlowGRPOConfig(PluginConfig):
    """Flow-GRPO (MDP; docs/method.md section 6): SDE rollouts with per-step Gaussian log-probs, per-step PPO.

    With ``window_size`` set it is MixGRPO: SDE (and training) only inside a sliding window of steps,
    deterministic Euler steps elsewhere. Rollouts always use the Euler grid of ``rollout.steps`` on
    the adapter's shifted schedule, whatever ``rollout.sampler`` says (an SDE needs its own step).
    """

    noise_level: float = Field(0.7, gt=0, description="a in s(t) = a sqrt(t / (1 - t)) (Flow-GRPO: 0.7).")
    clip_range: float = Field(1e-4, gt=0, description="Per-step PPO ratio clip (Flow-GRPO: 1e-4).")
    adv_clip: float = Field(5.0, gt=0, description="Advantages are clamped to [-adv_clip, adv_clip].")
    kl_beta: float = Field(
        0.04, ge=0, description="Weight of the KL to the frozen (LoRA-disabled) reference; 0 = off."
    )
    kl_include_dt: bool = Field(
        True,
        description="KL = |mu - mu_ref|^2 / (2 s^2 |dt|), the true Gaussian KL per element; False = "
        "Flow-GRPO's |mu - mu_ref|^2 / (2 s^2), without |dt|.",
    )
    window_size: int | None = Field(
        None, ge=1, description="MixGRPO: SDE steps per rollout in a sliding window; null = all (Flow-GRPO)."
    )
    window_shift_every: int = Field(25, ge=1, description="MixGRPO: iterations between window moves.")
    window_stride: int = Field(
        1, ge=1, description="MixGRPO: steps the window moves each time (wraps around)."
    )


class DiffusionNFTConfig(PluginConfig):
    """DiffusionNFT (docs/method.md section 6): implicit positive / negative policies around an EMA
    old policy."""

    beta: float = Field(
        1.0, gt=0, description="b in v+ = (1 - b) v_old + b v_theta, v- = (1 + b) v_old - b v_theta [guess]."
    )
    adv_clip: float = Field(
        5.0, gt=0, description="r = 1/2 + 1/2 clip(A / adv_clip, -1, 1); also scales the loss."
    )
    n_timesteps: int = Field(
        4, ge=1, description="(t, eps) draws per sample per update, each one forward pass."
    )
    adaptive_weighting: bool = Field(
        True, description="Self-normalised x-space loss MSE / sg(L1) (DiffusionNFT)."
    )
    kl_beta: float = Field(
        0.0, ge=0, description="Weight of |v_theta - v_ref|^2 to the LoRA-disabled reference."
    )
    ema_flat: int = Field(
        0, ge=0, description="EMA decay of the old policy is 0 (old = current) before this step."
    )
    ema_rate: float = Field(1e-3, ge=0, description="EMA decay grows by this much per optimiser step...")
    ema_max: float = Field(0.5, ge=0, lt=1, description="...up to this value (DiffusionNFT decay type 1).")
    t_min: float = Field(1e-3, ge=0, lt=1, description="Lower clamp of drawn timesteps.")
    t_max: float = Field(1.0 - 1e-3, gt=0, le=1, description="Upper clamp of drawn timesteps.")


class AWMConfig(PluginConfig):
    """Advantage-weighted matching: a flow-matching loss weighted by advantages (V-GRPO minus shared noise
    and self-normalisation)."""

    n_mc: int = Field(4, ge=1, description="Timesteps per sample, each one forward pass.")
    pair_scope: Literal["group", "batch", "sample"] = Field(
        "group", description="Who shares the timesteps (noise is always independent per sample)."
    )
    stratified: bool = Field(True, description="One timestep in each of n_mc strata; False = i.i.d.")
    space: Literal["velocity", "x"] = Field(
        "velocity", description="'velocity' = |v - (eps - x0)|^2 (flow matching), 'x' = |x_hat - x0|^2."
    )
    ratio_mode: Literal["per_pair", "mean"] = Field(
        "per_pair",
        description="'per_pair': one ratio per timestep, PPO terms averaged (AWM's exp-first); "
        "'mean': one ratio of the mean loss (V-GRPO's form).",
    )
    clip_range: float | None = Field(1.0, gt=0, description="PPO ratio clip; null = none (AWM: 1.0).")
    kl_beta: float = Field(
        0.0, ge=0, description="Weight of |v_theta - v_ref|^2 to the LoRA-disabled reference."
    )
    t_min: float = Field(1e-3, ge=0, lt=1, description="Lower clamp of drawn timesteps.")
    t_max: float = Field(1.0 - 1e-3, gt=0, le=1, description="Upper clamp of drawn timesteps.")


def build_flow_grpo(config: FlowGRPOConfig, context: Any = None) -> Any:
    from vgrpo_platform.surrogates.flow_grpo import FlowGRPOSurrogate

    return FlowGRPOSurrogate(config)


def build_nft(config: DiffusionNFTConfig, context: Any = None) -> Any:
    from vgrpo_platform.surrogates.nft import DiffusionNFTSurrogate

    return DiffusionNFTSurrogate(config)


def build_awm(config: AWMConfig, context: Any = None) -> Any:
    from vgrpo_platform.surrogates.awm import AWMSurrogate

    return AWMSurrogate(config)


def _register_baselines(register):  # noqa: ANN001 - the host's Register callable
    """The baselines V-GRPO is measured against (one pluggy hook per module: called from it)."""
    register(
        "flow_grpo",
        build_flow_grpo,
        FlowGRPOConfig,
        summary="Flow-GRPO: SDE rollouts, per-step Gaussian log-probs and PPO-clip (MixGRPO window option).",
    )
    register(
        "diffusion_nft",
        build_nft,
        DiffusionNFTConfig,
        summary="DiffusionNFT: implicit positive/negative policy loss around an EMA old policy.",
    )
    register(
        "awm",
        build_awm,
        AWMConfig,
        summary="AWM: advantage-weighted flow-matching loss, shared stratified timesteps, independent noise.",
    )
