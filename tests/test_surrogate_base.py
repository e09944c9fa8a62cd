"""``SurrogateBase``: the loop calls every optional hook on every surrogate, a surrogate that writes only
``prepare`` and ``loss`` trains, and a factory that returns anything else stops at start-up in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vgrpo_platform.algo.surrogates.vgrpo import VGRPOSurrogate
from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.errors import PluginError
from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.host.collect import collect_components
from vgrpo_platform.host.manager import build_plugin_manager
from vgrpo_platform.protocols import SurrogateBase
from vgrpo_platform.registry import Component, PluginConfig
from vgrpo_platform.training.loop import Trainer

TOY = Path(__file__).resolve().parents[1] / "recipes" / "toy.toml"
CALLS: list[tuple[str, Any]] = []


class Options(PluginConfig):
    pass


class OnlyPrepareAndLoss(SurrogateBase):
    """V-GRPO's math behind the base's no-op hooks, the calls recorded."""

    def __init__(self) -> None:
        self.inner = VGRPOSurrogate()

    def prepare(self, batch, adapter, generator):
        return self.inner.prepare(batch, adapter, generator)

    def loss(self, batch, adapter):
        return self.inner.loss(batch, adapter)

    def begin_iteration(self, iteration: int) -> None:
        CALLS.append(("begin_iteration", iteration))
        super().begin_iteration(iteration)

    def plan_updates(self, gradient_steps: int) -> None:
        CALLS.append(("plan_updates", gradient_steps))
        super().plan_updates(gradient_steps)

    def after_step(self, adapter: Any) -> None:
        CALLS.append(("after_step", None))
        super().after_step(adapter)


class NotASurrogateBase:
    def prepare(self, batch, adapter, generator):
        raise AssertionError("never built far enough to be called")

    def loss(self, batch, adapter):
        raise AssertionError("never built far enough to be called")


class Plugin:
    @hookimpl
    def register_components(self) -> list[Component]:
        return [
            Component(
                "surrogate", "hooks_recorded", lambda config, context: OnlyPrepareAndLoss(), Options, "test"
            ),
            Component(
                "surrogate", "not_a_base", lambda config, context: NotASurrogateBase(), Options, "test"
            ),
        ]


@pytest.fixture(scope="module")
def registry():
    return collect_components(build_plugin_manager(extra_plugins=[Plugin()]))


def toy(tmp_path: Path, surrogate: str, registry, *extra: str):
    sets = [
        f"run.output_dir={tmp_path.as_posix()!r}",
        f"surrogate.name={surrogate!r}",
        "train.iterations=2",
        "train.gradient_steps_per_iteration=2",
        "eval.every=0",
        "log.checkpoint_every=0",
        "log.progress='none'",
        *extra,
    ]
    return resolve_recipe(TOY, sets, registry=registry)


def test_the_loop_calls_each_hook_on_a_surrogate_that_keeps_the_defaults(tmp_path, registry):
    CALLS.clear()
    Trainer(toy(tmp_path, "hooks_recorded", registry)).run()
    assert CALLS[0] == ("plan_updates", 2)  # once, before training
    begins = [i for name, i in CALLS if name == "begin_iteration"]
    assert begins == [1, 2]
    assert sum(name == "after_step" for name, _ in CALLS) == 4  # two optimiser steps an iteration


def test_a_surrogate_outside_the_base_is_a_one_line_error(tmp_path, registry):
    with pytest.raises(PluginError, match="does not subclass vgrpo_platform.protocols.SurrogateBase") as err:
        Trainer(toy(tmp_path, "not_a_base", registry))
    assert "\n" not in str(err.value) and "not_a_base" in str(err.value)


def test_the_base_rollout_refuses_when_the_surrogate_does_not_own_one():
    surrogate = OnlyPrepareAndLoss()
    assert surrogate.owns_rollout is False and surrogate.initial_noise == "sample"
    with pytest.raises(NotImplementedError, match="owns_rollout = False"):
        surrogate.rollout(None, None, {}, None, None)
