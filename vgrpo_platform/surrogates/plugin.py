"""Entry module of the built-in surrogates: configs and registration only, no torch at import time.

``vgrpo`` is the method; ``elbo_naive`` is the same estimator with the three variance-reduction
techniques off (independent pairs per sample, i.i.d. timesteps, plain MSE), the paper's baseline
that oscillates or diverges.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import PluginConfig


class VGRPOConfig(PluginConfig):
    """Options of the V-GRPO ELBO surrogate (method.md sections 2-4)."""

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
