"""The code's layout (docs/architecture.md): layers import only downward, no import circles, small modules, a short
top level. The layer contracts live in pyproject.toml ([tool.importlinter]); import-linter checks them here."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import networkx
import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {"scorekeeper_worker": REPO / "worker" / "scorekeeper_worker",
            "scorekeeper_operator": REPO / "operator" / "scorekeeper_operator"}
MAX_MODULE_LINES = 400
MAX_TOP_LEVEL_MODULES = 12
MAX_LAYERS = 6  # floors under a package's entry point
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter over the packages under `root`, with this repository's contracts."""
    env = {"PATH": str(LINT_IMPORTS.parent), "PYTHONPATH": f"{root / 'worker'}:{root / 'operator'}"}
    return subprocess.run([str(LINT_IMPORTS), "--config", str(REPO / "pyproject.toml"), "--no-cache"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_layer_contracts_hold() -> None:
    result = _lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "8 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(("module", "line"), [
    # an upward import in the worker (the engine reaching up into the HTTP layer)
    ("worker/scorekeeper_worker/engine/heads.py", "from scorekeeper_worker.api import auth"),
    # an upward import in the operator (pure rendering reaching up into the Hub client)
    ("operator/scorekeeper_operator/render/drift.py", "from scorekeeper_operator import hub"),
    # a new top-level module outside every layer (the contracts are exhaustive)
    ("worker/scorekeeper_worker/stray.py", "X = 1"),
    # the queue reaching HTTP
    ("worker/scorekeeper_worker/engine/queue/scheduler.py", "import starlette"),
    # the runner reaching up into the queue
    ("worker/scorekeeper_worker/engine/runner/forward.py", "from scorekeeper_worker.engine.queue import jobs"),
    # the wire format reaching up into the routes
    ("worker/scorekeeper_worker/api/wire/score.py", "from scorekeeper_worker.api.routes import rerank"),
])
def test_an_upward_import_breaks_the_contracts(tmp_path: Path, module: str, line: str) -> None:
    for top in ("worker", "operator"):
        shutil.copytree(REPO / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    target = tmp_path / module
    target.write_text((target.read_text() if target.exists() else "") + f"\n{line}  # noqa\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout


def _cycles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """Groups of modules of `package` that import each other, directly or through others."""
    edges = networkx.DiGraph()
    for module in graph.modules:
        if module.startswith(package + "."):
            edges.add_edges_from((module, imported) for imported in graph.find_modules_directly_imported_by(module)
                                 if imported.startswith(package + "."))
    return sorted(sorted(group) for group in networkx.strongly_connected_components(edges) if len(group) > 1)


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_circles(package: str) -> None:
    graph = grimp.build_graph(package, cache_dir=None)
    assert _cycles(graph, package) == []


def test_the_circle_finder_finds_a_circle() -> None:
    graph = grimp.ImportGraph()
    for module in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(module)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.a")
    graph.add_import(importer="p.c", imported="p.a")
    assert _cycles(graph, "p") == [["p.a", "p.b"]]


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_modules_stay_small(package: str) -> None:
    sizes = {str(path.relative_to(PACKAGES[package])): len(path.read_text().splitlines())
             for path in PACKAGES[package].rglob("*.py")}
    assert {name: lines for name, lines in sizes.items() if lines > MAX_MODULE_LINES} == {}


def _packages(root: Path) -> list[Path]:
    return [root, *(init.parent for init in root.rglob("__init__.py") if init.parent != root)]


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_every_package_has_a_short_top_level(package: str) -> None:
    crowded = {}
    for directory in _packages(PACKAGES[package]):
        modules = sorted(path.name for path in directory.glob("*.py") if path.name != "__init__.py")
        if len(modules) > MAX_TOP_LEVEL_MODULES:
            crowded[str(directory.relative_to(PACKAGES[package].parent))] = modules
    assert crowded == {}


def _layer_counts() -> dict[str, int]:
    """Floors under each layered package's entry point: its layers less the top one (the entry)."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    return {contract["containers"][0]: len(contract["layers"]) - 1
            for contract in config if contract["type"] == "layers"}


def test_packages_have_at_most_six_floors() -> None:
    counts = _layer_counts()
    assert counts["scorekeeper_worker"] == MAX_LAYERS  # api, serving, planning, engine, model, base
    assert {name: floors for name, floors in counts.items() if floors > MAX_LAYERS} == {}  # the operator's too


@pytest.mark.parametrize("tree", ["bench", "tests"])
def test_every_folder_of_the_benchmarks_and_tests_has_a_short_top_level(tree: str) -> None:
    """bench/ is grouped by what it measures and tests/ by what it tests (tests/README.md): a folder that grows past
    the limit splits into subfolders."""
    folders = [REPO / tree, *(p for p in (REPO / tree).rglob("*") if p.is_dir() and p.name != "__pycache__")]
    crowded = {str(folder.relative_to(REPO)): n for folder in folders
               if (n := len(list(folder.glob("*.py")))) > MAX_TOP_LEVEL_MODULES}
    assert crowded == {}
