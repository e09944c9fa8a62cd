"""The plugin host: loading, provenance, duplicate and typo handling, option validation, the one
registration door (``register_components``) and the deprecated per-kind hooks."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import textwrap
import types
import warnings

import pytest
from pydantic import Field

from vgrpo_platform import hookspecs
from vgrpo_platform.errors import PluginError, RecipeError
from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.host import collect, manager
from vgrpo_platform.host.collect import collect_components, default_registry
from vgrpo_platform.host.components import ComponentRegistry
from vgrpo_platform.host.manager import build_plugin_manager
from vgrpo_platform.registry import KINDS, Component, ComponentSpec, PluginConfig


class ToyConfig(PluginConfig):
    resolution: int = Field(16, ge=4, description="Side of the square image, pixels.")
    channels: int = 3


class EmptyConfig(PluginConfig):
    pass


def toy_factory(config, context):
    return ("built", config, context)


class Offers:
    """A fake plugin offering ``records`` through the one door, reported as ``dist``."""

    def __init__(self, dist, *records):
        self.vgrpo_distribution = dist
        self.records = list(records)

    @hookimpl
    def register_components(self):
        return self.records


def plugin_a():
    """Two components of two kinds from one distribution."""
    return Offers(
        "dist-a",
        Component("adapter", "toy", toy_factory, ToyConfig, summary="a toy adapter"),
        Component("reward", "brightness", toy_factory, EmptyConfig),
    )


def plugin_b():
    return Offers("dist-b", Component("adapter", "toy", toy_factory, ToyConfig))


def plugin_c():
    return Offers(
        "dist-c",
        Component("surrogate", "vgrpo", toy_factory, EmptyConfig, summary="surrogate"),
        Component("adapter", "flux", toy_factory, EmptyConfig),
    )


def registry_of(*plugs) -> ComponentRegistry:
    return collect_components(build_plugin_manager(load_entry_points=False, extra_plugins=plugs))


# --------------------------------------------------------------------------- collecting


def test_components_record_kind_config_summary_and_distribution():
    reg = registry_of(plugin_a(), plugin_c())
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
        registry_of(plugin_a(), plugin_b())
    msg = str(info.value)
    assert "adapter 'toy'" in msg and "'dist-a'" in msg and "'dist-b'" in msg
    assert "\n" not in msg


def test_same_name_in_different_kinds_is_fine():
    reg = registry_of(plugin_a(), Offers("p", Component("reward", "toy", toy_factory, EmptyConfig)))
    assert reg.get("reward", "toy").distribution == "p"
    assert reg.get("adapter", "toy").distribution == "dist-a"


def test_config_must_be_a_plugin_config_subclass():
    from pydantic import BaseModel

    class NotPluginConfig(BaseModel):
        x: int = 1

    bad = Offers("bad-dist", Component("reward", "r", toy_factory, NotPluginConfig))
    with pytest.raises(PluginError, match="not a subclass of vgrpo_platform.registry.PluginConfig") as info:
        registry_of(bad)
    assert "bad-dist" in str(info.value) and "\n" not in str(info.value)


def test_hook_that_raises_is_wrapped_with_its_distribution():
    class Boom:
        vgrpo_distribution = "boom-dist"

        @hookimpl
        def register_components(self):
            raise RuntimeError("kaboom")

    with pytest.raises(PluginError, match=r"'boom-dist' failed in register_components: RuntimeError: kaboom"):
        registry_of(Boom())


def test_hookimpl_without_a_spec_is_refused():
    class Typo:
        vgrpo_distribution = "typo-dist"

        @hookimpl
        def register_component(self):  # missing "s"
            return []

    with pytest.raises(PluginError, match="typo-dist"):
        build_plugin_manager(load_entry_points=False, extra_plugins=[Typo()])


def test_a_hook_returning_none_registers_nothing():
    calls = []

    class Quiet:
        @hookimpl
        def register_components(self):
            calls.append(1)

    reg = registry_of(Quiet())
    assert calls == [1] and list(reg) == []


# --------------------------------------------------------------------------- the one door, through pluggy


def test_components_are_collected_through_pluggy_so_wrappers_and_tracing_see_each_plugin():
    seen = []

    class Observer:
        """Implements only a wrapper: it registers nothing and sees every plugin's call."""

        @hookimpl(wrapper=True)
        def register_components(self):
            records = yield
            seen.append(sorted(c.name for result in records for c in result))
            return records

    pm = build_plugin_manager(load_entry_points=False, extra_plugins=[plugin_a(), plugin_c(), Observer()])
    traced = []
    undo = pm.add_hookcall_monitoring(
        lambda hook_name, impls, kwargs: traced.append((hook_name, [i.plugin_name for i in impls])),
        lambda outcome, hook_name, impls, kwargs: None,
    )
    try:
        reg = collect_components(pm)
    finally:
        undo()
    assert seen == [["brightness", "toy"], ["flux", "vgrpo"]]  # one call per plugin, in order
    calls = [names for hook_name, names in traced if hook_name == "register_components"]
    assert len(calls) == 2 and all(len(names) == 2 for names in calls)  # the plugin and the wrapper
    assert reg.get("adapter", "flux").distribution == "dist-c"


def test_lazy_factory_string_is_imported_on_the_first_build_only(tmp_path, monkeypatch):
    (tmp_path / "lazy_target_mod.py").write_text(
        textwrap.dedent(
            """
            class Built:
                @classmethod
                def make(cls, config, context):
                    return ("lazy", config, context)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lazy_target_mod", raising=False)
    entry = types.ModuleType("lazy_entry")
    entry.register_components = hookimpl(
        lambda: [Component("adapter", "lazy", "lazy_target_mod:Built.make", ToyConfig, "deferred")]
    )
    reg = registry_of(entry)
    spec = reg.get("adapter", "lazy")
    assert "lazy_target_mod" not in sys.modules  # collecting (and `vgrpo plugins`) imports nothing
    assert spec.factory.__module__ == "lazy_entry"  # the conformance kit checks the entry module
    assert spec.summary == "deferred"
    built = reg.build("adapter", "lazy", {}, "ctx")
    assert built == ("lazy", ToyConfig(), "ctx") and "lazy_target_mod" in sys.modules


@pytest.mark.parametrize(
    "record, message",
    [
        (
            Component("model", "m", toy_factory, EmptyConfig),
            "plugin 'bad' from distribution 'bad-dist' returned a component of unknown kind 'model'; "
            "use one of adapter, reward, surrogate, rollout_backend",
        ),
        (
            Component("reward", " r", toy_factory, EmptyConfig),
            "plugin 'bad' from distribution 'bad-dist' registered a reward named ' r'; "
            "use a non-empty string",
        ),
        (
            Component("reward", "r", 42, EmptyConfig),
            "plugin 'bad' from distribution 'bad-dist' registered reward 'r' with a factory "
            "that is not callable",
        ),
        (
            Component("reward", "r", "no_colon.module", EmptyConfig),
            "plugin 'bad' from distribution 'bad-dist' registered reward 'r' with factory 'no_colon.module', "
            "which is not a 'package.module:attribute' string; name the factory as module:attribute or pass "
            "a callable",
        ),
        (
            Component("reward", "r", toy_factory, dict),
            "plugin 'bad' from distribution 'bad-dist' registered reward 'r' with config <class 'dict'>, "
            "which is not a subclass of vgrpo_platform.registry.PluginConfig; derive the Config from "
            "PluginConfig",
        ),
        (
            ("reward", "r", toy_factory, EmptyConfig),
            "plugin 'bad' from distribution 'bad-dist' returned ('reward', 'r', <function toy_factory at",
        ),
    ],
)
def test_bad_record_fields_are_one_line_plugin_errors(record, message):
    bad = Offers("bad-dist", record)
    pm = manager.VgrpoPluginManager()
    pm.add_hookspecs(hookspecs)
    pm.register(bad, name="bad")
    pm.distributions["bad"] = "bad-dist"
    with pytest.raises(PluginError) as info:
        collect_components(pm)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_a_hook_must_return_a_list_of_records():
    class Single:
        vgrpo_distribution = "single-dist"

        @hookimpl
        def register_components(self):
            return Component("reward", "r", toy_factory, EmptyConfig)

    with pytest.raises(
        PluginError, match=r"'single-dist' returned Component from register_components; return a list"
    ):
        registry_of(Single())


# --------------------------------------------------------------------------- the deprecated forms


class OldStyle:
    """A plugin written against the per-kind hooks of the previous release."""

    vgrpo_distribution = "old-dist"

    @hookimpl
    def register_adapters(self, register):
        register("old_toy", toy_factory, ToyConfig, summary="old form")

    @hookimpl
    def register_surrogates(self, register):
        register("old_sur", "lazy_missing_mod:make", EmptyConfig)


def test_old_register_hooks_still_work_and_warn_naming_the_plugin_and_the_new_hook():
    with pytest.warns(DeprecationWarning) as caught:
        reg = registry_of(plugin_a(), OldStyle())
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(messages) == 2
    for hook in ("register_adapters", "register_surrogates"):
        (msg,) = [m for m in messages if f"{hook}(register)" in m]
        assert "'old-dist'" in msg and "register_components()" in msg and "Component" in msg
    spec = reg.get("adapter", "old_toy")
    assert (spec.distribution, spec.summary, spec.factory) == ("old-dist", "old form", toy_factory)
    assert reg.get("surrogate", "old_sur").factory.__name__ == "build_old_sur"  # strings are lazy there too
    assert reg.names("reward") == ["brightness"]  # the new door beside it is untouched


def test_old_register_hook_errors_keep_their_one_line_form():
    class Boom:
        vgrpo_distribution = "boom-dist"

        @hookimpl
        def register_adapters(self, register):
            raise RuntimeError("kaboom")

    with pytest.warns(DeprecationWarning), pytest.raises(PluginError) as info:
        registry_of(Boom())
    assert "'boom-dist' failed in register_adapters: RuntimeError: kaboom; fix or uninstall boom-dist" in str(
        info.value
    )
    with (
        pytest.warns(DeprecationWarning),
        pytest.raises(PluginError, match="by distribution 'x' and by distribution 'old-dist'"),
    ):
        registry_of(
            plugin_a(), OldStyle(), Offers("x", Component("adapter", "old_toy", toy_factory, ToyConfig))
        )


def test_adapter_hook_of_the_previous_release_still_registers_lazily_and_warns():
    from vgrpo_adapters import _entry

    with pytest.warns(
        DeprecationWarning, match="my_entry uses the deprecated vgrpo_adapters._entry.adapter_hook"
    ):
        hook = _entry.adapter_hook("my_entry", ("lazy_toy", "lazy_missing_mod:make", ToyConfig, "s"))
    module = types.ModuleType("my_entry")
    module.register_adapters = hook
    with pytest.warns(DeprecationWarning, match="register_components"):
        spec = registry_of(module).get("adapter", "lazy_toy")
    assert spec.factory.__module__ == "my_entry" and "lazy_missing_mod" not in sys.modules
    with pytest.raises(ModuleNotFoundError, match="lazy_missing_mod"):
        spec.factory(ToyConfig(), None)  # imported only now
    with pytest.warns(DeprecationWarning, match="my_entry uses the deprecated .*deferred_factory"):
        factory = _entry.deferred_factory("my_entry", "x", "lazy_missing_mod:make")
    assert (factory.__module__, factory.__name__) == ("my_entry", "build_x")


@pytest.mark.parametrize(
    "old, new_home",
    [
        ("vgrpo_platform.plugins", "vgrpo_platform.host.collect"),
        ("vgrpo_platform.host.plugins", "vgrpo_platform.host.manager"),
        ("vgrpo_platform.algo.surrogates.plugin", "vgrpo_platform.algo.surrogates.configs"),
        ("vgrpo_platform.rollout_backends.plugin", "vgrpo_platform.rollout_backends.entry"),
    ],
)
def test_old_module_paths_import_with_a_deprecation_warning(monkeypatch, old, new_home):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=new_home.replace(".", r"\.")):
        module = importlib.import_module(old)
    assert module.__name__ == old


def test_the_built_in_entry_modules_use_only_the_new_door():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        reg = default_registry()
    assert {"toy", "shapes"} <= set(reg.names("adapter")) and "in_process" in reg.names("rollout_backend")


# --------------------------------------------------------------------------- lookup and build


def test_unknown_name_suggests_the_close_match_and_lists_installed():
    reg = registry_of(plugin_a(), plugin_c())
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
    reg = registry_of(plugin_a())
    ctx = object()
    built = reg.build("adapter", "toy", {"resolution": 8}, ctx)
    assert built == ("built", ToyConfig(resolution=8), ctx)


def test_option_typo_names_the_toml_path_and_suggests():
    reg = registry_of(plugin_a())
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

    monkeypatch.setattr(manager.importlib.metadata, "entry_points", entry_points)


def test_entry_point_plugins_carry_their_distribution(monkeypatch):
    module = types.ModuleType("fake_plugin_module")
    module.register_components = hookimpl(lambda: [Component("adapter", "toy", toy_factory, ToyConfig)])
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
    module.register_components = hookimpl(lambda: [Component("reward", "r", toy_factory, EmptyConfig)])
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
    assert {n for n, _ in specs} >= {"register_components", "register_commands", "register_adapters"}
    for name, fn in specs:
        assert fn.__doc__ and len(fn.__doc__.strip()) > 20, f"hookspec {name} needs a docstring"


def test_every_registration_hook_is_collected():
    hooks = {collect.HOOK, *collect.LEGACY_HOOKS.values()}
    assert hooks == {n for n, _ in _hookspecs()} - {"register_commands"}
    assert set(collect.LEGACY_HOOKS) == set(KINDS)


# --------------------------------------------------------------------------- the real installed plugins


def test_builtin_plugins_through_entry_points():
    needed = ["vgrpo_adapters.toy", "vgrpo_rewards.toy", "vgrpo_platform.algo.surrogates.entry"]
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
