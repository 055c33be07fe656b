"""The installed names come from the packaging, and each module has one identity (issue 35).

``faults/`` and ``reports/`` stay at the top level and install and import as
``ddp_conformance.faults`` and ``ddp_conformance.reports`` through ``[tool.setuptools]
package-dir`` in pyproject.toml, for a wheel and an editable install alike; never through a link
in the tree, which hides the folders from the static tools. A source checkout puts the
repository root on ``sys.path`` (pytest's rootdir, ``python -m``), where a bare ``import reports``
would load a second copy of every report module beside ``ddp_conformance.reports``: two
``CheckRecord`` classes, two stores.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests._installed import ROOT, folder_of, package_dirs, setuptools_table


def test_faults_and_reports_install_under_ddp_conformance_by_the_packaging() -> None:
    assert package_dirs() == {"ddp_conformance.faults": "faults", "ddp_conformance.reports": "reports"}


def test_no_link_stands_in_the_tree() -> None:
    """A link would give the installed names a second source, one the static tools cannot see."""
    staged = subprocess.run(["git", "ls-files", "--stage"], cwd=ROOT, capture_output=True, text=True, check=True)
    links = [line.split("\t", 1)[1] for line in staged.stdout.splitlines() if line.startswith("120000 ")]
    assert not links, f"links tracked in the repository: {links}"


def _package_folders() -> dict[str, str]:
    """Every folder with an ``__init__.py`` under the packages' roots, by its installed name."""
    roots = {name: folder_of(name) for name in setuptools_table()["packages"] if "." not in name}
    roots.update(package_dirs())
    found = {}
    for name, folder in roots.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            inside = init.parent.relative_to(ROOT / folder).parts
            found[".".join([name, *inside])] = str(init.parent.relative_to(ROOT))
    return found


def test_every_package_folder_is_listed_in_the_packaging() -> None:
    """setuptools installs only the listed packages: a new folder missing from the list would
    work in the editable install and be absent from the wheel."""
    listed = set(setuptools_table()["packages"])
    on_disk = _package_folders()
    missing = sorted(f"{name} ({folder}/)" for name, folder in on_disk.items() if name not in listed)
    gone = sorted(listed - set(on_disk))
    assert not missing and not gone, (f"add to [tool.setuptools] packages in pyproject.toml: {missing}; "
                                      f"listed without a folder: {gone}")


_LOADED = """
import json, runpy, sys
{statement}
print(json.dumps(sorted(m for m in sys.modules if m.partition(".")[0] in ("faults", "reports")
                        or m.startswith(("ddp_conformance.faults", "ddp_conformance.reports")))))
"""


def _report_modules_after(statement: str, cwd: Path) -> list[str]:
    """The faults and reports modules, by every name, in ``sys.modules`` once ``statement`` has
    run in a fresh interpreter. ``python -c`` puts its working directory (the repository root)
    first on ``sys.path``, as pytest's rootdir and ``python -m conformance`` do."""
    result = subprocess.run([sys.executable, "-c", _LOADED.format(statement=statement)], cwd=cwd,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    loaded: list[str] = json.loads(result.stdout.splitlines()[-1])
    return loaded


def _run_cli(report_dir: Path) -> str:
    """``python -m conformance run`` in-process: the pytest entry point plugin, the suite and a
    world whose rank processes import ``ddp_conformance.reports``."""
    argv = ["ddp-conformance", "run", "--checks", "rank-consistency", "--target", "mlp",
            "--report-dir", str(report_dir)]
    return (f"sys.argv = {argv!r}\n"
            "try:\n    runpy.run_module('conformance', run_name='__main__', alter_sys=True)\n"
            "except SystemExit:\n    pass")


def _bare(loaded: list[str]) -> list[str]:
    return [m for m in loaded if not m.startswith("ddp_conformance.")]


def test_a_cli_run_from_the_repository_root_loads_each_module_once(tmp_path: Path) -> None:
    loaded = _report_modules_after(_run_cli(tmp_path / "report"), ROOT)
    assert (tmp_path / "report" / "report.json").exists() and "ddp_conformance.reports.render" in loaded
    assert _bare(loaded) == []


def test_every_check_entry_loads_from_the_repository_root_once() -> None:
    """The registry's ``"module:function"`` strings are imported by name (the chaos checks' are
    faults/ modules), out of reach of the scan for bare imports."""
    loaded = _report_modules_after("from conformance.harness.registry import BY_ID\n"
                                   "for spec in BY_ID.values():\n    spec.load()", ROOT)
    assert "ddp_conformance.faults.checks.straggler" in loaded
    assert _bare(loaded) == []


def test_the_identity_check_sees_a_bare_import() -> None:
    """The measure above can fail: a bare import from the repository root is a second identity."""
    loaded = _report_modules_after("import conformance.plugin\nimport ddp_conformance.reports\nimport reports", ROOT)
    assert "ddp_conformance.reports" in loaded and "reports" in loaded
