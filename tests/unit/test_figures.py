"""benchmarks/figures.py, the figures' one home: docs/benchmarks.md's results table and README.md's
recipe table are written from benchmarks/figures/*.json, ``make lint`` fails in one line when a
table was edited by hand, and a benchmark's ``record`` updates its row with the run's facts."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import figures  # noqa: E402


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A copy of the two pages and the figures files, as committed."""
    for path in [*figures.PAGES, figures.FIGURES]:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        copy = shutil.copytree if (ROOT / path).is_dir() else shutil.copy
        copy(ROOT / path, tmp_path / path)
    return tmp_path


def test_the_committed_tables_are_what_the_files_say():
    assert figures.stale(ROOT) == []


def test_a_hand_edit_of_a_figure_in_the_results_table_fails_the_check(repo: Path, capsys):
    page = repo / "docs/benchmarks.md"
    text = page.read_text()
    row = json.loads((repo / figures.FIGURES / "data.json").read_text())["rows"][0]
    assert row["figure"] in text
    page.write_text(text.replace(row["figure"], "**0.99** (typed by hand)", 1))

    assert figures.main(["--root", str(repo)]) == 1
    assert capsys.readouterr().out == (
        "docs/benchmarks.md: the results table differs from benchmarks/figures: "
        "run .venv/bin/python benchmarks/figures.py --write\n"
    )
    assert figures.main(["--root", str(repo), "--write"]) == 0
    assert figures.main(["--root", str(repo)]) == 0
    assert row["figure"] in page.read_text()


def test_a_hand_edit_of_the_readme_recipe_table_fails_the_check(repo: Path):
    readme = repo / "README.md"
    readme.write_text(readme.read_text().replace("94.26", "95.00", 1))
    assert figures.stale(repo) == [
        "README.md: the recipes table differs from benchmarks/figures: "
        "run .venv/bin/python benchmarks/figures.py --write"
    ]


def test_the_tables_give_each_row_an_anchor_and_the_readme_links_to_it(repo: Path):
    files = figures.load(repo)
    ids = [r["id"] for rows in files.values() for r in rows]
    assert len(ids) == len(set(ids))
    results = (repo / "docs/benchmarks.md").read_text()
    readme = (repo / "README.md").read_text()
    assert all(f'<a id="{i}"></a>' in results for i in ids)
    assert all(f"(docs/benchmarks.md#{r['id']})" in readme for r in files[figures.RECIPES])


def test_text_outside_the_markers_is_kept(repo: Path):
    page = repo / "docs/benchmarks.md"
    page.write_text(page.read_text().replace("## Limits", "## Limits\n\nA line of prose.", 1))
    figures.write(repo)
    assert "## Limits\n\nA line of prose." in page.read_text()
    assert figures.stale(repo) == []


def test_a_page_without_its_markers_is_an_error():
    with pytest.raises(ValueError, match="no '<!-- results table"):
        figures.render("# Benchmarks\n", "results", {})


def test_record_replaces_a_rows_figure_with_this_runs_command_date_machine_and_commit(
    repo: Path, monkeypatch
):
    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks/data.py"), "--pairs", "1000"])
    figures.record("data", "data-stages", "**0.61**", root=repo)

    (row,) = json.loads((repo / figures.FIGURES / "data.json").read_text())["rows"]
    assert row["figure"] == "**0.61**"
    assert row["command"] == ".venv/bin/python benchmarks/data.py --pairs 1000"
    assert row["date"] == figures.datetime.datetime.now(figures.datetime.UTC).date().isoformat()
    assert row["machine"].split("-core ")[0].isdigit() or " x " in row["machine"]
    assert "what" in row and row["commit"] is None  # the copy is no git checkout
    assert figures.stale(repo) == []  # the tables are written with it
    assert "| **0.61** |" in (repo / "docs/benchmarks.md").read_text()


def test_record_refuses_a_new_row_without_what_and_an_unknown_file(repo: Path):
    with pytest.raises(ValueError, match="a new row needs what="):
        figures.record("data", "no-such-row", "1.0", root=repo)
    with pytest.raises(ValueError, match="not a figures file"):
        figures.record("nowhere", "data-stages", "1.0", root=repo)
    figures.record("data", "new-row", "1.0", root=repo, what="a new measurement")
    assert [r["id"] for r in figures.load(repo)["data"]] == ["data-stages", "new-row"]


def test_an_unlisted_figures_file_is_an_error(repo: Path):
    (repo / figures.FIGURES / "stray.json").write_text('{"rows": []}')
    with pytest.raises(ValueError, match="stray"):
        figures.load(repo)


def _peers_results(updates: int) -> dict:
    train = {
        "fairseq (2 processes)": {"target_tokens_per_s": 3473.0},
        "ours (Ray Train, as tfm run)": {"target_tokens_per_s": 6058.0},
    }
    decode = {
        "fairseq-generate": {"sentences": 1000, "decode_seconds": 10.0, "bleu_tok_lc": 20.31},
        "tfm translate, engine torch, fairseq's weights": {
            **{"sentences": 1000, "decode_seconds": 5.0, "bleu_tok_lc": 20.32},
            "identical": 0.996,
        },
    }
    best = {"ours": "ours (Ray Train, as tfm run)", "fairseq": "fairseq (2 processes)"}
    return {
        "updates": updates,
        "train": train,
        "decode": decode,
        "ours_over_fairseq": 6058 / 3473,
        "best_layouts": best,
    }


def test_bench_peers_records_its_rows_only_at_the_rows_length(repo: Path, monkeypatch):
    from peers import run

    monkeypatch.setattr(figures, "ROOT", repo)
    before = figures.load(repo)["peers"]
    run.record_rows(_peers_results(updates=30))
    assert figures.load(repo)["peers"] == before  # a default run writes nothing

    run.record_rows(_peers_results(updates=run.ROW_UPDATES))
    rows = {row["id"]: row for row in figures.load(repo)["peers"]}
    training, decoding = rows["peers-training"], rows["peers-decoding"]
    assert training["figure"].startswith("**1.74** (6,058 against 3,473 target tokens/s;")
    assert decoding["figure"] == (
        "**2.00x** fairseq-generate's sentences/s (200.0 against 100.0); 99.6% of the "
        "hypotheses identical, BLEU 20.32 against 20.31"
    )
    assert figures.stale(repo) == []


def _training_row(model: str, tokens: float, mfu: float, **switches: bool) -> dict:
    return {"model": model, "compile": False, "fused_loss": False, **switches} | {
        "tokens/s": tokens,
        "MFU": mfu,
    }


def test_bench_gpu_records_the_rows_its_sections_measured(repo: Path, monkeypatch):
    import gpu

    monkeypatch.setattr(figures, "ROOT", repo)
    results = {
        "environment": {"device": "NVIDIA H200"},
        "ray": [
            {"run": 1, "loop": "plain", "vs_plain_mean": 1.01},
            {"run": 1, "loop": "Ray Train, 1 worker", "vs_plain_mean": 0.95},
            {"run": 2, "loop": "Ray Train, 1 worker", "vs_plain_mean": 0.97},
            {"run": "mean", "loop": "Ray Train / plain", "vs_plain_mean": 0.96},
        ],
        "training": [
            _training_row("base", 400_000, 0.079),
            _training_row("base", 380_000, 0.075, fused_loss=True),
            _training_row("base", 580_000, 0.113, compile=True),
            _training_row("big", 376_000, 0.247, compile=True),
            _training_row("big", 370_000, 0.243, compile=True, fused_loss=True),
        ],
        "decoding": [
            {"dtype": "bfloat16", "batch": 64, "out_len": 50, "tgt_tokens/s": 12_000.0},
            {"dtype": "bfloat16", "batch": 128, "out_len": 50, "tgt_tokens/s": 20_958.0},
        ],
    }
    gpu.record_rows(results)

    rows = {r["id"]: r for r in figures.load(repo)["gpu"]}
    assert rows["ray-train-vs-plain-loop-gpu"]["figure"] == "0.950-0.970"
    assert rows["gpu-base-eager"]["figure"] == "400,000 tokens/s, 7.9% MFU"
    assert rows["gpu-training-mfu"]["figure"] == (
        "580,000 / 376,000 tokens/s; **11.3% / 24.7% MFU**"
    )
    assert rows["gpu-beam-search"]["figure"] == "20,958 target tokens/s"
    recorded = ("ray-train-vs-plain-loop-gpu", "gpu-base-eager", "gpu-training-mfu")
    assert {rows[i]["machine"] for i in (*recorded, "gpu-beam-search")} == {"NVIDIA H200"}
    assert rows["gpu-multi30k-2.5-minutes"]["machine"] == "H100"  # not measured: kept


def _train_args(**given: object) -> argparse.Namespace:
    defaults = {"shards": "runs/x/shard", "layouts": None, "glibc_defaults": False, "repeats": 3}
    return argparse.Namespace(**{**defaults, **given})


def test_train_py_records_a_row_only_for_the_rows_measurements(repo: Path, monkeypatch):
    import train

    monkeypatch.setattr(figures, "ROOT", repo)
    plain = {"path": "plain", "tokens_per_s": 8298.0}
    ray = {"path": "ray_train", "tokens_per_s": 7639.0, "vs_plain": 7639 / 8298}
    before = figures.load(repo)["train"]
    train.record_rows([plain, ray], _train_args(shards=None))  # synthetic batches: no row
    train.record_rows([plain, ray], _train_args(layouts="1x1:512"))  # not a row's layouts
    assert figures.load(repo)["train"] == before

    train.record_rows([plain, ray], _train_args())
    one = {"path": "ray_train 1x2:2048", "tokens_per_s": 10_452.0}
    two = {"path": "ray_train 2x1:1024", "tokens_per_s": 15_233.0}
    train.record_rows([one, two], _train_args(layouts="1x2:2048,2x1:1024"))
    kept = {"path": "ray_train 2x1:4096", "tokens_per_s": 7377.0}
    kept |= {"faults_per_step": 100.0, "worker_rss_mib": 2085.0}
    glibc = {"path": "ray_train 2x1:4096 glibc defaults", "tokens_per_s": 5705.0}
    glibc |= {"faults_per_step": 1200.0, "worker_rss_mib": 1556.0}
    train.record_rows([kept, glibc], _train_args(layouts="2x1:4096,1x2:4096", glibc_defaults=True))

    rows = {r["id"]: r["figure"] for r in figures.load(repo)["train"]}
    assert rows["ray-train-vs-plain-loop-cpu"] == (
        "**0.92** (7,639 against 8,298 tokens/s, best of 3 interleaved runs)"
    )
    assert rows["layout-2x1-vs-1x2"] == "**1.46** (15,233 against 10,452 tokens/s)"
    assert rows["keep-freed-memory"] == (
        "**1.29x** tokens/s (7,377 against 5,705), 12x fewer page faults, +529 MiB (+34%) "
        "resident memory a worker"
    )


def test_a_cpu_is_named_with_the_instruction_sets_its_kernels_use() -> None:
    import os

    xeon = "processor\t: 0\nmodel name\t: Intel Xeon\n"
    xeon += "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16\n"
    cores = os.cpu_count()
    assert figures.machine(xeon) == f"{cores}-core Intel Xeon (AVX2, AVX-512, AVX512-BF16, AMX)"
    epyc = "model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2\n"
    assert figures.machine(epyc) == f"{cores}-core AMD EPYC (AVX2)"
    assert (
        figures.machine("model name\t: Old CPU\nflags\t\t: fpu sse2\n") == f"{cores}-core Old CPU"
    )
    zen5 = "cpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\nflags\t\t: avx2\n"
    assert figures.machine(zen5) == f"{cores}-core AMD EPYC, family 26 model 2 (AVX2)"
    named = "cpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC 9654 96-Core Processor\n"
    assert figures.machine(named) == f"{cores}-core AMD EPYC 9654 96-Core Processor"
