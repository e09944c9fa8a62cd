"""What ships: import names that cannot collide, every recipe valid, every key and hook documented."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

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


# --------------------------------------------------------------------------- what the docs' tables name
def _table_names(doc: Path) -> set[str]:
    """Every `name` in backticks on a Markdown table row of ``doc``."""
    rows = [line for line in doc.read_text().splitlines() if line.lstrip().startswith("|")]
    return {name for row in rows for name in re.findall(r"`([a-z0-9_]+)`", row)}


def _builtins(kind: str) -> set[str]:
    from vgrpo_platform.host.collect import default_registry

    return {s.name for s in default_registry() if s.kind == kind and s.distribution == "vgrpo"}


@pytest.mark.parametrize(
    "kind, docs",
    [("adapter", ["README.md", "docs/adapters.md"]), ("reward", ["README.md", "docs/rewards.md"])],
)
def test_every_builtin_component_is_in_the_readme_and_docs_tables(kind, docs):
    """`vgrpo plugins` is the truth: a built-in adapter or reward that a table leaves out is a stale doc."""
    names = _builtins(kind)
    assert len(names) >= 10, names  # the registry was read (11 adapters and 20 rewards when written)
    for doc in docs:
        missing = sorted(names - _table_names(ROOT / doc))
        assert not missing, f"{kind}s missing from the tables of {doc}: {missing}"


# --------------------------------------------------------------------------- install: torch kept, or pinned
def _requirements(group: str | None = None) -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = project["dependencies"] if group is None else project["optional-dependencies"][group]
    return {(req := Requirement(line)).name: req for line in lines}


def test_core_install_keeps_a_machines_torch_and_the_test_extra_pins_the_tested_one():
    """README "On a GPU machine": `pip install -e .` keeps a cluster's torch 2.8 to 2.11 (local CUDA builds
    included) and pulls nothing built for one exact torch; `.[test]`, the README's first command, still
    resolves to exactly the tested torch 2.11.0 and torchaudio 2.11.0."""
    core = _requirements()
    torch_range = core["torch"].specifier
    kept = ["2.8.0", "2.9.1+cu128", "2.10.0+cu126", "2.11.0", "2.11.0+cu130"]
    assert [v for v in kept if torch_range.contains(v)] == kept
    assert not [v for v in ["2.7.1", "2.12.0", "2.13.0+cpu"] if torch_range.contains(v)]
    assert not core.keys() & {"torchaudio", "torchvision", "deepspeed", "pytest", "mypy", "wandb"}
    test = _requirements("test")
    both = torch_range & test["torch"].specifier
    assert [v for v in ["2.8.0", "2.10.0", "2.11.0", "2.11.1", "2.13.0+cpu"] if both.contains(v)] == [
        "2.11.0"
    ]
    assert str(test["torchaudio"].specifier) == "==2.11.0"
    # the torch-coupled extras accept the build made for any torch in the range (with the README's constraint
    # pip picks that one): torchaudio 2.8 ... 2.11, torchvision 0.23 ... 0.26
    for extra, name, versions in [
        ("audio", "torchaudio", ["2.8.0", "2.11.0"]),
        ("hpsv2", "torchvision", ["0.23.0", "0.26.0"]),
    ]:
        spec = _requirements(extra)[name].specifier
        assert all(spec.contains(v) for v in versions), (extra, spec)


# --------------------------------------------------------------------------- no machine's folders shipped
MACHINE_PATH = re.compile(rb"(?<![\w.~/-])/(?:work|home|root|Users|tmp)/")
"""The start of a folder of one machine: a home, a work tree or a temporary folder."""

ALLOWED_MACHINE_PATHS = {
    # example commands that write scratch output to a temporary folder, as a reader would type them
    "benchmarks/rollout_backends.py": {b"--out /tmp/rb"},
    "docs/benchmarks.md": {b"--out /tmp/fg", b"--out /tmp/vg"},
    "tests/test_packaging.py": set(),  # this scan: its own pattern and allow-list, skipped whole
}


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the shipped files are the tracked ones")
    return [name for name in out.stdout.decode().split("\0") if name and (ROOT / name).is_file()]


def _load_paths(node: object) -> list[str]:
    """Every ``_name_or_path`` / ``name_or_path`` string in a JSON document, at any depth."""
    if isinstance(node, dict):
        found = [v for k, v in node.items() if k in ("_name_or_path", "name_or_path") and isinstance(v, str)]
        return found + [p for v in node.values() for p in _load_paths(v)]
    return [p for v in node for p in _load_paths(v)] if isinstance(node, list) else []


def test_no_tracked_file_names_a_folder_of_the_machine_that_wrote_it():
    """A config saved after loading from a path keeps that path (`_name_or_path`), and a record may keep
    its run folder: a user's copy would name the developer's machine. Every tracked file is read as bytes
    (configs, records, safetensors headers); only the example commands above may name /tmp."""
    files = _tracked()
    assert "adapters/shapes/weights/transformer/config.json" in files
    found = []
    for name in files:
        if name == "tests/test_packaging.py":
            continue
        data = (ROOT / name).read_bytes()
        for match in MACHINE_PATH.finditer(data):
            line = data[data.rfind(b"\n", 0, match.start()) + 1 : data.find(b"\n", match.end())]
            if not any(allowed in line for allowed in ALLOWED_MACHINE_PATHS.get(name, ())):
                found.append(f"{name}: {data[max(0, match.start() - 50) : match.end() + 50]!r}")
    assert not found, "machine paths in tracked files:\n" + "\n".join(found)
    absolute = []
    for name in (n for n in files if n.endswith(".json")):
        paths = _load_paths(json.loads((ROOT / name).read_text()))
        absolute += [f"{name}: {p}" for p in paths if p.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", p)]
    assert not absolute, f"absolute load paths in shipped configs: {absolute}"
