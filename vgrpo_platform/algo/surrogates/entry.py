"""Entry module of the built-in surrogates: registration and factories only, no torch at import time.

``vgrpo`` is the method; ``elbo_naive`` is the same estimator with the three variance-reduction
techniques off (independent pairs per sample, i.i.d. timesteps, plain MSE), the paper's baseline
that oscillates or diverges. ``flow_grpo`` (options: MixGRPO's window, CPS steps, GRPO-Guard's
ratio, Flow-DPPO's KL mask), ``mixgrpo``, ``dance_grpo``, ``flow_grpo_fast``, ``flow_grpo_cps``,
``grpo_guard``, ``flow_dppo``, ``tree_grpo`` and ``branch_grpo`` (presets of its options; the last two
roll out a tree per prompt group), ``diffusion_nft``, ``awm``, ``awm_authors``
(AWM as its authors ship it), ``diffusion_dpo`` (online Diffusion-DPO) and ``dgpo`` are the baselines
of docs/method.md section 6, behind the same interfaces.
"""

from __future__ import annotations

from typing import Any

from vgrpo_platform.algo.surrogates.configs import (  # re-exported: the configs' historical import path
    AWMAuthorsConfig,
    AWMConfig,
    BranchGRPOConfig,
    DanceGRPOConfig,
    DGPOConfig,
    DiffusionNFTConfig,
    FlowDPPOConfig,
    FlowGRPOConfig,
    FlowGRPOCPSConfig,
    FlowGRPOFastConfig,
    GRPOGuardConfig,
    MixGRPOConfig,
    NaiveELBOConfig,
    OnlineDPOConfig,
    TreeGRPOConfig,
    VGRPOConfig,
)
from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component

__all__ = [
    "VGRPOConfig",
    "NaiveELBOConfig",
    "FlowGRPOConfig",
    "DanceGRPOConfig",
    "MixGRPOConfig",
    "FlowGRPOFastConfig",
    "FlowGRPOCPSConfig",
    "DiffusionNFTConfig",
    "AWMConfig",
    "AWMAuthorsConfig",
    "OnlineDPOConfig",
    "DGPOConfig",
    "GRPOGuardConfig",
    "FlowDPPOConfig",
    "TreeGRPOConfig",
    "BranchGRPOConfig",
]


def build_vgrpo(config: VGRPOConfig, context: Any = None) -> Any:
    """Factory: imports the torch implementation only when a run actually builds it."""
    from vgrpo_platform.algo.surrogates.vgrpo import VGRPOSurrogate

    return VGRPOSurrogate(config)


def build_flow_grpo(config: FlowGRPOConfig, context: Any = None) -> Any:
    from vgrpo_platform.algo.surrogates.flow_grpo import FlowGRPOSurrogate

    return FlowGRPOSurrogate(config)


def build_nft(config: DiffusionNFTConfig, context: Any = None) -> Any:
    from vgrpo_platform.algo.surrogates.nft import DiffusionNFTSurrogate

    return DiffusionNFTSurrogate(config)


def build_awm(config: AWMConfig, context: Any = None) -> Any:
    from vgrpo_platform.algo.surrogates.awm import AWMSurrogate

    return AWMSurrogate(config)


def build_dpo(config: OnlineDPOConfig, context: Any = None) -> Any:
    from vgrpo_platform.algo.surrogates.dpo import OnlineDPOSurrogate

    return OnlineDPOSurrogate(config)


def build_dgpo(config: DGPOConfig, context: Any = None) -> Any:
    from vgrpo_platform.algo.surrogates.dpo import DGPOSurrogate

    return DGPOSurrogate(config)


@hookimpl
def register_components() -> list[Component]:
    """The built-in surrogates, in registration order."""
    return [
        Component(
            "surrogate",
            "vgrpo",
            build_vgrpo,
            VGRPOConfig,
            "V-GRPO: ELBO surrogate with group-shared stratified pairs and adaptive x-space weighting.",
        ),
        Component(
            "surrogate",
            "elbo_naive",
            build_vgrpo,
            NaiveELBOConfig,
            "Naive ELBO surrogate (V-GRPO without its three variance-reduction techniques).",
        ),
        # the baselines V-GRPO is measured against
        Component(
            "surrogate",
            "flow_grpo",
            build_flow_grpo,
            FlowGRPOConfig,
            "Flow-GRPO: SDE rollouts, per-step Gaussian log-probs and PPO-clip (MixGRPO window option).",
        ),
        Component(
            "surrogate",
            "mixgrpo",
            build_flow_grpo,
            MixGRPOConfig,
            "MixGRPO as its authors ship it: Flow-GRPO's SDE on a 4-step window moving one step every "
            "25 iterations, ODE elsewhere, group-shared initial noise, no KL.",
        ),
        Component(
            "surrogate",
            "dance_grpo",
            build_flow_grpo,
            DanceGRPOConfig,
            "DanceGRPO: Flow-GRPO with constant SDE noise, group-shared initial noise, a random "
            "subset of steps trained.",
        ),
        Component(
            "surrogate",
            "flow_grpo_fast",
            build_flow_grpo,
            FlowGRPOFastConfig,
            "Flow-GRPO-Fast: ODE rollouts with a short SDE branch at a random early step, trained alone.",
        ),
        Component(
            "surrogate",
            "flow_grpo_cps",
            build_flow_grpo,
            FlowGRPOCPSConfig,
            "Flow-GRPO-Fast with coefficients-preserving (CPS) steps: a 3-step CPS branch, "
            "the CPS authors' log-prob (sde_kind = 'cps' gives CPS to any flow_grpo run).",
        ),
        Component(
            "surrogate",
            "diffusion_nft",
            build_nft,
            DiffusionNFTConfig,
            "DiffusionNFT: implicit positive/negative policy loss around an EMA old policy.",
        ),
        Component(
            "surrogate",
            "awm",
            build_awm,
            AWMConfig,
            "AWM: advantage-weighted flow-matching loss, shared stratified timesteps, independent noise.",
        ),
        Component(
            "surrogate",
            "awm_authors",
            build_awm,
            AWMAuthorsConfig,
            "AWM as its authors ship it: generalised-Huber weighting, EMA penalty, grid timesteps.",
        ),
        # the 2026 methods (docs/method.md section 6)
        Component(
            "surrogate",
            "diffusion_dpo",
            build_dpo,
            OnlineDPOConfig,
            "Online Diffusion-DPO: each group's best vs worst sample as a preference pair, ELBO form, "
            "frozen reference.",
        ),
        Component(
            "surrogate",
            "grpo_guard",
            build_flow_grpo,
            GRPOGuardConfig,
            "GRPO-Guard: Flow-GRPO with normalised per-step ratios (centred at 1, step-independent "
            "spread) and 1/|dt| gradient reweighting.",
        ),
        Component(
            "surrogate",
            "flow_dppo",
            build_flow_grpo,
            FlowDPPOConfig,
            "Flow-DPPO: Flow-GRPO's SDE steps with a KL-masked trust region (exact Gaussian step KL) "
            "in place of the ratio clip.",
        ),
        Component(
            "surrogate",
            "tree_grpo",
            build_flow_grpo,
            TreeGRPOConfig,
            "TreeGRPO: the group as one tree of SDE branchings (shared prefixes, ODE between), each edge "
            "trained once with the mean advantage of its leaves (tree_branch_steps: any flow_grpo run).",
        ),
        Component(
            "surrogate",
            "branch_grpo",
            build_flow_grpo,
            BranchGRPOConfig,
            "BranchGRPO: the group as one tree, DanceGRPO's SDE on every step, node advantages z-scored "
            "per depth, optional depth pruning (tree_prune_steps).",
        ),
        Component(
            "surrogate",
            "dgpo",
            build_dgpo,
            DGPOConfig,
            "DGPO: a group-level DPO preference of advantage-weighted samples against the frozen "
            "reference, no likelihood ratio.",
        ),
    ]
