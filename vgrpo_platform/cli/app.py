"""The ``vgrpo`` command line: a thin layer over recipes; the knobs live in the recipe.

Errors: a ``VgrpoError`` prints ``error: <one line>`` on stderr and exits with code 2; pass
``--debug`` to a command (or set ``VGRPO_DEBUG=1``, which also covers plugin commands and plugin
loading) to get the traceback instead. Ctrl-C exits with code 130. ``vgrpo plugins`` and
``vgrpo check`` never import torch: the training and sampling modules are imported lazily.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import signal
import sys
import types
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pluggy
import typer
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from vgrpo_platform.conditions import check_conditions, takes_condition_image, with_images
from vgrpo_platform.config.recipe import ResolvedRecipe, resolve_recipe
from vgrpo_platform.errors import VgrpoError
from vgrpo_platform.host.collect import collect_components
from vgrpo_platform.host.manager import build_plugin_manager
from vgrpo_platform.registry import ComponentSpec

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130

app = typer.Typer(
    name="vgrpo",
    help="Online RL alignment of diffusion / flow-matching generators with V-GRPO. "
    "Everything an experiment needs is in a TOML recipe; see `vgrpo check --help`.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # "rich" reads [eval] or [[rewards]] in a help text as markup: gone
)

_PM: list[pluggy.PluginManager] = []  # built on first use, once per process
_DEBUG: set[str] = set()  # {"on"} once a command got --debug, so the outer handler re-raises too

SET_HELP = (
    "Override a recipe key before validation, e.g. --set train.lr=1e-5 --set rewards.0.weight=2. Repeatable."
)
DEBUG_HELP = "Show the full traceback on errors (also: VGRPO_DEBUG=1)."


def _debug_env() -> bool:
    return os.environ.get("VGRPO_DEBUG", "") not in ("", "0", "false", "no")


def _plugin_manager() -> pluggy.PluginManager:
    """The installed plugins, loaded once (tests replace this function)."""
    if not _PM:
        _PM.append(build_plugin_manager())
    return _PM[0]


def _resolve(recipe: Path, overrides: list[str] | None) -> ResolvedRecipe:
    return resolve_recipe(recipe, overrides or (), registry=collect_components(_plugin_manager()))


def _fail(message: str, code: int) -> typer.Exit:
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    return typer.Exit(code)


@contextmanager
def user_errors(debug: bool = False) -> Iterator[None]:
    """Turn a ``VgrpoError`` into one stderr line and exit code 2 (traceback with ``debug``)."""
    _DEBUG.clear()  # each command invocation decides for itself (tests run many in one process)
    if debug:
        _DEBUG.add("on")
    try:
        yield
    except VgrpoError as exc:
        if debug or _DEBUG or _debug_env():  # read now: an inner command may have set --debug
            raise
        raise _fail(str(exc), EXIT_USER_ERROR) from None
    except KeyboardInterrupt as exc:
        if debug or _DEBUG or _debug_env():
            raise
        raise _interrupted(exc) from None


def _interrupted(exc: KeyboardInterrupt) -> typer.Exit:
    """The one line for a stop by Ctrl-C or SIGTERM (``training.recovery.interrupts.Interrupted`` names the
    signal). Later signals are ignored from here on: the process is on its way out, and one arriving while
    it reports or joins its workers would otherwise end it with a traceback, or killed by SIGINT (-2)."""
    previous = _ignore_stop_signals()
    name = getattr(exc, "signal_name", "SIGINT")
    what = "Ctrl-C" if name == "SIGINT" else name
    try:
        return _fail(
            f"interrupted ({what}); a run resumes from its last checkpoint with --resume", EXIT_INTERRUPTED
        )
    finally:
        # in-process callers (tests, notebooks) go on: put the handlers back, or every subprocess they
        # start would inherit SIGTERM ignored; the console script ignores them again on its way out (main)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _ignore_stop_signals() -> dict[signal.Signals, Any]:
    """Ignore SIGINT/SIGTERM; the handlers they had (empty off the main thread, where nothing changes)."""
    previous: dict[signal.Signals, Any] = {}
    for s in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[s] = signal.signal(s, signal.SIG_IGN)
        except ValueError:  # not the main thread
            break
    return previous


def _print_version(value: bool) -> None:
    if value:
        try:
            version = importlib.metadata.version("vgrpo")
        except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
            version = "unknown (not installed)"
        typer.echo(f"vgrpo {version}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print vgrpo's version and exit."
    ),
) -> None:
    """The options before any command."""


# --------------------------------------------------------------------------- commands

RecipeArg = typer.Argument(..., help="The recipe file (.toml).", show_default=False, metavar="RECIPE")
SetOpt = typer.Option(None, "--set", metavar="KEY=VALUE", help=SET_HELP, show_default=False)
DebugOpt = typer.Option(False, "--debug", help=DEBUG_HELP)


@app.command()
def run(
    recipe: Path = RecipeArg,
    overrides: list[str] | None = SetOpt,
    resume: bool = typer.Option(False, "--resume", help="Continue from the run directory's last checkpoint."),
    force: bool = typer.Option(
        False, "--force", help="With --resume: accept changed settings that break an exact resume."
    ),
    gpus: int = typer.Option(
        1, "--gpus", min=1, help="Start N processes through accelerate with the shipped config that fits."
    ),
    accelerate_config: Path | None = typer.Option(
        None, "--accelerate-config", help="Launch with this accelerate config instead.", show_default=False
    ),
    debug: bool = DebugOpt,
) -> None:
    """Train: validate RECIPE, then run the V-GRPO loop.

    Each iteration rolls out, scores, updates, logs and checkpoints. The run directory
    (run.output_dir/run.name) receives metrics.jsonl, checkpoints, sample grids and the resolved
    recipe. With --gpus N (N > 1) it starts `accelerate launch` itself (docs/cli.md).
    """
    code = 0
    with user_errors(debug):
        resolved = _resolve(recipe, overrides)
        changes = importlib.import_module("vgrpo_platform.training.recovery.recipe_changes")
        changes.before_run(resolved, resume=resume, force=force)
        if gpus > 1 or accelerate_config is not None:
            launch = importlib.import_module("vgrpo_platform.cli.launch")  # heavy: torch, the estimate
            flags = {"--resume": resume, "--force": force, "--debug": debug}
            code = launch.launch_run(resolved, recipe, gpus, accelerate_config, ACCELERATE_DIR, flags)
        else:
            train = importlib.import_module("vgrpo_platform.training.loop")  # heavy: torch, models
            train.run(resolved, resume=resume)
    if code:
        raise typer.Exit(code)


@app.command()
def check(
    recipe: Path = RecipeArg,
    overrides: list[str] | None = SetOpt,
    debug: bool = DebugOpt,
) -> None:
    """Validate RECIPE without loading any model, print a summary and "ok".

    Checks keys and types, plugin names and their options, prompt files. On a problem it prints one
    error line and exits with code 2.
    """
    with user_errors(debug):
        resolved = _resolve(recipe, overrides)
        for line in summary_lines(resolved):
            typer.echo(line)
        typer.echo("ok")


def _options(config: Any) -> str:
    items = config.model_dump(exclude_unset=True)
    return ", ".join(f"{k}={v!r}" for k, v in items.items())


def summary_lines(resolved: ResolvedRecipe) -> list[str]:
    """A short human summary of a resolved recipe (what `vgrpo check` prints)."""
    r = resolved.recipe
    adapter_opts = _options(resolved.adapter.config)
    rewards = ", ".join(f"{w.key} x{w.weight:g}" for w in resolved.rewards)
    batch = r.rollout.prompts_per_iteration * r.rollout.group_size
    sets = "".join(f" --set {o}" for o in resolved.overrides)
    return [
        f"recipe     {resolved.path}{sets}",
        f"adapter    {resolved.adapter.spec.name}" + (f" ({adapter_opts})" if adapter_opts else ""),
        f"rewards    {rewards} ({r.grpo.reward_aggregation})",
        f"surrogate  {resolved.surrogate.spec.name}",
        f"rollout    {r.rollout.prompts_per_iteration} prompts x {r.rollout.group_size} samples = {batch} "
        f"per iteration, {r.rollout.sampler} {r.rollout.steps} steps"
        + (f", backend {r.rollout.backend}" if r.rollout.backend != "in_process" else "")
        + (" (overlapped: one update old)" if r.rollout.overlap else ""),
        f"train      {r.train.iterations} iterations, lr {r.train.lr:g}, {r.train.finetune}, "
        f"micro-batch {r.train.micro_batch_size}",
        f"prompts    {len(resolved.train_prompts)} train, {len(resolved.eval_prompts)} eval",
        *_eval_lines(resolved),
        f"run dir    {Path(r.run.output_dir) / r.run.name}",
    ]


def _eval_lines(resolved: ResolvedRecipe) -> list[str]:
    """The optional extras: evaluation-only rewards, the reward-hacking monitor, trackers."""
    r = resolved.recipe
    lines = []
    if resolved.eval_rewards:
        keys = ", ".join(f"{w.key} x{w.weight:g}" for w in resolved.eval_rewards)
        lines.append(f"eval only  {keys} (scored at evaluations, not trained on)")
    m = r.eval.monitor
    if m.stop_when_falls:
        lines.append(
            f"monitor    stop when {m.rising} rises while {' or '.join(m.stop_when_falls)} falls by more "
            f"than {m.margin:g} from its best, {m.patience} evaluations in a row"
        )
    if r.log.trackers:
        lines.append(f"trackers   {', '.join(r.log.trackers)} (project {r.log.project!r})")
    return lines


def _type_str(ann: Any) -> str:
    """A readable type: ``float | None``, ``'euler' | 'unipc'``, ``list[str]`` (no Annotated noise)."""
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Annotated:
        return _type_str(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_str(a) for a in args)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if ann is type(None):
        return "None"
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(_type_str(a) for a in args)}]"
    if isinstance(ann, type):
        return ann.__name__
    return str(ann).replace("typing.", "")


def _type_name(info: FieldInfo) -> str:
    return _type_str(info.annotation)


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        return repr(info.default_factory())  # type: ignore[call-arg]
    if info.default is PydanticUndefined:
        return "required"
    return repr(info.default)


@app.command()
def plugins(
    options: bool = typer.Option(False, "--options", help="Also list each component's options (its Config)."),
    debug: bool = DebugOpt,
) -> None:
    """List the installed adapters, rewards and surrogates, and who provides each.

    With --options, also each component's options: the keys allowed in its recipe table
    ([adapter.options], [[rewards]].options, [surrogate.options]) with type and default.
    """
    from rich.console import Console
    from rich.table import Table

    with user_errors(debug):
        specs = list(collect_components(_plugin_manager()))
    console = Console(soft_wrap=False)
    table = Table(title="vgrpo components")
    for col in ("kind", "name", "distribution", "summary"):
        table.add_column(col, overflow="fold")
    for spec in specs:
        table.add_row(spec.kind, spec.name, spec.distribution, spec.summary)
    console.print(table)
    if options:
        for spec in specs:
            console.print(_options_table(spec))


def _options_table(spec: ComponentSpec) -> Any:
    from rich.table import Table

    table = Table(title=f"{spec.kind} '{spec.name}' options", title_justify="left")
    for col in ("option", "type", "default", "description"):
        table.add_column(col, overflow="fold")
    for name, info in spec.config.model_fields.items():
        table.add_row(name, _type_name(info), _default(info), info.description or "")
    if not spec.config.model_fields:
        table.add_row("(none)", "", "", "")
    return table


@app.command()
def sample(
    recipe: Path = RecipeArg,
    out: Path = typer.Option(..., "--out", help="Folder to write the samples to (created if missing)."),
    checkpoint: Path | None = typer.Option(
        None, "--checkpoint", help="A checkpoint (or run directory) to load; default: the base model."
    ),
    prompt: list[str] | None = typer.Option(
        None, "--prompt", help="A prompt to sample (repeatable); default: the recipe's eval prompts."
    ),
    image: list[Path] | None = typer.Option(
        None,
        "--image",
        help="A condition image for the --prompt prompts (an editing or image-to-video adapter): one per "
        "prompt, in order, or one for all.",
    ),
    num: int = typer.Option(4, "--num", min=1, help="Samples per prompt."),
    seed: int | None = typer.Option(None, "--seed", help="Random seed; default: the recipe's eval.seed."),
    overrides: list[str] | None = SetOpt,
    debug: bool = DebugOpt,
) -> None:
    """Generate samples with the recipe's adapter (optionally a trained checkpoint) into --out."""
    with user_errors(debug):
        resolved = _resolve(recipe, overrides)
        prompts = with_images(list(prompt or []), list(image or []))
        check_conditions(
            resolved.adapter.spec.name,
            takes_condition_image(resolved.adapter.config),
            prompts,
            "the --prompt prompts",
        )
        sample_module = importlib.import_module("vgrpo_platform.cli.sample")  # heavy: torch, models
        sample_module.sample_to_folder(
            resolved,
            out_dir=out,
            checkpoint=checkpoint,
            prompts=prompts or None,
            num_per_prompt=num,
            seed=resolved.recipe.eval.seed if seed is None else seed,
        )


@app.command("eval")
def eval_command(
    recipe: Path = RecipeArg,
    checkpoint: Path | None = typer.Option(
        None,
        "--checkpoint",
        help="A run directory (its newest checkpoint) or a checkpoints/iter_* folder; default: base model.",
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Folder for eval.json and grid.png; default: RUN/eval/iter_NNNNNN, or RUN/eval/base.",
        show_default=False,
    ),
    overrides: list[str] | None = SetOpt,
    debug: bool = DebugOpt,
) -> None:
    """Evaluate the base model or a trained run under the recipe's [eval] protocol.

    The held-out prompts, seed, sampler, steps and samples per prompt are the recipe's, as in
    training's evaluations; every reward, criterion and [[eval.rewards]] is printed with its mean
    and standard error, and written to eval.json with the protocol and per-prompt means.
    """
    from rich.console import Console

    with user_errors(debug):
        resolved = _resolve(recipe, overrides)
        eval_run = importlib.import_module("vgrpo_platform.cli.eval_run")  # heavy: torch, models
        output = eval_run.evaluate_recipe(resolved, checkpoint=checkpoint, out_dir=out)
    if output.main_process:
        Console(soft_wrap=False).print(eval_run.results_table(output))
        typer.echo(str(output.out_dir / eval_run.RESULTS))


@app.command()
def report(
    run_dir: Path = typer.Argument(
        ..., help="A run directory: run.output_dir/run.name.", show_default=False, metavar="RUN_DIR"
    ),
    debug: bool = DebugOpt,
) -> None:
    """Write RUN_DIR/report/index.html: reward and training curves, monitors, the evaluations (first,
    peak and last, with standard errors) and sample grids."""
    with user_errors(debug):
        report_module = importlib.import_module("vgrpo_platform.cli.report")  # matplotlib, lazily
        index = report_module.write_report(run_dir)
    typer.echo(str(index))


@app.command("anchor-data")
def anchor_data_command(
    recipe: Path = RecipeArg,
    images: Path = typer.Option(
        ...,
        "--images",
        help="A folder of images with a metadata.jsonl ({'file_name': ..., 'text': ...} per line).",
        show_default=False,
    ),
    out: Path = typer.Option(..., "--out", help="The .safetensors file to write.", show_default=False),
    batch_size: int = typer.Option(8, "--batch-size", min=1, help="Images encoded at once."),
    overrides: list[str] | None = SetOpt,
    debug: bool = DebugOpt,
) -> None:
    """Encode a folder of captioned images with the recipe's model into a [train.data_anchor] file.

    The images are resized to the adapter's resolution and encoded once (the VAE's posterior mode for
    latent models, the pixels for pixel-space ones); set train.data_anchor.source to the file written.
    """
    with user_errors(debug):
        resolved = _resolve(recipe, overrides)
        anchor_images = importlib.import_module("vgrpo_platform.cli.anchor_images")  # heavy: torch, models
        written = anchor_images.write_from_recipe(resolved, images, out, batch_size=batch_size)
    typer.echo(written)


@app.command("export")
def export_command(
    recipe: Path = RecipeArg,
    checkpoint: Path | None = typer.Option(
        None,
        "--checkpoint",
        help="A run directory or a checkpoints/iter_* folder; default: the recipe's run.",
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Folder to write; default: RUN/final (RUN/final_iter_NNNNNN for a named checkpoint).",
    ),
    overrides: list[str] | None = SetOpt,
    debug: bool = DebugOpt,
) -> None:
    """Write a run's checkpoint as a loadable export: weights, vgrpo_export.json and a model card.

    What every run writes to RUN/final at its end, for older runs or another checkpoint.
    """
    with user_errors(debug):
        resolved = _resolve(recipe, overrides)
        publish = importlib.import_module("vgrpo_platform.cli.publish")  # heavy: torch, models
        typer.echo(str(publish.export_checkpoint(resolved, checkpoint=checkpoint, out=out)))


@app.command()
def push(
    run_dir: Path = typer.Argument(
        ..., help="A run directory (its final/) or an export folder.", show_default=False, metavar="RUN_DIR"
    ),
    repo_id: str = typer.Option(
        ..., "--repo-id", help="The Hub model repo, e.g. you/shapes-lora (created if missing)."
    ),
    to_folder: Path | None = typer.Option(
        None, "--to-folder", help="Copy what would be uploaded into this folder instead (no network)."
    ),
    private: bool = typer.Option(False, "--private", help="Create the repo private."),
    debug: bool = DebugOpt,
) -> None:
    """Upload a run's export (weights and model card) to the Hugging Face Hub."""
    with user_errors(debug):
        publish = importlib.import_module("vgrpo_platform.cli.publish")
        typer.echo(publish.push(run_dir, repo_id, to_folder=to_folder, private=private))


ACCELERATE_DIR = Path(__file__).resolve().parents[2] / "recipes" / "accelerate"


@app.command()
def plan(
    recipe: Path = RecipeArg,
    gpus: int = typer.Option(1, "--gpus", min=1, help="Processes (GPUs) of the multi-GPU configs."),
    gpu_memory: str | None = typer.Option(
        None,
        "--gpu-memory",
        help="Memory of one GPU, e.g. 80GiB: says which configs fit.",
        show_default=False,
    ),
    reward_gb: float = typer.Option(
        0.0, "--reward-gb", min=0, help="GiB of reward models (and frozen encoders) on the GPU."
    ),
    tokens: int | None = typer.Option(
        None,
        "--tokens",
        min=1,
        help="Tokens per sample (default: from the adapter's size options).",
        show_default=False,
    ),
    transformer_config: Path | None = typer.Option(
        None,
        "--transformer-config",
        help="The denoiser's diffusers config.json, if not downloaded.",
        show_default=False,
    ),
    accelerate_dir: Path = typer.Option(
        ACCELERATE_DIR, "--accelerate-dir", help="Folder of accelerate configs to check."
    ),
    overrides: list[str] | None = SetOpt,
    debug: bool = DebugOpt,
) -> None:
    """Estimate peak GPU memory per process for RECIPE, and which accelerate configs fit.

    The denoiser is built from its config on the meta device (no weights, no download); the sums
    (weights, trainable state, AdamW, activations, sharding, reward offload) are in docs/cli.md. An
    estimate: check it against a short run.
    """
    with user_errors(debug):
        resolved = _resolve(recipe, overrides)
        plan_module = importlib.import_module("vgrpo_platform.cli.plan")  # heavy: torch, diffusers
        memory = plan_module.parse_size(gpu_memory) if gpu_memory else None
        for line in plan_module.lines(
            resolved,
            gpus=gpus,
            gpu_memory=memory,
            tokens=tokens,
            reward_gb=reward_gb,
            config_path=transformer_config,
            accelerate_dir=accelerate_dir,
        ):
            typer.echo(line)


@app.command("serve-reward")
def serve_reward(
    name: str = typer.Argument(
        ..., help="An installed reward (see `vgrpo plugins`).", show_default=False, metavar="NAME"
    ),
    option: list[str] | None = typer.Option(
        None,
        "--option",
        metavar="KEY=VALUE",
        help="A reward option, as in [rewards.options], e.g. --option objective=correct. Repeatable.",
        show_default=False,
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (loopback by default)."),
    port: int = typer.Option(8765, "--port", min=0, max=65535, help="Port to listen on (0: any free one)."),
    device: str = typer.Option("cpu", "--device", help="Device the reward is built on, e.g. cuda:0."),
    token_env: str | None = typer.Option(
        None,
        "--token-env",
        metavar="VAR",
        help="Require the token held in environment variable VAR (`Authorization: Bearer ...`) on every "
        "request; the `remote` reward sends it from its options.token_env.",
        show_default=False,
    ),
    max_pixels: int = typer.Option(
        1 << 25, "--max-pixels", min=1, help="Most pixels of encoded (png) images in one request."
    ),
    timeout_s: float = typer.Option(
        60.0, "--timeout-s", min=0.1, help="Seconds a connection may stay silent before it is closed."
    ),
    max_connections: int = typer.Option(
        32, "--max-connections", min=1, help="Connections served at once (one thread each); more wait."
    ),
    debug: bool = DebugOpt,
) -> None:
    """Serve reward NAME over HTTP: GET /health and POST /score (protocol in docs/rewards.md).

    A recipe scores through it with the `remote` reward. Prints the URL once listening; Ctrl-C stops it.
    """
    from vgrpo_platform.config.recipe import apply_overrides
    from vgrpo_platform.protocols import BuildContext

    with user_errors(debug):
        reward_server = importlib.import_module("vgrpo_platform.cli.reward_server")  # werkzeug, lazily
        token = reward_server.read_token(token_env)
        options = apply_overrides({}, option or [])
        registry = collect_components(_plugin_manager())
        reward = registry.build("reward", name, options, BuildContext(device=device), where="--option")
        app_ = reward_server.RewardApp(name, reward, options, token=token, max_pixels=max_pixels)
        server = reward_server.make_server(
            app_, host, port, timeout_s=timeout_s, max_connections=max_connections
        )
        if token is None and not reward_server.is_loopback(host):
            typer.echo(
                f"warning: listening on {host} without a token: anyone who reaches this port can score "
                "and read /health; pass --token-env VAR, or --host 127.0.0.1",
                err=True,
            )
        typer.echo(f"serving reward '{name}' on http://{host}:{server.server_port}")
        sys.stdout.flush()
        try:
            server.serve_forever()
        except KeyboardInterrupt:  # the normal way to stop a server, not an interrupted run
            typer.echo("stopped")
        finally:
            server.server_close()


new_app = typer.Typer(
    help="Start a plugin package from the template the tutorials walk through (docs/writing-a-*.md).",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)
app.add_typer(new_app, name="new")
NameArg = typer.Argument(
    ..., help="Component name in recipes: lower-case, digits, '_'.", show_default=False, metavar="NAME"
)
DirOpt = typer.Option(Path("."), "--dir", help="Folder to create the package in.")
PackageOpt = typer.Option(None, "--package", help="Import name; default: vgrpo_NAME.", show_default=False)
DistOpt = typer.Option(None, "--dist-name", help="pip name; default: vgrpo-NAME.", show_default=False)


def _new(kind: str, name: str, directory: Path, package: str | None, dist: str | None) -> None:
    from vgrpo_platform.cli.scaffold import scaffold

    with user_errors():
        target = scaffold(kind, name, directory, package=package, distribution=dist)
    typer.echo(f"wrote {target}")
    typer.echo(f"next: pip install -e {target}  &&  vgrpo plugins  &&  pytest {target / 'tests'}")


@new_app.command("reward")
def new_reward(
    name: str = NameArg,
    directory: Path = DirOpt,
    package: str | None = PackageOpt,
    dist: str | None = DistOpt,
) -> None:
    """Write a reward plugin package NAME (a working copy of the colourfulness example)."""
    _new("reward", name, directory, package, dist)


@new_app.command("adapter")
def new_adapter(
    name: str = NameArg,
    directory: Path = DirOpt,
    package: str | None = PackageOpt,
    dist: str | None = DistOpt,
) -> None:
    """Write an adapter plugin package NAME (a working copy of the 1-D signal flow example)."""
    _new("adapter", name, directory, package, dist)


# --------------------------------------------------------------------------- entry point

_COMMANDS_ADDED: list[bool] = []


def add_plugin_commands(target: typer.Typer = app) -> None:
    """Let installed plugins add sub-commands (``register_commands(app)``), once per process."""
    if _COMMANDS_ADDED:
        return
    _COMMANDS_ADDED.append(True)
    _plugin_manager().hook.register_commands(app=target)


def main() -> None:
    """The ``vgrpo`` console script."""
    try:
        with user_errors():
            add_plugin_commands(app)
            app()
    except typer.Exit as exc:  # raised by user_errors outside click's own handling
        if exc.exit_code == EXIT_INTERRUPTED:
            _ignore_stop_signals()  # the process is on its way out (joining workers): no traceback, no -2
        sys.exit(exc.exit_code)
    except KeyboardInterrupt as exc:  # a second Ctrl-C while the first was being reported
        if _DEBUG or _debug_env():
            raise
        code = _interrupted(exc).exit_code
        _ignore_stop_signals()
        sys.exit(code)
    except SystemExit as exc:  # click's own exit with a command's code
        if exc.code == EXIT_INTERRUPTED:
            _ignore_stop_signals()
        raise


if __name__ == "__main__":
    main()
