"""The docs check of `make lint` (.ci/check_docs.py): it fails on what a reader would trip on
(a dead link, a missing image or heading, a make target or tfm subcommand that does not exist, a
path of one machine) and passes on this repository."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_docs", ROOT / ".ci" / "check_docs.py")
assert _spec is not None and _spec.loader is not None
check_docs = importlib.util.module_from_spec(_spec)
sys.modules["check_docs"] = check_docs
_spec.loader.exec_module(check_docs)

TFM = {"run": {}, "stage": {}, "tracking": {"replay": {}}}
GUIDE = """# A guide

What it is for. ![the curve](img/curve.png)

```bash
make demo            # make sure it runs: a comment names no target
.venv/bin/tfm run configs/quickstart.yaml --set data.mirror=file://$PWD/../mirror
tfm tracking replay configs/quickstart.yaml
python benchmarks/train.py --steps 10
```

See [the results](#results), [the notebook](log/notes.md) and
[the README](../README.md#a-repository).

## Results

| figure | command |
|---|---|
| 1.0 | `make lint` |
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A small repository the check passes: a Makefile, a README, a guide, a notebook."""
    (tmp_path / "Makefile").write_text(
        "demo: $(STAMP)\n\ttfm run\n\nlint:\n\truff check .\nX := 1\n"
    )
    (tmp_path / "README.md").write_text("# A repository\n\n[The guide](docs/guide.md).\n")
    (tmp_path / "docs" / "img").mkdir(parents=True)
    (tmp_path / "docs" / "img" / "curve.png").write_bytes(b"\x89PNG")
    (tmp_path / "docs" / "guide.md").write_text(GUIDE)
    (tmp_path / "docs" / "log").mkdir()
    (tmp_path / "docs" / "log" / "notes.md").write_text(
        "# Notes\n\n## 2026-11-20: a run\n\n"
        "`make retired-target` ran then; [the guide](../guide.md).\n"
    )
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "quickstart.yaml").write_text("# tuned on a laptop\nname: quickstart\n")
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "train.py").write_text("")
    return tmp_path


def shown(root: Path) -> list[str]:
    return [p.show(root) for p in check_docs.check(root, TFM)]


def test_a_sound_repository_passes(repo: Path):
    assert shown(repo) == []


def test_this_repository_passes():
    problems = check_docs.check(ROOT, check_docs.tfm_commands())
    assert [p.show(ROOT) for p in problems] == []


@pytest.mark.parametrize(
    ("added", "problem"),
    [
        ("[gone](gone.md)", "gone.md: no such file"),
        ("![plot](img/plot.png)", "img/plot.png: no such file"),
        ("[here](#nowhere)", "#nowhere: no heading #nowhere in docs/guide.md"),
        (
            "[the notes](log/notes.md#2026-11-21-a-run)",
            "no heading #2026-11-21-a-run in docs/log/notes.md",
        ),
        ("[elsewhere](../../elsewhere.md)", "../../elsewhere.md: points outside the repository"),
        ("Run `make deploy`.", "`make deploy`: no such target in the Makefile"),
        (
            "```bash\n.venv/bin/tfm trian configs/quickstart.yaml\n```",
            "`tfm trian`: no such subcommand",
        ),
        ("`tfm tracking send`", "`tfm tracking send`: no such subcommand"),
        ("`python benchmarks/gone.py`", "benchmarks/gone.py: no such file"),
        ("`tfm run configs/gone.yaml`", "configs/gone.yaml: no such file"),
        (
            "```bash\ncd /work/recipe && tfm run configs/quickstart.yaml\n```",
            "a path of one machine: /work/",
        ),
        ("--set data.mirror=file:///root/data", "a path of one machine: file:///root/"),
    ],
)
def test_a_guide_that_points_at_nothing_fails(repo: Path, added: str, problem: str):
    guide = repo / "docs" / "guide.md"
    guide.write_text(GUIDE + "\n" + added + "\n")
    found = shown(repo)
    assert len(found) == 1, found
    assert found[0].startswith("docs/guide.md:") and problem in found[0]


def test_a_problem_names_its_line(repo: Path):
    (repo / "docs" / "guide.md").write_text(GUIDE.replace("make demo ", "make demos"))
    assert shown(repo) == ["docs/guide.md:6: `make demos`: no such target in the Makefile"]


def test_the_notebooks_keep_old_commands_but_not_dead_links(repo: Path):
    notes = repo / "docs" / "log" / "notes.md"
    notes.write_text(notes.read_text() + "\n`tfm retired` and [the old guide](../old.md)\n")
    assert shown(repo) == ["docs/log/notes.md:7: ../old.md: no such file"]


def test_a_machine_path_in_a_config_comment_fails(repo: Path):
    (repo / "configs" / "quickstart.yaml").write_text("# from /home/someone/mirror\nname: q\n")
    assert shown(repo) == ["configs/quickstart.yaml:1: a path of one machine: /home/someone/..."]


def test_the_command_line_exits_1_on_a_problem(repo: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(check_docs, "tfm_commands", lambda: TFM)
    assert check_docs.main(["--root", str(repo)]) == 0
    (repo / "README.md").write_text("[gone](gone.md)\n")
    assert check_docs.main(["--root", str(repo)]) == 1
