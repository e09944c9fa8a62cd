"""Options of the built-in surrogates (``[surrogate.options]``): pydantic models, no torch.

Why apart from the registration module: each implementation reads its own config, and the
registration module imports the implementations (lazily, in the factories); with the configs here
neither side imports the other.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from vgrpo_platform.registry import PluginConfig

REFERENCE = "the frozen base model (reference: LoRA off, or the initial weights)"


def kl_title(kl_beta: float, what: str) -> str:
    """What the training metric ``kl`` measures, as ``vgrpo report`` titles its panel.

    Each config's ``kl_measures()`` returns it: the metric's name says "KL" whatever the anchor, and
    a title that names the wrong anchor (the old policy for the base model) misleads.
    """
    return what if kl_beta > 0 else "no KL penalty (kl_beta = 0): kl is logged as 0"


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

    def kl_measures(self) -> str:
        """``kl``: the x-prediction distance to the anchor ``kl_anchor`` names."""
        anchor = "the old (rollout) policy" if self.kl_anchor == "old" else REFERENCE
        return kl_title(self.kl_beta, f"x-prediction KL to {anchor}")

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

    def kl_measures(self) -> str:
        """``kl``: the per-step Gaussian KL of the SDE steps to the reference's."""
        return kl_title(self.kl_beta, f"per-step Gaussian KL to {REFERENCE}")

    window_placement: Literal["sliding", "random"] = Field(
        "sliding",
        description="'sliding' = MixGRPO's schedule; 'random' = Flow-GRPO-Fast: a uniform start in "
        "[0, int(window_range * steps) - window_size], drawn once per iteration from the rollout generator.",
    )
    window_range: float = Field(
        1.0,
        gt=0,
        le=1,
        description="'random' placement: the window lies in this first fraction of the steps.",
    )
    diffusion: Literal["flow_grpo", "constant"] = Field(
        "flow_grpo",
        description="SDE diffusion s(t): 'flow_grpo' = a sqrt(t / (1 - t)), 'constant' = a (DanceGRPO).",
    )
    sde_kind: Literal["flow_grpo", "cps"] = Field(
        "flow_grpo",
        description="The stochastic step: 'flow_grpo' = the marginal-preserving SDE of s(t); 'cps' = "
        "coefficients-preserving sampling, std = t_next sin(noise_level pi / 2) (CPS; noise_level in "
        "(0, 1], the CPS configs use 0.8), the step to t = 0 deterministic and untrained.",
    )
    cps_log_prob: Literal["gaussian", "constant_free"] = Field(
        "gaussian",
        description="'cps' steps' log-prob: 'gaussian' = log N(x; mu, std^2); 'constant_free' = "
        "-mean_d (x - mu)^2, as the CPS authors' code (log-ratios 2 std^2 times smaller).",
    )
    ratio_norm: bool = Field(
        False,
        description="GRPO-Guard's ratio normalisation: log rho = (log p - log p_old + b) std, b = "
        "mean_d (mu - mu_old)^2 / (2 std^2), so the ratio is centred at 1 with a step-independent spread.",
    )
    step_reweight: bool = Field(
        False, description="GRPO-Guard's gradient reweighting: each step's PPO term times 1 / |dt|."
    )
    trust_region: Literal["clip", "kl_mask"] = Field(
        "clip",
        description="'clip' = PPO's ratio clip; 'kl_mask' = Flow-DPPO: the unclipped -A rho, dropped where "
        "the exact step KL to the rollout policy is >= kl_mask_threshold and the step moves further in the "
        "advantage's direction (rho > 1, A > 0 or rho < 1, A < 0).",
    )
    kl_mask_threshold: float = Field(
        1e-5,
        gt=0,
        description="Flow-DPPO's tau on mean_d (mu - mu_old)^2 / (2 std^2), the per-element step KL "
        "(Flow-DPPO: 1e-5).",
    )
    shared_initial_noise: bool = Field(
        False,
        description="One initial noise per prompt group (DanceGRPO, Flow-GRPO-Fast's branching); "
        "False = one per sample.",
    )
    train_last_step: bool = Field(
        True,
        description="Train the last SDE step (to t = 0); False = leave it out as DanceGRPO and "
        "Flow-GRPO's timestep_fraction 0.99 do.",
    )
    train_fraction: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Train a random subset of int(fraction * n) of each sample's n trainable steps, "
        "redrawn per sample every iteration (DanceGRPO: 0.6); 1 = all.",
    )

    tree_branch_steps: list[int] | None = Field(
        None,
        description="Tree rollout (TreeGRPO / BranchGRPO): the steps (0-based) at which every node branches "
        "into tree_branching children; the group is one tree of tree_branching^len leaves, which must equal "
        "rollout.group_size. null = independent trajectories.",
    )
    tree_branching: int = Field(2, ge=2, description="Tree rollout: children per node at a branching step.")
    tree_advantage: Literal["leaf_mean", "depth_norm"] = Field(
        "leaf_mean",
        description="Tree rollout: an edge's advantage. 'leaf_mean' = the mean advantage of the leaves "
        "below it (TreeGRPO); 'depth_norm' = that mean z-scored among the tree's nodes at the same step "
        "(BranchGRPO).",
    )
    tree_sde: Literal["branch", "all"] = Field(
        "branch",
        description="Tree rollout: which steps are stochastic (and trained): 'branch' = the branching steps "
        "only, ODE elsewhere (TreeGRPO); 'all' = every step, each node drawing its own noise (BranchGRPO).",
    )
    tree_prune_steps: list[int] = Field(
        default_factory=list,
        description="Tree rollout: steps (0-based) whose edges are not trained (BranchGRPO's depth pruning).",
    )

    step_rewards: bool = Field(
        False,
        description="DenseGRPO's dense rewards: each trained step's advantage is the change it made in the "
        "reward of the clean sample predicted from its latent, normalised per prompt group and step; only "
        "the scored steps train.",
    )
    step_reward_steps: list[int] | None = Field(
        None,
        description="step_rewards: the steps (0-based) to score and train; null = every trainable SDE step.",
    )
    step_reward_target: Literal["ode", "x0"] = Field(
        "ode",
        description="step_rewards: how a latent becomes a clean sample to score: 'ode' = the deterministic "
        "Euler completion over the rest of the rollout's grid with the rollout policy (DenseGRPO); 'x0' = "
        "the one-forward prediction z - t v.",
    )

    @model_validator(mode="after")
    def _check_tree(self) -> FlowGRPOConfig:
        if self.step_reward_steps is not None and not self.step_rewards:
            raise ValueError("step_reward_steps needs step_rewards = true")
        if self.step_rewards and self.tree_branch_steps is not None:
            raise ValueError(
                "step_rewards and a tree rollout both set per-step advantages: choose one "
                "(drop step_rewards or tree_branch_steps)"
            )
        if self.tree_branch_steps is None:
            if self.tree_prune_steps:
                raise ValueError("tree_prune_steps needs a tree rollout: set tree_branch_steps or drop it")
            return self
        steps = self.tree_branch_steps
        if not steps or sorted(set(steps)) != steps or steps[0] < 0:
            raise ValueError(
                f"tree_branch_steps must be distinct step indices >= 0 in increasing order, got {steps}"
            )
        if self.window_size is not None or self.train_fraction < 1:
            raise ValueError(
                "a tree rollout chooses its own SDE steps and trains each edge once: "
                "drop window_size and train_fraction (or tree_branch_steps)"
            )
        return self

    @model_validator(mode="after")
    def _check_cps_noise_level(self) -> FlowGRPOConfig:
        if self.sde_kind == "cps" and self.noise_level > 1:
            raise ValueError(
                f"sde_kind = 'cps' needs noise_level in (0, 1] (the angle a pi / 2), got {self.noise_level}"
            )
        if self.ratio_norm and self.sde_kind == "cps" and self.cps_log_prob == "constant_free":
            raise ValueError(
                "ratio_norm needs Gaussian step log-probs: "
                "set cps_log_prob = 'gaussian' or ratio_norm = false"
            )
        return self


class DanceGRPOConfig(FlowGRPOConfig):
    """DanceGRPO (docs/method.md section 6): constant SDE noise 0.3, one initial noise per group, a
    random 60% of the steps trained per sample, no KL."""

    noise_level: float = Field(0.3, gt=0, description="eta, the constant s(t) of the SDE (DanceGRPO: 0.3).")
    diffusion: Literal["flow_grpo", "constant"] = Field("constant", description="s(t) = eta (DanceGRPO).")
    shared_initial_noise: bool = Field(True, description="One initial noise per prompt group (DanceGRPO).")
    train_last_step: bool = Field(False, description="DanceGRPO never trains the last step.")
    train_fraction: float = Field(
        0.6, gt=0, le=1, description="Random share of the other steps trained per sample (DanceGRPO: 0.6)."
    )
    kl_beta: float = Field(0.0, ge=0, description="DanceGRPO trains without a KL term.")


class MixGRPOConfig(FlowGRPOConfig):
    """MixGRPO as its authors ship it (Tencent-Hunyuan/MixGRPO, docs/method.md section 6): Flow-GRPO's SDE
    on a 4-step window that moves one step every 25 iterations, ODE elsewhere, one initial noise per
    group, the last step never trained, no KL."""

    window_size: int | None = Field(
        4, ge=1, description="SDE (and trained) steps of the window (group_size 4)."
    )
    window_shift_every: int = Field(
        25, ge=1, description="Iterations between window moves (iters_per_group 25)."
    )
    window_stride: int = Field(1, ge=1, description="Steps the window moves each time (prog_overlap_step 1).")
    shared_initial_noise: bool = Field(True, description="One initial noise per group (init_same_noise).")
    train_last_step: bool = Field(False, description="The last step is never trained (ignore_last).")
    kl_beta: float = Field(0.0, ge=0, description="MixGRPO ships kl_coeff = 0: no KL term.")


class FlowGRPOFastConfig(FlowGRPOConfig):
    """Flow-GRPO-Fast (docs/method.md section 6): ODE everywhere but a 2-step SDE branch at a random
    step of the first half, trained alone; the group shares its initial noise (and so its ODE prefix)."""

    window_size: int | None = Field(2, ge=1, description="SDE (and trained) steps of the branch.")
    window_placement: Literal["sliding", "random"] = Field(
        "random", description="A random branch step each iteration (Flow-GRPO-Fast)."
    )
    window_range: float = Field(
        0.5, gt=0, le=1, description="The branch lies in the first half of the steps (Flow-GRPO-Fast)."
    )
    shared_initial_noise: bool = Field(
        True, description="One initial noise per group: the group branches off one ODE trajectory."
    )
    clip_range: float = Field(1e-5, gt=0, description="Per-step PPO ratio clip (Flow-GRPO-Fast: 1e-5).")
    kl_beta: float = Field(0.0, ge=0, description="Flow-GRPO-Fast trains without a KL term.")


class FlowGRPOCPSConfig(FlowGRPOFastConfig):
    """Flow-GRPO-Fast with CPS steps (docs/method.md section 6), as yifan123/flow_grpo's newer GenEval
    config: a 3-step CPS branch at a random step of the first half, noise_level 0.8, independent initial
    noise, the authors' constant-free log-prob, clip 1e-5, no KL."""

    sde_kind: Literal["flow_grpo", "cps"] = Field("cps", description="Coefficients-preserving steps (CPS).")
    noise_level: float = Field(0.8, gt=0, description="a in std = t_next sin(a pi / 2) (their config: 0.8).")
    cps_log_prob: Literal["gaussian", "constant_free"] = Field(
        "constant_free", description="-mean_d (x - mu)^2, the log-prob of the CPS authors' code."
    )
    window_size: int | None = Field(3, ge=1, description="CPS (and trained) steps of the branch (3).")
    shared_initial_noise: bool = Field(False, description="Independent initial noise (same_latent = False).")


class GRPOGuardConfig(FlowGRPOConfig):
    """GRPO-Guard (docs/method.md section 6): Flow-GRPO with ratio normalisation and 1 / |dt| gradient
    reweighting (Wang et al., "GRPO-Guard: Mitigating Implicit Over-Optimization in Flow Matching via
    Regulated Clipping")."""

    ratio_norm: bool = Field(True, description="Ratio normalisation (GRPO-Guard's RatioNorm).")
    step_reweight: bool = Field(True, description="Each step's PPO term times 1 / |dt| (GRPO-Guard).")


class FlowDPPOConfig(FlowGRPOConfig):
    """Flow-DPPO (docs/method.md section 6): Flow-GRPO's SDE steps with the KL-masked trust region in
    place of the ratio clip, on a 3-step SDE window in the first half, no KL to the reference (Ping et
    al., "Flow-DPPO: Divergence Proximal Policy Optimization for Flow Matching Models")."""

    trust_region: Literal["clip", "kl_mask"] = Field("kl_mask", description="The KL-masked update.")
    window_size: int | None = Field(3, ge=1, description="SDE (and trained) steps per rollout (3).")
    window_placement: Literal["sliding", "random"] = Field(
        "random", description="A random SDE window each iteration..."
    )
    window_range: float = Field(0.5, gt=0, le=1, description="...in the first half of the steps.")
    kl_beta: float = Field(0.0, ge=0, description="Flow-DPPO trains without a reference KL (beta 0).")


class TreeGRPOConfig(FlowGRPOConfig):
    """TreeGRPO (docs/method.md section 8): the group is one tree branching in two at steps 0, 2 and 4
    (8 leaves), SDE only on the branching steps, ODE elsewhere, each edge's advantage the mean of its
    leaves' (Ding & Ye, "TreeGRPO: Tree-Advantage GRPO for Online RL Post-Training of Diffusion Models")."""

    tree_branch_steps: list[int] | None = Field(
        [0, 2, 4], description="Branching steps: 2^3 = 8 leaves, rollout.group_size 8 (ours)."
    )
    tree_advantage: Literal["leaf_mean", "depth_norm"] = Field(
        "leaf_mean", description="An edge's advantage is the mean of its leaves' (TreeGRPO)."
    )
    tree_sde: Literal["branch", "all"] = Field(
        "branch", description="Stochastic transitions only where the tree branches (TreeGRPO)."
    )
    kl_beta: float = Field(0.0, ge=0, description="No KL to the reference (ours).")


class BranchGRPOConfig(FlowGRPOConfig):
    """BranchGRPO (docs/method.md section 8): DanceGRPO's constant-noise SDE on every step, the group one
    tree branching in two at steps 0, 2 and 4, node advantages z-scored per depth ("BranchGRPO: Stable and
    Efficient GRPO with Structured Branching in Diffusion Models")."""

    tree_branch_steps: list[int] | None = Field(
        [0, 2, 4], description="Split points: 2^3 = 8 leaves, rollout.group_size 8 (ours)."
    )
    tree_advantage: Literal["leaf_mean", "depth_norm"] = Field(
        "depth_norm", description="Node rewards z-scored among the nodes of each depth (BranchGRPO)."
    )
    tree_sde: Literal["branch", "all"] = Field("all", description="SDE on every step (BranchGRPO).")
    noise_level: float = Field(0.3, gt=0, description="eta, the constant s(t) of the SDE (DanceGRPO's 0.3).")
    diffusion: Literal["flow_grpo", "constant"] = Field(
        "constant", description="s(t) = eta: BranchGRPO's step is DanceGRPO's flux_step."
    )
    kl_beta: float = Field(0.0, ge=0, description="BranchGRPO trains without a KL term.")


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

    def kl_measures(self) -> str:
        """``kl``: the squared velocity distance to the reference."""
        return kl_title(self.kl_beta, f"velocity distance to {REFERENCE}")


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
    weighting: Literal["uniform", "ghuber"] = Field(
        "uniform",
        description="Per-pair loss: 'uniform' = the plain error l; 'ghuber' = "
        "t ((l + 1e-10)^p - 1e-10^p) / p (AWM's generalised Huber, p = ghuber_power).",
    )
    ghuber_power: float = Field(
        0.25, gt=0, le=1, description="p of the generalised Huber weighting (AWM: 0.25)."
    )
    ema_beta: float = Field(
        0.0, ge=0, description="Weight of mean |v_theta - v_ema|^2 toward an EMA copy of the policy (AWM: 1)."
    )
    ema_rate: float = Field(1e-3, ge=0, description="EMA decay = min(ema_max, ema_rate * optimiser steps)...")
    ema_max: float = Field(0.3, ge=0, lt=1, description="...capped here (AWM: min(0.3, 0.001 step)).")
    timestep_grid: int | None = Field(
        None,
        ge=1,
        description="Draw t from this many points of diffusers' flow-matching grid (AWM: 14), one per "
        "stratum of grid indices (always stratified, no t_min/t_max clamp); null = continuous draws.",
    )
    timestep_fraction: float = Field(
        1.0, gt=0, le=1, description="Only the first int(fraction * grid) grid points (AWM: 0.9)."
    )
    grid_skip_first: bool = Field(
        False, description="Leave grid point 0 (t = 1) out, as AWM's 'discrete_wo_init' does."
    )
    adv_clip: float | None = Field(
        None, gt=0, description="Advantages are clamped to [-adv_clip, adv_clip] (AWM: 5); null = not."
    )
    adv_scale: float = Field(1.0, gt=0, description="...then multiplied by this (AWM: 1/5).")

    def kl_measures(self) -> str:
        """``kl``: the squared velocity distance to the reference (the EMA penalty is ``ema_penalty``)."""
        return kl_title(self.kl_beta, f"velocity distance to {REFERENCE}")


class AWMAuthorsConfig(AWMConfig):
    """AWM as its authors ship it (scxue/advantage_weighted_matching, docs/method.md section 6)."""

    n_mc: int = Field(6, ge=1, description="Timesteps per sample (AWM: train_timesteps = 6).")
    pair_scope: Literal["group", "batch", "sample"] = Field(
        "sample", description="AWM shares timesteps only inside a shuffled micro-batch: 'sample' here."
    )
    weighting: Literal["uniform", "ghuber"] = Field("ghuber", description="Generalised Huber weighting.")
    ema_beta: float = Field(1.0, ge=0, description="Weight of the EMA penalty (AWM: 1).")
    timestep_grid: int | None = Field(14, ge=1, description="AWM's 14-step sampling grid.")
    timestep_fraction: float = Field(0.9, gt=0, le=1, description="Its first 90%: grid points 0..11.")
    adv_clip: float | None = Field(5.0, gt=0, description="Advantages clamped to +-5 (AWM).")
    adv_scale: float = Field(0.2, gt=0, description="...and scaled by 1/5 (AWM: advantage_max 1 / 5).")
    kl_beta: float = Field(
        1e-3, ge=0, description="Velocity KL to the reference (AWM: 1e-4 PickScore, 1e-3 GenEval, 3e-3 OCR)."
    )


class OnlineDPOConfig(PluginConfig):
    """Online Diffusion-DPO (docs/method.md section 6): each group's best and worst sample form one
    preference pair, scored by the ELBO form of Diffusion-DPO against the frozen reference."""

    beta: float = Field(
        5000.0,
        gt=0,
        description="Diffusion-DPO's beta T (the ELBO's step count folded in, as its code does; "
        "paper: 5000 for SD 1.5, 2500 for SDXL).",
    )
    n_mc: int = Field(
        1, ge=1, description="(t, eps) draws per sample, shared by the pair (Diffusion-DPO: 1 per step)."
    )
    stratified: bool = Field(True, description="One timestep in each of n_mc strata; False = i.i.d.")
    min_reward_gap: float = Field(
        0.0,
        ge=0,
        description="A group whose best and worst rewards differ by no more than this makes no pair.",
    )
    t_min: float = Field(1e-3, ge=0, lt=1, description="Lower clamp of drawn timesteps.")
    t_max: float = Field(1.0 - 1e-3, gt=0, le=1, description="Upper clamp of drawn timesteps.")

    def kl_measures(self) -> str:
        """``kl``: none; the reference enters the DPO loss itself."""
        return "no KL penalty (the reference is inside the DPO loss): kl is logged as 0"


class DGPOConfig(PluginConfig):
    """DGPO (docs/method.md section 6): a DPO-style preference between a group's advantage-weighted
    samples, on deterministic (any) rollouts; Luo et al., "Reinforcing Diffusion Models by Direct Group
    Preference Optimization"."""

    beta: float = Field(100.0, gt=0, description="beta of the group preference (DGPO's beta_dpo: 100).")
    n_mc: int = Field(
        4, ge=1, description="(t, eps) draws per sample, shared by its group (DGPO: 4 train timesteps)."
    )
    stratified: bool = Field(True, description="One timestep in each of n_mc strata; False = i.i.d.")
    t_min: float = Field(
        1e-3, ge=0, lt=1, description="Lower clamp of drawn timesteps (DGPO truncates at about 0.3 shifted)."
    )
    t_max: float = Field(1.0 - 1e-3, gt=0, le=1, description="Upper clamp of drawn timesteps.")

    def kl_measures(self) -> str:
        """``kl``: none; the reference enters the preference itself."""
        return "no KL penalty (the reference is inside the DGPO preference): kl is logged as 0"
