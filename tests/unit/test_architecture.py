"""The code's shape as rules that fail: the import contracts of docs/contracts.md (import-linter,
configured in pyproject.toml) and the size limits on production code."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "transformer_core",
    "corpora",
    "parsing",
    "training",
    "evaluation",
    "serving",
    "tasks",
    "pipelines",
)
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 450  # as `ruff format` writes them (make lint checks the format)
DATA_TABLES = {
    # word lists and inflection tables of the synthetic English-German grammar
    "corpora/synthetic_lexicon.py",
}


def production_modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the packages under ``root`` (first on the path), with our contracts."""
    script = (
        "import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename='pyproject.toml', no_logo=True, cache_dir=None))"
    )
    return subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True)


CYCLES_SCRIPT = """
import sys
import grimp
graph = grimp.build_graph(*sys.argv[1:], exclude_type_checking_imports=False)
for module in sorted(graph.modules):
    for imported in sorted(graph.find_modules_directly_imported_by(module)):
        back = graph.find_shortest_chain(importer=imported, imported=module)
        if back:
            print(" -> ".join((module, *back)))
"""


def import_cycles(root: Path) -> list[str]:
    """Every file-level import cycle among the packages under ``root`` (first on the path), one
    line each, found by grimp (import-linter's graph): every import statement of a file counts,
    under ``if TYPE_CHECKING:`` and inside functions too."""
    done = subprocess.run(
        [sys.executable, "-c", CYCLES_SCRIPT, *PACKAGES], cwd=root, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_no_file_imports_itself_through_others():
    """No module is on an import cycle, ``TYPE_CHECKING`` imports included: a name two files
    share lives below both (import-linter's acyclic contract sees only the cycles between the
    siblings of a package, not those through the package's own ``__init__``)."""
    assert import_cycles(ROOT) == []


@pytest.mark.parametrize(
    ("module", "source"),
    [
        (
            "serving/ct2_options.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import serving.ct2\n",
        ),
        ("serving/__init__.py", "def engine():\n    from serving.ct2 import CTranslate2Engine\n"),
    ],
)
def test_the_cycle_check_sees_type_checking_and_package_imports(tmp_path, module, source):
    for package in PACKAGES:
        skip = shutil.ignore_patterns("__pycache__")
        shutil.copytree(ROOT / package, tmp_path / package, ignore=skip)
    target = tmp_path / module
    target.write_text(target.read_text() + source)
    name = module.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    assert any(line.startswith(f"{name} -> ") for line in import_cycles(tmp_path))


def test_import_contracts_hold():
    """Layers, forbidden runtimes per package, and no import cycles inside a package."""
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "source", "contract"),
    [
        ("transformer_core/_probe.py", "import tasks.framework.graph\n", "Layers"),
        ("transformer_core/_probe.py", "import ray\n", "The model library"),
        ("serving/_probe.py", "import prefect\n", "Prefect"),
        ("serving/ct2.py", "import serving.translator\n", "No import cycles"),
        (
            "serving/decode_config.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import serving.ct2\n",
            "No import cycles",
        ),
        ("tasks/framework/graph.py", "import tasks.clean\n", "No import cycles"),
    ],
)
def test_import_contracts_catch_a_broken_rule(tmp_path, module, source, contract):
    """The contracts are live: a copy of the code with one bad import breaks the named one."""
    for package in PACKAGES:
        skip = shutil.ignore_patterns("__pycache__")
        shutil.copytree(ROOT / package, tmp_path / package, ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    target = tmp_path / module
    target.write_text((target.read_text() if target.exists() else "") + source)
    done = lint_imports(tmp_path)
    assert done.returncode != 0
    broken = done.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, done.stdout


@pytest.mark.parametrize("path", production_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_production_functions_and_modules_stay_small(path: Path):
    rel = str(path.relative_to(ROOT))
    source = path.read_text(encoding="utf-8")
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{rel}: functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"
    if rel not in DATA_TABLES:
        lines = source.count("\n")
        assert lines <= MAX_MODULE_LINES, f"{rel}: {lines} lines (limit {MAX_MODULE_LINES})"


def test_no_benchmark_script_shadows_a_package():
    """``python benchmarks/x.py`` puts benchmarks/ first on sys.path: a benchmarks/parsing.py
    made ``import parsing`` find the script, and every benchmark that imports the translator
    failed."""
    root = Path(__file__).resolve().parents[2]
    packages = {p.parent.name for p in root.glob("*/__init__.py")}
    scripts = {p.stem for p in (root / "benchmarks").glob("*.py")}
    assert not scripts & packages


def test_the_top_level_of_tasks_holds_only_stages_and_none_runs_itself():
    """``tasks/`` holds the stages, ``tasks/framework/`` what runs them: every module at the top
    level is a stage of a pipeline that says what it builds (``stage_config``, ``build``) and
    leaves running it to the runner (no ``run``, no import of the runner)."""
    from tasks.framework.graph import PIPELINES, stage_module

    stages = {s.name for pipeline in PIPELINES.values() for s in pipeline}
    assert {p.stem for p in (ROOT / "tasks").glob("*.py")} - {"__init__"} == stages
    for name in sorted(stages):
        module = stage_module(name)
        assert callable(module.stage_config) and callable(module.build), name
        assert not hasattr(module, "run"), name
        tree = ast.parse((ROOT / "tasks" / f"{name}.py").read_text(encoding="utf-8"))
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "tasks.framework.runner" not in imported, name
