"""Which stages a code change reaches: the stage modules and the project modules they import,
their syntax without docstrings (so comments and formatting reach none)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tasks.framework import code_fingerprint
from tasks.framework.code_fingerprint import PACKAGES, stage_code

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
    for package in PACKAGES:
        shutil.copytree(
            code_fingerprint.REPO / package,
            tmp_path / package,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    monkeypatch.setattr(code_fingerprint, "REPO", tmp_path)
    return tmp_path


def changed_stages(repo: Path, edit) -> set[str]:
    before = {s: stage_code(s) for s in STAGES}
    edit(repo)
    return {s for s in STAGES if stage_code(s) != before[s]}


def _add_code(path: Path) -> None:
    """A change Python runs: one more function."""
    path.write_text(path.read_text() + "\n\ndef _added_helper():\n    return 1\n")


def test_a_changed_filter_reaches_clean_alone(repo: Path):
    assert changed_stages(repo, lambda r: _add_code(r / "corpora/filters.py")) == {"clean"}


def test_comments_docstrings_and_formatting_reach_no_stage(repo: Path):
    def edit(r: Path) -> None:
        path = r / "corpora/filters.py"
        text = path.read_text()
        text = text.replace('"""', '"""Reworded. ', 1)  # the module docstring
        text = text.replace("\ndef ", "\n# a comment\n\n\ndef ", 1)
        path.write_text(text + "\n\n# trailing comment\n")

    assert changed_stages(repo, edit) == set()


def test_the_corpus_translator_reaches_translate_not_train(repo: Path):
    changed = changed_stages(repo, lambda r: _add_code(r / "serving/corpus_translation.py"))
    assert changed == {"translate"}


def test_a_model_change_reaches_what_runs_the_model_not_the_data_stages(repo: Path):
    changed = changed_stages(repo, lambda r: _add_code(r / "transformer_core/model.py"))
    assert {"train", "average", "translate", "register"} <= changed
    assert not changed & {"download", "clean", "tokenizer", "shard", "score", "treebank"}


def test_every_stage_module_reaches_the_modules_it_imports():
    """The fingerprint follows what a stage really imports: a stage's code includes the module
    of every project name that the stage module imports (checked against the imports Python
    records while importing it)."""
    import importlib
    import sys

    for stage in STAGES:
        module = importlib.import_module(f"tasks.{stage}")
        files = set(stage_code(stage))
        direct = {
            Path(sys.modules[v.__module__].__file__).relative_to(code_fingerprint.REPO).as_posix()
            for v in vars(module).values()
            if getattr(v, "__module__", "").split(".")[0] in PACKAGES
            and not code_fingerprint.is_plumbing(getattr(v, "__module__", ""))
        }
        assert direct <= files, (stage, direct - files)


def test_plumbing_changes_reach_no_stage(repo: Path):
    """How stages are configured, run and logged is not what they compute: a refactor of the
    config loader, the runner or MLflow logging keeps every output (the config's values count
    themselves). Every module of the framework package is plumbing, by the layout."""
    for plumbing in (
        "tasks/framework/config.py",
        "tasks/framework/mlflow_runs.py",
        "tasks/framework/contract.py",
        "tasks/framework/runner.py",
    ):
        assert changed_stages(repo, lambda r, p=plumbing: _add_code(r / p)) == set(), plumbing


def test_the_tracking_package_is_plumbing(repo: Path):
    """How a run is recorded (the journal a training rank writes through, the sender) is not
    what a stage computes: a change to any tracking module reaches no stage, and no stage's code
    lists one, though train's worker imports its relay."""
    for module in ("tracking/relay.py", "tracking/journal.py", "tracking/sender.py"):
        assert changed_stages(repo, lambda r, p=module: _add_code(r / p)) == set(), module
    assert not any(path.startswith("tracking/") for s in STAGES for path in stage_code(s))
