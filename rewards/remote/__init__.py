"""Entry module of the ``remote`` reward: scores through a ``vgrpo serve-reward`` server over HTTP.

Why: a reward whose model is large or lives elsewhere (another GPU, another host) runs in its own
process; training only sends the decoded samples. No torch here: the client loads in the factory.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component, PluginConfig


class Config(PluginConfig):
    """Options of ``[rewards.options]`` for ``name = "remote"``."""

    modalities: ClassVar[frozenset[str]] = frozenset({"image", "video", "audio"})  # the server decides

    url: str = Field(
        ...,
        pattern=r"^https?://",
        description="The server's base URL, e.g. http://127.0.0.1:8765 (from `vgrpo serve-reward`).",
    )
    timeout_s: float = Field(60.0, gt=0, description="Seconds to wait for one request's reply.")
    retries: int = Field(
        2,
        ge=0,
        le=10,
        description="Extra tries after a connection failure, a timeout or a 5xx reply (a 4xx is final).",
    )
    backoff_s: float = Field(
        1.0, ge=0, le=60, description="Wait before the first retry; doubles with each further one."
    )
    batch_size: int = Field(0, ge=0, description="Samples per request (0 = the whole batch in one).")
    reward: str | None = Field(
        None,
        description="The reward the server must serve (checked against each reply's 'reward'); "
        "null = whichever it serves.",
    )
    groups: bool = Field(
        False,
        description="The served reward is a group reward (it scores one prompt's whole group per call, "
        "e.g. `diversity`; its /health says `groups: true`): each prompt group goes in one request, never "
        "split by batch_size. A group reward's server refuses requests without it.",
    )
    token_env: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Name of an environment variable holding the server's token (vgrpo serve-reward "
        "--token-env); the token itself never goes in a recipe. null = send none.",
    )


def build(config: Config, context: Any) -> Any:
    """Factory: the HTTP client (and torch) load only when a run builds the reward."""
    from .impl import RemoteReward

    return RemoteReward(config)


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "reward",
            "remote",
            build,
            Config,
            summary="Any reward served by `vgrpo serve-reward`, scored over HTTP.",
        ),
    ]
