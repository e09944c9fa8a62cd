"""V-GRPO against its baselines and its own ablations, side by side, on one adapter, reward and budget.

    python benchmarks/compare.py --world shapes  # both tables: 11 runs x 50 iterations, 22 min
    python benchmarks/compare.py --world shapes --iterations 2 --methods vgrpo awm --no-ablation  # smoke
    python benchmarks/compare.py --recipe recipes/flux_pickscore.toml --iterations 300   # real scale, GPU

Every row is a real run of its own surrogate through the same loop (``vgrpo_platform.train``): same
recipe, prompts, seeds, rollout batch and iterations; only ``[surrogate]`` (and, for the MDP
baselines, the Euler SDE grid they need) differ. Printed per row: held-out reward reached, gradient
steps / wall-clock / NFE to reach the target reward, the time split rollout / reward / train, and the
surrogate diagnostics (``diag/*``, ELBO surrogates only). Curves go to ``OUT/curves.png`` and every
number to ``OUT/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORLDS = {"shapes": ROOT / "recipes" / "quickstart.toml", "toy": ROOT / "recipes" / "toy.toml"}
# per world: the batch and rate every row shares (the default budget runs both tables in 22 min on
# 2 CPU cores, docs/benchmarks.md), and the
# detail metric shown beside the reward (the quickstart's own KL, schedule, two steps per rollout and
# weight average are left out:
# every method trains with the same plain AdamW rate)
WORLD_SETTINGS: dict[str, list[str]] = {
    "shapes": [
        "rollout.prompts_per_iteration=4",
        "train.lr=2e-3",
        "train.lr_schedule='constant'",
        "train.gradient_steps_per_iteration=1",  # the tables were measured fully on-policy,
        "train.ema_decay=0",  # on the raw weights (docs/benchmarks.md)
        "eval.samples_per_prompt=2",
    ],
    "toy": [],
}
WORLD_DETAIL = {"shapes": "detail/shapes/correct", "toy": None}

# name -> recipe overrides (surrogate options are replaced whole, so the recipe's own never leak in)
METHODS: dict[str, list[str]] = {
    "vgrpo": ["surrogate.name='vgrpo'", "surrogate.options={n_mc=4}"],
    "elbo_naive": ["surrogate.name='elbo_naive'", "surrogate.options={n_mc=4}"],
    "flow_grpo": ["surrogate.name='flow_grpo'", "surrogate.options={}"],
    "mixgrpo": ["surrogate.name='flow_grpo'", "surrogate.options={window_size=4, window_shift_every=25}"],
    "diffusion_nft": ["surrogate.name='diffusion_nft'", "surrogate.options={n_timesteps=4}"],
    "awm": ["surrogate.name='awm'", "surrogate.options={n_mc=4}"],
}
ABLATIONS: dict[str, list[str]] = {
    "vgrpo (all)": METHODS["vgrpo"],
    "- shared pairs": ["surrogate.name='vgrpo'", "surrogate.options={n_mc=4, pair_scope='sample'}"],
    "- stratified t": ["surrogate.name='vgrpo'", "surrogate.options={n_mc=4, stratified=false}"],
    "- adaptive weight": ["surrogate.name='vgrpo'", "surrogate.options={n_mc=4, adaptive_weighting=false}"],
    "N_MC 2": ["surrogate.name='vgrpo'", "surrogate.options={n_mc=2}"],
    "N_MC 8": ["surrogate.name='vgrpo'", "surrogate.options={n_mc=8}"],
}


def run_one(recipe: Path, label: str, overrides: list[str], common: list[str], out: Path) -> dict:
    """Train one row; returns its metrics records (train and eval) and wall time."""
    from vgrpo_platform.metrics import read_metrics
    from vgrpo_platform.recipe import resolve_recipe
    from vgrpo_platform.train import Trainer

    safe = "".join(c if c.isalnum() else "_" for c in label).strip("_")
    base = [f"run.output_dir={out.as_posix()!r}", f"run.name={safe!r}", "log.progress='plain'"]
    resolved = resolve_recipe(recipe, [*base, *common, *overrides])
    start = time.perf_counter()
    run_dir = Trainer(resolved).run()
    records = read_metrics(run_dir / "metrics.jsonl")
    return {
        "label": label,
        "records": records,
        "wall": time.perf_counter() - start,
        "recipe": resolved.recipe,
    }


def nfe_per_iteration(row: dict) -> float:
    """Network evaluations per iteration: rollout steps for every sample plus the surrogate's passes."""
    recipe = row["recipe"]
    b = recipe.rollout.group_size * recipe.rollout.prompts_per_iteration
    steps, grad_steps = recipe.rollout.steps, recipe.train.gradient_steps_per_iteration
    name, opts = recipe.surrogate.name, recipe.surrogate.options
    if name in ("vgrpo", "elbo_naive", "awm"):
        train = opts.get("n_mc", 4) * (1 + grad_steps)  # prepare (old surrogate) + each gradient step
    elif name == "diffusion_nft":
        train = opts.get("n_timesteps", 4) * 2 * grad_steps  # old (EMA) and current policy
    else:  # flow_grpo: every trained SDE step, each gradient step (+ the reference with a KL)
        trained = min(opts.get("window_size") or steps, steps)
        train = trained * grad_steps + (trained if opts.get("kl_beta", 0.04) > 0 else 0)
    return float(b * (steps + train))


def summarise(row: dict, target: float, detail: str | None = None) -> dict:
    evals = [r for r in row["records"] if r["kind"] == "eval"]
    trains = [r for r in row["records"] if r["kind"] == "train"]
    reached = next((r for r in evals if r["reward"] >= target), None)
    grad_steps = sum(r.get("gradient_steps", 0) for r in trains)
    per_iter_steps = grad_steps / max(len(trains), 1)
    summary = {
        "label": row["label"],
        "reward_start": evals[0]["reward"] if evals else math.nan,
        "reward_end": evals[-1]["reward"] if evals else math.nan,
        "iter_to_target": reached["iteration"] if reached else None,
        "steps_to_target": reached["iteration"] * per_iter_steps if reached else None,
        "wall_to_target": reached["wall_seconds"] if reached else None,  # diagnostics left out by the loop
        "nfe_to_target": reached["iteration"] * nfe_per_iteration(row) if reached else None,
        "wall": row["wall"],
        "detail_start": evals[0].get(detail) if evals and detail else None,
        "detail_end": evals[-1].get(detail) if evals and detail else None,
    }
    for key in ("time_rollout", "time_reward", "time_train"):
        summary[key] = sum(r.get(key, 0.0) for r in trains)
    for key in ("diag/cv", "diag/within_group_cv", "diag/grad_corr"):
        vals = [r[key] for r in trains if key in r and math.isfinite(r[key])]
        summary[key] = sum(vals) / len(vals) if vals else None
    summary["curve"] = [(r["iteration"], r["reward"]) for r in evals]
    return summary


def fmt(value: object, spec: str = ".3f") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else format(value, spec)
    return str(value)


def print_table(title: str, rows: list[dict], target: float, detail: str | None = None) -> None:
    short = detail.rsplit("/", 1)[-1][:7] if detail else ""
    extra = f" {short + ' 0':>9} {short + ' end':>11}" if detail else ""
    head = (
        f"{'method':<18} {'reward 0':>9} {'reward end':>10}{extra} {'steps->' + fmt(target, '.2f'):>12} "
        f"{'wall->tgt s':>11} {'NFE->tgt':>10} {'rollout s':>9} {'reward s':>8} {'train s':>8} "
        f"{'CV':>6} {'grpCV':>6} {'gcorr':>6}"
    )
    print(f"\n{title}\n{head}\n{'-' * len(head)}")
    for s in rows:
        cells = f" {fmt(s['detail_start']):>9} {fmt(s['detail_end']):>11}" if detail else ""
        print(
            f"{s['label']:<18} {fmt(s['reward_start']):>9} {fmt(s['reward_end']):>10}{cells} "
            f"{fmt(s['steps_to_target'], '.0f'):>12} {fmt(s['wall_to_target'], '.0f'):>11} "
            f"{fmt(s['nfe_to_target'], '.0f'):>10} {fmt(s['time_rollout'], '.0f'):>9} "
            f"{fmt(s['time_reward'], '.0f'):>8} {fmt(s['time_train'], '.0f'):>8} {fmt(s['diag/cv']):>6} "
            f"{fmt(s['diag/within_group_cv']):>6} {fmt(s['diag/grad_corr'], '.2f'):>6}"
        )


def plot(groups: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4), squeeze=False)
    for ax, (title, rows) in zip(axes[0], groups.items(), strict=True):
        for s in rows:
            if s["curve"]:
                xs, ys = zip(*s["curve"], strict=True)
                ax.plot(xs, ys, marker="o", label=s["label"])
        ax.set(title=title, xlabel="iteration", ylabel="held-out reward")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--world", choices=sorted(WORLDS), default="shapes")
    parser.add_argument("--recipe", type=Path, help="any recipe instead of a world's (real scale)")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-prompts", type=int, default=32)
    parser.add_argument("--target", type=float, help="reward to reach; default: V-GRPO's end reward")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--no-ablation", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "benchmark")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="extra recipe override")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    recipe = args.recipe or WORLDS[args.world]
    out = args.out / time.strftime("%Y%m%d-%H%M%S")
    world = [] if args.recipe else WORLD_SETTINGS[args.world]
    detail = None if args.recipe else WORLD_DETAIL[args.world]
    common = [
        *world,
        f"train.iterations={args.iterations}",
        f"eval.every={args.eval_every}",
        f"eval.max_prompts={args.eval_prompts}",
        "log.diagnostics_every=5",
        "log.checkpoint_every=0",
        "log.save_grids=false",
        *args.overrides,
    ]
    rows = {m: run_one(recipe, m, METHODS[m], common, out) for m in args.methods}
    ablation = {}
    if not args.no_ablation:
        for label, overrides in ABLATIONS.items():
            same = label == "vgrpo (all)" and "vgrpo" in rows
            ablation[label] = rows["vgrpo"] if same else run_one(recipe, label, overrides, common, out)
    reference = rows.get("vgrpo") or next(iter(rows.values()))
    target = args.target
    if target is None:
        evals = [r for r in reference["records"] if r["kind"] == "eval"]
        target = evals[-1]["reward"] if evals else math.inf
    main_rows = [summarise(r, target, detail) for r in rows.values()]
    abl_rows = [summarise({**r, "label": label}, target, detail) for label, r in ablation.items()]
    print_table(
        f"Methods ({recipe.name}, {args.iterations} iterations, target reward {target:.3f})",
        main_rows,
        target,
        detail,
    )
    if abl_rows:
        print_table("V-GRPO ablations", abl_rows, target, detail)
    out.mkdir(parents=True, exist_ok=True)
    plot({"methods": main_rows, **({"ablations": abl_rows} if abl_rows else {})}, out / "curves.png")
    (out / "summary.json").write_text(
        json.dumps({"target": target, "methods": main_rows, "ablations": abl_rows}, indent=1)
    )
    print(f"\ncurves: {out / 'curves.png'}\nsummary: {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
