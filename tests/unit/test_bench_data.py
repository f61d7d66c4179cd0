"""benchmarks/data.py's input (``make bench`` runs it and train_memory.py): the WMT14 sample
beside the clone, or on a clone without ../shared a synthetic corpus of the same shape."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import data as bench_data  # noqa: E402


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_without_the_wmt14_sample_a_synthetic_corpus_of_its_shape_stands_in(
    tmp_path: Path, monkeypatch, capsys
):
    missing = tmp_path / "shared" / "data" / "wmt14_ende_sample"
    monkeypatch.setattr(bench_data, "SAMPLE", missing)
    monkeypatch.setattr(bench_data, "ROOT", tmp_path / "clone")

    folder = bench_data.sample_folder()

    assert capsys.readouterr().out == (
        f"{missing} is absent: the synthetic corpus stands in for the WMT14 sample\n"
    )
    assert folder.is_relative_to(tmp_path / "clone" / "benchmarks" / "results")
    counts = {p.name: _lines(p) for p in folder.iterdir()}
    assert counts == {
        **{f"train.{lang}": 10_000 for lang in ("en", "de")},
        **{f"newstest2012.{lang}": 3_000 for lang in ("en", "de")},
        **{f"newstest2014.full.{lang}": 3_003 for lang in ("en", "de")},
    }
    assert bench_data.sample_folder() == folder  # written once, then reused


def test_the_wmt14_sample_is_used_where_it_is(tmp_path: Path, monkeypatch, capsys):
    sample = tmp_path / "wmt14_ende_sample"
    sample.mkdir()
    (sample / "train.en").write_text("a line\n")
    monkeypatch.setattr(bench_data, "SAMPLE", sample)
    assert bench_data.sample_folder() == sample
    assert capsys.readouterr().out == ""
