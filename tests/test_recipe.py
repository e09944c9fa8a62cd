"""Recipes: TOML reading, ``--set`` overrides, one-line errors, component resolution, saving."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import Field

from vgrpo_platform.config.recipe import (
    RESOLVED_JSON,
    apply_overrides,
    load_prompts,
    load_recipe,
    load_resolved,
    parse_override,
    resolve_recipe,
    save_resolved,
    validate_components,
)
from vgrpo_platform.config.schema import PromptsSection, Recipe, TrainSection
from vgrpo_platform.errors import RecipeError
from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.host.collect import collect_components
from vgrpo_platform.host.manager import build_plugin_manager
from vgrpo_platform.registry import Component, PluginConfig

GOOD = """
[adapter]
name = "toy"
options = { resolution = 8 }

[[rewards]]
name = "brightness"
weight = 0.5

[prompts]
train = ["a bright image", "a dark image"]

[train]
lr = 3e-4
"""


class ToyConfig(PluginConfig):
    modality: ClassVar[str] = "image"
    resolution: int = Field(16, description="pixels")


class ImageReward(PluginConfig):
    modalities: ClassVar[frozenset[str]] = frozenset({"image"})
    target: float = 1.0


class AudioReward(PluginConfig):
    modalities: ClassVar[frozenset[str]] = frozenset({"audio"})


class SurrogateConfig(PluginConfig):
    n_mc: int = 4


def factory(config, context):
    return config


class TestPlugin:
    vgrpo_distribution = "test-dist"

    @hookimpl
    def register_components(self):
        return [
            Component("adapter", "toy", factory, ToyConfig),
            Component("reward", "brightness", factory, ImageReward),
            Component("reward", "loudness", factory, AudioReward),
            Component("surrogate", "vgrpo", factory, SurrogateConfig),
        ]


@pytest.fixture
def registry():
    return collect_components(build_plugin_manager(load_entry_points=False, extra_plugins=[TestPlugin()]))


def write(tmp_path: Path, text: str, name: str = "r.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(fn, *args, **kwargs) -> str:
    with pytest.raises(RecipeError) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


# --------------------------------------------------------------------------- loading and errors


def test_good_recipe_loads_with_defaults(tmp_path):
    recipe = load_recipe(write(tmp_path, GOOD))
    assert recipe.adapter.options == {"resolution": 8}
    assert recipe.rewards[0].weight == 0.5 and recipe.train.lr == 3e-4
    assert recipe.rollout.group_size == Recipe.model_fields["rollout"].default_factory().group_size


def test_typo_key_names_the_path_suggests_and_lists_valid_keys(tmp_path):
    path = write(tmp_path, GOOD.replace("lr = 3e-4", "lrr = 3e-4"))
    msg = error_of(load_recipe, path)
    assert msg.startswith(f"{path}: unknown key 'train.lrr'; did you mean 'train.lr'?")
    assert msg.endswith(f"Valid keys in [train]: {', '.join(TrainSection.model_fields)}")


def test_key_in_the_wrong_table_points_to_its_home(tmp_path):
    msg = error_of(load_recipe, write(tmp_path, GOOD + "group_size = 4\n"))
    assert "unknown key 'train.group_size'" in msg and "'group_size' belongs in [rollout]" in msg


def test_typo_in_array_of_tables(tmp_path):
    msg = error_of(load_recipe, write(tmp_path, GOOD.replace("weight = 0.5", "wieght = 0.5")))
    assert "unknown key 'rewards.0.wieght'; did you mean 'rewards.0.weight'?" in msg
    assert "Valid keys in [[rewards]]: name, options, weight" in msg


def test_typo_at_the_top_level(tmp_path):
    msg = error_of(load_recipe, write(tmp_path, "[rolout]\nsteps = 3\n" + GOOD))
    assert "unknown key 'rolout'; did you mean 'rollout'? Valid keys at the top level: run, adapter" in msg


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('lr = "abc"', "train.lr: expected a number, got 'abc'"),
        ("iterations = 2.5", "train.iterations: expected an integer, got 2.5"),
        (
            'gradient_checkpointing = "maybe"',
            "train.gradient_checkpointing: expected true or false, got 'maybe'",
        ),
        ("lora_targets = 3", "train.lora_targets: expected an array, got 3"),
        ('finetune = "qlora"', "train.finetune: expected one of 'lora' or 'full', got 'qlora'"),
        ("iterations = 0", "train.iterations: expected greater than or equal to 1, got 0"),
    ],
)
def test_wrong_types_say_what_was_expected(tmp_path, line, expected):
    msg = error_of(load_recipe, write(tmp_path, GOOD.replace("lr = 3e-4", line)))
    assert msg.startswith(f"{tmp_path / 'r.toml'}: {expected}"), msg


def test_missing_required_key_and_table(tmp_path):
    msg = error_of(load_recipe, write(tmp_path, GOOD.replace('name = "toy"', "options2 = 1")))
    assert "unknown key 'adapter.options2'" in msg and "(and 1 more problem)" in msg
    msg = error_of(load_recipe, write(tmp_path, GOOD.replace('name = "toy"\n', "")))
    assert msg.endswith("missing required key 'adapter.name'; add it to [adapter]")
    no_adapter = GOOD.split("[[rewards]]")[1]
    msg = error_of(load_recipe, write(tmp_path, "[[rewards]]" + no_adapter))
    assert msg.endswith("missing required table [adapter]; add it")
    msg = error_of(load_recipe, write(tmp_path, "rewards = []\n" + GOOD.split("[[rewards]]")[0]))
    assert msg.endswith("rewards: needs at least 1 entry, got 0")


def test_malformed_toml_gives_file_line_and_parser_message(tmp_path):
    path = write(tmp_path, '[adapter]\nname = "toy"\nthis is not toml\n')
    msg = error_of(load_recipe, path)
    assert msg.startswith(f"{path}:3:") and "invalid TOML" in msg and "fix the syntax" in msg


def test_missing_recipe_file(tmp_path):
    msg = error_of(load_recipe, tmp_path / "nope.toml")
    assert msg == f"recipe file '{tmp_path / 'nope.toml'}' not found; check the path"


# --------------------------------------------------------------------------- overrides


@pytest.mark.parametrize(
    ("text", "path", "value"),
    [
        ("train.lr=1e-5", ["train", "lr"], 1e-5),
        ("rewards.0.weight=2", ["rewards", "0", "weight"], 2),
        ('prompts.train=["a","b"]', ["prompts", "train"], ["a", "b"]),
        ("rollout.sampler=dpmsolver++", ["rollout", "sampler"], "dpmsolver++"),
        ('run.name="x = y"', ["run", "name"], "x = y"),
        ("run.name=hello world", ["run", "name"], "hello world"),
        ("run.name=2024-01-01", ["run", "name"], "2024-01-01"),
        ("train.gradient_checkpointing=true", ["train", "gradient_checkpointing"], True),
        ("adapter.options={ a = 1 }", ["adapter", "options"], {"a": 1}),
        ("run.name=", ["run", "name"], ""),
    ],
)
def test_parse_override(text, path, value):
    assert parse_override(text) == (path, value)
    assert type(parse_override(text)[1]) is type(value)


@pytest.mark.parametrize("bad", ["train.lr", "=3", "train..lr=3", ".x=1"])
def test_malformed_override(bad):
    assert "expected KEY.PATH=VALUE" in error_of(parse_override, bad)


def test_overrides_index_arrays_create_tables_and_leave_the_input_alone():
    data = {"rewards": [{"name": "a"}], "train": {"lr": 1.0}}
    out = apply_overrides(
        data,
        ["rewards.0.weight=2", "rewards.1.name=b", "adapter.options.resolution=8", "train.lr=0.5"],
    )
    assert out == {
        "rewards": [{"name": "a", "weight": 2}, {"name": "b"}],
        "train": {"lr": 0.5},
        "adapter": {"options": {"resolution": 8}},
    }
    assert data == {"rewards": [{"name": "a"}], "train": {"lr": 1.0}}  # not mutated


def test_bad_override_paths():
    data = {"rewards": [{"name": "a"}], "train": {"lr": 1.0}}
    assert "index it with a number" in error_of(apply_overrides, data, ["rewards.weight=2"])
    assert "'rewards' has 1 entries" in error_of(apply_overrides, data, ["rewards.5.weight=2"])
    assert "'train.lr' is 1.0, not a table" in error_of(apply_overrides, data, ["train.lr.x=2"])


@given(
    st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=4),
    st.one_of(st.integers(-(10**6), 10**6), st.booleans(), st.text("xyz ", min_size=1, max_size=5)),
)
def test_override_round_trip(path, value):
    """Setting then reading back a path gives the value, for any depth (an independent walk)."""
    raw = json.dumps(value) if not isinstance(value, bool) else str(value).lower()
    out = apply_overrides({}, [f"{'.'.join(path)}={raw}"])
    node = out
    for part in path:
        node = node[part]
    assert node == value


def test_overrides_are_applied_before_validation(tmp_path):
    path = write(tmp_path, GOOD.replace("lr = 3e-4", 'lr = "abc"'))
    error_of(load_recipe, path)
    recipe = load_recipe(path, ["train.lr=1e-5", "rewards.0.weight=2", 'prompts.train=["a","b","c"]'])
    assert recipe.train.lr == 1e-5 and recipe.rewards[0].weight == 2.0
    assert recipe.prompts.train == ["a", "b", "c"]
    msg = error_of(load_recipe, write(tmp_path, GOOD), ["train.lrr=1"])
    assert "unknown key 'train.lrr'; did you mean 'train.lr'?" in msg


# --------------------------------------------------------------------------- prompts


def test_load_prompts_txt_and_jsonl(tmp_path):
    (tmp_path / "p.txt").write_text("# comment\none\n\n  two  \n#x\n")
    (tmp_path / "e.jsonl").write_text('{"prompt": "three"}\n\n{"prompt": "four", "seed": 1}\n')
    section = PromptsSection(train=["zero"], train_file="p.txt", eval_file="e.jsonl")
    assert load_prompts(section, tmp_path) == (["zero", "one", "two"], ["three", "four"])
    assert load_prompts(PromptsSection(train=["a"]), tmp_path) == (["a"], ["a"])


def test_prompt_file_errors(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"prompt": "ok"}\n{"text": "no"}\n')
    msg = error_of(load_prompts, PromptsSection(train_file="bad.jsonl"), tmp_path)
    assert msg.startswith(f'{tmp_path / "bad.jsonl"}:2: expected an object with a "prompt" string')
    (tmp_path / "broken.jsonl").write_text("{oops\n")
    assert ":1: invalid JSON" in error_of(load_prompts, PromptsSection(train_file="broken.jsonl"), tmp_path)
    assert "use a .txt or .jsonl" in error_of(load_prompts, PromptsSection(train_file="p.csv"), tmp_path)
    msg = error_of(load_prompts, PromptsSection(eval_file="missing.txt"), tmp_path)
    assert msg.startswith("prompts.eval_file: prompt file") and "not found" in msg


# --------------------------------------------------------------------------- components


def test_validate_components_resolves_everything(tmp_path, registry):
    text = GOOD + '\n[[rewards]]\nname = "brightness"\noptions = { target = 0.2 }\nweight = -1\n'
    resolved = resolve_recipe(write(tmp_path, text), ["adapter.options.resolution=4"], registry=registry)
    assert resolved.adapter.config == ToyConfig(resolution=4)
    assert resolved.adapter.spec is registry.get("adapter", "toy")
    assert resolved.surrogate.config == SurrogateConfig()
    assert [(r.key, r.weight, r.config) for r in resolved.rewards] == [
        ("brightness_0", 0.5, ImageReward()),
        ("brightness_1", -1.0, ImageReward(target=0.2)),
    ]
    assert resolved.train_prompts == ["a bright image", "a dark image"] == resolved.eval_prompts
    assert resolved.recipe_dir == tmp_path.resolve()
    assert resolved.adapter.build("ctx") == ToyConfig(resolution=4)


def test_plugin_option_typo_reports_its_path(tmp_path, registry):
    path = write(tmp_path, GOOD.replace("resolution = 8", "resolutoin = 8"))
    msg = error_of(resolve_recipe, path, registry=registry)
    assert msg.startswith(
        f"{path}: unknown key 'adapter.options.resolutoin'; did you mean 'adapter.options.resolution'?"
    )
    msg = error_of(resolve_recipe, path, ["rewards.0.options.targt=1"], registry=registry)
    assert "unknown key 'adapter.options.resolutoin'" in msg  # the adapter is checked first
    path = write(tmp_path, GOOD)
    msg = error_of(resolve_recipe, path, ["rewards.0.options.targt=1"], registry=registry)
    assert "unknown key 'rewards.0.options.targt'; did you mean 'rewards.0.options.target'?" in msg


def test_unknown_component_names_its_recipe_path(tmp_path, registry):
    msg = error_of(resolve_recipe, write(tmp_path, GOOD), ["rewards.0.name=brightnes"], registry=registry)
    assert "rewards.0.name: unknown reward 'brightnes'; did you mean 'brightness'?" in msg
    msg = error_of(resolve_recipe, write(tmp_path, GOOD), ["surrogate.name=flow_grpo"], registry=registry)
    assert "surrogate.name: unknown surrogate 'flow_grpo'. Installed: vgrpo." in msg


def test_cross_checks(tmp_path, registry):
    path = write(tmp_path, GOOD)
    msg = error_of(resolve_recipe, path, ["prompts.train_file=prompts/train.txt"], registry=registry)
    assert msg.startswith(
        f"{path}: prompts.train_file: prompt file '{tmp_path.resolve() / 'prompts/train.txt'}'"
    )
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "train.txt").write_text("from a file\n")
    resolved = resolve_recipe(path, ["prompts.train_file=prompts/train.txt"], registry=registry)
    assert resolved.train_prompts[-1] == "from a file"
    msg = error_of(resolve_recipe, path, ["prompts.train=[]"], registry=registry)
    assert "no train prompts" in msg
    msg = error_of(resolve_recipe, path, ["rewards.1.name=loudness"], registry=registry)
    assert "rewards.1: reward 'loudness' scores audio but adapter 'toy' makes image" in msg


def test_validate_components_without_a_file(registry):
    recipe = Recipe.model_validate(
        {
            "adapter": {"name": "toy"},
            "rewards": [{"name": "brightness"}],
            "prompts": {"train": ["x"]},
        }
    )
    resolved = validate_components(recipe, registry)
    assert [r.key for r in resolved.rewards] == ["brightness"] and resolved.path is None


# --------------------------------------------------------------------------- saving


def test_save_and_load_resolved(tmp_path, registry):
    resolved = resolve_recipe(write(tmp_path, GOOD), ["train.grad_clip=nan"], registry=registry)
    resolved.recipe.train.grad_clip = None  # TOML cannot say this; JSON keeps it
    run_dir = tmp_path / "runs" / "x"
    out = save_resolved(resolved, run_dir)
    assert out == run_dir / RESOLVED_JSON
    assert load_resolved(run_dir) == resolved.recipe
    copy = (run_dir / "recipe.toml").read_text()
    assert "# --set train.grad_clip=nan" in copy and copy.endswith(GOOD)
    save_resolved(resolved.recipe, tmp_path / "plain")
    assert load_resolved(tmp_path / "plain" / RESOLVED_JSON) == resolved.recipe
    assert not (tmp_path / "plain" / "recipe.toml").exists()
    assert "is this a vgrpo run directory" in error_of(load_resolved, tmp_path / "empty")
