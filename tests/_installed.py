"""The packages as a wheel installs them, read from pyproject.toml's ``[tool.setuptools]``.

``faults/`` and ``reports/`` install as ``ddp_conformance.faults`` and ``ddp_conformance.reports``
through the packaging's ``package-dir`` mapping (docs/architecture.md, "The layers").
The static tools (import-linter and its graph library grimp, mypy) read folders and cannot
follow that mapping, so ``stage`` lays the packages out under their installed names in a
scratch folder for them: the tree a wheel installs, built from the same table, never a link
in the repository.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli, the same parser, comes with mypy (the dev extra)
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]


def setuptools_table() -> dict[str, Any]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        table: dict[str, Any] = tomllib.load(f)["tool"]["setuptools"]
    return table


def package_dirs() -> dict[str, str]:
    """Installed package name -> its folder in the repository, for the mapped packages."""
    return dict(setuptools_table().get("package-dir", {}))


def folder_of(package: str) -> str:
    """The repository folder of an installed package (``ddp_conformance.faults.checks`` ->
    ``faults/checks``), by its nearest mapped parent, as setuptools resolves it."""
    mapped = package_dirs()
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):
        head = ".".join(parts[:cut])
        if head in mapped:
            return "/".join([mapped[head], *parts[cut:]])
    return "/".join(parts)


def staged_path(repo_path: str) -> str:
    """Where a repository file lies in the staged tree (``reports/verdict.py`` ->
    ``ddp_conformance/reports/verdict.py``)."""
    for name, folder in package_dirs().items():
        if repo_path.startswith(folder + "/"):
            return name.replace(".", "/") + repo_path[len(folder):]
    return repo_path


def as_in_repo(text: str) -> str:
    """A tool's report on the staged tree with its file paths put back to the repository's."""
    for name, folder in package_dirs().items():
        text = text.replace(name.replace(".", "/") + "/", folder + "/")
    return text


def stage(dest: Path) -> Path:
    """The listed packages under their installed names in ``dest``, with pyproject.toml beside
    them (the tools' configuration), as a wheel would install them."""
    listed: list[str] = setuptools_table()["packages"]
    mapped = package_dirs()
    # A top-level package brings its unmapped sub-packages along; a mapped one is copied into
    # its parent's copy, which is why parents go first (sorted: "a" before "a.b").
    for package in sorted(p for p in listed if "." not in p or p in mapped):
        shutil.copytree(ROOT / folder_of(package), dest / package.replace(".", "/"), dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest
