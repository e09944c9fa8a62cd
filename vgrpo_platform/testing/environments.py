"""Fresh virtual environments for installing a plugin package in tests (no torch needed)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sysconfig
import venv
from pathlib import Path


def fresh_venv(path: str | Path) -> Path:
    """A new virtual environment at ``path`` that also sees this interpreter's installed packages.

    For testing that a plugin package installs: ``<path>/bin/pip install --no-deps
    --no-build-isolation -e my-plugin`` then ``<path>/bin/python -m vgrpo_platform plugins``. Plain
    ``--system-site-packages`` would expose the *base* interpreter's packages, not those of the
    virtual environment we run in, so a ``.pth`` file adds our site directories (processing their
    own ``.pth`` files, which editable installs need). Returns the new environment's ``python``.
    """
    path = Path(path)
    # our pip (seen through the .pth below) installs into the new environment: no ensurepip needed
    venv.EnvBuilder(with_pip=importlib.util.find_spec("pip") is None, clear=True).create(path)
    python = (
        path / ("Scripts" if os.name == "nt" else "bin") / ("python.exe" if os.name == "nt" else "python")
    )
    ours = [p for p in dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])]
    target = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    lines = [f"import site; site.addsitedir({p!r})" for p in ours]
    (Path(target) / "_vgrpo_parent_env.pth").write_text("\n".join(lines) + "\n")
    return python


def _offline_build_backend() -> bool:
    """Whether setuptools here can build an editable wheel by itself (>= 70.1, or with ``wheel``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = (int(x) for x in version("setuptools").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return False
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


def pip_install_editable(python: str | Path, project: str | Path) -> subprocess.CompletedProcess[str]:
    """``pip install --no-deps -e project`` into the environment of ``python`` (from ``fresh_venv``).

    Builds with this environment's setuptools (no download) when it can; otherwise pip fetches the
    build backend from the package index. Raises ``AssertionError`` with pip's output on failure.
    """
    cmd = [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check"]
    if _offline_build_backend():
        cmd.append("--no-build-isolation")
    proc = subprocess.run([*cmd, "-e", str(project)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"pip install -e {project} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc
