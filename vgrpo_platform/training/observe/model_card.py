"""The model card (``README.md``) of an export folder: what the weights are, what trained them, how
they scored and how to load them, from the run's own records.

Written beside the weights at the end of a run and by ``vgrpo export``; ``vgrpo push`` uploads the
folder with it. The figures are copied from the run's files, never computed here: the first and last
held-out evaluations of ``metrics.jsonl`` and every ``vgrpo eval`` report under ``RUN/eval/*/eval.json``.
The card's metadata (``huggingface_hub.ModelCardData``) names the base model only when it is a Hub repo
id: a local folder means nothing to the Hub.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vgrpo_platform.config.recipe import HUB_REPO_ID, ORIGINAL_TOML
from vgrpo_platform.config.schema import Recipe
from vgrpo_platform.lora_files import read_export_info
from vgrpo_platform.training.observe.metrics import read_metrics

README = "README.md"
TASKS = {"image": "text-to-image", "video": "text-to-video", "audio": "text-to-audio"}
EVAL_KEYS = ("reward/", "detail/", "monitor/")  # besides "reward": what the card's table lists


def write_model_card(out: Path, run_dir: Path, recipe: Recipe, *, modality: str) -> Path:
    """``out/README.md`` for the export in ``out`` (its ``vgrpo_export.json``) of the run in ``run_dir``."""
    from huggingface_hub import ModelCard, ModelCardData

    info = read_export_info(out) or {}
    base = str(info.get("base_model", "the base model"))
    task = TASKS.get(modality)
    tags = ["vgrpo", "reinforcement-learning", "lora" if info.get("kind") == "lora" else "full-finetune"]
    data = ModelCardData(
        base_model=base if _is_hub_id(base) else None,
        library_name="diffusers",
        pipeline_tag=task,
        tags=[*tags, recipe.adapter.name, *([task] if task else [])],
    )
    sections = [_title(recipe, base, info), _results(run_dir), _how_to_load(info, out)]
    sections.append(_training(recipe, run_dir))
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n\n".join(sections) + "\n")
    path = out / README
    card.save(path)
    return path


def _is_hub_id(name: str) -> bool:
    return bool(HUB_REPO_ID.match(name)) and not Path(name).exists()


def _title(recipe: Recipe, base: str, info: dict[str, Any]) -> str:
    what = "Full fine-tune"
    if info.get("kind") == "lora":
        alpha = info.get("lora_alpha")
        what = f"LoRA (rank {info.get('lora_rank')}, alpha {alpha:g})" if alpha is not None else "LoRA"
    if recipe.train.init_lora:
        what += f", trained on from the LoRA `{recipe.train.init_lora}`,"
    rewards = ", ".join(f"`{r.name}` (weight {r.weight:g})" for r in recipe.rewards)
    return (
        f"# {recipe.run.name}\n\n{what} of `{base}`, trained with vgrpo (online RL for diffusion and "
        f"flow-matching generators; surrogate `{recipe.surrogate.name}`) to raise the reward {rewards}."
    )


def _results(run_dir: Path) -> str:
    """The first and last held-out evaluations of training, and every ``vgrpo eval`` report."""
    parts = ["## Results"]
    metrics = run_dir / "metrics.jsonl"
    evals = [r for r in read_metrics(metrics) if r.get("kind") == "eval"] if metrics.is_file() else []
    if len(evals) >= 2:
        first, last = evals[0], evals[-1]
        keys = [k for k in last if k in first and (k == "reward" or k.startswith(EVAL_KEYS))]
        rows = [f"| `{k}` | {first[k]:.4f} | {last[k]:.4f} | {last[k] - first[k]:+.4f} |" for k in keys]
        parts.append(
            "Held-out prompts and fixed seeds, from the run's `metrics.jsonl`:\n\n"
            f"| metric | iteration {first['iteration']} | iteration {last['iteration']} | change |\n"
            "|---|---|---|---|\n" + "\n".join(rows)
        )
    parts += [_eval_report(report, run_dir) for report in sorted((run_dir / "eval").glob("*/eval.json"))]
    if len(parts) == 1:
        parts.append("The run recorded no evaluation.")
    return "\n\n".join(parts)


def _eval_report(path: Path, run_dir: Path) -> str:
    """One ``eval.json`` (``vgrpo eval``) as a table of means with standard errors."""
    report = json.loads(path.read_text())
    checkpoint = report.get("checkpoint")
    which = "the base model" if checkpoint is None else f"iteration {checkpoint.get('iteration')}"
    protocol = report.get("protocol", {})
    rows = []
    for key, row in report.get("results", {}).items():
        mean = "–" if row.get("mean") is None else f"{row['mean']:.4f}"
        sem = "–" if row.get("sem") is None else f"{row['sem']:.4f}"
        rows.append(f"| `{key}` | {mean} | {sem} | {row.get('n')} |")
    prompts = len(protocol.get("prompts", []))
    return (
        f"`vgrpo eval` of {which} (`{path.relative_to(run_dir)}`: {prompts} prompts x "
        f"{protocol.get('samples_per_prompt')} samples, seed {protocol.get('seed')}):\n\n"
        "| metric | mean | s.e. | n |\n|---|---|---|---|\n" + "\n".join(rows)
    )


# the card travels (vgrpo push): where the export lay on the machine that wrote it means nothing elsewhere
THIS_FOLDER = "path/to/this/folder"


def _how_to_load(info: dict[str, Any], out: Path) -> str:
    load = info.get("load")
    if not load:
        return "## How to load\n\nThis folder holds the run's exported weights."
    for written in sorted({str(out.resolve()), str(out)}, key=len, reverse=True):
        load = str(load).replace(written, THIS_FOLDER)
    text = (
        f"## How to load\n\n`{THIS_FOLDER}`: a copy of this folder (`huggingface_hub.snapshot_download` of "
        f"its repo).\n\n```python\n{load}\n```"
    )
    if info.get("kind") == "lora":
        text += (
            "\n\nRank and alpha are stored in the LoRA file's metadata: load the folder (with "
            "`weight_name`), not the file's path, and diffusers reads them instead of guessing. "
            "`train.init_lora` starts another vgrpo run from this folder."
        )
    return text


def _training(recipe: Recipe, run_dir: Path) -> str:
    t, r = recipe.train, recipe.rollout
    lines = [
        "## Training",
        "",
        f"- adapter `{recipe.adapter.name}`, surrogate `{recipe.surrogate.name}`",
        f"- {t.iterations} iterations of {r.prompts_per_iteration} prompts x {r.group_size} samples "
        f"({r.sampler}, {r.steps} steps), learning rate {t.lr:g}",
    ]
    if t.ema_decay:
        lines.append(
            f"- the exported weights are the moving average (`train.ema_decay = {t.ema_decay:g}`): the "
            "weights every evaluation used"
        )
    source = run_dir / ORIGINAL_TOML
    if source.is_file():
        text = f"```toml\n{source.read_text()}```"
        lines += ["", "<details><summary>recipe</summary>", "", text, "</details>"]
    return "\n".join(lines)
