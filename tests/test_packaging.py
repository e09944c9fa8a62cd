"""What ships: import names that cannot collide, every recipe valid, every key and hook documented."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from vgrpo_platform import hookspecs
from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.config.schema import Recipe

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.toml"))


def test_plugin_folders_install_under_collision_free_names():
    """`adapters` on PyPI is AdapterHub's package: ours must install as vgrpo_adapters / vgrpo_rewards."""
    import vgrpo_adapters
    import vgrpo_rewards

    assert Path(vgrpo_adapters.__file__).resolve().parent == ROOT / "adapters"
    assert Path(vgrpo_rewards.__file__).resolve().parent == ROOT / "rewards"
    code = "import importlib.util, sys; sys.exit(int(bool(importlib.util.find_spec('adapters'))))"
    # from a neutral folder, the name `adapters` stays free for AdapterHub
    assert subprocess.run([sys.executable, "-c", code], cwd="/").returncode == 0


def test_builtins_are_registered_only_through_entry_points():
    eps = importlib.metadata.entry_points(group="vgrpo")
    ours = {ep.value for ep in eps if ep.dist is not None and ep.dist.name == "vgrpo"}
    assert {"vgrpo_adapters.toy", "vgrpo_rewards.toy", "vgrpo_platform.algo.surrogates.entry"} <= ours


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.name for p in RECIPES])
def test_every_shipped_recipe_passes_check(recipe):
    resolved = resolve_recipe(recipe)
    assert resolved.train_prompts


def _keys(model: type, prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and hasattr(ann, "model_fields") and name not in {"adapter", "surrogate"}:
            out += _keys(ann, f"{prefix}{name}.")
        else:
            out.append(f"{prefix}{name}")
    return out


def test_every_recipe_key_is_documented():
    doc = (ROOT / "docs" / "recipes.md").read_text()
    sections = [k for k in _keys(Recipe) if "." in k]
    missing = [
        k for k in sections if f"| `{k.split('.', 1)[1]}` |" not in doc or f"[{k.split('.')[0]}]" not in doc
    ]
    assert not missing, f"keys missing from docs/recipes.md: {missing}"


def test_every_hook_is_documented():
    doc = (ROOT / "docs" / "hooks.md").read_text()
    hooks = [name for name in dir(hookspecs) if name.startswith("register_")]
    assert hooks
    for name in hooks:
        assert getattr(hookspecs, name).__doc__, name
        assert f"`{name}" in doc, f"hook {name} is not documented in docs/hooks.md"
