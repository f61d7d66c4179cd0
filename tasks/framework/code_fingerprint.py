"""The code a stage runs, as fingerprints: so that a code change reruns exactly the stages it can
change, and a comment, docstring or formatting change reruns none.

A stage's code is its module (``tasks/<stage>.py``) and every project module it imports, at
module level or inside a function, transitively, found by reading the sources (``ast``), not
by importing them. Each module counts by a digest of its syntax tree without docstrings, so only
what Python executes counts. Two kinds of edge are not followed:

- into the stage framework (``tasks.framework``, this package) and the tracking package
  (``tracking``: a run's journal, its sender, a training rank's relay), neither counted nor
  followed: how a stage is configured, run, recorded and logged, not what it computes; the
  config's values are fingerprinted themselves, so a refactor of the config loader or of MLflow
  logging reruns nothing. The rule follows from the layout: every module of those two packages,
  and the stages' package ``__init__`` above the framework, is plumbing (``is_plumbing``);
  nothing is listed.
- into a package's ``__init__`` re-exports: importing ``transformer_core.config`` runs
  ``transformer_core/__init__.py``, whose own imports (the model) count only for a module that
  imports a name from the package itself.

Hand-written: Python's ``modulefinder`` imports nothing either, but follows every ``__init__``
and cannot stop at the plumbing; the rules above are what keep a model change from re-cleaning
a corpus.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = (
    "transformer_core",
    "filesystem",
    "corpora",
    "parsing",
    "weight_adapters",
    "tracking",
    "training",
    "evaluation",
    "serving",
    "tasks",
)
"""The project's packages; imports of anything else (torch, ray, the standard library) do not
count."""
FRAMEWORK = __name__.rpartition(".")[0]
"""The stage framework's package (``tasks.framework``): every module in it is plumbing."""
STAGES = FRAMEWORK.rpartition(".")[0]
"""The stages' package (``tasks``): stage ``x`` is module ``tasks.x``."""
TRACKING = "tracking"
"""The tracking package: how a stage's runs are recorded, every module of it plumbing."""


def is_plumbing(module: str) -> bool:
    """Whether a stage's code leaves ``module`` out (module doc): the framework's modules and the
    packages above it (the stages' ``__init__``, which holds no code), and the tracking
    package's modules."""
    return any(module == p or module.startswith(p + ".") for p in (FRAMEWORK, TRACKING)) or (
        module in _parents(FRAMEWORK)
    )


def module_file(name: str, root: Path | None = None) -> Path | None:
    """The source file of project module ``name`` (a package's ``__init__.py``) under ``root``
    (the project's), or None."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = (root or REPO).joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@functools.cache
def _parsed(path: Path, mtime_ns: int) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _tree(path: Path) -> ast.Module:
    return _parsed(path, path.stat().st_mtime_ns)


def imported(name: str, root: Path | None = None) -> set[str]:
    """Project modules that module ``name`` imports anywhere in its source; ``from package
    import name`` counts as the submodule when there is one, else as the package."""
    path = module_file(name, root)
    if path is None:
        return set()
    found: set[str] = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if module_file(sub, root) else node.module)
    return {m for m in found if module_file(m, root) is not None}


def _parents(name: str) -> list[str]:
    """The packages whose ``__init__`` importing ``name`` runs."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


@functools.cache
def _closure(name: str, root: Path, mtimes: tuple[int, ...]) -> frozenset[str]:
    seen: set[str] = set()
    follow = [name]
    while follow:
        module = follow.pop()
        if module in seen:
            continue
        seen.add(module)
        seen.update(p for p in _parents(module) if module_file(p, root))  # counted, not followed
        if not is_plumbing(module):
            follow.extend(imported(module, root))
    return frozenset(m for m in seen if not is_plumbing(m))


def modules_of(stage_module: str) -> list[str]:
    """The project modules stage module ``stage_module`` runs (module doc), sorted."""
    if module_file(stage_module) is None:
        return []
    # Keyed on every source's time as well: an edited import list makes another closure.
    mtimes = tuple(
        p.stat().st_mtime_ns for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))
    )
    return sorted(_closure(stage_module, REPO, mtimes))


class _NoDocstrings(ast.NodeTransformer):
    """Drops the docstring of every module, class and function (an expression statement that
    is a string constant, first in its body)."""

    def _strip(self, node: ast.AST) -> ast.AST:
        self.generic_visit(node)
        body = node.body  # type: ignore[attr-defined]
        if (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
        return node

    visit_Module = visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = _strip


@functools.cache
def _digest(path: Path, mtime_ns: int) -> str:
    tree = _NoDocstrings().visit(ast.parse(path.read_text(encoding="utf-8")))
    return hashlib.sha256(ast.dump(tree, annotate_fields=False).encode()).hexdigest()


def source_digest(path: Path) -> str:
    """sha256 of a module's syntax tree without docstrings: comments, docstrings and formatting
    do not change it; any change to what Python runs does."""
    return _digest(path, path.stat().st_mtime_ns)


def stage_code(stage: str) -> dict[str, str]:
    """``{file relative to the repository: digest}`` of the code stage ``stage`` runs
    (``tasks/<stage>.py`` and what it imports); empty for a name that is no stage module."""
    files = (module_file(m) for m in modules_of(f"{STAGES}.{stage}"))  # under REPO, as read now
    return {p.relative_to(REPO).as_posix(): source_digest(p) for p in files if p is not None}


def git_state() -> dict[str, str]:
    """``{"git_commit": ..., "git_dirty": "true"/"false"}`` when the code runs from a git
    checkout (dirty: tracked files differ from the commit); empty otherwise."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if commit.returncode != 0:
            return {}
        changes = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return {
        "git_commit": commit.stdout.strip(),
        "git_dirty": str(bool(changes.stdout.strip())).lower(),
    }
