"""The architecture holds by tools, not by goodwill (docs/architecture.md, "The layers").

- import-linter keeps the layers of ``[tool.importlinter]`` in pyproject.toml, and is shown to
  catch a deliberate back-import in a copy of the packages;
- mypy is clean on the three packages (``[tool.mypy]``);
- the repository stands alone: no file cites a document that is not in it, and every docs/
  page or README section that the code cites by title exists.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("conformance", "faults", "reports", "ddp_conformance")
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name
    if not path.exists():  # the dev extra is part of README command 1; say how to get it
        pytest.fail(f"{name} is not installed in {BIN}; install the dev extra: pip install -e '.[dev]'")
    return str(path)


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    # PYTHONPATH first: in the copy below, the copied packages must shadow the editable install.
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_layer_contracts_are_kept() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(("module", "back_import"), [
    ("conformance/harness/outcome.py", "import ddp_conformance.faults.checks.straggler"),  # harness -> a family
    ("reports/verdict.py", "import conformance.harness.registry"),             # reports -> harness
    ("faults/diagnosis.py", "import conformance.checks.equivalence.tensors"),   # family -> sibling family
    ("conformance/targets/mlp.py", "import conformance.harness.ddp"),          # a built-in -> the suite
])
def test_a_back_import_breaks_the_contract(tmp_path: Path, module: str, back_import: str) -> None:
    for package in PACKAGES:
        # symlinks=True: ddp_conformance/ links to faults/ and reports/, and must in the copy too.
        shutil.copytree(ROOT / package, tmp_path / package, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{back_import}  # the deliberate back-import\n")
    result = _lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout
    importer = module.removesuffix(".py").replace("/", ".")
    if not importer.startswith("conformance."):  # faults/ and reports/ import as ddp_conformance.*
        importer = f"ddp_conformance.{importer}"
    assert importer in result.stdout, result.stdout


def test_mypy_is_clean_on_the_packages() -> None:
    result = subprocess.run([_tool("mypy"), "--no-incremental"], cwd=ROOT, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


# -- the repository stands alone ------------------------------------------------------------

def _tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / line for line in out.stdout.splitlines()
            if line.endswith((".py", ".md", ".j2", ".toml", ".ini", ".cfg", ".txt")) or line.startswith(".ci/")]


OUTSIDE = re.compile(r"DESIGN\.md|BACKGROUND\.md|STYLE\.md|\.\./shared|/work/")


def test_no_file_cites_a_document_outside_the_repository() -> None:
    offenders = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
                 for path in _tracked_text_files() if path.name != "test_architecture.py"
                 for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
                 if OUTSIDE.search(line)]
    assert not offenders, "\n".join(offenders)


def _headings(markdown: Path) -> set[str]:
    return {line.lstrip("#").strip() for line in markdown.read_text().splitlines() if line.startswith("#")}


# docs/some-page.md, "Section"  |  docs/some-page.md ("Section")  |  docs/some-page.md
DOC_CITE = re.compile(r"docs/([\w.-]+\.md)(?:,?\s*\(?[\"“']([^\"”']+)[\"”'])?")
# the README section 'Title' | README, "Title" | the README's 'Title' | README 'Title'
README_CITE = re.compile(r"README(?:'s)?(?: section)?,?\s*[\"'“]([^\"'”]+)[\"'”]")


def _citations(pattern: re.Pattern[str]) -> list[tuple[Path, re.Match[str]]]:
    sources = [p for p in _tracked_text_files() if p.suffix in (".py", ".j2", ".md")
               and p.name != "test_architecture.py"]
    return [(p, m) for p in sources for m in pattern.finditer(p.read_text(errors="replace"))]


def test_every_cited_docs_page_and_section_exists() -> None:
    cites = _citations(DOC_CITE)
    assert cites, "the code cites docs/ pages; finding none means the pattern is broken"
    missing = []
    for source, match in cites:
        page = ROOT / "docs" / match.group(1)
        if not page.exists():
            missing.append(f"{source.relative_to(ROOT)} cites missing docs/{match.group(1)}")
        elif match.group(2) and match.group(2).strip() not in _headings(page):
            missing.append(f"{source.relative_to(ROOT)} cites docs/{match.group(1)} section "
                           f"{match.group(2)!r}, which is not a heading there")
    assert not missing, "\n".join(missing)


def test_every_cited_readme_section_exists() -> None:
    cites = _citations(README_CITE)
    assert cites, "error messages cite README sections; finding none means the pattern is broken"
    headings = _headings(ROOT / "README.md")
    missing = [f"{source.relative_to(ROOT)} cites README section {m.group(1)!r}"
               for source, m in cites if m.group(1).strip() not in headings]
    assert not missing, "\n".join(missing) + f"\nREADME headings: {sorted(headings)}"


_BARE = re.compile(r"^\s*(?:from|import)\s+(?:faults|reports)(?:[.\s]|$)", re.M)


def test_nothing_imports_the_bare_faults_or_reports_names() -> None:
    """faults/ and reports/ import as ``ddp_conformance.faults``/``ddp_conformance.reports``
    (ddp_conformance/__init__.py): a bare ``import reports`` would load a second copy of the
    module beside the namespaced one in a source checkout, and a user's own ``reports``
    package in an installed one."""
    offenders = [str(path.relative_to(ROOT)) for path in _tracked_text_files()
                 if path.suffix == ".py" and not path.is_symlink() and _BARE.search(path.read_text())]
    assert not offenders, f"import ddp_conformance.faults / ddp_conformance.reports instead in: {offenders}"
