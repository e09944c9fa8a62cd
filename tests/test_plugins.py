"""The plugin host: loading, provenance, duplicate and typo handling, option validation."""

from __future__ import annotations

import importlib.util
import inspect
import types

import pytest
from pydantic import Field

from vgrpo_platform import hookspecs
from vgrpo_platform.errors import PluginError, RecipeError
from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.host import plugins
from vgrpo_platform.host.plugins import (
    ComponentRegistry,
    build_plugin_manager,
    collect_components,
    default_registry,
)
from vgrpo_platform.registry import ComponentSpec, PluginConfig


class ToyConfig(PluginConfig):
    resolution: int = Field(16, ge=4, description="Side of the square image, pixels.")
    channels: int = 3


class EmptyConfig(PluginConfig):
    pass


def toy_factory(config, context):
    return ("built", config, context)


class PluginA:
    vgrpo_distribution = "dist-a"

    @hookimpl
    def register_adapters(self, register):
        register("toy", toy_factory, ToyConfig, summary="a toy adapter")

    @hookimpl
    def register_rewards(self, register):
        register("brightness", toy_factory, EmptyConfig)


class PluginB:
    vgrpo_distribution = "dist-b"

    # intended copy of tests/test_plugins.py (PluginA): each fake plugin registers its own parts
    @hookimpl
    def register_adapters(self, register):
        register("toy", toy_factory, ToyConfig)


class PluginC:
    vgrpo_distribution = "dist-c"

    @hookimpl
    def register_surrogates(self, register):
        register("vgrpo", toy_factory, EmptyConfig, summary="surrogate")

    @hookimpl
    def register_adapters(self, register):
        register("flux", toy_factory, EmptyConfig)


def registry_of(*plugs) -> ComponentRegistry:
    return collect_components(build_plugin_manager(load_entry_points=False, extra_plugins=plugs))


# --------------------------------------------------------------------------- collecting


def test_components_record_kind_config_summary_and_distribution():
    reg = registry_of(PluginA(), PluginC())
    spec = reg.get("adapter", "toy")
    assert spec == ComponentSpec("adapter", "toy", toy_factory, ToyConfig, "a toy adapter", "dist-a")
    assert reg.get("surrogate", "vgrpo").distribution == "dist-c"
    assert reg.get("reward", "brightness").summary == ""
    assert reg.names("adapter") == ["flux", "toy"]
    assert [(s.kind, s.name) for s in reg] == [
        ("adapter", "flux"),
        ("adapter", "toy"),
        ("reward", "brightness"),
        ("surrogate", "vgrpo"),
    ]
    assert ("adapter", "toy") in reg and ("reward", "toy") not in reg


def test_duplicate_component_names_both_distributions():
    with pytest.raises(PluginError) as info:
        registry_of(PluginA(), PluginB())
    msg = str(info.value)
    assert "adapter 'toy'" in msg and "'dist-a'" in msg and "'dist-b'" in msg
    assert "\n" not in msg


def test_same_name_in_different_kinds_is_fine():
    class P:
        vgrpo_distribution = "p"

        @hookimpl
        def register_rewards(self, register):
            register("toy", toy_factory, EmptyConfig)

    reg = registry_of(PluginA(), P())
    assert reg.get("reward", "toy").distribution == "p"
    assert reg.get("adapter", "toy").distribution == "dist-a"


def test_config_must_be_a_plugin_config_subclass():
    from pydantic import BaseModel

    class NotPluginConfig(BaseModel):
        x: int = 1

    class Bad:
        vgrpo_distribution = "bad-dist"

        @hookimpl
        def register_rewards(self, register):
            register("r", toy_factory, NotPluginConfig)

    with pytest.raises(PluginError, match="not a subclass of vgrpo_platform.registry.PluginConfig") as info:
        registry_of(Bad())
    assert "bad-dist" in str(info.value)


def test_hook_that_raises_is_wrapped_with_its_distribution():
    class Boom:
        vgrpo_distribution = "boom-dist"

        @hookimpl
        def register_adapters(self, register):
            raise RuntimeError("kaboom")

    with pytest.raises(PluginError, match=r"'boom-dist' failed in register_adapters: RuntimeError: kaboom"):
        registry_of(Boom())


def test_hookimpl_without_a_spec_is_refused():
    class Typo:
        vgrpo_distribution = "typo-dist"

        @hookimpl
        def register_adapter(self, register):  # missing "s"
            pass

    with pytest.raises(PluginError, match="typo-dist"):
        build_plugin_manager(load_entry_points=False, extra_plugins=[Typo()])


def test_hookimpl_may_omit_the_register_argument():
    calls = []

    class Quiet:
        @hookimpl
        def register_rewards(self):
            calls.append(1)

    reg = registry_of(Quiet())
    assert calls == [1] and reg.names("reward") == []


# --------------------------------------------------------------------------- lookup and build


def test_unknown_name_suggests_the_close_match_and_lists_installed():
    reg = registry_of(PluginA(), PluginC())
    with pytest.raises(PluginError) as info:
        reg.get("adapter", "toyy")
    assert str(info.value) == (
        "unknown adapter 'toyy'; did you mean 'toy'? Installed: flux, toy. Run `vgrpo plugins` to list them."
    )
    with pytest.raises(PluginError) as info:
        reg.get("adapter", "wan")
    assert "did you mean" not in str(info.value) and "Installed: flux, toy." in str(info.value)
    with pytest.raises(PluginError, match="Installed: no rewards"):
        registry_of().get("reward", "brightness")
    with pytest.raises(ValueError):
        reg.get("model", "toy")


def test_build_validates_options_then_calls_the_factory():
    reg = registry_of(PluginA())
    ctx = object()
    built = reg.build("adapter", "toy", {"resolution": 8}, ctx)
    assert built == ("built", ToyConfig(resolution=8), ctx)


def test_option_typo_names_the_toml_path_and_suggests():
    reg = registry_of(PluginA())
    with pytest.raises(RecipeError) as info:
        reg.build("adapter", "toy", {"resolutoin": 8}, None)
    msg = str(info.value)
    assert "unknown key 'adapter.options.resolutoin'" in msg
    assert "did you mean 'adapter.options.resolution'?" in msg
    assert f"Valid keys in [adapter.options]: {', '.join(ToyConfig.model_fields)}" in msg
    with pytest.raises(RecipeError, match=r"^r.toml: rewards\.2\.options\.resolution: expected an integer"):
        reg.validate_options(
            "adapter", "toy", {"resolution": "big"}, where="rewards.2.options", source="r.toml"
        )
    with pytest.raises(RecipeError, match=r"adapter\.options\.resolution: .*greater than or equal to 4"):
        reg.validate_options("adapter", "toy", {"resolution": 2})


# --------------------------------------------------------------------------- entry points


class FakeDist:
    def __init__(self, name):
        self.name = name


class FakeEntryPoint:
    def __init__(self, name, dist, target=None, error=None, value=None):
        self.name, self.dist, self._target, self._error = name, FakeDist(dist), target, error
        self.value = value or f"{dist}.module"
        self.group = "vgrpo"

    def load(self):
        if self._error is not None:
            raise self._error
        return self._target


def fake_entry_points(monkeypatch, eps):
    def entry_points(**kwargs):
        assert kwargs == {"group": "vgrpo"}
        return list(eps)

    monkeypatch.setattr(plugins.importlib.metadata, "entry_points", entry_points)


def test_entry_point_plugins_carry_their_distribution(monkeypatch):
    module = types.ModuleType("fake_plugin_module")
    module.register_adapters = hookimpl(lambda register: register("toy", toy_factory, ToyConfig))
    fake_entry_points(monkeypatch, [FakeEntryPoint("fake", "fake-dist", target=module)])
    reg = collect_components(build_plugin_manager())
    assert reg.get("adapter", "toy").distribution == "fake-dist"


def test_failing_import_is_wrapped_with_the_distribution(monkeypatch):
    err = ImportError("No module named 'torchh'")
    fake_entry_points(monkeypatch, [FakeEntryPoint("broken", "broken-dist", error=err)])
    with pytest.raises(PluginError) as info:
        build_plugin_manager()
    assert str(info.value) == (
        "plugin 'broken' from distribution 'broken-dist' failed to import: "
        "ImportError: No module named 'torchh'; fix or uninstall broken-dist"
    )
    assert info.value.__cause__ is err


def test_duplicate_entry_point_names_are_refused(monkeypatch):
    a, b = types.ModuleType("a_mod"), types.ModuleType("b_mod")
    fake_entry_points(
        monkeypatch,
        [
            FakeEntryPoint("same", "dist-one", target=a),
            FakeEntryPoint("same", "dist-two", target=b),
        ],
    )
    with pytest.raises(PluginError, match="'same'.*'dist-one' and 'dist-two'"):
        build_plugin_manager()


def test_the_same_install_seen_twice_is_loaded_once(monkeypatch):
    module = types.ModuleType("once")
    module.register_rewards = hookimpl(lambda register: register("r", toy_factory, EmptyConfig))
    ep = FakeEntryPoint("once", "d", target=module)
    fake_entry_points(monkeypatch, [ep, FakeEntryPoint("once", "d", target=module, value=ep.value)])
    assert collect_components(build_plugin_manager()).names("reward") == ["r"]


def test_entry_points_are_skipped_on_request(monkeypatch):
    fake_entry_points(monkeypatch, [FakeEntryPoint("broken", "broken-dist", error=ImportError("x"))])
    with pytest.raises(PluginError, match="broken-dist"):
        build_plugin_manager()  # loading it fails, naming its distribution...
    pm = build_plugin_manager(load_entry_points=False)  # ...and skipping entry points never touches it
    assert pm.get_plugin("broken") is None


# --------------------------------------------------------------------------- hookspecs


def _hookspecs():
    return [
        (name, fn)
        for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
        if hasattr(fn, f"{hookspecs.PROJECT_NAME}_spec")
    ]


def test_every_hookspec_has_a_docstring():
    specs = _hookspecs()
    assert {n for n, _ in specs} >= {
        "register_adapters",
        "register_rewards",
        "register_surrogates",
        "register_commands",
    }
    for name, fn in specs:
        assert fn.__doc__ and len(fn.__doc__.strip()) > 20, f"hookspec {name} needs a docstring"


def test_every_registration_hook_is_collected():
    assert set(plugins.HOOKS.values()) == {n for n, _ in _hookspecs()} - {"register_commands"}


# --------------------------------------------------------------------------- the real installed plugins


def test_builtin_plugins_through_entry_points():
    needed = ["vgrpo_adapters.toy", "vgrpo_rewards.toy", "vgrpo_platform.algo.surrogates.plugin"]
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    assert not missing, f"{missing} not importable: install the project with pip install -e '.[test]'"
    reg = default_registry()
    assert "toy" in reg.names("adapter") and "vgrpo" in reg.names("surrogate"), (
        "the built-ins are not registered through the vgrpo entry points: rerun pip install -e '.[test]'"
    )
    for kind, name in [("adapter", "toy"), ("surrogate", "vgrpo")]:
        spec = reg.get(kind, name)
        assert spec.distribution == "vgrpo", spec
        assert issubclass(spec.config, PluginConfig)
