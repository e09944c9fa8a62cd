"""``vgrpo new adapter NAME`` / ``vgrpo new reward NAME``: write a plugin package from a template.

The templates are the packages in ``examples/`` with their names replaced by placeholders, so a new
package is exactly what the tutorials (``docs/writing-a-reward.md``, ``docs/writing-an-adapter.md``)
walk through: it installs, passes the conformance kit and trains with its ``recipe.toml`` before its
author changes a line. ``tests/test_scaffold.py`` checks that rendering a template with an example's
names gives that example back byte for byte.

Placeholders: ``{{name}}`` (the component name), ``{{Class}}`` (its CamelCase form), ``{{package}}``
(import name), ``{{distribution}}`` (pip name); in paths, ``PACKAGE`` and ``NAME``. Template files end
in ``.tmpl`` so no tool takes them for code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from vgrpo_platform.errors import VgrpoError

TEMPLATES = Path(__file__).resolve().parent / "templates"
KINDS = ("adapter", "reward")
SUFFIX = ".tmpl"
NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
PACKAGE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DIST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class ScaffoldError(VgrpoError):
    """A name that cannot become a package, or a target folder that is already there."""


@dataclass(frozen=True)
class Names:
    """What the placeholders become."""

    name: str  # component name in recipes: "colorfulness"
    Class: str
    package: str  # import name: "vgrpo_colorfulness"
    distribution: str  # pip name, also the folder: "vgrpo-colorfulness"

    def tokens(self) -> dict[str, str]:
        """Placeholder -> value, the longest values first (the order ``templatize`` replaces them in)."""
        pairs = {
            "{{distribution}}": self.distribution,
            "{{package}}": self.package,
            "{{Class}}": self.Class,
            "{{name}}": self.name,
        }
        return dict(sorted(pairs.items(), key=lambda kv: -len(kv[1])))


def names_for(name: str, *, package: str | None = None, distribution: str | None = None) -> Names:
    """``name`` -> ``Names``; default package ``vgrpo_<name>`` and distribution ``vgrpo-<name>``."""
    if not NAME_RE.match(name):
        raise ScaffoldError(
            f"invalid component name {name!r}: use lower-case letters, digits and underscores, starting "
            "with a letter (e.g. 'my_reward')"
        )
    package = package or f"vgrpo_{name}"
    distribution = distribution or f"vgrpo-{name.replace('_', '-')}"
    if not PACKAGE_RE.match(package):
        raise ScaffoldError(f"invalid package name {package!r}: it must be a Python identifier")
    if not DIST_RE.match(distribution):
        raise ScaffoldError(f"invalid distribution name {distribution!r}: use letters, digits, '.', '_', '-'")
    camel = "".join(part.capitalize() for part in name.split("_") if part)
    return Names(name=name, Class=camel, package=package, distribution=distribution)


def _template_dir(kind: str) -> Path:
    if kind not in KINDS:
        raise ScaffoldError(f"unknown plugin kind {kind!r}; choose one of {', '.join(KINDS)}")
    return TEMPLATES / kind


def render(kind: str, names: Names) -> dict[str, str]:
    """The package's files, relative path -> text, from the ``kind`` template."""
    root = _template_dir(kind)
    files: dict[str, str] = {}
    for path in sorted(root.rglob(f"*{SUFFIX}")):
        rel = path.relative_to(root).as_posix()[: -len(SUFFIX)]
        rel = rel.replace("PACKAGE", names.package).replace("NAME", names.name)
        text = path.read_text(encoding="utf-8")
        for token, value in names.tokens().items():
            text = text.replace(token, value)
        files[rel] = text
    if not files:
        raise ScaffoldError(f"no template files under {root}; the vgrpo installation is incomplete")
    return files


def scaffold(
    kind: str,
    name: str,
    dest: str | Path = ".",
    *,
    package: str | None = None,
    distribution: str | None = None,
) -> Path:
    """Write a ``kind`` plugin package for component ``name`` into ``dest/<distribution>``; return it."""
    names = names_for(name, package=package, distribution=distribution)
    files = render(kind, names)
    target = Path(dest) / names.distribution
    if target.exists():
        raise ScaffoldError(f"{target} already exists; choose another --dir or name, or remove it")
    for rel, text in files.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return target


def templatize(text: str, names: Names) -> str:
    """The inverse of ``render`` on one text: how the templates are made from ``examples/``."""
    for token, value in names.tokens().items():
        text = text.replace(value, token)
    return text


def package_files(folder: str | Path) -> dict[str, str]:
    """A plugin package's own text files, relative path -> text (no caches, builds or run outputs)."""
    root = Path(folder)
    skip = ("__pycache__", ".pytest_cache", "build", "dist", "runs")
    files = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_dir() or any(p in skip or p.endswith(".egg-info") for p in rel.parts):
            continue
        files[rel.as_posix()] = path.read_text(encoding="utf-8")
    return files


def write_templates(kind: str, example: str | Path, names: Names) -> None:
    """Replace the ``kind`` template with ``example`` (a package named ``names``), placeholders put back.

    How the templates are maintained: edit the example, check it, then run this.
    """
    root = _template_dir(kind)
    for old in root.rglob(f"*{SUFFIX}"):
        old.unlink()
    for rel, text in package_files(example).items():
        parts = rel.split("/")
        parts = ["PACKAGE" if p == names.package else p for p in parts]
        parts[-1] = parts[-1].replace(names.name, "NAME") if parts[-1].startswith("test_") else parts[-1]
        path = root / ("/".join(parts) + SUFFIX)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(templatize(text, names), encoding="utf-8")
