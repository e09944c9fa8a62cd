"""The reward half of the conformance kit: ``check_reward``, ``example_samples`` and their checks."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from vgrpo_platform.testing.common import (
    DEFAULT_PROMPTS,
    REWARD_CHECKS,
    ConformanceReport,
    _close,
    _open_run,
)


def example_samples(modality: str, batch: int = 6, seed: int = 0) -> Any:
    """Varied ``protocols.Samples`` of a known modality (flat colours, noise, halves), or None.

    Audio clips last 0.5 s (BS.1770 loudness needs one 0.4 s gating block) and every third one falls
    silent halfway, so level-based rewards (loudness, silence ratio) see different inputs too."""
    import torch

    from vgrpo_platform.protocols import Samples

    g = torch.Generator().manual_seed(seed)
    if modality in ("image", "video"):
        side = 32
        colours = torch.tensor(
            [[0, 0, 0], [1, 1, 1], [1, 0, 0], [0, 0, 1], [0, 1, 0], [1, 1, 0]], dtype=torch.float32
        )
        images = []
        for i in range(batch):
            kind = i % 8
            if kind < 4:  # flat colour
                img = colours[i % len(colours)].reshape(3, 1, 1).expand(3, side, side).clone()
            elif kind < 6:  # noise
                img = torch.rand((3, side, side), generator=g)
            else:  # two halves of different colours
                img = colours[2].reshape(3, 1, 1).expand(3, side, side).clone()
                img[:, :, side // 2 :] = colours[3 + (kind - 6)].reshape(3, 1)
            images.append(img)
        data = torch.stack(images)  # [B, 3, H, W]
        if modality == "image":
            return Samples("image", data)
        frames = torch.stack([data.roll(f, dims=-1) for f in range(4)], dim=1)  # [B, F, 3, H, W]
        return Samples("video", frames, fps=8.0)
    if modality == "audio":
        rate, n = 16000, 8000
        time = torch.arange(n) / rate
        rows = [
            torch.sin(2 * torch.pi * 110 * (i + 1) * time) * (0.2 + 0.1 * i)
            if i % 3
            else 0.5 * torch.randn(n, generator=g).clamp(-2, 2) / 2
            for i in range(batch)
        ]
        for i in range(2, batch, 3):  # a sound that stops halfway
            rows[i] = torch.cat([rows[i][: n // 2], torch.zeros(n - n // 2)])
        return Samples("audio", torch.stack(rows).unsqueeze(1), sample_rate=rate)  # [B, 1, S]
    return None


def _score(
    reward: Any, samples: Any, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
) -> tuple[Any, dict[str, Any]]:
    """``(score [B], diagnostics)`` from either return form of ``Reward.score``."""
    out = reward.score(samples, list(prompts), list(metadata))
    if isinstance(out, Mapping):
        assert "score" in out, f"score returned a mapping without a 'score' entry (keys {sorted(out)})"
        return out["score"], {k: v for k, v in out.items() if k != "score"}
    return out, {}


def _slice(samples: Any, index: Any) -> Any:
    """The rows at ``index``, a video's soundtrack with them (``Samples.select``; a plugin's own
    samples-like object without it is sliced through ``data``)."""
    import dataclasses

    if hasattr(samples, "select"):
        return samples.select(index)
    return dataclasses.replace(samples, data=samples.data[index])


def check_reward(
    reward: Any,
    config: Any = None,
    context: Any = None,
    *,
    entry_module: str | None = None,
    samples: Any = None,
    prompts: Sequence[str] | None = None,
    metadata: Sequence[Mapping[str, Any]] | None = None,
    checks: Iterable[str] | None = None,
    atol: float = 1e-4,
    label: str | None = None,
) -> ConformanceReport:
    """Check a reward against ``protocols.Reward``; raise ``AssertionError`` listing what fails.

    ``reward`` is a factory ``factory(config, context)`` or a built reward. ``samples`` (a
    ``protocols.Samples``, at least 2 different items) is scored; default: varied samples of each
    declared modality the kit can make (image, video, audio); pass your own for other modalities.
    ``prompts`` (cycled to one per sample; default ``DEFAULT_PROMPTS``) and ``metadata`` (one per
    sample) go to ``score``. A group reward (``groups = True``) is handed the samples as one prompt's
    group (every row gets the first prompt), and ``batch_consistent`` checks instead that reordering
    the group's rows reorders its scores the same way (a group has no row order).
    """
    from vgrpo_platform.protocols import BuildContext

    context = context if context is not None else BuildContext()
    run, config, is_factory = _open_run(
        "reward", reward, "score", config, checks, REWARD_CHECKS, entry_module, label
    )
    state: dict[str, Any] = {}

    def attributes() -> None:
        if is_factory:
            assert config is not None, "pass config= (the factory's PluginConfig) with a factory"
            state["reward"] = reward(config, context)
        else:
            state["reward"] = reward
        _reward_attributes(state["reward"], config)

    run("attributes", attributes)
    r = state.get("reward")
    if r is None or "attributes" in run.failures:
        return run.finish()
    suites = [samples] if samples is not None else [example_samples(m) for m in sorted(r.modalities)]
    suites = [s for s in suites if s is not None]
    if not suites:
        for name in REWARD_CHECKS[3:]:
            run(name, lambda: f"pass samples= for modality {'/'.join(sorted(r.modalities))}")
        return run.finish()
    for s in suites:
        assert len(s) >= 2, "pass at least 2 samples"
    grouped = getattr(r, "groups", False) is True
    args = []
    for s in suites:
        pool = list(prompts) if prompts is not None else list(DEFAULT_PROMPTS)
        p = [pool[0 if grouped else i % len(pool)] for i in range(len(s))]  # cycled; one prompt per group
        m = list(metadata) if metadata is not None else [{} for _ in range(len(s))]
        assert len(m) == len(s), f"{len(s)} samples need {len(s)} metadata entries, got {len(m)}"
        args.append((s, p, m))
    run("score", lambda: _each(args, lambda s, p, m: _reward_score(r, s, p, m, state)))
    run(
        "score_deterministic",
        lambda: _each(args, lambda s, p, m: _reward_deterministic(r, s, p, m, atol)),
        needs=["score"],
    )
    run(
        "batch_consistent",
        lambda: _each(
            args,
            lambda s, p, m: (_reward_group_order if grouped else _reward_batch)(r, s, p, m, atol),
        ),
        needs=["score"],
    )
    run(
        "responds_to_input",
        lambda: _each(args, lambda s, p, m: _reward_responds(r, s, p, m)),
        needs=["score"],
    )
    run("input_unchanged", lambda: _each(args, lambda s, p, m: _reward_pure(r, s, p, m)), needs=["score"])
    return run.finish()


def _each(args: list[tuple[Any, list[str], list[Any]]], fn: Callable[..., None]) -> None:
    for s, p, m in args:
        try:
            fn(s, p, m)
        except AssertionError as exc:
            raise AssertionError(f"{s.modality}: {exc}") from None


def _reward_attributes(reward: Any, config: Any) -> None:
    from vgrpo_platform.protocols import Reward

    assert isinstance(reward, Reward), "the reward lacks `modalities` or `score` of protocols.Reward"
    mods = reward.modalities
    assert isinstance(mods, frozenset) and mods and all(isinstance(m, str) for m in mods), (
        f"modalities must be a non-empty frozenset of strings, got {mods!r}"
    )
    groups = getattr(reward, "groups", False)
    assert isinstance(groups, bool), f"groups must be True (a group reward) or False, got {groups!r}"
    declared = getattr(config, "modalities", None)
    assert declared is None or set(declared) == set(mods), (
        f"the Config declares modalities {sorted(declared)} but the reward scores {sorted(mods)}"
    )


def _reward_score(
    reward: Any, samples: Any, prompts: list[str], metadata: list[Any], state: dict[str, Any]
) -> None:
    import torch

    score, details = _score(reward, samples, prompts, metadata)
    b = len(samples)
    assert isinstance(score, torch.Tensor), f"score is {type(score).__name__}, not a tensor"
    assert score.shape == (b,), f"score has shape {tuple(score.shape)}, expected ({b},)"
    assert score.is_floating_point(), f"score must be floating point, got {score.dtype}"
    assert bool(torch.isfinite(score).all()), f"score has non-finite values: {score.tolist()}"
    for key, value in details.items():
        value = torch.as_tensor(value)
        assert value.shape == (b,), f"diagnostic {key!r} has shape {tuple(value.shape)}, expected ({b},)"


def _reward_deterministic(
    reward: Any, samples: Any, prompts: list[str], metadata: list[Any], atol: float
) -> None:
    a, _ = _score(reward, samples, prompts, metadata)
    b, _ = _score(reward, samples, prompts, metadata)
    _close(a, b, atol, "scoring the same batch twice")


def _reward_batch(reward: Any, samples: Any, prompts: list[str], metadata: list[Any], atol: float) -> None:
    import torch

    full, _ = _score(reward, samples, prompts, metadata)
    one = [
        _score(reward, _slice(samples, slice(i, i + 1)), prompts[i : i + 1], metadata[i : i + 1])[0]
        for i in range(len(samples))
    ]
    _close(
        full.reshape(-1),
        torch.cat([o.reshape(-1) for o in one]),
        atol,
        "a batch's scores vs. scoring items one by one",
    )


def _reward_group_order(
    reward: Any, samples: Any, prompts: list[str], metadata: list[Any], atol: float
) -> None:
    import torch

    full, _ = _score(reward, samples, prompts, metadata)
    order = torch.arange(len(samples)).roll(1)  # every row moves
    moved, _ = _score(
        reward,
        _slice(samples, order),
        [prompts[i] for i in order],
        [metadata[i] for i in order],
    )
    _close(
        torch.as_tensor(full).reshape(-1)[order],
        torch.as_tensor(moved).reshape(-1),
        atol,
        "a group's scores vs. scoring its rows in another order",
    )


def _reward_responds(reward: Any, samples: Any, prompts: list[str], metadata: list[Any]) -> None:
    score, _ = _score(reward, samples, prompts, metadata)
    spread = float(score.max() - score.min())
    assert spread > 1e-6, (
        f"every sample gets the same score {float(score[0]):.4g}: the reward ignores its input"
    )


def _reward_pure(reward: Any, samples: Any, prompts: list[str], metadata: list[Any]) -> None:
    before = samples.data.clone()
    _score(reward, samples, prompts, metadata)
    assert bool((samples.data == before).all()), (
        "score modified samples.data in place; other rewards see it next"
    )
