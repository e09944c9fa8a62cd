"""``vgrpo export`` (a run's checkpoint as a ``final/`` folder) and ``vgrpo push`` (that folder to the Hub).

``export`` writes what the end of a run writes (``training/export.py``), for runs older than it or for
another checkpoint: the adapter is built from the recipe, the checkpoint's served weights (the moving
average where the run kept one) are copied in, and nothing else (rewards, surrogate) is built.
``push`` uploads an export folder with ``huggingface_hub``'s ``upload_folder``; ``--to-folder`` copies
exactly what would be uploaded into a local folder instead, with no network.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from vgrpo_platform.config.recipe import ResolvedRecipe
from vgrpo_platform.errors import CheckpointError, HubError
from vgrpo_platform.lora_files import EXPORT_INFO, FINAL
from vgrpo_platform.training.observe.model_card import README


def export_checkpoint(
    resolved: ResolvedRecipe, *, checkpoint: str | Path | None = None, out: str | Path | None = None
) -> Path:
    """Export ``checkpoint`` (a run directory: its newest checkpoint; default the recipe's run) to ``out``
    (default ``RUN/final`` for a run directory, ``RUN/final_iter_NNNNNN`` for a named checkpoint)."""
    import torch

    from vgrpo_platform.cli.sample import check_fit, load_weights, resolve_checkpoint  # `push` needs no torch
    from vgrpo_platform.finetune import make_trainable
    from vgrpo_platform.protocols import BuildContext
    from vgrpo_platform.training.export import export_policy
    from vgrpo_platform.training.session import resolve_device, run_dir_of

    recipe = resolved.recipe
    source = Path(checkpoint) if checkpoint is not None else run_dir_of(recipe)
    ckpt = resolve_checkpoint(source)
    assert ckpt is not None  # a path was given
    differ = check_fit(resolved, ckpt)  # another model's checkpoint stops here, before any model loads
    run_dir = ckpt.path.parent.parent
    whole_run = (source / "checkpoints").is_dir()
    default = run_dir / (FINAL if whole_run else f"{FINAL}_{ckpt.path.name}")
    target = Path(out) if out is not None else default
    if target.exists() and any(target.iterdir()) and not (target / EXPORT_INFO).is_file():
        raise CheckpointError(f"--out {target} exists and is not a vgrpo export; choose another folder")
    context = BuildContext(
        device=resolve_device(recipe.run.device), seed=recipe.run.seed, recipe_dir=resolved.recipe_dir
    )
    adapter = resolved.adapter.build(context)
    with torch.no_grad():
        load_weights(make_trainable(adapter, recipe.train), ckpt, differ)
    shutil.rmtree(target, ignore_errors=True)  # a previous export: no stale file may stay beside the new
    return export_policy(adapter, target, run_dir, recipe)


def export_folder(path: str | Path) -> Path:
    """The export to push: ``path`` itself or its ``final/``; it must hold weights and a model card."""
    path = Path(path)
    folder = path / FINAL if (path / FINAL / EXPORT_INFO).is_file() else path
    if not (folder / EXPORT_INFO).is_file():
        raise CheckpointError(
            f"{path} holds no vgrpo export (no {FINAL}/{EXPORT_INFO}); write one with `vgrpo export RECIPE`"
        )
    if not (folder / README).is_file():
        raise CheckpointError(f"{folder} has no model card ({README}); rewrite it with `vgrpo export RECIPE`")
    return folder


def push(
    path: str | Path,
    repo_id: str,
    *,
    to_folder: str | Path | None = None,
    private: bool = False,
    message: str | None = None,
) -> str:
    """Upload the export at ``path`` to the model repo ``repo_id`` (created if missing); with ``to_folder``
    copy it there instead. Returns where it went (the commit's URL, or the folder)."""
    folder = export_folder(path)
    if to_folder is not None:
        target = Path(to_folder)
        if target.exists() and any(target.iterdir()):
            raise CheckpointError(f"--to-folder {target} is not empty; give a new or empty folder")
        shutil.copytree(folder, target, dirs_exist_ok=True)
        return str(target)
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        commit = api.upload_folder(
            folder_path=folder,
            repo_id=repo_id,
            repo_type="model",
            commit_message=message or f"vgrpo export of {folder}",
        )
    except Exception as exc:  # auth, network, a bad id: huggingface_hub raises each as its own type
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise HubError(
            f"pushing {folder} to {repo_id} failed ({type(exc).__name__}: {first_line}); log in with "
            "`hf auth login` (or set HF_TOKEN) and check the repo id"
        ) from exc
    return str(getattr(commit, "commit_url", commit))
