"""The docs check of `make lint` (.ci/check_docs.py): it fails on what a reader would trip on
(a dead link, a missing image, heading or section, a make target that does not exist, a tfm
command its parser refuses or whose config does not load, a path of one machine) and passes on
this repository."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
Shown = Callable[[Path], list[str]]
_spec = importlib.util.spec_from_file_location("check_docs", ROOT / ".ci" / "check_docs.py")
assert _spec is not None and _spec.loader is not None
check_docs = importlib.util.module_from_spec(_spec)
sys.modules["check_docs"] = check_docs
_spec.loader.exec_module(check_docs)

GUIDE = """# A guide

What it is for. ![the curve](img/curve.png)

```bash
make demo            # make sure it runs: a comment names no target
make demo STEPS=10
.venv/bin/tfm run configs/quickstart.yaml --set data.mirror=file://$PWD/../mirror
FOO=1 nice -n 19 tfm stage train --config configs/quickstart.yaml \\
  --set train.steps=20 | tee log.txt && tfm status configs/quickstart.yaml
tfm tracking replay configs/quickstart.yaml
tfm run configs/quickstart.yaml --set 'workdir=s3://<bucket>/runs/{name}'
tfm stage <stage> --config <config> --accept
prefect deployment run pipeline/quickstart
python benchmarks/train.py --steps 10
```

See [the results](#results), [a row of them](#lint-row), [the notebook](log/notes.md) and
[the README](../README.md#a-repository); fragments in prose: `tfm status --verify`,
`tfm deploy --cron`, `tfm -v ...`. More in log/notes.md, "2026-11-20: a run" and in section
"Results" of guide.md.

## Results

| figure | command |
|---|---|
| <a id="lint-row"></a>1.0 | `make lint` |
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A small repository the check passes: a Makefile, a README, a guide, a notebook."""
    (tmp_path / "Makefile").write_text(
        "demo: $(STAMP)\n\ttfm run --set train.steps=$(STEPS)\n\nlint:\n\truff check .\nX := 1\n"
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


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return check_docs.tfm_parser()


@pytest.fixture
def shown(parser: argparse.ArgumentParser) -> Callable[[Path], list[str]]:
    return lambda root: [p.show(root) for p in check_docs.check(root, parser)]


def test_a_sound_repository_passes(repo: Path, shown: Shown):
    assert shown(repo) == []


def test_this_repository_passes(shown: Shown):
    assert shown(ROOT) == []


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
        ("Run `make demo TROCH=cpu`.", "`make TROCH=...`: the Makefile uses no TROCH"),
        (
            "```bash\n.venv/bin/tfm trian configs/quickstart.yaml\n```",
            "`tfm trian configs/quickstart.yaml`: argument COMMAND: invalid choice: 'trian'",
        ),
        ("`tfm tracking send`", "`tfm tracking send`: argument ACTION: invalid choice: 'send'"),
        (
            "```bash\ntfm run configs/quickstart.yaml --stesp 3\n```",
            "unrecognized arguments: --stesp 3",
        ),
        ("`tfm stage <stage> --froce`", "`tfm stage '<stage>' --froce`: unrecognized arguments"),
        ("```\ntfm translate --beam four\n```", "argument --beam: invalid int value: 'four'"),
        ("```\ntfm status\n```", "the following arguments are required: config"),
        (
            "`tfm run configs/quickstart.yaml --set train.stesp=3`",
            "--set train.stesp=3`: train.stesp: unknown key (known: steps,",
        ),
        (
            "`tfm run configs/quickstart.yaml --set data.mirro=file://<mirror>`",
            "data.mirro: unknown key (--set data.mirro=file://<mirror>)",
        ),
        (
            "```bash\ntfm run configs/quickstart.yaml \\\n  --set train.steps=many\n```",
            "train.steps: 'many' must be an integer (from --set train.steps='many')",
        ),
        (
            "```bash\nRAY_ADDRESS=ray://head:10001 tfm run configs/quickstart.yaml\n```",
            "RAY_ADDRESS=ray://head:10001: ray:// (Ray Client)",
        ),
        (
            "`tfm run configs/quickstart.yaml --set ray.address=ray://head:10001`",
            "--set ray.address=ray://head:10001: ray:// (Ray Client)",
        ),
        (
            "```bash\nprefect deployment run pipeline/quick-start\n```",
            "tfm deploy makes no deployment pipeline/quick-start",
        ),
        ('See log/notes.md, "A walk".', 'docs/log/notes.md, "A walk": no such section'),
        (
            'See [the notes](log/notes.md), "A walk".',
            'docs/log/notes.md, "A walk": no such section',
        ),
        ('See section "Outcomes" of guide.md.', 'docs/guide.md, "Outcomes": no such section'),
        ('See docs/gone.md\'s section "Results".', 'docs/gone.md, "Results": no such file'),
        ("`python benchmarks/gone.py`", "benchmarks/gone.py: no such file"),
        ("`tfm run configs/gone.yaml`", "configs/gone.yaml: no such file"),
        (
            "```bash\ncd /work/recipe && tfm run configs/quickstart.yaml\n```",
            "a path of one machine: /work/",
        ),
        ("--set data.mirror=file:///root/data", "a path of one machine: file:///root/"),
    ],
)
def test_a_guide_that_points_at_nothing_fails(repo: Path, shown: Shown, added: str, problem: str):
    guide = repo / "docs" / "guide.md"
    guide.write_text(GUIDE + "\n" + added + "\n")
    found = shown(repo)
    assert len(found) == 1, found
    assert found[0].startswith("docs/guide.md:") and problem in found[0]


def test_a_problem_names_its_line(repo: Path, shown: Shown):
    (repo / "docs" / "guide.md").write_text(GUIDE.replace("make demo ", "make demos", 1))
    assert shown(repo) == ["docs/guide.md:6: `make demos`: no such target in the Makefile"]


def test_a_command_over_lines_is_one_named_by_its_first(repo: Path, shown: Shown):
    (repo / "docs" / "guide.md").write_text(GUIDE.replace("train.steps=20 |", "train.step=20 |"))
    [found] = shown(repo)
    assert found.startswith(
        "docs/guide.md:9: `tfm stage train --config configs/quickstart.yaml "
        "--set train.step=20`: train.step: unknown key"
    )


def test_loading_the_configs_makes_nothing(
    repo: Path,
    shown: Shown,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
):
    """The check loads each command's config (relative work dirs resolve from the CWD) and
    writes nothing: no work dir, no MLflow database, no Prefect home."""
    here = tmp_path_factory.mktemp("cwd")
    monkeypatch.chdir(here)
    before = sorted(repo.rglob("*"))
    assert shown(repo) == []
    assert list(here.iterdir()) == [] and sorted(repo.rglob("*")) == before


def test_the_notebooks_keep_old_commands_but_not_dead_links(repo: Path, shown: Shown):
    notes = repo / "docs" / "log" / "notes.md"
    notes.write_text(notes.read_text() + "\n`tfm retired` and [the old guide](../old.md)\n")
    assert shown(repo) == ["docs/log/notes.md:7: ../old.md: no such file"]


def test_a_machine_path_in_a_config_comment_fails(repo: Path, shown: Shown):
    (repo / "configs" / "quickstart.yaml").write_text(
        "# from /home/someone/mirror\nname: quickstart\n"
    )
    assert shown(repo) == ["configs/quickstart.yaml:1: a path of one machine: /home/someone/..."]


def test_the_command_line_exits_1_on_a_problem(repo: Path):
    assert check_docs.main(["--root", str(repo)]) == 0
    (repo / "README.md").write_text("[gone](gone.md)\n")
    assert check_docs.main(["--root", str(repo)]) == 1
