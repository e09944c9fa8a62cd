"""The method matrix's protocol, fixed before any run: worlds, methods, ablations and the selection rule.

Kept apart from the code that runs and summarises the matrix so that what a benchmark *compares* can be
read (and reviewed) in one place, and so that the runner and the tests share one definition.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORLDS = {"shapes": ROOT / "benchmarks" / "worlds" / "shapes.toml", "toy": ROOT / "recipes" / "toy.toml"}
# per world: the batch every cell shares (the quickstart's own KL, schedule, two steps per rollout and
# weight average are left out: every method trains with the same plain AdamW at its own rate)
WORLD_SETTINGS: dict[str, list[str]] = {
    "shapes": [
        "rollout.prompts_per_iteration=4",
        "train.lr=2e-3",
        "train.lr_schedule='constant'",
        "train.gradient_steps_per_iteration=1",  # fully on-policy
        "train.ema_decay=0",  # evaluated on the raw weights
        "eval.samples_per_prompt=2",
    ],
    "toy": [],
}
WORLD_DETAIL = {"shapes": "detail/shapes/correct", "toy": None}
# the target every method races to, fixed before the runs: the base model's value plus this much
WORLD_TARGET = {"shapes": ("detail/shapes/correct", 0.10), "toy": ("reward", 0.2)}

# name -> recipe overrides (surrogate options are replaced whole, so the recipe's own never leak in)
METHODS: dict[str, list[str]] = {
    "vgrpo": ["surrogate.name='vgrpo'", "surrogate.options={n_mc=4}"],
    "elbo_naive": ["surrogate.name='elbo_naive'", "surrogate.options={n_mc=4}"],
    # Flow-GRPO as shipped: its KL form (no |dt|) and the last step left untrained (timestep_fraction 0.99)
    "flow_grpo": [
        "surrogate.name='flow_grpo'",
        "surrogate.options={kl_include_dt=false, train_last_step=false}",
    ],
    "mixgrpo": ["surrogate.name='flow_grpo'", "surrogate.options={window_size=4, window_shift_every=25}"],
    "dance_grpo": ["surrogate.name='dance_grpo'", "surrogate.options={}"],
    "flow_grpo_fast": ["surrogate.name='flow_grpo_fast'", "surrogate.options={}"],
    # tree rollouts (docs/method.md section 8): the presets' 8-leaf trees are the worlds' groups of 8
    "tree_grpo": ["surrogate.name='tree_grpo'", "surrogate.options={}"],
    "branch_grpo": ["surrogate.name='branch_grpo'", "surrogate.options={}"],
    # dense step rewards (docs/method.md section 9) on Flow-GRPO as shipped: each step's ODE completion scored
    "dense_grpo": [
        "surrogate.name='flow_grpo'",
        "surrogate.options={kl_include_dt=false, train_last_step=false, step_rewards=true}",
    ],
    "diffusion_nft": ["surrogate.name='diffusion_nft'", "surrogate.options={n_timesteps=4}"],
    "awm": ["surrogate.name='awm'", "surrogate.options={n_mc=4}"],
    "awm_authors": ["surrogate.name='awm_authors'", "surrogate.options={}"],
}
ABLATIONS: dict[str, list[str]] = {
    "vgrpo (all)": METHODS["vgrpo"],
    "- shared pairs": ["surrogate.name='vgrpo'", "surrogate.options={n_mc=4, pair_scope='sample'}"],
    "- stratified t": ["surrogate.name='vgrpo'", "surrogate.options={n_mc=4, stratified=false}"],
    "- adaptive weight": ["surrogate.name='vgrpo'", "surrogate.options={n_mc=4, adaptive_weighting=false}"],
    "N_MC 2": ["surrogate.name='vgrpo'", "surrogate.options={n_mc=2}"],
    "N_MC 8": ["surrogate.name='vgrpo'", "surrogate.options={n_mc=8}"],
}
# the label of the ablation that is V-GRPO itself: its cells are the methods block's vgrpo cells
FULL_ABLATION = "vgrpo (all)"
SELECTION_RULE = "best mean held-out reward over the last two evaluations, mean over sweep seeds"
