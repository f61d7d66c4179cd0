"""``tfm evaluate``'s parts that need no model: reading test sets, the table, the version's tags."""

from __future__ import annotations

import gzip
import socket
from pathlib import Path

import pytest

from corpora import CorpusError
from evaluation.bleu import score_texts
from evaluation.compare import compare_systems
from evaluation.evidence import figure_tags, tag_name
from pipelines.evaluate_command import (
    EvaluationSet,
    SetResult,
    read_test_set,
    table,
    tag_version,
)

LANGS = ("en", "de")
SOURCES = ["the cat", "a dog", "the old tree"]
REFS = ["die Katze", "ein Hund", "der alte Baum"]


def lines(texts: list[str]) -> str:
    return "".join(t + "\n" for t in texts)


def test_a_prefix_of_plain_or_gzip_files_and_a_tsv_read_alike(tmp_path: Path) -> None:
    (tmp_path / "plain.en").write_text(lines(SOURCES))
    (tmp_path / "plain.de").write_text(lines(REFS))
    (tmp_path / "zipped.en").write_text(lines(SOURCES))
    with gzip.open(tmp_path / "zipped.de.gz", "wt", encoding="utf-8") as f:
        f.write(lines(REFS))
    with gzip.open(tmp_path / "pairs.tsv.gz", "wt", encoding="utf-8") as f:
        f.write(lines([f"{s}\t{r}" for s, r in zip(SOURCES, REFS, strict=True)]))
    for spec, name in (("plain", "plain"), ("zipped", "zipped"), ("pairs.tsv.gz", "pairs")):
        read = read_test_set(str(tmp_path / spec), LANGS)
        assert (read.name, read.sources, read.refs) == (name, SOURCES, REFS)


def test_bad_test_files_are_named(tmp_path: Path) -> None:
    (tmp_path / "short.en").write_text(lines(SOURCES))
    (tmp_path / "short.de").write_text(lines(REFS[:2]))
    with pytest.raises(CorpusError, match=r"short\.en has 3 lines but .*short\.de has 2"):
        read_test_set(str(tmp_path / "short"), LANGS)
    (tmp_path / "half.en").write_text(lines(SOURCES))
    with pytest.raises(CorpusError, match=r"half\.de does not exist"):
        read_test_set(str(tmp_path / "half"), LANGS)
    (tmp_path / "ragged.tsv").write_text("the cat\tdie Katze\nno tab here\n")
    with pytest.raises(CorpusError, match=r"ragged\.tsv, line 2: 1 tab-separated fields"):
        read_test_set(str(tmp_path / "ragged.tsv"), LANGS)
    (tmp_path / "empty.tsv").write_text("")
    with pytest.raises(CorpusError, match=r"empty\.tsv is empty \(0 segments\)"):
        read_test_set(str(tmp_path / "empty.tsv"), LANGS)


def results(compared: bool) -> list[SetResult]:
    hyps, other = ["die Katze", "ein Hund", "der Baum"], ["die Katze", "Hund", "Baum"]
    test_set = EvaluationSet("my set/2017", "x.tsv", SOURCES, REFS)
    scores = score_texts(hyps, REFS, "de")
    if not compared:
        return [SetResult(test_set, scores)]
    comparison = compare_systems(REFS, hyps, other, "de")
    return [SetResult(test_set, scores, score_texts(other, REFS, "de"), comparison)]


def test_the_table_shows_each_set_or_each_comparison() -> None:
    (row,) = results(False)
    head, line = table([row]).splitlines()
    assert head.split() == ["set", "sentences", "sacreBLEU", "tok", "BLEU", "chrF"]
    assert line.split()[:2] == ["my", "set/2017"] and f"{row.scores['chrf']:.2f}" in line
    compared = table(results(True), markdown=True).splitlines()
    assert compared[0].startswith("| set | sentences | metric | model | against | difference |")
    assert [cells.split(" | ")[2] for cells in compared[2:]] == [
        "bleu_sacre",
        "bleu_tok_compound",
        "chrf",
    ]


def test_the_version_tags_carry_each_figure_under_a_safe_name() -> None:
    (row,) = results(False)
    tags = figure_tags({row.test_set.name: row.scores})
    assert tag_name("my set/2017") == "my_set_2017"
    assert tags["eval.my_set_2017.bleu_sacre"] == f"{row.scores['bleu_sacre']:.4f}"
    assert tags["eval.my_set_2017.segments"] == "3"
    assert tags["eval.my_set_2017.signature"] == row.scores["bleu_sacre_signature"]
    assert {k.rsplit(".", 1)[1] for k in tags} == {
        "bleu_sacre",
        "bleu_tok_compound",
        "bleu_tok_lc",
        "chrf",
        "segments",
        "signature",
    }


def test_a_tracking_server_that_does_not_answer_is_one_line(monkeypatch) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    line = tag_version(("tiny", 3), f"http://127.0.0.1:{port}", {"eval.x.chrf": "1"}, ["x"])
    assert line.startswith("not logged on tiny version 3: the tracking server did not take")
    assert "\n" not in line


def test_the_configs_other_sets_are_read_from_their_prefix_or_named_as_not_fetched(
    tmp_path: Path,
) -> None:
    """``tfm evaluate --config``: a set of your own files is read from its prefix before the
    evaluate stage ran; a built-in split it has not fetched yet is one line naming the set."""
    import yaml

    from pipelines.evaluate_command import config_extra_sets
    from tasks.framework.config import ConfigError, load_config

    (tmp_path / "own.en").write_text(lines(SOURCES))
    (tmp_path / "own.de").write_text(lines(REFS))
    sets = [
        {"name": "test2016"},
        {"name": "own", "prefix": str(tmp_path / "own"), "holdout": False},
    ]
    raw = {"name": "m", "workdir": str(tmp_path / "run"), "data": {"source": "multi30k"}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**raw, "eval": {"test_sets": sets}}))
    (own,) = config_extra_sets(load_config(path))
    assert (own.name, own.sources, own.refs) == ("own", SOURCES, REFS)

    sets.append({"name": "flickr2017", "split": "test_2017_flickr", "holdout": False})
    path.write_text(yaml.safe_dump({**raw, "eval": {"test_sets": sets}}))
    with pytest.raises(ConfigError, match=r"eval.test_sets\[flickr2017\].*tfm stage evaluate"):
        config_extra_sets(load_config(path))
