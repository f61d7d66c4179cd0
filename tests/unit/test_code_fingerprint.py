"""Which stages a code change reaches: the definitions a stage module reaches through its call
graph, their syntax normalised, so that a move, a rename, a comment or a docstring reaches none
and a changed body reaches exactly the stages that call it."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest

from tasks.framework import code_fingerprint
from tasks.framework.code_fingerprint import project_packages, stage_code

STAGES = (
    "download",
    "clean",
    "tokenizer",
    "shard",
    "train",
    "average",
    "translate",
    "score",
    "register",
    "treebank",
    "linearize",
    "parse_score",
)


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A copy of the project's packages that the fingerprints read instead of the real ones."""
    for package in project_packages():
        shutil.copytree(
            code_fingerprint.REPO / package,
            tmp_path / package,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    monkeypatch.setattr(code_fingerprint, "REPO", tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def original() -> dict[str, dict[str, str]]:
    """Every stage's code as the project has it (what a fresh copy of it has too)."""
    return codes()


def codes() -> dict[str, dict[str, str]]:
    return {s: stage_code(s) for s in STAGES}


def changed_stages(repo: Path, edit, original: dict[str, dict[str, str]]) -> set[str]:
    edit(repo)
    return {s for s in STAGES if stage_code(s) != original[s]}


def module_path(repo: Path, module: str) -> Path:
    return repo.joinpath(*module.split(".")).with_suffix(".py")


def sources(repo: Path) -> list[Path]:
    return sorted(p for package in project_packages() for p in (repo / package).rglob("*.py"))


def reimport(repo: Path, name: str, old: str, new: str | None) -> None:
    """Every ``from old import ..., name, ...`` (anywhere in a file but ``new``'s own) imports
    ``name`` from ``new`` instead (the callers' import lines after a move), or, with ``new``
    None, no longer imports it."""
    own = {module_path(repo, new or ""), repo.joinpath(*(new or "").split("."), "__init__.py")}
    for path in sources(repo):
        if path not in own:
            _reimport_in(path, name, old, new)


def _reimport_in(path: Path, name: str, old: str, new: str | None) -> None:
    lines = path.read_text().splitlines(keepends=True)
    found = [
        n
        for n in ast.walk(ast.parse("".join(lines)))
        if isinstance(n, ast.ImportFrom)
        and n.module == old
        and any(a.name == name for a in n.names)
    ]
    for node in sorted(found, key=lambda n: -n.lineno):
        indent = " " * node.col_offset
        (alias,) = [a for a in node.names if a.name == name]
        node.names = [a for a in node.names if a.name != name]
        text = f"{indent}from {new} import {ast.unparse(alias)}\n" if new else ""
        if node.names:
            text = f"{indent}{ast.unparse(node)}\n{text}"
        lines[node.lineno - 1 : node.end_lineno] = [text or f"{indent}pass\n"]
    if found:
        path.write_text("".join(lines))


def move(repo: Path, module: str, name: str, target: str) -> None:
    """Move top-level definition ``name`` from ``module`` to the new module ``target``, which
    imports what it needs, and update every caller's import (the old module's included)."""
    source = module_path(repo, module)
    lines = source.read_text().splitlines(keepends=True)
    tree = ast.parse("".join(lines))
    (node,) = [n for n in tree.body if getattr(n, "name", None) == name]
    start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
    cut = lines[start : node.end_lineno]
    own = {getattr(n, "name", None) for n in tree.body} - {name, None}
    own |= {
        t.id
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    used = sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name)} & own)
    imports = [
        "".join(lines[n.lineno - 1 : n.end_lineno])
        for n in tree.body
        if isinstance(n, ast.Import | ast.ImportFrom)
    ]
    local = [f"from {module} import {', '.join(used)}\n"] if used else []
    module_path(repo, target).write_text("".join(imports + local + ["\n\n"] + cut))
    del lines[start : node.end_lineno]
    source.write_text("".join(lines) + f"\nfrom {target} import {name}\n")
    reimport(repo, name, module, target)


def rename_module(repo: Path, old: str, new: str) -> None:
    """Rename module ``old`` to ``new`` and every dotted reference to it."""
    pattern = re.compile(rf"\b{re.escape(old)}\b")
    parent, _, leaf = old.rpartition(".")
    for path in sources(repo):
        text = path.read_text()
        assert not re.search(rf"from {re.escape(parent)} import .*\b{leaf}\b", text), path
        path.write_text(pattern.sub(new, text))
    module_path(repo, old).rename(module_path(repo, new))


def test_a_moved_function_or_class_reaches_no_stage(repo: Path, original):
    """``write_json_atomic`` (download reaches it) and ``ModelConfig`` (train and translate do)
    move to new modules, with their callers' imports: no stage's code changes."""
    assert "write_json_atomic" in original["download"] and "ModelConfig" in original["train"]
    move(repo, "transformer_core.folders", "write_json_atomic", "transformer_core.json_files")
    move(repo, "transformer_core.config", "ModelConfig", "transformer_core.model_config")
    assert "class ModelConfig" in module_path(repo, "transformer_core.model_config").read_text()
    assert codes() == original


def test_a_renamed_module_reaches_no_stage(repo: Path, original):
    rename_module(repo, "transformer_core.search_settings", "transformer_core.beam_settings")
    rename_module(repo, "transformer_core.folders", "transformer_core.disk_folders")
    assert not module_path(repo, "transformer_core.folders").exists()
    assert codes() == original


def test_a_facade_added_or_removed_reaches_no_stage(repo: Path, original):
    """Callers import ``ModelConfig`` through the package's re-export, then the re-export goes
    and they import it from its module again: the same code throughout."""
    reimport(repo, "ModelConfig", "transformer_core.config", "transformer_core")
    init = repo / "transformer_core/__init__.py"
    assert "from transformer_core.config import" in init.read_text()  # the re-export
    through_facade = codes()
    reimport(repo, "ModelConfig", "transformer_core", "transformer_core.config")
    _reimport_in(init, "ModelConfig", "transformer_core.config", None)
    assert "ModelConfig\n" not in init.read_text().split("__all__")[0]
    assert through_facade == original and codes() == original


def _change_body(path: Path, name: str) -> None:
    """A change Python runs in function ``name``: one more statement first in its body."""
    lines = path.read_text().splitlines(keepends=True)
    (node,) = [n for n in ast.parse("".join(lines)).body if getattr(n, "name", None) == name]
    first = node.body[0]
    lines.insert(first.lineno - 1, " " * first.col_offset + "_unused = 1\n")
    path.write_text("".join(lines))


def test_a_changed_body_reaches_the_stages_that_call_it(repo: Path, original):
    reached = {s for s in STAGES if "write_json_atomic" in original[s]}
    assert "download" in reached and reached != set(STAGES)
    edit = lambda r: _change_body(r / "transformer_core/folders.py", "write_json_atomic")  # noqa: E731
    assert changed_stages(repo, edit, original) == reached


def test_an_unreached_addition_reaches_no_stage(repo: Path, original):
    def edit(r: Path) -> None:
        path = r / "corpora/filters.py"
        path.write_text(path.read_text() + "\n\ndef _added_helper():\n    return 1\n")

    assert changed_stages(repo, edit, original) == set()


def _reword_docstrings(path: Path) -> None:
    """Every docstring of a module (its own, its functions' and classes') starts with one more
    word."""
    lines = path.read_text().splitlines(keepends=True)
    tree = ast.parse("".join(lines))
    for node in [tree, *ast.walk(tree)]:
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and code_fingerprint._is_docstring(body[0]):
            line, col = body[0].lineno - 1, body[0].col_offset + 3
            lines[line] = lines[line][:col] + "Reworded. " + lines[line][col:]
    path.write_text("".join(lines))


def test_comments_and_docstrings_reach_no_stage(repo: Path, original):
    def edit(r: Path) -> None:
        path = r / "transformer_core/folders.py"
        _reword_docstrings(path)
        text = path.read_text().replace("\ndef ", "\n# a comment\n\n\ndef ", 1)
        path.write_text(text + "\n\n# trailing comment\n")

    assert changed_stages(repo, edit, original) == set()


def test_a_model_change_reaches_what_runs_the_model_not_the_data_stages(repo: Path, original):
    edit = lambda r: _change_body(r / "transformer_core/model.py", "Transformer")  # noqa: E731
    changed = changed_stages(repo, edit, original)
    assert {"train", "translate", "register"} <= changed
    assert not changed & {"download", "clean", "tokenizer", "shard", "score", "treebank"}


def test_every_stage_reaches_the_project_names_its_module_uses():
    """A stage's code holds every project definition its module's names stand for (checked
    against the objects Python binds when it imports the module)."""
    import importlib

    for stage in STAGES:
        module = importlib.import_module(f"tasks.{stage}")
        reached = set(stage_code(stage))
        names = {
            getattr(v, "__name__", "")
            for v in vars(module).values()
            if callable(v)
            and getattr(v, "__module__", "").split(".")[0] in project_packages()
            and not code_fingerprint.is_plumbing(v.__module__)
        }
        assert names <= reached, (stage, names - reached)


def _change_every_body(path: Path) -> None:
    """``_change_body`` of every top-level function and class of a module."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            _change_body(path, node.name)


def test_plumbing_changes_reach_no_stage(repo: Path, original):
    """How stages are configured, run and logged is not what they compute: a change to every
    function and class of the stage framework and of the tracking package keeps every output
    (the config's values count themselves). Every module of those packages is plumbing, by the
    layout."""

    def edit(r: Path) -> None:
        for package in ("tasks/framework", "tracking"):
            for path in sorted((r / package).rglob("*.py")):
                _change_every_body(path)

    assert changed_stages(repo, edit, original) == set()


def _tiny_project(root: Path, stage: str) -> dict[str, str]:
    """Stage ``demo`` (source ``stage``) over a library module with two functions."""
    (root / "tasks").mkdir(exist_ok=True)
    (root / "corpora").mkdir(exist_ok=True)
    for package in ("tasks", "corpora"):
        (root / package / "__init__.py").write_text("")
    (root / "corpora/helpers.py").write_text(
        "def clean_text(x):\n    return x.strip()\n\n\ndef unused(x):\n    return x\n"
    )
    (root / "tasks/demo.py").write_text(stage)
    return stage_code("demo")


def test_how_a_stage_names_a_function_does_not_count(tmp_path, monkeypatch):
    """``mod.func``, ``pkg.mod.func``, ``func`` and an alias of it are the same code; a module
    passed as a value counts whole."""
    monkeypatch.setattr(code_fingerprint, "REPO", tmp_path)
    styles = [
        "from corpora import helpers\n\ndef build(x):\n    return helpers.clean_text(x)\n",
        "import corpora.helpers\n\ndef build(x):\n    return corpora.helpers.clean_text(x)\n",
        "from corpora.helpers import clean_text\n\ndef build(x):\n    return clean_text(x)\n",
        "from corpora.helpers import clean_text as ct\n\ndef build(x):\n    return ct(x)\n",
    ]
    found = [_tiny_project(tmp_path, style) for style in styles]
    assert all(code == found[0] for code in found) and set(found[0]) == {"build", "clean_text"}
    whole = _tiny_project(tmp_path, "from corpora import helpers\n\nPARTS = [helpers]\n")
    assert set(whole) == {"PARTS", "clean_text", "unused"}


def test_status_names_the_definitions_that_changed():
    """``tfm status`` says which definitions differ; a manifest from before per-definition
    fingerprints (a digest per file) says so in one reason, not a list of file names."""
    from tasks.framework.stage_fingerprint import why_changed

    now = {"stage": "clean", "config": {}, "inputs": {}, "code": {"keep": "b", "build": "c"}}
    written = {"config": {}, "inputs": {}, "code": {"keep": "a", "build": "c", "gone": "d"}}
    assert why_changed(written, now) == "code changed (gone, keep)"
    per_file = {**written, "code": {"corpora/filters.py": "a", "tasks/clean.py": "c"}}
    assert why_changed(per_file, now) == (
        "code changed (recorded before per-definition code fingerprints)"
    )
