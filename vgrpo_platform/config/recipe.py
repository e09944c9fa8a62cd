"""Read a recipe, apply ``--set`` overrides, validate it, and resolve its plugins.

The flow is ``load_recipe`` (TOML -> overrides -> ``schema.Recipe``) then
``validate_components`` (each component exists, its options validate against its own ``Config``,
prompt files exist) giving a ``ResolvedRecipe``; ``resolve_recipe`` does both. Every failure is a
one-line ``RecipeError`` naming the TOML path and the fix, because a recipe is what users edit most.
Nothing here imports torch: ``vgrpo check`` must stay fast.
"""

from __future__ import annotations

import copy
import datetime as _dt
import difflib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from vgrpo_platform.conditions import check_conditions, prompt_from_line, takes_condition_image
from vgrpo_platform.config.schema import DIVERSITY, EVAL_ONLY_TOTAL, PromptsSection, Recipe
from vgrpo_platform.errors import PluginError, RecipeError
from vgrpo_platform.host.validation_errors import format_validation_error, show_value
from vgrpo_platform.registry import ComponentSpec, PluginConfig

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

if TYPE_CHECKING:
    from vgrpo_platform.host.components import ComponentRegistry

RESOLVED_JSON = "resolved_recipe.json"  # lossless, what `load_resolved` reads back
ORIGINAL_TOML = "recipe.toml"  # the user's text, verbatim, with the overrides as a header comment


# --------------------------------------------------------------------------- overrides


def _parse_value(raw: str) -> Any:
    """A ``--set`` value: a TOML value when it parses as one, else the bare string."""
    if "\n" in raw:
        return raw
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw
    except RecursionError:  # tomllib recurses per nesting level
        raise RecipeError(
            f"--set value {raw[:20]!r}...: arrays or tables nested too deeply; flatten it"
        ) from None
    if isinstance(value, (_dt.date, _dt.time)):  # `run.name=2024-01-01` means the string
        return raw
    return value


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"train.lr=1e-5"`` -> ``(["train", "lr"], 1e-05)``."""
    key, sep, raw = text.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(p.strip() for p in parts):
        raise RecipeError(f"--set {text!r}: expected KEY.PATH=VALUE, e.g. --set train.lr=1e-5")
    return [p.strip() for p in parts], _parse_value(raw.strip())


def _index(node: list[Any], part: str, where: str, text: str) -> int:
    if not part.isdigit():
        raise RecipeError(
            f"--set {text!r}: '{where}' is an array of tables; index it with a number, e.g. {where}.0"
        )
    i = int(part)
    if i > len(node):
        raise RecipeError(
            f"--set {text!r}: '{where}' has {len(node)} entries; use an index up to {len(node)} "
            f"({len(node)} appends a new entry)"
        )
    if i == len(node):
        node.append({})
    return i


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of the raw recipe dict with each ``a.b.c=value`` applied, in order.

    Missing intermediate tables are created (an array of tables when the next part is ``0``); a number
    indexes an array of tables (``rewards.0.weight``), and the index one past the end appends a new entry.
    """
    data = copy.deepcopy(data)
    for text in overrides:
        path, value = parse_override(text)
        node: Any = data
        for depth, part in enumerate(path):
            where = ".".join(path[:depth])
            last = depth == len(path) - 1
            if isinstance(node, list):
                i = _index(node, part, where, text)
                if last:
                    node[i] = value
                else:
                    node = node[i]
            elif isinstance(node, dict):
                if last:
                    node[part] = value
                else:  # a missing array of tables starts at its index 0: --set eval.rewards.0.name=...
                    node = node.setdefault(part, [] if path[depth + 1] == "0" else {})
            else:
                raise RecipeError(
                    f"--set {text!r}: '{where}' is {show_value(node)}, not a table; "
                    f"set '{where}' itself or fix the key path"
                )
    return data


# --------------------------------------------------------------------------- loading


def _read_toml(path: Path) -> tuple[str, dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(f"recipe file '{path}' not found; check the path") from None
    except IsADirectoryError:
        raise RecipeError(f"'{path}' is a folder, not a recipe file; pass the .toml file") from None
    except UnicodeDecodeError as exc:
        raise RecipeError(f"{path}: not UTF-8 text ({exc.reason}); save the recipe as UTF-8") from None
    except OSError as exc:  # permissions, a broken link, an I/O error
        raise RecipeError(
            f"cannot read recipe file '{path}' ({exc.strerror or exc}); check the path"
        ) from None
    try:
        return text, tomllib.loads(text)
    except RecursionError:  # tomllib recurses per nesting level; a traceback would hide the line
        raise RecipeError(
            f"{path}: invalid TOML: arrays or tables nested too deeply; flatten the nesting"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = re.search(r"\(at line (\d+), column (\d+)\)", msg)
        where = f"{path}:{m.group(1)}:{m.group(2)}" if m else str(path)
        msg = msg[: m.start()].strip() if m else msg
        raise RecipeError(f"{where}: invalid TOML: {msg}; fix the syntax at that line") from None


def load_recipe(path: str | Path, overrides: Sequence[str] = ()) -> Recipe:
    """Read ``path``, apply ``--set`` overrides, validate with ``schema.Recipe``."""
    path = Path(path)
    _, data = _read_toml(path)
    return _validate(data, overrides, source=str(path))


def _validate(data: dict[str, Any], overrides: Sequence[str], source: str) -> Recipe:
    data = apply_overrides(data, overrides)
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(format_validation_error(exc, model=Recipe, source=source)) from None


# --------------------------------------------------------------------------- prompts


def confined(rel: str, key: str, recipe_dir: Path, *, allow_outside: bool, fix: str) -> Path:
    """The file a recipe path names, refused when a symlink takes it out of the recipe's folder.

    Why: a recipe folder someone hands over can link ``prompts.txt`` to a private file; its lines end up
    in logs, model cards and the Hub. A path written *inside* the folder must stay inside once every
    symlink is resolved. A path written to leave it (``../data/p.txt``, an absolute path) is the recipe's
    visible choice and is read as written, except through a symlink followed by ``..`` (which would hide
    where it lands). ``allow_outside`` (``fix`` names its key) lifts the rule.
    """
    folder = recipe_dir.resolve()
    joined = Path(rel).expanduser() if Path(rel).expanduser().is_absolute() else folder / rel
    written = Path(os.path.abspath(joined))  # ``..`` collapsed as written, no symlink followed
    real = joined.resolve()
    if allow_outside or real == written:
        return joined
    stays = folder in written.parents
    if (stays and folder not in real.parents) or (not stays and written.resolve() != real):
        raise RecipeError(
            f"{key} '{rel}': a symlink takes it outside the recipe's folder {folder} (to {real}); copy the "
            f"file into the recipe's folder, or set {fix} = true if you trust where it points"
        )
    return joined


def _read_prompt_file(rel: str, key: str, recipe_dir: Path, allow_outside: bool = False) -> list[str]:
    path = confined(rel, key, recipe_dir, allow_outside=allow_outside, fix="prompts.allow_outside")
    suffix = path.suffix.lower()
    if suffix not in (".txt", ".jsonl"):
        raise RecipeError(f"{key} '{rel}': unsupported file type '{suffix}'; use a .txt or .jsonl file")
    if not path.is_file():
        raise RecipeError(
            f"{key}: prompt file '{path}' not found (paths are relative to the recipe's folder); "
            "fix the path or create the file"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError(
            f"{key}: prompt file '{path}' is not UTF-8 text ({exc.reason}); save it as UTF-8"
        ) from None
    except OSError as exc:
        raise RecipeError(
            f"{key}: cannot read prompt file '{path}' ({exc.strerror or exc}); check it"
        ) from None
    prompts: list[str] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or (suffix == ".txt" and line.startswith("#")):
            continue
        if suffix == ".txt":
            prompts.append(line)
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            msg = f"{path}:{lineno}: invalid JSON ({exc.msg}); write one JSON object per line"
            raise RecipeError(msg) from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise RecipeError(
                f'{path}:{lineno}: expected an object with a "prompt" string, e.g. {{"prompt": "a cat"}}'
            )
        prompts.append(prompt_from_line(obj, path.parent, f"{path}:{lineno}"))
    return prompts


def load_prompts(section: PromptsSection, recipe_dir: str | Path) -> tuple[list[str], list[str]]:
    """``(train, eval)`` prompts: inline ones first, then the file's.

    ``.txt``: one prompt per line, blank lines and ``#`` comments skipped. ``.jsonl``: one
    ``{"prompt": ...}`` object per line, its other fields the prompt's metadata and ``"image"`` its
    condition image (a ``conditions.Prompt``). An empty eval list means "the train prompts" (the caller
    truncates to ``eval.max_prompts``).
    """
    recipe_dir = Path(recipe_dir)
    train = list(section.train)
    outside = section.allow_outside
    if section.train_file:
        train += _read_prompt_file(section.train_file, "prompts.train_file", recipe_dir, outside)
    evals = list(section.eval)
    if section.eval_file:
        evals += _read_prompt_file(section.eval_file, "prompts.eval_file", recipe_dir, outside)
    return train, (evals or list(train))


# --------------------------------------------------------------------------- resolving plugins


@dataclass(frozen=True)
class ResolvedComponent:
    """A component the recipe selected, with its validated options."""

    spec: ComponentSpec
    config: PluginConfig

    def build(self, context: Any) -> Any:
        """Call the plugin's factory (this is where heavy imports happen)."""
        return self.spec.factory(self.config, context)


@dataclass(frozen=True)
class ResolvedReward(ResolvedComponent):
    weight: float = 1.0
    key: str = ""  # unique label for logs: the name, or name_<index> when a name is used twice


@dataclass
class ResolvedRecipe:
    """A validated recipe whose components all exist and whose options all validate."""

    recipe: Recipe
    adapter: ResolvedComponent
    surrogate: ResolvedComponent
    rewards: list[ResolvedReward]
    train_prompts: list[str]
    eval_prompts: list[str]
    rollout_backend: ResolvedComponent | None = None  # None: the core's own sampler (in_process)
    eval_rewards: list[ResolvedReward] = field(default_factory=list)  # [[eval.rewards]]: scored, not trained
    recipe_dir: Path = field(default_factory=Path.cwd)
    path: Path | None = None  # the recipe file, when loaded from one
    source_text: str | None = None  # its text, verbatim
    overrides: tuple[str, ...] = ()


def _resolve(
    registry: ComponentRegistry, kind: str, name: str, options: dict[str, Any], where: str, source: str | None
) -> ResolvedComponent:
    try:
        spec = registry.get(kind, name)
    except PluginError as exc:
        prefix = f"{source}: " if source else ""
        raise RecipeError(f"{prefix}{where}.name: {exc}") from None
    config = registry.validate_options(kind, name, options, where=f"{where}.options", source=source)
    return ResolvedComponent(spec, config)


def _resolve_rewards(
    registry: ComponentRegistry, refs: Sequence[Any], where: str, source: str | None, taken: set[str]
) -> list[ResolvedReward]:
    """Each reward's key in the logs: its name; ``name_<index>`` when the table uses a name twice; and
    ``<that>_eval`` when an evaluation-only reward would take a training reward's key (``taken``)."""
    counts: dict[str, int] = {}
    for ref in refs:
        counts[ref.name] = counts.get(ref.name, 0) + 1
    out = []
    for i, ref in enumerate(refs):
        got = _resolve(registry, "reward", ref.name, ref.options, f"{where}.{i}", source)
        key = ref.name if counts[ref.name] == 1 else f"{ref.name}_{i}"
        if key in taken:
            key = f"{key}_eval"
        out.append(ResolvedReward(got.spec, got.config, weight=ref.weight, key=key))
    return out


def evaluation_keys(recipe: Recipe, reward_keys: Sequence[str], eval_reward_keys: Sequence[str]) -> list[str]:
    """The keys every evaluation record has (besides ``detail/<reward>/<criterion>``, which rewards
    report at run time): what ``[eval.monitor]`` may name."""
    keys = ["reward", *(f"reward/{k}" for k in (*reward_keys, *eval_reward_keys))]
    if eval_reward_keys:
        keys.append(EVAL_ONLY_TOTAL)
    if recipe.eval.samples_per_prompt >= 2:
        keys.append(DIVERSITY)
    return keys


def _check_monitor(
    recipe: Recipe, reward_keys: Sequence[str], eval_reward_keys: Sequence[str], prefix: str
) -> None:
    """``[eval.monitor]`` names metrics an evaluation will have (details are checked at the first one)."""
    m = recipe.eval.monitor
    known = evaluation_keys(recipe, reward_keys, eval_reward_keys)
    details = tuple(f"detail/{k}/" for k in (*reward_keys, *eval_reward_keys))
    for i, key in enumerate([*m.stop_when_falls, m.rising]):
        where = f"eval.monitor.stop_when_falls.{i}" if i < len(m.stop_when_falls) else "eval.monitor.rising"
        if key in known or (key.startswith(details) and key.count("/") == 2):
            continue
        hint = ""
        if key == DIVERSITY:
            hint = " (it needs eval.samples_per_prompt >= 2)"
        elif key == EVAL_ONLY_TOTAL:
            hint = " (it needs at least one [[eval.rewards]])"
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        rewards = ", ".join([*reward_keys, *eval_reward_keys])
        fix = (
            f"did you mean '{close[0]}'?"
            if close
            else (f"use one of {', '.join(known)}, or detail/<reward>/<criterion> for a reward in {rewards}")
        )
        raise RecipeError(f"{prefix}{where}: '{key}' is not a metric of the evaluations{hint}; {fix}")


def _check_scoring(recipe: Recipe, prefix: str) -> None:
    """``[scoring]`` keys that only mean something with a worker process."""
    scoring = recipe.scoring
    if scoring.isolation == "inline":
        for key in ("device", "worker_threads"):
            if getattr(scoring, key) is not None:
                raise RecipeError(
                    f"{prefix}scoring.{key} applies to the reward worker; set scoring.isolation = 'process' "
                    f"or remove scoring.{key}"
                )
    elif recipe.train.offload_rewards:
        raise RecipeError(
            f"{prefix}train.offload_rewards moves in-process rewards on and off the device; with "
            "scoring.isolation = 'process' the worker holds them: remove one of the two"
        )


def _check_parallel(recipe: Recipe, prefix: str) -> None:
    """Context parallelism makes every forward a collective of a group of processes: rollouts must come
    from those processes' own denoiser, in step with training."""
    if recipe.parallel.context == 1:
        return
    rollout = recipe.rollout
    if rollout.backend != "in_process" or rollout.overlap:
        raise RecipeError(
            f"{prefix}parallel.context = {recipe.parallel.context} splits each forward over a group of "
            f"training processes; rollout.backend = '{rollout.backend}'"
            f"{' with overlap' if rollout.overlap else ''} generates outside them: use rollout.backend = "
            "'in_process' without overlap, or parallel.context = 1"
        )


HUB_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name


def _resolve_data_anchor(recipe: Recipe, recipe_dir: Path, prefix: str) -> None:
    """``train.data_anchor.source`` made absolute (relative to the recipe's folder); a missing file is an
    error now, before any model loads. Nothing is checked while the anchor is off (weight 0)."""
    anchor = recipe.train.data_anchor
    if anchor.weight == 0 or anchor.source is None:
        return
    path = Path(anchor.source).expanduser()
    local = path if path.is_absolute() else recipe_dir / path
    if not local.is_file():
        raise RecipeError(
            f"{prefix}train.data_anchor.source: '{local}' is not a file (relative paths are resolved against "
            "the recipe's folder); give a .safetensors file with 'latents' and 'prompts', e.g. one written "
            "by `vgrpo shapes-anchor-data`"
        )
    anchor.source = str(local.resolve())


def _resolve_init_lora(recipe: Recipe, recipe_dir: Path, prefix: str) -> None:
    """``train.init_lora`` made absolute when it names a file or folder (relative to the recipe's folder),
    so the saved recipe finds it from anywhere; a path that exists nowhere and cannot be a Hub repo id
    is an error now, before any model loads."""
    source = recipe.train.init_lora
    if source is None:
        return
    path = Path(source).expanduser()
    local = path if path.is_absolute() else recipe_dir / path
    if local.exists():
        recipe.train.init_lora = str(local.resolve())
    elif path.is_absolute() or source.startswith(".") or not HUB_REPO_ID.match(source):
        raise RecipeError(
            f"{prefix}train.init_lora: '{local}' does not exist (relative paths are resolved against the "
            "recipe's folder); give a LoRA folder such as a run's final/, a .safetensors file, or a Hub "
            "repo id 'owner/name'"
        )


def _resolve_backend(
    registry: ComponentRegistry, recipe: Recipe, surrogate: ResolvedComponent, source: str | None
) -> ResolvedComponent | None:
    """``rollout.backend`` and its options, and whether the surrogate may take its samples: an MDP
    surrogate's ratio is the sampler's own per-step log-probability, so it needs the exact sampler.
    None: the core's own exact sampler (``in_process``) in a registry without backend plugins."""
    prefix = f"{source}: " if source else ""
    rollout = recipe.rollout
    if rollout.backend == "in_process" and ("rollout_backend", "in_process") not in registry:
        if rollout.overlap:  # the core's own sampler, even where no backend plugin is registered
            raise RecipeError(
                f"{prefix}rollout.overlap = true needs a backend that generates in the background; "
                "set rollout.backend = 'worker' or rollout.overlap = false"
            )
        return None
    try:
        spec = registry.get("rollout_backend", rollout.backend)
    except PluginError as exc:
        raise RecipeError(f"{prefix}rollout.backend: {exc}") from None
    config = registry.validate_options(
        "rollout_backend",
        rollout.backend,
        rollout.backend_options,
        where="rollout.backend_options",
        source=source,
    )
    exact, overlaps = bool(getattr(config, "exact", False)), bool(getattr(config, "overlaps", False))
    if rollout.overlap and not overlaps:
        raise RecipeError(
            f"{prefix}rollout.overlap = true needs a backend that generates in the background; "
            f"'{rollout.backend}' does not: set rollout.backend = 'worker' or rollout.overlap = false"
        )
    if (not exact or rollout.overlap) and surrogate_needs_exact_rollouts(surrogate):
        what = (
            "overlapped rollouts (one update old)" if exact else f"the '{rollout.backend}' backend's samples"
        )
        raise RecipeError(
            f"{prefix}surrogate '{surrogate.spec.name}' takes its ratio from the sampler's own per-step "
            f"log-probs, so it cannot train on {what}: use rollout.backend = 'in_process' without "
            "overlap, or a final-sample surrogate (vgrpo, diffusion_nft, awm) that accepts any sampler"
        )
    return ResolvedComponent(spec, config)


def _check_rollout_block(recipe: Recipe, surrogate: ResolvedComponent, prefix: str) -> None:
    """A surrogate whose rollout sees a block of rows together (a tree rollout: the prompt group is one
    tree, docs/method.md section 8) needs groups of exactly that size."""
    # read from the validated options, not a built surrogate: `vgrpo check` must not import torch
    branch_steps = getattr(surrogate.config, "tree_branch_steps", None) or ()
    block = int(getattr(surrogate.config, "tree_branching", 1)) ** len(branch_steps) if branch_steps else 1
    if block > 1 and recipe.rollout.group_size != block:
        raise RecipeError(
            f"{prefix}surrogate '{surrogate.spec.name}' rolls each prompt group out as one tree of {block} "
            f"leaves, but rollout.group_size = {recipe.rollout.group_size}: set rollout.group_size = {block} "
            "(or change tree_branching / tree_branch_steps)"
        )


def surrogate_needs_exact_rollouts(surrogate: ResolvedComponent) -> bool:
    """``needs_exact_rollouts`` of the surrogate the recipe builds (cheap: no model is involved)."""
    built = surrogate.spec.factory(surrogate.config, None)
    return bool(getattr(built, "needs_exact_rollouts", False))


def validate_components(
    recipe: Recipe,
    registry: ComponentRegistry,
    *,
    recipe_dir: str | Path | None = None,
    source: str | None = None,
) -> ResolvedRecipe:
    """Check that every component exists and its options validate, then the cross-table rules.

    Cross-checks: prompt files exist (relative to ``recipe_dir``), there is at least one train
    prompt, and each reward accepts the adapter's modality when both are declared cheaply (a
    ``modality`` attribute on the adapter's ``Config``, a ``modalities`` one on the reward's).
    """
    recipe_dir = Path(recipe_dir) if recipe_dir is not None else Path.cwd()
    prefix = f"{source}: " if source else ""
    adapter = _resolve(registry, "adapter", recipe.adapter.name, recipe.adapter.options, "adapter", source)
    surrogate = _resolve(
        registry, "surrogate", recipe.surrogate.name, recipe.surrogate.options, "surrogate", source
    )
    rewards = _resolve_rewards(registry, recipe.rewards, "rewards", source, taken=set())
    eval_rewards = _resolve_rewards(
        registry, recipe.eval.rewards, "eval.rewards", source, taken={r.key for r in rewards}
    )

    modality = getattr(adapter.config, "modality", None)
    # a joint model's samples carry companions (LTX-2's video carries its audio): rewards of those fit too
    made = {modality, *getattr(adapter.config, "companion_modalities", ())}
    for where, group in (("rewards", rewards), ("eval.rewards", eval_rewards)):
        for i, reward in enumerate(group):
            accepts = getattr(reward.config, "modalities", None)
            if isinstance(modality, str) and accepts and not made & set(accepts):
                raise RecipeError(
                    f"{prefix}{where}.{i}: reward '{reward.spec.name}' scores {'/'.join(sorted(accepts))} "
                    f"but adapter '{adapter.spec.name}' makes {modality}; pick a reward for {modality}"
                )
    _check_monitor(recipe, [r.key for r in rewards], [r.key for r in eval_rewards], prefix)
    _check_scoring(recipe, prefix)
    _check_parallel(recipe, prefix)
    _resolve_init_lora(recipe, recipe_dir, prefix)
    _resolve_data_anchor(recipe, recipe_dir, prefix)
    backend = _resolve_backend(registry, recipe, surrogate, source)
    _check_rollout_block(recipe, surrogate, prefix)

    try:
        train, evals = load_prompts(recipe.prompts, recipe_dir)
    except RecipeError as exc:
        raise RecipeError(f"{prefix}{exc}") from None
    if not train:
        raise RecipeError(
            f'{prefix}no train prompts; add prompts.train = ["..."] or prompts.train_file = "prompts.txt"'
        )
    takes_image = takes_condition_image(adapter.config)
    for key, prompts in (("the train prompts", train), ("the eval prompts", evals)):
        try:
            check_conditions(adapter.spec.name, takes_image, prompts, key)
        except RecipeError as exc:
            raise RecipeError(f"{prefix}{exc}") from None
    return ResolvedRecipe(
        recipe=recipe,
        adapter=adapter,
        surrogate=surrogate,
        rewards=rewards,
        train_prompts=train,
        rollout_backend=backend,
        eval_prompts=evals,
        eval_rewards=eval_rewards,
        recipe_dir=recipe_dir,
    )


def resolve_recipe(
    path: str | Path, overrides: Sequence[str] = (), registry: ComponentRegistry | None = None
) -> ResolvedRecipe:
    """``load_recipe`` + ``validate_components`` with the installed plugins (what the CLI runs)."""
    path = Path(path)
    text, data = _read_toml(path)
    recipe = _validate(data, overrides, source=str(path))
    if registry is None:
        from vgrpo_platform.host.collect import default_registry

        registry = default_registry()
    resolved = validate_components(recipe, registry, recipe_dir=path.resolve().parent, source=str(path))
    resolved.path = path
    resolved.source_text = text
    resolved.overrides = tuple(overrides)
    return resolved


# --------------------------------------------------------------------------- saving


def save_resolved(recipe: Recipe | ResolvedRecipe, run_dir: str | Path) -> Path:
    """Save the recipe in the run directory; returns the path of ``resolved_recipe.json``.

    Writes ``resolved_recipe.json`` (every key, defaults filled in, overrides applied: lossless,
    read back by ``load_resolved``) and, when the original text is known, ``recipe.toml`` (the
    user's file verbatim, with the source path and ``--set`` overrides as header comments). JSON
    rather than emitted TOML because TOML cannot say ``grad_clip = None``.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = recipe if isinstance(recipe, ResolvedRecipe) else None
    model = recipe.recipe if isinstance(recipe, ResolvedRecipe) else recipe
    out = run_dir / RESOLVED_JSON
    out.write_text(json.dumps(model.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8")
    if resolved is not None and resolved.source_text is not None:
        header = [f"# copied from {resolved.path}"]
        header += [f"# --set {o}" for o in resolved.overrides]
        header.append(f"# the recipe actually used (defaults and overrides applied) is {RESOLVED_JSON}")
        text = "\n".join(header) + "\n" + resolved.source_text
        (run_dir / ORIGINAL_TOML).write_text(text, encoding="utf-8")
    return out


def load_resolved(path: str | Path) -> Recipe:
    """Read back a ``resolved_recipe.json`` (or the run directory holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / RESOLVED_JSON
    try:
        return Recipe.model_validate_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecipeError(f"'{path}' not found; is this a vgrpo run directory?") from None
    except ValidationError as exc:
        raise RecipeError(format_validation_error(exc, model=Recipe, source=str(path))) from None
