"""The hooks a vgrpo plugin may implement.

Every hook receives a ``register`` callable: the plugin says *what* it offers, the host decides
*how* it is stored (it records the providing distribution, refuses duplicate names and keeps the
component's config model so ``vgrpo plugins`` can print its options). Plugin entry modules must
stay cheap to import: import torch and model code lazily inside the factory.
"""

from __future__ import annotations

import pluggy

PROJECT_NAME = "vgrpo"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def register_adapters(register):  # noqa: ANN001 - pluggy passes the host's Register callable
    """Register model adapters (policies).

    Call ``register(name, factory, config, summary=...)`` once per adapter. ``config`` is a
    ``vgrpo_platform.registry.PluginConfig`` subclass validating ``[adapter.options]``;
    ``factory(config, context)`` returns an object satisfying ``vgrpo_platform.protocols.Adapter``.
    """


@hookspec
def register_rewards(register):  # noqa: ANN001
    """Register reward functions.

    Call ``register(name, factory, config, summary=...)``; ``factory(config, context)`` returns an
    object satisfying ``vgrpo_platform.protocols.Reward``. ``config`` validates one
    ``[[rewards]].options`` table.
    """


@hookspec
def register_surrogates(register):  # noqa: ANN001
    """Register policy-likelihood surrogates (V-GRPO and the baselines).

    Call ``register(name, factory, config, summary=...)``; ``factory(config, context)`` returns an
    instance of a ``vgrpo_platform.protocols.SurrogateBase`` subclass (``prepare``, ``loss`` and the
    optional hooks). ``config`` validates ``[surrogate.options]``.
    """


@hookspec
def register_rollout_backends(register):  # noqa: ANN001
    """Register rollout backends: where training rollouts' final latents come from.

    Call ``register(name, factory, config, summary=...)``; ``factory(config, context)`` returns a
    ``vgrpo_platform.rollout_backends.contract.RolloutBackend``. ``config`` validates
    ``[rollout.backend_options]`` and carries two class attributes read without building it: ``exact``
    (bit-identical to the trainer's own sampler) and ``overlaps`` (can generate during an update).
    """


@hookspec
def register_commands(app):  # noqa: ANN001
    """Add sub-commands to the ``vgrpo`` command line; ``app`` is the root ``typer.Typer``."""
