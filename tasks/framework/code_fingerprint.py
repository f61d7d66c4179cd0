"""The code a stage runs, as fingerprints: so that a code change reruns exactly the stages it can
change, and a move, a rename, a comment, docstring or formatting change reruns none.

A stage's code is what it reaches: the top-level definitions of its module
(``tasks/<stage>.py``: functions, classes, module-level values), and every definition of a
project module that those name, transitively (a call graph, found by reading the sources with
``ast``, not by importing them). A name is resolved as Python would bind it: defined in the same
module, or imported (``import x``, ``import x as y``, ``from x import y``, at module level or
inside a function), through the re-exports of a package's ``__init__`` or any module, chains
included, and attribute access on a module (``mod.func``, ``pkg.mod.func``). Each reached
definition counts by a digest of its syntax tree, normalised (``_normalised``): no docstrings,
no import statements in its body, and a module-qualified reference written as the bare name of
what it reaches. The result is keyed by definition name, not by module, so moving a function to
another module, renaming a module or removing a re-export changes no stage's code, while any
change to a reached body changes every stage that reaches it.

Not counted:

- names outside the project's packages (torch, ray, the standard library);
- the stage framework (``tasks.framework``, this package) and the tracking package
  (``tracking``), neither counted nor followed: how a stage is configured, run, recorded and
  logged, not what it computes; the config's values are fingerprinted themselves. The rule
  follows from the layout (``is_plumbing``); nothing is listed;
- what a module runs outside its definitions (an ``if __name__ == "__main__":`` block).

(``from x import *`` is not read: ruff's F403 keeps it out of the project.)

Where a name cannot be resolved statically (an attribute a module does not define) or a module
is used as a value (passed, not called through), every top-level definition of that module
counts: more reruns, never a missed one.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import subprocess
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FRAMEWORK = __name__.rpartition(".")[0]
"""The stage framework's package (``tasks.framework``): every module in it is plumbing."""
STAGES = FRAMEWORK.rpartition(".")[0]
"""The stages' package (``tasks``): stage ``x`` is module ``tasks.x``."""
TRACKING = "tracking"
"""The tracking package: how a stage's runs are recorded, every module of it plumbing."""


@functools.cache
def project_packages() -> tuple[str, ...]:
    """The project's top-level packages, from their one list: ``root_packages`` of
    ``[tool.importlinter]`` in pyproject.toml (the wheel finds the same packages, the type
    checker covers them; tests/unit/test_architecture.py holds both to it). Installed without
    the checkout, the installed distribution's top-level packages."""
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if pyproject.is_file():
        config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        return tuple(config["tool"]["importlinter"]["root_packages"])
    top_level = metadata.distribution("attention-pipeline").read_text("top_level.txt") or ""
    return tuple(top_level.split())


def is_plumbing(module: str) -> bool:
    """Whether a stage's code leaves ``module`` out (module doc): the framework's modules and the
    packages above it (the stages' ``__init__``, which holds no code), and the tracking
    package's modules."""
    return any(module == p or module.startswith(p + ".") for p in (FRAMEWORK, TRACKING)) or (
        module in _parents(FRAMEWORK)
    )


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def module_file(name: str, root: Path | None = None) -> Path | None:
    """The source file of project module ``name`` (a package's ``__init__.py``) under ``root``
    (the project's), or None."""
    if name.split(".")[0] not in project_packages():
        return None
    base = (root or REPO).joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


Binding = tuple[str, str]
"""What an import binds a name to: ``(module, "")`` for a module, ``(module, attr)`` for a name
taken from one (``from module import attr``: a name it defines or imports, or a submodule)."""


@dataclass
class _Namespace:
    """A module's top-level names: its definitions (a name defined in two branches has two
    statements) and its imports."""

    name: str
    package: bool
    definitions: dict[str, list[ast.stmt]] = field(default_factory=dict)
    imports: dict[str, Binding] = field(default_factory=dict)
    names: dict[str, Binding] = field(default_factory=dict)
    """Every top-level name as a binding: the imports and the module's own definitions."""


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of a module body, with those inside ``if`` and ``try`` blocks (``if
    TYPE_CHECKING:`` imports, fallbacks), which bind names at module level too."""
    for node in body:
        if isinstance(node, ast.If):
            yield from _top_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            handlers = [s for h in node.handlers for s in h.body]
            yield from _top_level(node.body + handlers + node.orelse + node.finalbody)
        else:
            yield node


def _targets(node: ast.expr) -> Iterator[str]:
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, ast.Tuple | ast.List):
        for element in node.elts:
            yield from _targets(element)


def _bindings(node: ast.Import | ast.ImportFrom, module: str, package: bool) -> dict[str, Binding]:
    """The names an import statement in ``module`` binds."""
    if isinstance(node, ast.Import):
        return {
            a.asname or a.name.partition(".")[0]: (a.name if a.asname else a.name.split(".")[0], "")
            for a in node.names
        }
    base = node.module or ""
    if node.level:  # relative: from the module's package, up level - 1 more
        parts = module.split(".")[: len(module.split(".")) - node.level + package]
        base = ".".join(parts + ([base] if base else []))
    return {a.asname or a.name: (base, a.name) for a in node.names if a.name != "*"}


def _namespace(name: str, path: Path, tree: ast.Module) -> _Namespace:
    space = _Namespace(name, path.name == "__init__.py")
    for node in _top_level(tree.body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            space.definitions.setdefault(node.name, []).append(node)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for bound in _targets(target):
                    space.definitions.setdefault(bound, []).append(node)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            space.imports.update(_bindings(node, name, space.package))
    space.names = {**space.imports, **{n: (name, n) for n in space.definitions}}
    return space


@functools.cache
def _parsed(text: bytes) -> ast.Module:
    """A source's syntax tree, by its bytes: an unchanged module is parsed once per process."""
    return ast.parse(text)


Ref = tuple[str, str, str]
"""What a name reaches: ``("def", module, name)``, ``("module", module, "")``, ``("unresolved",
module, "")`` (a project module that has no such name), or ``("outside", "", "")``."""
OUTSIDE: Ref = ("outside", "", "")


class _Project:
    """The project's modules under ``root``, read once each, and name resolution over them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._spaces: dict[str, _Namespace | None] = {}
        self._definitions: dict[Binding, tuple[set[str], list[Ref]]] = {}

    def space(self, module: str) -> _Namespace | None:
        if module not in self._spaces:
            path = module_file(module, self.root)
            self._spaces[module] = (
                None if path is None else _namespace(module, path, _parsed(path.read_bytes()))
            )
        return self._spaces[module]

    def definition(self, space: _Namespace, name: str) -> tuple[set[str], list[Ref]]:
        """The digests of definition ``name`` of a module (one per statement that defines it)
        and what it refers to, read once for every stage."""
        key = (space.name, name)
        if key not in self._definitions:
            digests: set[str] = set()
            refs: list[Ref] = []
            for node in space.definitions[name]:
                found, bare = _resolved(self, node, {**space.names, **_local_imports(node, space)})
                refs.extend(found)
                digests.add(hashlib.sha256(_normalised(node, bare).encode()).hexdigest())
            self._definitions[key] = (digests, refs)
        return self._definitions[key]

    def lookup(self, module: str, name: str, seen: frozenset[Binding] = frozenset()) -> Ref:
        """What ``name`` in ``module``'s namespace (or as its attribute) reaches."""
        space = self.space(module)
        if space is None:
            return OUTSIDE
        if name in space.definitions:
            return ("def", module, name)
        if name in space.imports and (module, name) not in seen:
            return self.bound(space.imports[name], seen | {(module, name)})
        if space.package and self.space(f"{module}.{name}") is not None:
            return ("module", f"{module}.{name}", "")
        return ("unresolved", module, "")

    def bound(self, binding: Binding, seen: frozenset[Binding] = frozenset()) -> Ref:
        """What an import's binding reaches, following re-exports."""
        module, attr = binding
        if not attr:
            return ("module", module, "") if self.space(module) is not None else OUTSIDE
        return self.lookup(module, attr, seen)

    def chain(self, node: ast.expr, imports: dict[str, Binding]) -> tuple[Ref, ast.expr] | None:
        """What a name or attribute chain (``mod.sub.func.attr``) rooted in a project name
        reaches, and the sub-expression that reaches it (``mod.sub.func``); None for a name
        bound to nothing here (a local, a builtin)."""
        parts: list[ast.Attribute] = []
        while isinstance(node, ast.Attribute):
            parts.append(node)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in imports:
            return None
        ref, reached = self.bound(imports[node.id]), node
        for attribute in reversed(parts):
            if ref[0] != "module":
                break
            ref, reached = self.lookup(ref[1], attribute.attr), attribute
        return ref, reached


def _local_imports(node: ast.AST, space: _Namespace) -> dict[str, Binding]:
    """The names a definition's body imports (``from corpora import filters`` inside a
    function)."""
    found: dict[str, Binding] = {}
    for child in ast.walk(node):
        if isinstance(child, ast.Import | ast.ImportFrom) and child is not node:
            found.update(_bindings(child, space.name, space.package))
    return found


def _resolved(
    project: _Project, node: ast.AST, imports: dict[str, Binding]
) -> tuple[list[Ref], dict[int, str]]:
    """What every outermost name or attribute chain read in ``node`` reaches, and the bare name
    that stands for each sub-expression reaching a project definition (by the node's id)."""
    refs: list[Ref] = []
    bare: dict[int, str] = {}
    inner: set[int] = set()
    for child in ast.walk(node):
        if id(child) in inner or not _is_read(child):
            continue
        below = child
        while isinstance(below, ast.Attribute):  # the chain's own links, not what they contain
            below = below.value
            inner.add(id(below))
        found = project.chain(child, imports)  # type: ignore[arg-type]
        if found is not None:
            refs.append(found[0])
            if found[0][0] == "def":
                bare[id(found[1])] = found[0][2]
    return refs, bare


def _is_read(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) or (
        isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    )


def _is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _normalised(node: object, bare: dict[int, str]) -> str:
    """A definition's syntax tree as text, as ``ast.dump`` writes it, less where the definition
    lives: no docstrings, no import statements, and each sub-expression in ``bare`` (``mod.func``,
    ``pkg.mod.func``, an ``import ... as`` alias) written as the bare name of the definition it
    reaches."""
    if id(node) in bare:
        return f"Name({bare[id(node)]!r})"
    if isinstance(node, list):
        return "[" + ", ".join(_normalised(v, bare) for v in node) + "]"
    if not isinstance(node, ast.AST):
        return repr(node)
    fields = []
    for name, value in ast.iter_fields(node):
        if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
            value = [s for s in value if not isinstance(s, ast.Import | ast.ImportFrom)]
            if (
                name == "body"
                and isinstance(node, _DOCUMENTED)
                and value
                and _is_docstring(value[0])
            ):
                value = value[1:]
        fields.append(_normalised(value, bare))
    return f"{type(node).__name__}({', '.join(fields)})"


_DOCUMENTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _reached(project: _Project, stage_module: str) -> dict[str, set[str]]:
    """The digests of every definition the stage module reaches, by definition name."""
    digests: dict[str, set[str]] = {}
    start = project.space(stage_module)
    follow = [(stage_module, n) for n in (start.definitions if start else ())]
    seen: set[Binding] = set()
    while follow:
        module, name = follow.pop()
        space = project.space(module)
        if (module, name) in seen or is_plumbing(module) or space is None:
            continue
        seen.add((module, name))
        found, refs = project.definition(space, name)
        digests.setdefault(name, set()).update(found)
        for kind, target, defined in refs:
            if kind == "def":
                follow.append((target, defined))
            elif kind in ("module", "unresolved"):  # a module as a value: all of it
                follow.extend((target, n) for n in _all_definitions(project, target))
    return digests


def _all_definitions(project: _Project, module: str) -> list[str]:
    space = project.space(module)
    return list(space.definitions) if space is not None else []


@functools.lru_cache(maxsize=2)
def _project(root: Path, sources: tuple[bytes, ...]) -> _Project:
    """The project as read with these sources, shared by every stage's code."""
    return _Project(root)


@functools.lru_cache(maxsize=64)
def _stage_code(stage_module: str, root: Path, sources: tuple[bytes, ...]) -> dict[str, str]:
    digests = _reached(_project(root, sources), stage_module)
    return {
        name: next(iter(found)) if len(found) == 1 else _combined(found)
        for name, found in sorted(digests.items())
    }


def _combined(digests: set[str]) -> str:
    return hashlib.sha256("\n".join(sorted(digests)).encode()).hexdigest()


def stage_code(stage: str) -> dict[str, str]:
    """``{definition name: digest}`` of the code stage ``stage`` reaches (module doc); two
    different definitions of one name count together. Empty for a name that is no stage
    module."""
    if module_file(f"{STAGES}.{stage}") is None:
        return {}
    # Keyed on every source's path and digest: an edit, a new or a moved file reads again.
    sources = tuple(
        p.relative_to(REPO).as_posix().encode() + hashlib.sha256(p.read_bytes()).digest()
        for pkg in project_packages()
        for p in sorted((REPO / pkg).rglob("*.py"))
    )
    return dict(_stage_code(f"{STAGES}.{stage}", REPO, sources))


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
