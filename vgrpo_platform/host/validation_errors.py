"""Pydantic validation errors as one line: the first problem, its TOML path, what was expected.

Why its own module: the recipe loader and the plugin host both format errors, and the host must
not import the loader (which resolves components through the host).
"""

from __future__ import annotations

import datetime as _dt
import difflib
import json
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

_EXPECTED = {  # pydantic error type -> what the user should have written
    "float_type": "a number",
    "float_parsing": "a number",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string in quotes",
    "list_type": "an array",
    "tuple_type": "an array",
    "dict_type": "a table",
    "model_type": "a table",
    "model_attributes_type": "a table",
}


def _strip_optional(ann: Any) -> Any:
    """``X | None`` -> ``X`` so we can walk into optional sub-models."""
    args = typing.get_args(ann)
    if args and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0] if len(rest) == 1 else ann
    return ann


def _model_at(model: type[BaseModel] | None, loc: Sequence[Any]) -> type[BaseModel] | None:
    """The pydantic model describing the table at ``loc`` (None if it is not a model)."""
    ann: Any = model
    for item in loc:
        if isinstance(item, int):
            args = typing.get_args(ann)
            ann = args[0] if args else None
        elif isinstance(ann, type) and issubclass(ann, BaseModel) and item in ann.model_fields:
            ann = ann.model_fields[item].annotation
        else:
            return None
        ann = _strip_optional(ann)
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def _join(prefix: str, loc: Sequence[Any]) -> str:
    return ".".join([p for p in [prefix] if p] + [str(x) for x in loc])


def _table_name(path: str) -> str:
    """``rewards.0`` -> ``[[rewards]]``, ``train`` -> ``[train]``, ``""`` -> ``the top level``."""
    if not path:
        return "the top level"
    head, _, last = path.rpartition(".")
    if last.isdigit():
        return f"[[{head}]]"
    return f"[{path}]"


def show_value(value: Any) -> str:
    """A value as the user wrote it in TOML (roughly)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, (_dt.date, _dt.time)):  # a TOML date/time, shown as written
        return value.isoformat()
    return json.dumps(value) if isinstance(value, list) else repr(value)


def _describe(err: ErrorDetails, model: type[BaseModel] | None, prefix: str) -> str:
    loc = [x for x in err["loc"] if isinstance(x, int) or "[" not in str(x)]  # drop union tags
    path = _join(prefix, loc)
    kind = err["type"]
    if kind == "extra_forbidden":
        parent_loc, key = loc[:-1], str(loc[-1])
        parent_path = _join(prefix, parent_loc)
        parent = _model_at(model, parent_loc)
        valid = list(parent.model_fields) if parent is not None else []
        msg = f"unknown key '{path}'"
        close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
        if close:
            msg += f"; did you mean '{_join(parent_path, [close[0]])}'?"
        elif model is not None and len(parent_loc) == 1:  # a key put in the wrong top-level table
            homes = [
                name
                for name in model.model_fields
                if (sub := _model_at(model, [name])) is not None and key in sub.model_fields
            ]
            if homes:
                msg += f"; '{key}' belongs in [{homes[0]}]"
        if valid:
            where = f"in {_table_name(parent_path)}" if parent_path else "at the top level"
            msg += f"{'' if msg.endswith('?') else ';'} Valid keys {where}: {', '.join(valid)}"
        return msg
    if kind == "missing":
        parent_path = _join(prefix, loc[:-1])
        sub = _model_at(model, loc)
        if sub is not None:
            return f"missing required table {_table_name(path)}; add it"
        return f"missing required key '{path}'; add it to {_table_name(parent_path)}"
    got = show_value(err.get("input"))
    if kind in _EXPECTED:
        return f"{path}: expected {_EXPECTED[kind]}, got {got}"
    if kind == "literal_error":
        return f"{path}: expected one of {err['ctx']['expected']}, got {got}"
    if kind == "too_short":
        n = err["ctx"]["min_length"]
        return f"{path}: needs at least {n} entr{'y' if n == 1 else 'ies'}, got {err['ctx']['actual_length']}"
    msg = str(err["msg"])
    msg = msg.replace("Input should be", "expected", 1) if msg.startswith("Input should be") else msg
    return f"{path}: {msg}, got {got}"


def format_validation_error(
    exc: ValidationError, *, model: type[BaseModel] | None = None, prefix: str = "", source: str | None = None
) -> str:
    """One line for a pydantic error: the first problem, its TOML path, and a suggestion.

    ``prefix`` is the TOML path of the validated table (``adapter.options``) and ``source`` the
    recipe file; ``model`` is the model that was validated (used to list valid keys).
    """
    errors = exc.errors(include_url=False)
    # Unknown keys first: a typo often also causes a "missing" error for the intended key.
    errors.sort(key=lambda e: e["type"] != "extra_forbidden")
    msg = _describe(errors[0], model, prefix) if errors else str(exc)
    if len(errors) > 1:
        msg += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return f"{source}: {msg}" if source else msg
