"""The example plugin packages install into a fresh environment, show up in `vgrpo plugins`, pass their
own tests (the conformance kit) and train with their recipes; the tutorials show their code verbatim."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from vgrpo_platform.cli.scaffold import package_files
from vgrpo_platform.testing import fresh_venv, pip_install_editable

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {
    "vgrpo-example-reward": {"components": [("reward", "colorfulness")], "doc": "writing-a-reward.md"},
    "vgrpo-example-adapter": {
        "components": [("adapter", "signal_flow"), ("reward", "signal_flow_tone")],
        "doc": "writing-an-adapter.md",
    },
    "vgrpo-example-engine": {
        "components": [("rollout_backend", "http_engine")],
        "doc": "rollout-backends.md",
    },
}
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "250", "PYTHONPATH": ""}


def train(python: Path, folder: Path, *settings: str) -> None:
    """``vgrpo run recipe.toml`` in ``folder`` with ``--set`` for each of ``settings``."""
    run(
        python,
        "-m",
        "vgrpo_platform",
        "run",
        "recipe.toml",
        *[x for s in settings for x in ("--set", s)],
        cwd=folder,
    )


def run(python: Path, *args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(python), *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, (
        f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A new venv that sees this environment's packages, with copies of both examples installed (-e)."""
    root = tmp_path_factory.mktemp("examples")
    python = fresh_venv(root / "venv")
    for name in EXAMPLES:
        shutil.copytree(
            ROOT / "examples" / name, root / name, ignore=shutil.ignore_patterns("*.egg-info", "runs")
        )
        pip_install_editable(python, root / name)
    return python, root


def plugin_rows(output: str) -> set[tuple[str, str, str]]:
    """(kind, name, distribution) of each row of the `vgrpo plugins` table."""
    rows = set()
    for line in output.splitlines():
        cells = [c.strip() for c in re.split(r"[│|]", line) if c.strip()]
        if len(cells) >= 3:
            rows.add(tuple(cells[:3]))
    return rows


def test_vgrpo_plugins_lists_the_examples_with_their_distributions(env):
    python, root = env
    rows = plugin_rows(run(python, "-m", "vgrpo_platform", "plugins", cwd=root).stdout)
    for dist, info in EXAMPLES.items():
        for kind, name in info["components"]:
            assert (kind, name, dist) in rows
    assert ("adapter", "toy", "vgrpo") in rows  # the parent environment's plugins are still there


@pytest.mark.slow  # ~20-40 s each on 2 busy cores; test_scaffold runs the same kit checks in-process
@pytest.mark.parametrize("example", list(EXAMPLES))
def test_example_passes_its_own_tests(env, example):
    python, root = env
    run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests", cwd=root / example)


@pytest.mark.parametrize(
    "example",
    [
        "vgrpo-example-adapter",  # a third-party adapter and reward together: the default suite runs it
        pytest.param("vgrpo-example-reward", marks=pytest.mark.slow),
    ],
)
def test_example_recipe_trains_and_improves_the_reward(env, example):
    python, root = env
    out = root / f"runs-{example}"
    run(python, "-m", "vgrpo_platform", "check", "recipe.toml", cwd=root / example)
    train(python, root / example, f"run.output_dir={out}")
    (metrics,) = out.glob("*/metrics.jsonl")
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    evals = [r["reward"] for r in records if r["kind"] == "eval"]
    assert len(evals) == 2 and evals[-1] > evals[0], evals
    assert [r["iteration"] for r in records if r["kind"] == "train"] == list(range(1, len(records) - 1))


def test_the_engine_example_trains_on_rollouts_from_its_fake_engine(env):
    """The engine in its own process, the trainer in another: rollouts over HTTP, one update ahead."""
    import socket
    import time
    import urllib.request

    python, root = env
    folder = root / "vgrpo-example-engine"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    engine = subprocess.Popen(
        [str(python), "-m", "vgrpo_example_engine.fake_engine", "recipe.toml", "--port", str(port)],
        cwd=folder,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):  # the engine builds its model first
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.5)
        out = root / "runs-engine"
        train(
            python,
            folder,
            f"run.output_dir={out}",
            f"rollout.backend_options.url={url}",
            "train.iterations=12",
        )
    finally:
        engine.terminate()
        engine.wait(timeout=30)
    (metrics,) = out.glob("*/metrics.jsonl")
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    iterations = [r for r in records if r["kind"] == "train"]
    assert [r["rollout_staleness"] for r in iterations] == [0.0] + [1.0] * 11
    evals = [r["reward"] for r in records if r["kind"] == "eval"]
    assert len(evals) == 2 and evals[-1] > evals[0], evals


def code_blocks(markdown: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", markdown, re.M | re.S)]


@pytest.mark.parametrize("example", list(EXAMPLES))
def test_tutorial_code_is_the_example_code(example):
    """Each code block of the tutorial is part of a file of the example, and every file is shown."""
    doc = (ROOT / "docs" / EXAMPLES[example]["doc"]).read_text()
    files = package_files(ROOT / "examples" / example)
    blocks = [(lang, code) for lang, code in code_blocks(doc) if lang in ("python", "toml")]
    assert blocks
    shown = set()
    for lang, code in blocks:
        hits = [rel for rel, text in files.items() if code in text]
        assert hits, (
            f"a {lang} block of docs/{EXAMPLES[example]['doc']} is in no file of examples/{example}:\n{code}"
        )
        shown.update(hits)
    code_files = {rel for rel in files if rel.endswith((".py", ".toml"))}
    assert code_files <= shown, (
        f"files of examples/{example} the tutorial never shows: {sorted(code_files - shown)}"
    )
