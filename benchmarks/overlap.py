"""Overlapped scoring (``[scoring]``) against scoring after the rollout, in one run, side by side.

The quickstart recipe with an artificially slow reward (the shapes judge sleeping
``--latency`` seconds per image, standing in for a reward model) is trained for a few iterations
under each ``[scoring]`` setting; the rollout is cut into chunks of one prompt group
(``train.micro_batch_size = group_size``) for every setting alike, so only where the scoring runs
differs. Printed: the mean iteration time after the first (which pays for the worker's start),
the reward's exposed wait, the reward's own seconds, and each setting's ratio to the inline
baseline; and whether every setting trained exactly the same run (it must).

    python -m benchmarks.overlap                     # 6 iterations, 0.06 s per image
    python -m benchmarks.overlap --latency 0.06 --iterations 8 --out benchmarks/results/overlap.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.training.loop import Trainer
from vgrpo_platform.training.observe.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "quickstart.toml"
SETTINGS = {
    "inline": [],
    "inline+overlap": ["scoring.overlap=true"],
    "process": ["scoring.isolation='process'"],
    "process+overlap": ["scoring.isolation='process'", "scoring.overlap=true"],
}
TIMING = ("time_iteration", "time_rollout", "time_reward", "time_scoring", "time_train", "wall_seconds")


def run_setting(name: str, extra: list[str], args: argparse.Namespace, out_dir: Path) -> list[dict]:
    overrides = [
        f"run.output_dir={out_dir.as_posix()!r}",
        f"run.name={name.replace('+', '_')!r}",
        f"run.seed={args.seed}",
        f"train.iterations={args.iterations}",
        "train.micro_batch_size=8",  # one prompt group per rollout chunk, for every setting
        "eval.every=0",
        "eval.max_prompts=8",
        "eval.samples_per_prompt=2",
        "log.checkpoint_every=0",
        "log.diagnostics_every=0",
        "log.save_grids=false",
        "log.progress='none'",
        f"rewards.0.options.latency_per_sample_s={args.latency}",
        *extra,
    ]
    run_dir = Trainer(resolve_recipe(RECIPE, overrides)).run()
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]


def summarise(records: list[dict]) -> dict[str, float]:
    timed = records[1:]  # the first iteration pays for the worker's start and the first compile of kernels
    row = {key: statistics.fmean(r[key] for r in timed) for key in TIMING if key != "wall_seconds"}
    row["time_iteration_min"] = min(r["time_iteration"] for r in timed)
    row["time_iteration_max"] = max(r["time_iteration"] for r in timed)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--latency", type=float, default=0.06, help="seconds the reward sleeps per image")
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--out", type=Path, help="write the table as JSON here")
    args = parser.parse_args()
    results, runs = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.settings:
            runs[name] = run_setting(name, SETTINGS[name], args, Path(tmp))
            results[name] = summarise(runs[name])
    base = results[args.settings[0]]["time_iteration"]
    for row in results.values():  # what overlap can shorten: the rollout and the wait for its scores
        row["rollout_and_reward"] = row["time_rollout"] + row["time_reward"]
    base_rr = results[args.settings[0]]["rollout_and_reward"]
    learned = {
        name: [
            {k: v for k, v in r.items() if not k.startswith("time_") and k != "wall_seconds"} for r in records
        ]
        for name, records in runs.items()
    }
    identical = all(v == learned[args.settings[0]] for v in learned.values())
    print(
        f"quickstart, {args.iterations} iterations (mean of 2..{args.iterations}), reward sleeps "
        f"{args.latency} s per image, 64 images an iteration in chunks of 8"
    )
    print(
        f"{'setting':18s} {'iteration s':>11s} {'(min-max)':>11s} {'rollout s':>9s} {'reward wait s':>13s} "
        f"{'reward busy s':>13s} {'train s':>7s} {'iter ratio':>10s} {'rollout+reward ratio':>20s}"
    )
    for name, row in results.items():
        print(
            f"{name:18s} {row['time_iteration']:11.2f} "
            f"{row['time_iteration_min']:5.2f}-{row['time_iteration_max']:5.2f} "
            f"{row['time_rollout']:9.2f} {row['time_reward']:13.2f} "
            f"{row['time_scoring']:13.2f} {row['time_train']:7.2f} {row['time_iteration'] / base:10.2f} "
            f"{row['rollout_and_reward'] / base_rr:20.2f}"
        )
    print(f"every setting trained the same run (rewards, losses, weights' metrics): {identical}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "results": results,
                    "identical": identical,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
