"""The method matrix's protocol, fixed before any run: worlds, methods, ablations and the selection rule.

Kept apart from the code that runs and summarises the matrix so that what a benchmark *compares* can be
read (and reviewed) in one place, and so that the runner and the tests share one definition.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORLDS = {
    "shapes": ROOT / "benchmarks" / "worlds" / "shapes.toml",  # the first protocol's (committed cells)
    "shapes_v2": ROOT / "benchmarks" / "worlds" / "shapes_v2.toml",  # issue 37's: validation split
    "toy": ROOT / "recipes" / "toy.toml",
    # issue 40's worlds, fixed before any of their cells: the same protocol as shapes_v2
    "video": ROOT / "benchmarks" / "worlds" / "moving_shapes.toml",
    "audio": ROOT / "benchmarks" / "worlds" / "tones.toml",
}
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
WORLD_SETTINGS["shapes_v2"] = WORLD_SETTINGS["shapes"]
# the video and audio worlds: the image world's batch (4 prompts of 8), rate and schedule; their world
# files set the evaluation (prompts and samples per prompt)
WORLD_SETTINGS["video"] = WORLD_SETTINGS["audio"] = [
    s for s in WORLD_SETTINGS["shapes"] if not s.startswith("eval.")
]
WORLD_DETAIL = {
    "shapes": "detail/shapes/correct",
    "shapes_v2": "detail/shapes/correct",
    "toy": None,
    "video": "detail/moving_shapes/correct",
    "audio": "detail/tones/correct",
}
# the target every method races to, fixed before the runs: the base model's value plus this much (on
# the prompts the seeds phase evaluates: in shapes_v2 the reported half)
WORLD_TARGET = {
    "shapes": ("detail/shapes/correct", 0.10),
    "shapes_v2": ("detail/shapes/correct", 0.10),
    "toy": ("reward", 0.2),
    "video": ("detail/moving_shapes/correct", 0.10),
    "audio": ("detail/tones/correct", 0.10),
}
# per world: (validation, reported) prompt files, relative to the world file. The sweep's cells evaluate
# the validation file, so the rate rule never reads the prompts that are reported; the seeds phase's
# cells (and their extensions) evaluate the reported file, on which the target is set. Written by
# benchmarks/prompt_split.py; a world without an entry evaluates its own eval_file in both phases.
WORLD_EVAL_FILES: dict[str, tuple[str, str]] = {
    "shapes_v2": (
        "../../recipes/prompts/shapes_validation.txt",
        "../../recipes/prompts/shapes_reported.txt",
    ),
    "video": (
        "../../recipes/prompts/moving_shapes_validation.txt",
        "../../recipes/prompts/moving_shapes_reported.txt",
    ),
    "audio": ("../../recipes/prompts/tones_validation.txt", "../../recipes/prompts/tones_reported.txt"),
}

# name -> recipe overrides (surrogate options are replaced whole, so the recipe's own never leak in).
# The first protocol's methods, frozen: the committed cells of benchmarks/results/shapes ran these
# (its mixgrpo is Flow-GRPO's surrogate with a window, keeping Flow-GRPO's default KL with |dt|).
METHODS_FIRST: dict[str, list[str]] = {
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
    "diffusion_nft": ["surrogate.name='diffusion_nft'", "surrogate.options={n_timesteps=4}"],
    "awm": ["surrogate.name='awm'", "surrogate.options={n_mc=4}"],
    "awm_authors": ["surrogate.name='awm_authors'", "surrogate.options={}"],
}
# The current protocol's methods (shapes_v2, toy, --recipe): every baseline as its authors ship it
# (tests/test_baselines_as_shipped.py pins the presets; docs/benchmarks.md says where we still differ),
# and the 2026 methods of docs/method.md section 6 at their presets, which are their authors' settings.
METHODS: dict[str, list[str]] = {
    "vgrpo": METHODS_FIRST["vgrpo"],
    "elbo_naive": METHODS_FIRST["elbo_naive"],
    "flow_grpo": METHODS_FIRST["flow_grpo"],
    "mixgrpo": ["surrogate.name='mixgrpo'", "surrogate.options={}"],  # no KL, shared noise, ignore_last
    "dance_grpo": METHODS_FIRST["dance_grpo"],
    "flow_grpo_fast": METHODS_FIRST["flow_grpo_fast"],
    "diffusion_nft": METHODS_FIRST["diffusion_nft"],
    "awm": METHODS_FIRST["awm"],
    "awm_authors": METHODS_FIRST["awm_authors"],
    "flow_grpo_cps": ["surrogate.name='flow_grpo_cps'", "surrogate.options={}"],
    # GRPO-Guard changes Flow-GRPO's loss: here on the flow_grpo row's settings, Flow-GRPO as shipped
    # (its KL form without |dt|, the last step untrained), so the two rows differ only by the guard
    "grpo_guard": [
        "surrogate.name='grpo_guard'",
        "surrogate.options={kl_include_dt=false, train_last_step=false}",
    ],
    "flow_dppo": ["surrogate.name='flow_dppo'", "surrogate.options={}"],
    "diffusion_dpo": ["surrogate.name='diffusion_dpo'", "surrogate.options={}"],
    "dgpo": ["surrogate.name='dgpo'", "surrogate.options={}"],
    # tree rollouts (docs/method.md section 8): the presets' 8-leaf trees are the worlds' groups of 8
    "tree_grpo": ["surrogate.name='tree_grpo'", "surrogate.options={}"],
    "branch_grpo": ["surrogate.name='branch_grpo'", "surrogate.options={}"],
    # dense step rewards (docs/method.md section 9) on Flow-GRPO as shipped: each step's ODE completion scored
    "dense_grpo": [
        "surrogate.name='flow_grpo'",
        "surrogate.options={kl_include_dt=false, train_last_step=false, step_rewards=true}",
    ],
}
WORLD_METHODS: dict[str, dict[str, list[str]]] = {
    "shapes": METHODS_FIRST,
    "shapes_v2": METHODS,
    "toy": METHODS,
}
# issue 40's matrix in the other modalities: V-GRPO and the four baselines the issue names, as shipped
MEDIA_METHODS = ("vgrpo", "flow_grpo", "mixgrpo", "diffusion_nft", "awm")
WORLD_METHODS["video"] = WORLD_METHODS["audio"] = {m: METHODS[m] for m in MEDIA_METHODS}
# per world and method: the rates its sweep tries (``--lrs`` replaces them for every method). Fixed
# before any shapes_v2 cell ran, from the first protocol's sweep (docs/benchmarks.md): a method whose
# pick was the lowest swept rate (MixGRPO, DanceGRPO, Flow-GRPO-Fast) gets a grid a step lower, one whose
# pick was inside the grid keeps 3e-4..3e-3, and a method never run here spans 1e-4..3e-3 (its
# neighbours': Flow-GRPO-Fast's for CPS, Flow-GRPO's for GRPO-Guard and Flow-DPPO, the ELBO methods'
# for the DPO family).
_LOW, _MID, _WIDE = [1e-4, 3e-4, 1e-3], [3e-4, 1e-3, 3e-3], [1e-4, 3e-4, 1e-3, 3e-3]
RATE_GRIDS: dict[str, dict[str, list[float]]] = {
    "shapes_v2": {
        "vgrpo": _MID,
        "elbo_naive": _MID,
        "flow_grpo": _MID,
        "mixgrpo": _LOW,
        "dance_grpo": _LOW,
        "flow_grpo_fast": _LOW,
        "diffusion_nft": _MID,
        "awm": _MID,
        "awm_authors": _MID,
        "flow_grpo_cps": _WIDE,
        "grpo_guard": _WIDE,
        "flow_dppo": _WIDE,
        "diffusion_dpo": _WIDE,
        "dgpo": _WIDE,
        "tree_grpo": _MID,  # Flow-GRPO's neighbours: its grid
        "branch_grpo": _MID,
        "dense_grpo": _MID,
    },
}
# the video and audio worlds: no earlier sweep to start from, so every method spans 1e-4..3e-3
RATE_GRIDS["video"] = RATE_GRIDS["audio"] = {m: _WIDE for m in MEDIA_METHODS}
# a baseline's seed that has not held the target by the seeds phase's budget runs on (``--extend``)
# to this many times that budget, so that its cost to the target is measured rather than bounded
EXTEND_FACTOR = 3
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
