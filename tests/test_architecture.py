"""The architecture holds by tools, not by goodwill (docs/architecture.md, "The layers").

- import-linter keeps the layers of ``[tool.importlinter]`` in pyproject.toml, and is shown to
  catch a deliberate back-import in a copy of the packages;
- mypy is clean on the packages (``[tool.mypy]``);
- the tools read the packages as a wheel installs them: ``faults/`` and ``reports/`` staged as
  ``ddp_conformance/faults`` and ``ddp_conformance/reports`` (tests/_installed.py), since they
  read folders and the installed names come from the packaging's mapping;
- the repository stands alone: no file cites a document that is not in it, and every docs/
  page or README section that the code cites by title exists.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests._installed import ROOT, as_in_repo, stage, staged_path

BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name
    if not path.exists():  # the dev extra is installed by README command 2; say how to get it
        pytest.fail(f"{name} is not installed in {BIN}; install the dev extra: pip install -e '.[dev]'")
    return str(path)


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    # PYTHONPATH first: in the copy below, the copied packages must shadow the editable install.
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_layer_contracts_are_kept(tmp_path: Path) -> None:
    result = _lint_imports(stage(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(("module", "back_import"), [
    ("conformance/harness/outcome.py", "import ddp_conformance.faults.checks.straggler"),  # harness -> a family
    ("reports/verdict.py", "import conformance.harness.registry"),             # reports -> harness
    ("faults/diagnosis.py", "import conformance.checks.equivalence.tensors"),   # family -> sibling family
    ("conformance/targets/mlp.py", "import conformance.harness.ddp"),          # a built-in -> the suite
    ("conformance/checks/gradient_equivalence.py", "import conformance.checks.no_sync_equivalence"),  # entry -> entry
    ("conformance/checks/equivalence/checkpointing.py", "import conformance.checks.no_sync_equivalence"),  # engine -> entry
    ("conformance/checks/equivalence/tensors.py", "import conformance.checks.equivalence.verdict"),  # engine leaf -> its top
    ("conformance/perf/allreduce_bandwidth.py", "import conformance.perf.scaling_cliff"),  # perf entry -> entry
    ("conformance/perf/measure/sweep.py", "import conformance.perf.cliff.rank"),  # shared measurement -> the cliff engine
    ("conformance/perf/cliff/shaped_link.py", "import conformance.perf.cliff.model"),  # cliff leaf -> its model
    ("conformance/_plugin/options.py", "import conformance._plugin.writer"),  # plugin's options -> the writer
])
def test_a_back_import_breaks_the_contract(tmp_path: Path, module: str, back_import: str) -> None:
    target = stage(tmp_path) / staged_path(module)
    target.write_text(target.read_text() + f"\n{back_import}  # the deliberate back-import\n")
    result = _lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout
    importer = staged_path(module).removesuffix(".py").replace("/", ".")  # reports/x.py: ddp_conformance.reports.x
    assert importer in result.stdout, result.stdout


# -- size and shape -------------------------------------------------------------------------

#: The most lines a function (``def`` to its last line) and a module may have in conformance/
#: and faults/: past them, a reader no longer sees one idea at once.
FUNCTION_LINES, MODULE_LINES = 100, 600


def _sizes(root: Path, folder: str) -> tuple[list[str], list[str]]:
    long_functions, long_modules = [], []
    for path in sorted((root / folder).rglob("*.py")):
        source = path.read_text()
        where = path.relative_to(root)
        if len(source.splitlines()) > MODULE_LINES:
            long_modules.append(f"{where}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > FUNCTION_LINES:
                    long_functions.append(f"{where}:{node.lineno} {node.name}: {lines} lines")
    return long_functions, long_modules


def test_no_function_over_100_lines_and_no_module_over_600() -> None:
    found = [_sizes(ROOT, folder) for folder in ("conformance", "faults")]
    functions = [f for fs, _ in found for f in fs]
    modules = [m for _, ms in found for m in ms]
    assert not functions and not modules, "\n".join(functions + modules)


def test_the_measure_sees_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    (tmp_path / "long").mkdir()
    (tmp_path / "long" / "m.py").write_text(f"def f() -> None:\n{body}\n")
    functions, modules = _sizes(tmp_path, "long")
    assert functions == [f"long/m.py:1 f: {FUNCTION_LINES + 1} lines"] and not modules


#: The rank-side preamble (TF32 off, the target loaded, the model built and wrapped, the
#: run_loop's ctx) is written once, in conformance/harness/rank_run.py: a check's rank side
#: starts through ``RankRun`` and never imports these pieces of it again.
PREAMBLE = ("disable_tf32", "wrap", "LoopContext")


def _preamble_copies(root: Path, folder: str) -> list[str]:
    found = []
    for path in sorted((root / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("harness.ddp"):
                found += [f"{path.relative_to(root)}:{node.lineno} {alias.name}"
                          for alias in node.names if alias.name in PREAMBLE]
    return found


def test_the_checks_start_their_rank_side_through_rank_run() -> None:
    found = _preamble_copies(ROOT, "conformance/checks")
    assert not found, "start the rank side with harness.rank_run.RankRun instead:\n" + "\n".join(found)


def test_the_preamble_search_finds_a_copy(tmp_path: Path) -> None:
    (tmp_path / "checks").mkdir()
    (tmp_path / "checks" / "m.py").write_text("def f():\n    from ..harness.ddp import MODEL_SEED, disable_tf32, wrap\n")
    assert _preamble_copies(tmp_path, "checks") == ["checks/m.py:2 disable_tf32", "checks/m.py:2 wrap"]


def _cycles(graph: object) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    imports = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}  # type: ignore[attr-defined]
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            children = [c for c in imports[node] if c in imports]
            if i < len(children):
                work.append((node, i + 1))
                child = children[i]
                if child not in index:
                    work.append((child, 0))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return cycles


class _Imports:
    """A module graph read back from grimp's in another process (``_cycles`` asks only these two)."""

    def __init__(self, imports: dict[str, list[str]]) -> None:
        self.modules = set(imports)
        self._imports = imports

    def find_modules_directly_imported_by(self, module: str) -> set[str]:
        return set(self._imports[module])


# grimp finds a package by importing its name: in a process of its own whose sys.path starts at
# the staged tree, so that ddp_conformance is the staged one (faults/ and reports/ inside), not
# this process's editable install, whose folder holds neither.
_GRAPH = ("import grimp, json; g = grimp.build_graph('conformance', 'ddp_conformance', cache_dir=None); "
          "print(json.dumps({m: sorted(g.find_modules_directly_imported_by(m)) for m in g.modules}))")


def test_no_import_cycle_anywhere(tmp_path: Path) -> None:
    """grimp (import-linter's graph) over every package: function-level imports count too."""
    root = stage(tmp_path)
    result = subprocess.run([sys.executable, "-c", _GRAPH], cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    graph = _Imports(json.loads(result.stdout))
    assert len(graph.modules) > 100
    assert {"ddp_conformance.faults.scenarios", "ddp_conformance.reports.schema"} <= graph.modules
    assert _cycles(graph) == []


def test_the_cycle_search_finds_a_cycle() -> None:
    class Graph:
        modules = {"a", "b", "c", "d"}
        edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}

        def find_modules_directly_imported_by(self, module: str) -> set[str]:
            return self.edges[module]

    assert _cycles(Graph()) == [["a", "b", "c"]]


def test_mypy_is_clean_on_the_packages(tmp_path: Path) -> None:
    root = stage(tmp_path)
    result = subprocess.run([_tool("mypy"), "--no-incremental"], cwd=root, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, as_in_repo(result.stdout[-6000:] + result.stderr[-2000:])
    # Not vacuous: mypy read faults/ and reports/ under their installed names.
    assert re.search(r"Success: no issues found in \d+ source files", result.stdout), result.stdout


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
    (the packaging's mapping, pyproject.toml): a bare ``import reports`` would load a second copy
    of the module beside the namespaced one in a source checkout, and a user's own ``reports``
    package in an installed one (tests/test_packaging.py holds it for a whole run too)."""
    offenders = [str(path.relative_to(ROOT)) for path in _tracked_text_files()
                 if path.suffix == ".py" and _BARE.search(path.read_text())]
    assert not offenders, f"import ddp_conformance.faults / ddp_conformance.reports instead in: {offenders}"


# The README is the front door (what it is, the two commands, links); the reference lives in docs/.
README_MAX_BYTES = 20 * 1024
# [text](target) in markdown, not images' alt text; the target up to an optional #anchor
MD_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    kept = "".join(c for c in heading.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def _broken_links(markdown: Path, root: Path = ROOT) -> list[str]:
    broken = []
    for match in MD_LINK.finditer(markdown.read_text()):
        target = match.group(1)
        if "://" in target or target.startswith("mailto:"):
            continue  # an outside page: not this repository's to keep
        path, _, anchor = target.partition("#")
        page = (markdown.parent / path).resolve() if path else markdown
        if not page.exists():
            broken.append(f"{markdown.relative_to(root)}: link to missing {path}")
        elif anchor and page.suffix == ".md" and anchor not in {_anchor(h) for h in _headings(page)}:
            broken.append(f"{markdown.relative_to(root)}: link to {path or page.name}#{anchor}, "
                          f"which is no heading there")
    return broken


def test_the_readme_is_a_front_door() -> None:
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_MAX_BYTES, (
        f"README.md is {size} bytes, over {README_MAX_BYTES}: move reference text to docs/ "
        f"(targets.md, checks.md, running.md, scaling-cliff.md) or benchmarks/README.md")


#: A date as the README's history used to carry them ("2026-12-02", "December 2026").
_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b(?:January|February|March|April|May|June|July|August|"
                   r"September|October|November|December) \d{4}\b")


def front_door_problems(readme: str, ci_script: str) -> list[str]:
    """What keeps a README from being the front door (issue 38 §4): command 1 installs what a
    user needs (not the dev extra), command 2 installs the dev extra before the project's tests,
    CI runs both as written (command 1's install with pip's -q, its run left to the tests), no
    dates nor 'Tried and not kept' history, and the performance table one line per figure with
    its host's load named."""
    problems = []
    quick = readme[readme.index("## Quick start"):]
    block = quick[quick.index("```bash"):quick.index("```", quick.index("```bash") + 3)]
    commands = [line for line in block.splitlines()[1:] if line.strip() and not line.startswith("#")]
    if len(commands) != 2:
        return [f"Quick start has {len(commands)} commands, not 2: {commands}"]
    setup, tests = commands
    install = next((part for part in setup.split(" && ") if "pip install " in part), "")
    if "[dev]" in setup or " -e ." not in install:
        problems.append(f"command 1 must install the package without the dev extra: {setup}")
    if not re.fullmatch(r"\.venv/bin/pip install -e '\.\[dev\]' && \.venv/bin/python -m pytest.*", tests):
        problems.append(f"command 2 must install the dev extra, then run the tests: {tests}")
    ci_lines = {line.strip() for line in ci_script.splitlines()}
    if tests not in ci_lines:
        problems.append(f".ci/run does not run command 2 as written: {tests}")
    if install.replace(" install ", " install -q ", 1) not in ci_lines:
        problems.append(f".ci/run does not run command 1's install as written: {install}")
    problems += [f"a date in the README: {m.group(0)}" for m in _DATE.finditer(readme)]
    if "Tried and not kept" in readme:
        problems.append("history ('Tried and not kept') belongs in benchmarks/README.md")
    perf = readme.partition("\n## Performance")[2]
    rows = [line for line in perf.split("\n## ")[0].splitlines() if line.startswith("| `")]
    if not rows:
        problems.append("no Performance section with a table of the current figures")
    for row in rows:  # | benchmark | figure | host's load |, one line each
        cells = [cell.strip() for cell in row.strip().strip("|").split(" | ")]
        if len(cells) != 3 or not cells[-1]:
            problems.append(f"a performance row without its host's load: {row[:60]}")
    return problems


def test_the_readme_commands_are_what_a_user_needs_and_what_ci_runs() -> None:
    assert front_door_problems((ROOT / "README.md").read_text(), (ROOT / ".ci" / "run").read_text()) == []


def test_the_front_door_check_sees_the_old_readme() -> None:
    # The README before issue 38, in brief: command 1 installed the dev extra, command 2 did not,
    # and dated history sat in it.
    old = ("## Quick start\n\n```bash\n# 1. Set up.\npython3 -m venv .venv && .venv/bin/pip install "
           "torch==2.13.0 -e '.[dev]' && .venv/bin/ddp-conformance run\n\n# 2. Tests.\n"
           ".venv/bin/python -m pytest -n 3\n```\n\nTried and not kept (2026-12-02): a twin.\n\n"
           "## Performance\n\n| `world_overhead.py` | 11 ms vs 7.6 s |\n")
    ci = ".venv/bin/pip install -q torch==2.13.0 -e '.[dev]'\n.venv/bin/python -m pytest -n 3\n"
    assert front_door_problems(old, ci) == [
        "command 1 must install the package without the dev extra: " + old.splitlines()[4],
        "command 2 must install the dev extra, then run the tests: .venv/bin/python -m pytest -n 3",
        "a date in the README: 2026-12-02",
        "history ('Tried and not kept') belongs in benchmarks/README.md",
        "a performance row without its host's load: | `world_overhead.py` | 11 ms vs 7.6 s |"]


def test_every_link_in_the_markdown_resolves() -> None:
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "benchmarks" / "README.md",
             *sorted((ROOT / "docs").glob("*.md"))]
    assert sum(len(MD_LINK.findall(p.read_text())) for p in pages) >= 5, "the link pattern is broken"
    broken = [b for page in pages for b in _broken_links(page)]
    assert not broken, "\n".join(broken)


def test_the_link_check_catches_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# Title\n\n## Quick start\n")
    page = tmp_path / "docs" / "_link_probe.md"
    page.write_text("# Probe\n\n[ok](../README.md#quick-start) [gone](missing.md) "
                    "[bad anchor](../README.md#no-such)\n")
    broken = _broken_links(page, tmp_path)
    assert broken == ["docs/_link_probe.md: link to missing missing.md",
                      "docs/_link_probe.md: link to ../README.md#no-such, which is no heading there"]


# -- one way to watch the user's code (docs/architecture.md, "The rank side: probes") ---------

#: The check families that watch the user's code on the rank side through ``harness.observe``.
WATCHING_FAMILIES = ("conformance/checks", "conformance/perf")
#: What stands for ``torch.distributed`` (or its ``distributed_c10d``) in an expression.
_DIST_MODULES = ("torch.distributed",)
#: Calls that replace an attribute of their first argument.
_REPLACERS = {"setattr", "delattr", "replaced", "_replaced", "object"}  # object: mock.patch.object


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _dist_aliases(tree: ast.AST) -> set[str]:
    """Local names bound to torch.distributed or a module inside it (``import torch.distributed
    as dist``, ``from torch import distributed``, ``from torch.distributed import
    distributed_c10d as c10d``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname for a in node.names if a.asname and a.name.startswith(_DIST_MODULES)}
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                if f"{node.module}.{a.name}".startswith(_DIST_MODULES) and a.name[:1].islower():
                    names.add(a.asname or a.name)
    return names


def _is_dist(node: ast.AST, aliases: set[str]) -> bool:
    name = _dotted(node)
    return name is not None and (name in aliases or name.startswith(_DIST_MODULES))


def watching_on_its_own(source: str) -> list[str]:
    """What a module does that only ``conformance/harness/observe/`` may: define a ``Protocol``
    (a second observation contract), touch ``_BaseDataLoaderIter`` (the loader-index probe's
    patch), or replace an attribute of ``torch.distributed`` (the collectives probe's patch:
    ``setattr``/``replaced``/``monkeypatch.setattr``/``mock.patch.object`` on it, an assignment
    to one of its attributes, or ``mock.patch("torch.distributed....")``). One line each."""
    tree = ast.parse(source)
    aliases = _dist_aliases(tree)
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.ClassDef):
            bases = [_dotted(b.value if isinstance(b, ast.Subscript) else b) or "" for b in node.bases]
            if any(b.rsplit(".", 1)[-1] == "Protocol" for b in bases):
                found.append(f"line {line}: class {node.name} is a Protocol (a second observation contract)")
        elif (isinstance(node, ast.Name) and node.id == "_BaseDataLoaderIter") or (
                isinstance(node, ast.Attribute) and node.attr == "_BaseDataLoaderIter") or (
                isinstance(node, ast.alias) and node.name == "_BaseDataLoaderIter"):
            found.append(f"line {line}: _BaseDataLoaderIter (the loader-index probe's patch)")
        elif isinstance(node, ast.Call):
            callee = _dotted(node.func) or ""
            first = node.args[0] if node.args else None
            if callee.rsplit(".", 1)[-1] in _REPLACERS and first is not None and _is_dist(first, aliases):
                found.append(f"line {line}: {callee}({_dotted(first)}, ...) patches torch.distributed")
            elif (callee.rsplit(".", 1)[-1] == "patch" and isinstance(first, ast.Constant)
                    and str(first.value).startswith(_DIST_MODULES)):
                found.append(f"line {line}: {callee}({first.value!r}) patches torch.distributed")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                owner = target.value if isinstance(target, (ast.Attribute, ast.Subscript)) else None
                if isinstance(owner, ast.Attribute) and owner.attr == "__dict__":
                    owner = owner.value
                if owner is not None and _is_dist(owner, aliases):
                    found.append(f"line {line}: assigns {_dotted(owner)}.* (patches torch.distributed)")
    return found


def test_no_check_family_watches_the_users_code_its_own_way() -> None:
    """One way to watch the user's code: no Protocol under conformance/checks/ or
    conformance/perf/, and no second patch of _BaseDataLoaderIter or torch.distributed there
    (a probe in conformance/harness/observe/ does it, once)."""
    found = [f"{path.relative_to(ROOT)} {what}"
             for family in WATCHING_FAMILIES for path in sorted((ROOT / family).rglob("*.py"))
             for what in watching_on_its_own(path.read_text())]
    assert not found, ("write a probe against conformance.harness.observe.Probe, or tap the one patch "
                       "(observe.collectives.tap, observe.LoaderIndices), instead:\n" + "\n".join(found))


@pytest.mark.parametrize("planted", [
    "from typing import Protocol\nclass Instrument(Protocol):\n    def attach(self) -> None: ...\n",
    "import typing\nclass Watch(typing.Protocol[T]):\n    pass\n",
    "from torch.utils.data.dataloader import _BaseDataLoaderIter\n",
    "import torch\nwith replaced(torch.utils.data.dataloader._BaseDataLoaderIter, '__next__', f):\n    pass\n",
    "import torch.distributed as dist\nfrom x import replaced as _replaced\n_replaced(dist, 'all_reduce', make)\n",
    "import torch.distributed as d\nfor name in names:\n    setattr(d, name, wrap(name))\n",
    "import torch\ntorch.distributed.all_reduce = counted\n",
    "from torch import distributed\ndistributed.__dict__['barrier'] = counted\n",
    "from torch.distributed import distributed_c10d as c10d\nc10d.all_gather = counted\n",
    "def test(monkeypatch):\n    import torch.distributed as dist\n    monkeypatch.setattr(dist, 'all_reduce', f)\n",
    "from unittest import mock\nwith mock.patch('torch.distributed.all_reduce', f):\n    pass\n",
])
def test_the_watch_rule_catches_a_back_slide(planted: str) -> None:
    """The rule above, fed a deliberate back-slide: each planted module is caught."""
    assert watching_on_its_own(planted), planted


def test_the_watch_rule_lets_plain_use_through() -> None:
    """Calling and reading torch.distributed, and the shared probes, are no patch."""
    plain = ("import torch.distributed as dist\nfrom typing import Protocol as _P\n"
             "from conformance.harness.observe import LoaderIndices, Probe\n"
             "class Mine(Probe):\n    pass\n"
             "dist.all_reduce(x)\nf = getattr(dist, 'all_reduce', None)\nmodel.step = wrapped\n"
             "setattr(optimizer, 'step', wrapped)\n")
    assert watching_on_its_own(plain) == []
