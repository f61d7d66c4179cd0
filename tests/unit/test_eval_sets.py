"""The eval section (``eval.test_sets``) and reading a test set: its rules and errors, a config
without it running and fingerprinting what it did before, a set's files (plain, gzip, TSV; one
line naming a missing or misaligned file), a built-in split from the Multi30k mirror, the
overlap with the training split, and the table."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from helpers.shared_data import require_shared_data

from corpora import CorpusError
from corpora.assemble import from_local_set, from_registry_set
from corpora.overlap import training_overlap
from tasks import evaluate
from tasks.framework import graph
from tasks.framework.config import ConfigError, config_from_dict, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
MULTI30K = {"source": "multi30k", "pair": "en-de"}


def _load(sets: list[dict], data: dict | None = None):
    return config_from_dict({"name": "x", "data": data or MULTI30K, "eval": {"test_sets": sets}})


def test_sets_are_named_the_first_is_the_primary_and_prefixes_become_absolute(tmp_path):
    config = _load(
        [
            {"name": "test2016"},
            {"name": "test2017", "split": "test_2017_flickr"},
            {"name": "own", "prefix": "data/own"},
        ]
    )
    assert [s.name for s in config.eval.test_sets] == ["test2016", "test2017", "own"]
    assert [s.name for s in config.eval.extra] == ["test2017", "own"]
    assert config.eval.test_sets[2].prefix == str(Path("data/own").resolve())
    assert evaluate.primary_name(config) == "test2016"
    assert "evaluate" in [s.name for s in graph.pipeline(config)]
    assert _load([{"name": "t", "split": "test_2016_flickr"}]).eval.test_sets[0].split


@pytest.mark.parametrize(
    ("sets", "data", "line"),
    [
        (
            [{"name": "a"}, {"name": "b", "split": "test_2019"}],
            None,
            "eval.test_sets[1].split: unknown Multi30k dev/test set 'test_2019' (known: val, "
            "test_2016_flickr, test_2017_flickr, test_2017_mscoco, test_2018_flickr)",
        ),
        (
            [{"name": "a"}, {"name": "b", "split": "test_2017_flickr"}],
            {"source": "multi30k", "pair": "en-cs"},
            "eval.test_sets[1].split: Multi30k test_2017_flickr has no 'cs' text (it has en, de, "
            "fr)",
        ),
        (
            [{"name": "a", "split": "test_2017_flickr"}],
            None,
            "eval.test_sets[0].split: 'test_2017_flickr': the first set is the primary one, "
            "data's test set (test_2016_flickr); set data.test to change it, or give it a name "
            "alone",
        ),
        ([{"name": "a"}, {"name": "b"}], None, "eval.test_sets[1]: 'b' needs a split of "),
        ([{"name": "a"}, {"name": "a", "split": "val"}], None, "eval.test_sets: 'a' names two"),
        ([{"name": "a/b"}], None, "eval.test_sets[0].name: 'a/b': a test set's name is "),
        (
            [{"name": "a"}, {"name": "b", "split": "val", "prefix": "p"}],
            None,
            "eval.test_sets[1].prefix: a test set is a split or a prefix, not both",
        ),
        (
            [{"name": "a"}, {"name": "b", "split": "test_2017_flickr"}],
            {"source": "local", "local_dir": "d"},
            "eval.test_sets[1].split: 'test_2017_flickr': data.source local has no built-in ",
        ),
        (
            [{"name": "a"}, {"name": "b", "split": "newstest2012"}],
            {"source": "wmt14", "pair": "en-de"},
            "eval.test_sets[1].split: unknown dev/test set 'newstest2012' (full)",
        ),
        ([{"name": "a"}], {"source": "treebank", "pair": "words-tree"}, "eval.test_sets: the "),
        (
            [{"name": "a", "holdout": False}],
            None,
            "eval.test_sets[0].holdout: the primary set is data's test set, which clean always ",
        ),
    ],
)
def test_a_bad_set_is_one_line_naming_its_key(sets, data, line):
    with pytest.raises(ConfigError) as info:
        _load(sets, data)
    assert str(info.value).startswith(line) and "\n" not in str(info.value)


def test_a_config_without_the_section_runs_and_fingerprints_as_before():
    plain = load_config(CONFIGS / "quickstart.yaml")
    with_sets = plain.replace(eval=_load([{"name": "q"}]).eval)  # the primary set alone
    assert "evaluate" not in [s.name for s in graph.pipeline(plain)]
    assert graph.pipeline(plain) == graph.pipeline(with_sets)
    for stage in graph.pipeline(plain):
        assert stage.stage_config(plain) == stage.stage_config(with_sets), stage.name


def test_a_set_not_held_out_changes_nothing_upstream_and_a_held_out_one_trains_without_it():
    alone = {s.name: s for s in graph.pipeline(_load([{"name": "t"}]))}
    later = _load([{"name": "t"}, {"name": "m", "split": "test_2017_mscoco", "holdout": False}])
    assert [s.name for s in graph.pipeline(later)] == [*list(alone)[:-1], "evaluate", "register"]
    # Register reads the evaluate stage's sets where it runs (their figures and hypotheses).
    assert "evaluate" not in alone["register"].inputs
    for stage in graph.pipeline(later):
        if stage.name == "register":
            assert stage.inputs == {**alone["register"].inputs, "evaluate": "evaluate"}
        elif stage.name != "evaluate":
            assert stage == alone[stage.name], stage.name
            assert stage.stage_config(later) == alone[stage.name].stage_config(
                _load([{"name": "t"}])
            ), stage.name
    held = {
        s.name: s
        for s in graph.pipeline(_load([{"name": "t"}, {"name": "m", "split": "test_2017_mscoco"}]))
    }
    assert list(held)[:4] == ["download", "clean", "holdout", "tokenizer"]
    assert held["holdout"].inputs == {"clean": "clean"}
    assert held["tokenizer"].inputs == {"clean": "holdout"}
    assert held["shard"].inputs["clean"] == held["evaluate"].inputs["clean"] == "holdout"


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _outputs(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "out").mkdir(exist_ok=True)
    return {lang: tmp_path / "out" / f"test.{lang}" for lang in ("en", "de")}


@pytest.mark.parametrize("form", ["plain", "gzip", "tsv", "tsv.gz"])
def test_a_prefix_reads_in_each_form_source_reads(tmp_path, form):
    src, tgt = ["a cat", "the dog"], ["eine Katze", "der Hund"]
    if form.startswith("tsv"):
        text = "".join(f"{s}\t{t}\n" for s, t in zip(src, tgt, strict=True)).encode()
        name = f"set.{form}"
        (tmp_path / name).write_bytes(gzip.compress(text) if form.endswith("gz") else text)
    else:
        for lang, lines in (("en", src), ("de", tgt)):
            data = "".join(x + "\n" for x in lines).encode()
            gz = form == "gzip" and lang == "en"
            (tmp_path / f"set.{lang}{'.gz' if gz else ''}").write_bytes(
                gzip.compress(data) if gz else data
            )
    outputs = _outputs(tmp_path)
    assert from_local_set(outputs, tmp_path / "set", "en-de") == 2
    assert (_lines(outputs["en"]), _lines(outputs["de"])) == (src, tgt)


def test_a_misaligned_or_missing_file_is_named(tmp_path):
    (tmp_path / "set.en").write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"missing file\(s\): \S*/set\.de \("):
        from_local_set(_outputs(tmp_path), tmp_path / "set", "en-de")
    (tmp_path / "set.de").write_text("a\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"set\.en \(en\) has 2 lines, \S*set\.de \(de\) has 1"):
        from_local_set(_outputs(tmp_path), tmp_path / "set", "en-de")


def test_a_multi30k_split_is_read_from_the_mirror(tmp_path):
    mirror = require_shared_data("multi30k")
    outputs = _outputs(tmp_path)
    lines = from_registry_set(
        outputs,
        source="multi30k",
        split="test_2017_mscoco",
        pair="en-de",
        mirror=mirror.as_uri() + "/",
        cache=tmp_path / "cache",
        lock_file=tmp_path / "lock.json",
        max_retries=1,
    )
    assert lines == 461 == len(_lines(outputs["en"])) == len(_lines(outputs["de"]))
    assert (tmp_path / "lock.json").is_file()  # pinned, as the download stage pins


def test_overlap_is_the_share_of_each_side_seen_in_training(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    for i, rows in enumerate([[("a", "A"), ("b", "x")], [("c", "C")]]):
        table = pa.table({"src": [r[0] for r in rows], "tgt": [r[1] for r in rows]})
        pq.write_table(table, tmp_path / f"part-{i}.parquet")
    parts = sorted(tmp_path.glob("part-*.parquet"))
    seen = training_overlap(parts, ["a", "c", "d", "e"], ["A", "B", "C", "x"])
    assert seen == {"sources_seen": 0.5, "targets_seen": 0.75}


def test_the_table_marks_the_primary_set_and_shows_the_overlap():
    row = {m: 12.345 for m in evaluate.COLUMNS}
    rows = [
        {**row, "test_set": "test2016", "test_segments": 1000, "held_out": True},
        {
            **row,
            "test_set": "mscoco",
            "test_segments": 461,
            "held_out": False,
            "sources_seen": 0.021,
            "targets_seen": 0.0,
        },
    ]
    lines = evaluate.format_table(rows).splitlines()
    assert lines[0].split()[:3] == ["set", "segments", "bleu_sacre"]
    assert lines[1].split() == [
        "test2016",
        "*",
        "1000",
        *["12.35"] * 4,
        "held",
        "out",
        "held",
        "out",
    ]
    assert lines[2].split()[-2:] == ["2.1%", "0.0%"]
