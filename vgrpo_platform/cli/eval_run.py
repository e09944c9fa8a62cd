"""``vgrpo eval``: the base model or a trained run under the recipe's pinned ``[eval]`` protocol.

Independent of training, but the same code path as its evaluations (``evaluation.evaluate``) and
the same weights as ``vgrpo sample`` (``cli.sample.trained_session``): a run's last checkpoint
evaluated here gives the numbers its last evaluation logged, and two calls give the same digits.
Writes ``eval.json`` (protocol, results with standard errors, per-prompt means) and ``grid.png``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from vgrpo_platform.protocols import BuildContext
from vgrpo_platform.training.iteration.reward_workers import InlineScorer
from vgrpo_platform.training.observe.evaluation import Evaluation, Protocol, evaluate
from vgrpo_platform.training.recovery.checkpoint import Checkpoint
from vgrpo_platform.training.session import resolve_device, run_dir_of

RESULTS = "eval.json"
GRID = "grid.png"  # its layout goes to grid.json (grids.save_grid), beside eval.json
GUIDANCE_OPTIONS = ("cfg_scale", "guidance", "guidance_scale")  # the adapters' guidance knobs


@dataclass
class EvalOutput:
    out_dir: Path
    evaluation: Evaluation
    checkpoint: Checkpoint | None
    report: dict[str, Any]  # what eval.json holds
    main_process: bool = True  # under `accelerate launch` only the main process writes and prints


def default_out_dir(resolved: Any, checkpoint: Checkpoint | None) -> Path:
    """``RUN/eval/iter_NNNNNN`` for a checkpoint (beside the run's checkpoints), else ``RUN/eval/base``."""
    if checkpoint is not None:
        return checkpoint.path.parent.parent / "eval" / checkpoint.path.name
    return run_dir_of(resolved.recipe) / "eval" / "base"


def evaluate_recipe(
    resolved: Any, *, checkpoint: str | Path | None = None, out_dir: str | Path | None = None
) -> EvalOutput:
    """Evaluate ``resolved`` (a ``recipe.ResolvedRecipe``) from the base model or ``checkpoint``."""
    from accelerate import Accelerator

    from vgrpo_platform.cli.sample import trained_session
    from vgrpo_platform.parallel.data_parallel import process_group_kwargs

    recipe = resolved.recipe
    device = resolve_device(recipe.run.device)
    accelerator = Accelerator(  # under `accelerate launch` ranks share the prompts
        cpu=device.type == "cpu", kwargs_handlers=process_group_kwargs(recipe.train.collective_timeout_s)
    )
    context = BuildContext(
        device=accelerator.device, seed=recipe.run.seed, run_dir=None, recipe_dir=resolved.recipe_dir
    )
    session, ckpt = trained_session(resolved, context, checkpoint)
    protocol = Protocol.of(resolved)
    scorer = InlineScorer(session.rewards, session.eval_rewards)
    result = evaluate(session, protocol, accelerator=accelerator, scorer=scorer, keep_samples=True)
    out = Path(out_dir) if out_dir is not None else default_out_dir(resolved, ckpt)
    report = {
        "recipe": str(resolved.path) if resolved.path else None,
        "overrides": list(resolved.overrides),
        "checkpoint": _checkpoint_info(ckpt),
        "protocol": {**protocol.as_dict(), **_model_info(resolved)},
        "results": _finite(result.summary()),
        "per_prompt": _finite(result.per_prompt()),
    }
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / RESULTS).write_text(json.dumps(report, indent=1) + "\n")
        where = "the base model" if ckpt is None else f"{ckpt.path}"
        result.save_grid(out / GRID, title=f"{where}: {protocol.samples_per_prompt} fixed seeds per prompt")
    return EvalOutput(out, result, ckpt, report, accelerator.is_main_process)


def _checkpoint_info(ckpt: Checkpoint | None) -> dict[str, Any] | None:
    if ckpt is None:
        return None
    weights = "moving average" if ckpt.averaged is not None else "trained weights"
    return {"path": str(ckpt.path), "iteration": ckpt.state.get("iteration"), "weights": weights}


def _model_info(resolved: Any) -> dict[str, Any]:
    """The adapter and rewards the numbers depend on, and the adapter's guidance where it has one."""
    options = resolved.adapter.config.model_dump(mode="json")
    info: dict[str, Any] = {"adapter": {"name": resolved.adapter.spec.name, "options": options}}
    guidance = {k: options[k] for k in GUIDANCE_OPTIONS if k in options}
    if guidance:
        info["guidance"] = guidance
    for field, rewards in (("rewards", resolved.rewards), ("eval_rewards", resolved.eval_rewards)):
        info[field] = [
            dict(key=r.key, name=r.spec.name, weight=r.weight, options=r.config.model_dump(mode="json"))
            for r in rewards
        ]
    return info


def _finite(tree: Any) -> Any:
    """NaN (a standard error of one value) as JSON ``null``: strict JSON has no NaN."""
    if isinstance(tree, dict):
        return {k: _finite(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_finite(v) for v in tree]
    if isinstance(tree, float) and not math.isfinite(tree):
        return None
    return tree


def results_table(output: EvalOutput) -> Any:
    """A rich table: every metric's mean, standard error and count."""
    from rich.table import Table

    protocol = output.evaluation.protocol
    source = "base model" if output.checkpoint is None else str(output.checkpoint.path)
    table = Table(
        title=f"vgrpo eval: {source}; {len(protocol.prompts)} prompts x {protocol.samples_per_prompt} "
        f"samples, seed {protocol.seed}, {protocol.sampler.name} {protocol.sampler.steps} steps",
        title_justify="left",
    )
    columns: list[tuple[str, Literal["left", "right"]]] = [
        ("metric", "left"),
        ("mean", "right"),
        ("s.e.", "right"),
        ("n", "right"),
    ]
    for col, justify in columns:
        table.add_column(col, justify=justify)
    for key, row in output.report["results"].items():
        sem = "–" if row["sem"] is None else f"{row['sem']:.4f}"
        mean = "–" if row["mean"] is None else f"{row['mean']:.4f}"
        table.add_row(key, mean, sem, str(row["n"]))
    return table
