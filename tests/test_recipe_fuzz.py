"""Property-based: ``vgrpo check`` answers every malformed recipe with one clean error line and exit 2.

Hypothesis generates broken recipes from ``recipes/toy.toml`` (character and byte mutations,
truncations; wrong value types, unknown keys, unknown plugins, bad enum values, out-of-range numbers,
missing keys, missing or unreadable prompt files, broken ``--set`` overrides) and runs the real
``check`` command on each, with the installed plugins. Every example must end in exit 2 with a
single ``error: ...`` line on stderr and no traceback, or in exit 0 for a mutation that happens to
leave the recipe valid, which an independent walk of the schema then confirms.

Generated examples with derandomize=True (run with ``-s`` to see the counts per strategy): 1,224 in
all: 300 text mutations (69 of which happen to stay valid), 484 schema-aware mutations, 240 prompt
files, 200 ``--set`` lists. About 17 s on 2 busy cores.
"""

from __future__ import annotations

import collections
import datetime as dt
import functools
import json
import tempfile
import tomllib
import typing
from pathlib import Path
from typing import Any

import annotated_types
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from typer.testing import CliRunner

from vgrpo_platform.cli import app as cli
from vgrpo_platform.config.schema import Recipe

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "recipes" / "toy.toml"
TOY_TEXT = TOY.read_text(encoding="utf-8")
BASE: dict[str, Any] = tomllib.loads(TOY_TEXT)

COUNTS: collections.Counter[str] = collections.Counter()  # examples run, per strategy
FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
KINDS = {"adapter": "adapter", "surrogate": "surrogate", "rewards.0": "reward"}  # table -> component kind


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    total = sum(n for k, n in COUNTS.items() if k != "text_valid")
    print(f"\nrecipe fuzz: {total} generated recipes: {dict(COUNTS)}")


@functools.cache
def registry():
    return cli.collect_components(cli._plugin_manager())


# --------------------------------------------------------------------------- running check


def run_check(recipe: Path, *extra: str):
    return CliRunner().invoke(cli.app, ["check", str(recipe), *extra], env={"VGRPO_DEBUG": None})


def assert_clean_error(result, *fragments: str) -> str:
    """Exit 2, nothing on stdout, one ``error:`` line on stderr, no traceback; returns the line."""
    detail = (result.exit_code, result.output, result.exc_info)
    assert result.exit_code == 2, detail
    assert isinstance(result.exception, SystemExit), detail
    assert result.stdout == "", detail
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), detail
    assert "Traceback" not in result.output and "datetime." not in lines[0]  # no Python reprs
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def assert_clean_outcome(result, recipe_bytes: bytes) -> None:
    """Exit 2 with one line, or exit 0 for a recipe an independent check finds valid."""
    if result.exit_code == 0:
        COUNTS["text_valid"] += 1
        assert result.stdout.splitlines()[-1] == "ok"
        assert really_valid(recipe_bytes), recipe_bytes
    else:
        assert_clean_error(result)


def really_valid(raw: bytes) -> bool:
    """Valid TOML, only keys the schema and the named plugins know, names that are installed."""
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    if not known_keys_only(data, Recipe):
        return False
    reg = registry()
    tables = [("adapter", data.get("adapter")), ("surrogate", data.get("surrogate", {}))]
    tables += [("reward", r) for r in data.get("rewards", [])]
    for kind, table in tables:
        if not isinstance(table, dict):
            return False
        name = table.get("name", "vgrpo" if kind == "surrogate" else None)
        if name not in reg.names(kind):
            return False
        if not set(table.get("options", {})) <= set(reg.get(kind, name).config.model_fields):
            return False
    Recipe.model_validate(data)  # raises if a value is wrong
    return True


def known_keys_only(data: dict[str, Any], model: type[BaseModel]) -> bool:
    for key, value in data.items():
        if key not in model.model_fields:
            return False
        sub = _sub_model(model.model_fields[key].annotation)
        if sub is not None and isinstance(value, dict) and not known_keys_only(value, sub):
            return False
        if sub is not None and isinstance(value, list):
            if not all(isinstance(v, dict) and known_keys_only(v, sub) for v in value):
                return False
    return True


def _sub_model(ann: Any) -> type[BaseModel] | None:
    for a in (ann, *typing.get_args(ann)):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


# --------------------------------------------------------------------------- a small TOML writer


def toml_str(s: str) -> str:
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return (
            "nan" if v != v else ("inf" if v == float("inf") else "-inf" if v == -float("inf") else repr(v))
        )
    if isinstance(v, str):
        return toml_str(v)
    if isinstance(v, (dt.date, dt.datetime)):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{toml_str(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def to_toml(data: dict[str, Any]) -> str:
    lines = [f"{toml_str(k)} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for k, v in data.items():
        if isinstance(v, dict):
            lines.append(f"[{toml_str(k)}]")
            lines += [f"{toml_str(kk)} = {toml_value(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"


def test_the_toml_writer_round_trips_the_base_recipe():
    assert tomllib.loads(to_toml(BASE)) == BASE


# --------------------------------------------------------------------------- 1. raw text mutations

ALPHABET = "[]{}=\"'.,#\n\\ -+_0123456789abcdefinrtuxyz\t\r" + "éλ中"


@st.composite
def mutated_text(draw: st.DrawFn) -> bytes:
    raw = TOY_TEXT.encode("utf-8")
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["delete", "insert", "replace", "truncate", "bytes", "lines"]))
        pos = draw(st.integers(0, len(raw)))
        if op == "delete":
            raw = raw[:pos] + raw[pos + draw(st.integers(1, 40)) :]
        elif op == "insert":
            raw = raw[:pos] + draw(st.text(ALPHABET, min_size=1, max_size=6)).encode() + raw[pos:]
        elif op == "replace":
            raw = raw[:pos] + draw(st.text(ALPHABET, min_size=1, max_size=1)).encode() + raw[pos + 1 :]
        elif op == "truncate":
            raw = raw[:pos]
        elif op == "bytes":  # possibly not UTF-8 at all
            raw = raw[:pos] + draw(st.binary(min_size=1, max_size=3)) + raw[pos:]
        else:  # drop, duplicate or swap whole lines: valid TOML, broken recipes
            lines = raw.split(b"\n")
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            how = draw(st.sampled_from(["drop", "dup", "swap"]))
            if how == "drop":
                del lines[i]
            elif how == "dup":
                lines.insert(j, lines[i])
            else:
                lines[i], lines[j] = lines[j], lines[i]
            raw = b"\n".join(lines)
    return raw


@FUZZ
@given(raw=mutated_text())
def test_mutated_toml_text_gives_a_clean_error(workdir, raw):
    COUNTS["text"] += 1
    path = workdir / "mutated.toml"
    path.write_bytes(raw)
    assert_clean_outcome(run_check(path), raw)


def test_deeply_nested_toml_is_a_clean_error(workdir):
    path = workdir / "deep.toml"
    path.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    assert_clean_error(run_check(path), "nested too deeply")
    assert_clean_error(run_check(TOY, "--set", "train.lr=" + "[" * 5000), "nested too deeply")


# --------------------------------------------------------------------------- 2. schema-aware mutations


def _constraints(info_or_ann: Any) -> tuple[Any, list[Any]]:
    """The bare annotation (Optional and Annotated removed) and its annotated_types constraints."""
    found = list(getattr(info_or_ann, "metadata", []))
    ann = info_or_ann.annotation if isinstance(info_or_ann, FieldInfo) else info_or_ann
    while True:
        args = typing.get_args(ann)
        if typing.get_origin(ann) is typing.Annotated:
            for meta in args[1:]:
                found += list(getattr(meta, "metadata", [meta]))
            ann = args[0]
        elif args and type(None) in args and typing.get_origin(ann) is not typing.Literal:
            rest = [a for a in args if a is not type(None)]
            if len(rest) != 1:
                return ann, found
            ann = rest[0]
        else:
            return ann, found


LETTERS = st.text("abcdeghjkmopqrsuvwxz", min_size=1, max_size=6).map(lambda s: "x" + s)  # no number/bool
LISTS = st.lists(st.integers(-5, 5), min_size=1, max_size=3)
TABLES = st.dictionaries(st.sampled_from("abc"), st.integers(0, 9), min_size=1, max_size=2)
DATES = st.dates()
FRACTIONS = st.integers(-100, 100).map(lambda i: i + 0.5)


def wrong_type(ann: Any) -> st.SearchStrategy[Any]:
    """Values of a type that ``ann`` rejects even in pydantic's lax mode."""
    if ann is bool:
        return st.one_of(LETTERS, LISTS, TABLES, DATES, FRACTIONS, st.integers(2, 1000))
    if ann is int:
        return st.one_of(LETTERS, LISTS, TABLES, DATES, FRACTIONS)
    if ann is float:
        return st.one_of(LETTERS, LISTS, TABLES, DATES)
    if ann is str:
        return st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(), LISTS, TABLES, DATES)
    origin = typing.get_origin(ann)
    if origin is typing.Literal:
        return st.one_of(LETTERS, st.integers(), st.booleans(), LISTS, TABLES)
    if origin is list:
        return st.one_of(LETTERS, st.integers(), st.booleans(), TABLES, DATES)
    if origin is tuple:
        return st.one_of(LETTERS, st.integers(), TABLES, st.lists(st.floats(-1, 1), min_size=3, max_size=4))
    return st.one_of(LETTERS, st.integers(), st.booleans(), LISTS, DATES)  # tables: a model or dict


def out_of_range(ann: Any, bounds: list[Any]) -> st.SearchStrategy[Any] | None:
    """Numbers that break one of the field's ge/gt/le/lt bounds (None if it has none)."""
    options = []
    for b in bounds:
        step = st.integers(1, 10**6) if ann is int else st.floats(1e-3, 1e6)
        if isinstance(b, annotated_types.Ge):
            options.append(step.map(lambda d, b=b: b.ge - d))
        elif isinstance(b, annotated_types.Gt):
            options.append(st.one_of(st.just(b.gt), step.map(lambda d, b=b: b.gt - d)))
        elif isinstance(b, annotated_types.Le):
            options.append(step.map(lambda d, b=b: b.le + d))
        elif isinstance(b, annotated_types.Lt):
            options.append(st.one_of(st.just(b.lt), step.map(lambda d, b=b: b.lt + d)))
    return st.one_of(*options) if options else None


def bad_enum(choices: tuple[str, ...]) -> st.SearchStrategy[str]:
    near = st.sampled_from(choices).flatmap(
        lambda c: st.sampled_from([c.upper(), c + "x", c[:-1], " " + c, c.replace("+", "")])
    )
    return st.one_of(near, st.text(max_size=12)).filter(lambda s: s not in choices)


def schema_fields() -> list[tuple[str, str, FieldInfo]]:
    """(table, key, field) for every key of every platform table, and the top-level keys."""
    out = [("", name, info) for name, info in Recipe.model_fields.items()]
    for section, info in Recipe.model_fields.items():
        sub = _sub_model(info.annotation)
        table = "rewards.0" if section == "rewards" else section
        out += [(table, name, f) for name, f in sub.model_fields.items()] if sub else []
    return out


def plugin_fields() -> list[tuple[str, str, str, FieldInfo]]:
    """(table, component name, option key, field) for every option of every installed component."""
    reg = registry()
    return [
        (table, name, key, info)
        for table, kind in KINDS.items()
        for name in reg.names(kind)
        for key, info in reg.get(kind, name).config.model_fields.items()
    ]


def get_table(data: dict[str, Any], table: str) -> dict[str, Any]:
    node: Any = data
    for part in [p for p in table.split(".") if p]:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    return node


def dotted(table: str, key: str) -> str:
    return f"{table}.{key}" if table else key


MUTATIONS = [
    "wrong_type",
    "out_of_range",
    "bad_enum",
    "unknown_key",
    "unknown_plugin",
    "plugin_option",
    "missing",
]


@st.composite
def broken_recipe(draw: st.DrawFn, what: str) -> tuple[dict[str, Any], list[str]]:
    """(recipe dict with one ``what`` mutation, fragments the error line must contain)."""
    data = json.loads(json.dumps(BASE))
    reg = registry()
    if what in ("wrong_type", "out_of_range", "bad_enum"):
        candidates = []
        for table, key, info in schema_fields():
            ann, bounds = _constraints(info)
            if what == "wrong_type":
                candidates.append((table, key, wrong_type(ann)))
            elif what == "out_of_range" and (s := out_of_range(ann, bounds)) is not None:
                candidates.append((table, key, s))
            elif what == "bad_enum" and typing.get_origin(ann) is typing.Literal:
                candidates.append((table, key, bad_enum(typing.get_args(ann))))
        table, key, values = draw(st.sampled_from(candidates))
        if table == "":
            data[key] = draw(values)
        else:
            get_table(data, table)[key] = draw(values)
        return data, [dotted(table, key)]
    if what == "unknown_key":
        tables = ["", *(n for n in Recipe.model_fields if n != "rewards"), "rewards.0"]
        tables += ["adapter.options", "surrogate.options", "rewards.0.options"]
        table = draw(st.sampled_from(tables))
        node = get_table(data, table)
        valid = set(node) | _valid_keys(table, data, reg)
        key = draw(st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True).filter(lambda k: k not in valid))
        node[key] = draw(st.one_of(st.integers(), st.text(max_size=5), st.booleans(), LISTS, TABLES))
        return data, ["unknown key", dotted(table, key)]
    if what == "unknown_plugin":
        table = draw(st.sampled_from(list(KINDS)))
        names = set(reg.names(KINDS[table]))
        name = draw(st.text(min_size=1, max_size=12).filter(lambda n: n not in names))
        get_table(data, table)["name"] = name
        return data, [f"{table}.name", "unknown"]
    if what == "plugin_option":  # any installed component, one option wrong or out of range
        table, name, key, info = draw(st.sampled_from(plugin_fields()))
        ann, bounds = _constraints(info)
        bad = out_of_range(ann, bounds)
        values = wrong_type(ann) if bad is None else draw(st.sampled_from([wrong_type(ann), bad]))
        node = get_table(data, table)
        node["name"] = name
        node["options"] = {key: draw(values)}
        return data, [f"{table}.options"]
    gone = draw(st.sampled_from(["adapter", "rewards", "adapter.name", "rewards.0.name"]))
    head, _, last = gone.rpartition(".")
    del get_table(data, head)[last]
    return data, ["missing", gone]


def _valid_keys(table: str, data: dict[str, Any], reg: Any) -> set[str]:
    if table.endswith(".options"):
        owner = table.rsplit(".", 1)[0]
        name = get_table(data, owner).get("name", "vgrpo")
        return set(reg.get(KINDS[owner], name).config.model_fields)
    model = Recipe if table == "" else _sub_model(Recipe.model_fields[table.split(".")[0]].annotation)
    return set(model.model_fields)


@pytest.mark.parametrize("what", MUTATIONS)
@settings(FUZZ, max_examples=80)
@given(data=st.data())
def test_schema_aware_mutations_name_the_key(workdir, what, data):
    recipe, fragments = data.draw(broken_recipe(what))
    COUNTS[what] += 1
    path = workdir / "broken.toml"
    path.write_text(to_toml(recipe), encoding="utf-8")
    assert_clean_error(run_check(path), *fragments)


# --------------------------------------------------------------------------- 3. prompt files

NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)
JSONL_LINE = st.one_of(
    st.text(min_size=1, max_size=8).map(lambda p: json.dumps({"prompt": p})),
    st.text(max_size=12),
    st.sampled_from(['{"prompt": 3}', "[1, 2]", '{"text": "a"}', "NaN", "{", '"just a string"']),
)


def _jsonl_ok(lines: list[str]) -> bool:
    for line in lines:
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            return False
        if not (isinstance(obj, dict) and isinstance(obj.get("prompt"), str)):
            return False
    return True


@pytest.mark.parametrize("kind", ["missing", "folder", "not_utf8", "jsonl"])
@settings(FUZZ, max_examples=60)
@given(
    key=st.sampled_from(["train_file", "eval_file"]),
    name=NAMES,
    suffix=st.sampled_from([".txt", ".jsonl", ".csv", ""]),
    junk=st.binary(min_size=1, max_size=16),
    lines=st.lists(JSONL_LINE, min_size=1, max_size=4),
)
def test_bad_prompt_files_give_a_clean_error(workdir, key, name, suffix, kind, junk, lines):
    COUNTS[f"prompt_file_{kind}"] += 1
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        folder = Path(tmp)
        data = json.loads(json.dumps(BASE))
        if kind == "jsonl":
            suffix = ".jsonl"
        rel = f"{name}{suffix}"
        data["prompts"][key] = rel
        if kind == "folder":
            (folder / rel).mkdir()
        elif kind == "not_utf8":
            (folder / rel).write_bytes(b"\xff" + junk)  # 0xff never starts a UTF-8 character
        elif kind == "jsonl":
            (folder / rel).write_text("\n".join(line.replace("\r", " ") for line in lines), encoding="utf-8")
        recipe = folder / "r.toml"
        raw = to_toml(data).encode("utf-8")
        recipe.write_bytes(raw)
        result = run_check(recipe)
        if kind == "jsonl" and _jsonl_ok("\n".join(lines).replace("\r", " ").splitlines()):
            assert result.exit_code == 0, result.output
            assert really_valid(raw)
        else:
            assert_clean_error(result, f"prompts.{key}" if kind != "jsonl" else rel)


# --------------------------------------------------------------------------- 4. --set overrides

OVERRIDE = st.one_of(
    st.text(max_size=30),
    st.tuples(
        st.sampled_from([*BASE, "rewards.0", "rewards.1", "rewards.x", "adapter.options", "prompts.train.0"]),
        st.text("abcdefghijklmnopqrstuvwxyz_.0123456789", max_size=12),
        st.text(ALPHABET, max_size=12),
    ).map(lambda t: f"{t[0]}.{t[1]}={t[2]}"),
)


@settings(FUZZ, max_examples=200)
@given(overrides=st.lists(OVERRIDE, min_size=1, max_size=3))
def test_malformed_overrides_give_a_clean_error(overrides):
    COUNTS["overrides"] += 1
    result = run_check(TOY, *(f"--set={o}" for o in overrides))
    if result.exit_code == 0:
        assert result.stdout.splitlines()[-1] == "ok"
    else:
        assert_clean_error(result)
