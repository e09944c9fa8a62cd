"""The ``vgrpo`` command line: commands, exit codes, one-line errors, and no torch where it is not needed."""

from __future__ import annotations

import importlib.metadata
import signal
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest
import typer
from pydantic import Field
from typer.testing import CliRunner

from vgrpo_platform.cli import app as cli
from vgrpo_platform.errors import RecipeError
from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.host.collect import default_registry
from vgrpo_platform.host.manager import build_plugin_manager
from vgrpo_platform.registry import Component, PluginConfig

ROOT = Path(__file__).resolve().parents[1]
TOY_RECIPE = ROOT / "recipes" / "toy.toml"

RECIPE = """
[adapter]
name = "toy"

[adapter.options]
resolution = 8

[[rewards]]
name = "brightness"
weight = 2.0

[prompts]
train = ["a bright image"]

[eval]
seed = 77
"""


class ToyConfig(PluginConfig):
    resolution: int = Field(16, description="Side of the square image, in pixels.")


class EmptyConfig(PluginConfig):
    pass


def factory(config, context):
    raise AssertionError("vgrpo check/plugins must not build components")


class TestPlugin:
    vgrpo_distribution = "test-dist"

    @hookimpl
    def register_components(self):
        return [
            Component("adapter", "toy", factory, ToyConfig, "toy adapter for tests"),
            Component("reward", "brightness", factory, EmptyConfig, "mean pixel value"),
            Component("surrogate", "vgrpo", factory, EmptyConfig),
        ]

    @hookimpl
    def register_commands(self, app):
        @app.command()
        def hello(name: str = "world") -> None:
            """Say hello (a plugin command)."""
            typer.echo(f"hello {name}")


@pytest.fixture
def runner(monkeypatch):
    pm = build_plugin_manager(load_entry_points=False, extra_plugins=[TestPlugin()])
    monkeypatch.setattr(cli, "_plugin_manager", lambda: pm)
    monkeypatch.delenv("VGRPO_DEBUG", raising=False)
    return CliRunner()


@pytest.fixture
def recipe(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text(RECIPE)
    return path


def invoke(runner, *args):
    return runner.invoke(cli.app, [str(a) for a in args], env={"COLUMNS": "200"})


def assert_user_error(result, *fragments):
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


# --------------------------------------------------------------------------- check


def test_check_prints_a_summary_and_ok(runner, recipe):
    result = invoke(runner, "check", recipe, "--set", "rollout.group_size=4", "--set", "train.iterations=7")
    assert result.exit_code == 0, result.output
    out = result.stdout.splitlines()
    assert out[-1] == "ok"
    text = result.stdout
    assert "adapter    toy (resolution=8)" in text
    assert "rewards    brightness x2" in text
    assert "surrogate  vgrpo" in text
    assert "4 prompts x 4 samples = 16 per iteration" in text  # default prompts_per_iteration is 4
    assert "7 iterations" in text and "--set rollout.group_size=4" in text


def test_check_typo_is_one_line_exit_2(runner, recipe):
    result = invoke(runner, "check", recipe, "--set", "adapter.options.resolutoin=4")
    assert_user_error(
        result,
        f"{recipe}:",
        "unknown key 'adapter.options.resolutoin'",
        "did you mean 'adapter.options.resolution'?",
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--set", "train.lr=abc"], "train.lr: expected a number, got 'abc'"),
        (["--set", "nonsense"], "expected KEY.PATH=VALUE"),
        (["--set", "adapter.name=toyy"], "unknown adapter 'toyy'; did you mean 'toy'?"),
        (["--set", "prompts.train_file=nope.txt"], "prompt file"),
    ],
)
def test_check_bad_input(runner, recipe, args, fragment):
    assert_user_error(invoke(runner, "check", recipe, *args), fragment)


def test_check_missing_and_malformed_files(runner, tmp_path):
    assert_user_error(invoke(runner, "check", tmp_path / "missing.toml"), "not found")
    bad = tmp_path / "bad.toml"
    bad.write_text("[adapter\n")
    assert_user_error(invoke(runner, "check", bad), f"{bad}:1:", "invalid TOML")


def test_debug_shows_the_exception_instead(runner, recipe):
    result = invoke(runner, "check", recipe, "--set", "train.lr=abc", "--debug")
    assert result.exit_code == 1 and isinstance(result.exception, RecipeError)
    # and the flag does not leak into the next command
    assert_user_error(invoke(runner, "check", recipe, "--set", "train.lr=abc"), "train.lr")


# --------------------------------------------------------------------------- run and sample


def fake_module(monkeypatch, name, func_name):
    calls = []
    module = types.ModuleType(name)
    setattr(module, func_name, lambda *a, **k: calls.append((a, k)))
    monkeypatch.setitem(sys.modules, name, module)
    return module, calls


def test_run_calls_train_run_with_the_resolved_recipe(runner, recipe, monkeypatch):
    _, calls = fake_module(monkeypatch, "vgrpo_platform.training.loop", "run")
    result = invoke(runner, "run", recipe, "--set", "train.lr=1e-5", "--resume")
    assert result.exit_code == 0, result.output
    [(args, kwargs)] = calls
    assert kwargs == {"resume": True}
    resolved = args[0]
    assert resolved.recipe.train.lr == 1e-5 and resolved.overrides == ("train.lr=1e-5",)
    assert resolved.adapter.config == ToyConfig(resolution=8)
    assert [(r.key, r.weight) for r in resolved.rewards] == [("brightness", 2.0)]
    result = invoke(runner, "run", recipe)
    assert result.exit_code == 0 and calls[-1][1] == {"resume": False}


def test_run_reports_user_errors_and_interrupts(runner, recipe, monkeypatch):
    module, _ = fake_module(monkeypatch, "vgrpo_platform.training.loop", "run")

    def interrupted(resolved, resume):
        raise KeyboardInterrupt

    module.run = interrupted
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    result = invoke(runner, "run", recipe)
    assert result.exit_code == 130
    assert len(result.stderr.splitlines()) == 1 and "interrupted" in result.stderr
    # in-process, the handlers come back: a process that ignored SIGTERM would pass that on to every
    # subprocess it starts (servers that a test then cannot stop)
    assert {s: signal.getsignal(s) for s in before} == before

    def bad_reward(resolved, resume):
        from vgrpo_platform.errors import RewardError

        raise RewardError("reward 'brightness' returned NaN for 3 of 16 samples; check its inputs")

    module.run = bad_reward
    assert_user_error(invoke(runner, "run", recipe), "returned NaN")


def test_sample_calls_sample_to_folder(runner, recipe, monkeypatch, tmp_path):
    _, calls = fake_module(monkeypatch, "vgrpo_platform.cli.sample", "sample_to_folder")
    out = tmp_path / "out"
    result = invoke(
        runner, "sample", recipe, "--out", out, "--prompt", "a cat", "--prompt", "a dog", "--num", 3
    )
    assert result.exit_code == 0, result.output
    ((args, kwargs),) = calls
    assert args[0].recipe.adapter.name == "toy"
    assert kwargs == {
        "out_dir": out,
        "checkpoint": None,
        "prompts": ["a cat", "a dog"],
        "num_per_prompt": 3,
        "seed": 77,  # the recipe's eval.seed
    }
    ckpt = tmp_path / "ckpt"
    result = invoke(runner, "sample", recipe, "--out", out, "--checkpoint", ckpt, "--seed", 5)
    assert result.exit_code == 0, result.output
    assert (
        calls[-1][1]["prompts"] is None and calls[-1][1]["seed"] == 5 and calls[-1][1]["checkpoint"] == ckpt
    )


def test_sample_gives_prompts_their_image_and_a_text_adapter_refuses_it(
    runner, recipe, monkeypatch, tmp_path
):
    from PIL import Image

    _, calls = fake_module(monkeypatch, "vgrpo_platform.cli.sample", "sample_to_folder")
    Image.new("RGB", (4, 4)).save(tmp_path / "src.png")
    args = ("sample", recipe, "--out", tmp_path / "out", "--prompt", "a", "--prompt", "b")
    result = invoke(runner, *args, "--image", tmp_path / "src.png")
    assert_user_error(result, "adapter toy takes no condition image but the --prompt prompts carry one")
    assert not calls  # refused before any model loads
    assert_user_error(invoke(runner, *args, "--image", tmp_path / "gone.png"), "--image")
    from vgrpo_platform.conditions import with_images

    paired = with_images(["a", "b"], [tmp_path / "src.png"])
    assert [p.images for p in paired] == [(tmp_path / "src.png",)] * 2  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- plugins and help


def test_plugins_lists_components_and_options(runner):
    result = invoke(runner, "plugins")
    assert result.exit_code == 0, result.output
    for row in [
        "adapter",
        "toy",
        "test-dist",
        "toy adapter for tests",
        "brightness",
        "mean pixel value",
    ]:
        assert row in result.stdout
    assert "resolution" not in result.stdout
    result = invoke(runner, "plugins", "--options")
    assert "resolution" in result.stdout and "Side of the square image, in pixels." in result.stdout
    assert "16" in result.stdout


def test_plugin_commands_are_added(runner, monkeypatch):
    monkeypatch.setattr(cli, "_COMMANDS_ADDED", [])
    app = typer.Typer()

    @app.command()
    def other() -> None:
        """A built-in stand-in."""

    cli.add_plugin_commands(app)
    result = runner.invoke(app, ["hello", "--name", "vgrpo"])
    assert result.exit_code == 0 and result.stdout == "hello vgrpo\n"


def test_every_command_has_help(runner):
    names = {c.name or c.callback.__name__ for c in cli.app.registered_commands}
    assert names >= {"run", "check", "plugins", "sample", "eval", "report"}
    for command in cli.app.registered_commands:
        first_line = command.callback.__doc__.strip().splitlines()[0]
        result = invoke(runner, command.name or command.callback.__name__, "--help")
        assert result.exit_code == 0
        assert first_line[:40] in " ".join(result.stdout.split())


# --------------------------------------------------------------------------- real processes

NO_HEAVY = """
import sys
from vgrpo_platform.cli.app import main
sys.argv = ["vgrpo", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
heavy = sorted(m for m in ("torch", "diffusers", "transformers") if m in sys.modules)
assert not heavy, heavy
print("NO_HEAVY_IMPORTS")
"""


def run_cli(*args, code=None):
    cmd = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "vgrpo_platform", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_plugins_does_not_import_torch():
    proc = run_cli("plugins", "--options", code=NO_HEAVY)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith("NO_HEAVY_IMPORTS")


def test_check_toy_recipe_does_not_import_torch():
    reg = default_registry()
    needed = [("adapter", "toy"), ("reward", "brightness"), ("surrogate", "vgrpo")]
    if not all(k in reg for k in needed):
        pytest.skip("the built-in toy plugins are not registered yet")
    proc = run_cli("check", str(TOY_RECIPE), code=NO_HEAVY)
    assert proc.returncode == 0, proc.stderr
    assert "\nok\n" in proc.stdout and proc.stdout.rstrip().endswith("NO_HEAVY_IMPORTS")


def test_console_entry_exit_code_and_single_line():
    proc = run_cli("check", "definitely/missing.toml")
    assert proc.returncode == 2
    assert proc.stderr == "error: recipe file 'definitely/missing.toml' not found; check the path\n"


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (int, "int"),
        (float | None, "float | None"),
        (list[str] | None, "list[str] | None"),
        (typing.Literal["euler", "unipc"], "'euler' | 'unipc'"),
        (typing.Optional[typing.Annotated[float, Field(ge=0)]], "float | None"),  # noqa: UP045
        (tuple[float, float], "tuple[float, float]"),
    ],
)
def test_option_types_are_readable(annotation, expected):
    assert cli._type_str(annotation) == expected


def test_broken_plugin_is_one_line_at_startup(monkeypatch, capsys):
    class BrokenEntryPoint:
        name, value, group = "broken", "broken_mod", "vgrpo"
        dist = types.SimpleNamespace(name="broken-dist")

        def load(self):
            raise ImportError("boom")

    monkeypatch.setattr(cli, "_PM", [])
    monkeypatch.setattr(cli, "_COMMANDS_ADDED", [])
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [BrokenEntryPoint()])
    monkeypatch.setattr(sys, "argv", ["vgrpo", "plugins"])
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == 2
    assert capsys.readouterr().err == (
        "error: plugin 'broken' from distribution 'broken-dist' failed to import: ImportError: boom; "
        "fix or uninstall broken-dist\n"
    )


def _builtin_plugin_commands() -> set[str]:
    """The commands vgrpo's own plugins add (the shapes adapter's ``pretrain-shapes``), as the console
    script adds them, but from this distribution's entry points only (not a test's or another package's)."""
    ours = [ep.load() for ep in importlib.metadata.entry_points(group="vgrpo") if ep.dist.name == "vgrpo"]
    app = typer.Typer()
    build_plugin_manager(load_entry_points=False, extra_plugins=ours).hook.register_commands(app=app)
    return {c.name or c.callback.__name__ for c in app.registered_commands}


def test_docs_cli_md_has_a_section_for_every_command():
    headings = [
        ln for ln in (ROOT / "docs" / "cli.md").read_text().splitlines() if ln.startswith("## `vgrpo ")
    ]
    documented = {ln.split()[2].rstrip("`") for ln in headings}
    commands = {c.name or c.callback.__name__ for c in cli.app.registered_commands}
    groups = {g.name for g in cli.app.registered_groups}  # `vgrpo new reward|adapter`
    plugin_commands = _builtin_plugin_commands()
    assert "new" in groups and "pretrain-shapes" in plugin_commands  # what the scan must see
    missing = sorted((commands | groups | plugin_commands) - documented)
    assert not missing, f"commands without a '## `vgrpo COMMAND ...`' section in docs/cli.md: {missing}"
