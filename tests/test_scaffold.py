"""`vgrpo new adapter|reward NAME`: the templates are the examples, and a new package installs, passes the
conformance kit and appears in `vgrpo plugins`."""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vgrpo_platform.cli.app import app
from vgrpo_platform.cli.scaffold import ScaffoldError, names_for, package_files, render, scaffold
from vgrpo_platform.testing import check_adapter, check_reward, fresh_venv, pip_install_editable

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_NAMES = {
    "reward": ("vgrpo-example-reward", "colorfulness", "vgrpo_example_reward"),
    "adapter": ("vgrpo-example-adapter", "signal_flow", "vgrpo_example_adapter"),
}


@pytest.mark.parametrize("kind", list(EXAMPLE_NAMES))
def test_template_rendered_with_the_examples_names_is_the_example(kind):
    dist, name, package = EXAMPLE_NAMES[kind]
    rendered = render(kind, names_for(name, package=package, distribution=dist))
    example = package_files(ROOT / "examples" / dist)
    assert sorted(rendered) == sorted(example)
    for rel, text in example.items():
        assert rendered[rel] == text, (
            f"templates/{kind} and examples/{dist}/{rel} differ; after editing the example run "
            f"vgrpo_platform.cli.scaffold.write_templates({kind!r}, 'examples/{dist}', names_for(...))"
        )


def test_names_default_and_validation():
    names = names_for("my_reward")
    assert (names.package, names.distribution, names.Class) == (
        "vgrpo_my_reward",
        "vgrpo-my-reward",
        "MyReward",
    )
    for bad in ("MyReward", "my-reward", "1reward", ""):
        with pytest.raises(ScaffoldError, match="invalid component name"):
            names_for(bad)
    with pytest.raises(ScaffoldError, match="invalid package name"):
        names_for("ok", package="not-an-identifier")


@pytest.mark.parametrize("kind", ["reward", "adapter"])
def test_rendered_package_is_valid_and_leaves_no_placeholder(kind, tmp_path):
    target = scaffold(kind, "my_thing", tmp_path)
    files = package_files(target)
    assert "vgrpo_my_thing/__init__.py" in files and "tests/test_my_thing.py" in files
    for rel, text in files.items():
        assert "{{" not in text and "PACKAGE" not in rel, rel
        if rel.endswith(".py"):
            ast.parse(text, filename=rel)
    assert 'vgrpo_my_thing = "vgrpo_my_thing"' in files["pyproject.toml"]


def test_cli_new_writes_the_package_and_refuses_to_overwrite(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["new", "reward", "myreward", "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "vgrpo-myreward" / "vgrpo_myreward" / "impl.py").is_file()
    again = runner.invoke(app, ["new", "reward", "myreward", "--dir", str(tmp_path)])
    assert again.exit_code == 2 and "already exists" in again.output
    bad = runner.invoke(app, ["new", "adapter", "Bad-Name", "--dir", str(tmp_path)])
    assert bad.exit_code == 2 and "invalid component name" in bad.output


def test_new_adapter_passes_the_conformance_kit_in_process(tmp_path, monkeypatch):
    target = scaffold("adapter", "wave", tmp_path)
    monkeypatch.syspath_prepend(str(target))
    monkeypatch.setenv("PYTHONPATH", str(target))  # for the kit's import check in a subprocess
    module = importlib.import_module("vgrpo_wave")
    try:
        check_adapter(
            module.build_adapter, module.WaveConfig(length=16, hidden=16), entry_module="vgrpo_wave"
        )
        data = module.ToneConfig()
        check_reward(
            module.build_tone, data, entry_module="vgrpo_wave", samples=_signals(), prompts=["2 cycles"]
        )
    finally:
        for name in [m for m in sys.modules if m.startswith("vgrpo_wave")]:
            del sys.modules[name]


def _signals():
    import torch

    from vgrpo_platform.protocols import Samples

    x = torch.arange(16) / 16
    return Samples("signal", torch.stack([torch.sin(6.283 * k * x) for k in (1, 2, 3)]).unsqueeze(1))


def test_new_reward_installs_passes_the_kit_and_is_listed(tmp_path):
    """The issue's acceptance test: `vgrpo new reward myreward` in a fresh environment."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "250", "PYTHONPATH": ""}
    python = fresh_venv(tmp_path / "venv")
    made = subprocess.run(
        [str(python), "-m", "vgrpo_platform", "new", "reward", "myreward", "--dir", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    package = tmp_path / "vgrpo-myreward"
    pip_install_editable(python, package)
    listed = subprocess.run(
        [str(python), "-m", "vgrpo_platform", "plugins"], env=env, capture_output=True, text=True
    )
    assert re.search(r"reward\s*│\s*myreward\s*│\s*vgrpo-myreward\s*│", listed.stdout), (
        listed.stdout + listed.stderr
    )
    tests = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=package,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-3000:]
    assert "2 passed" in tests.stdout  # the conformance kit and the formula test
