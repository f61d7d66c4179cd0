"""The evaluate stage on a tiny copy model: a second, shifted test set written as local files is
translated and scored (per-set scores, the table, MLflow metrics per set); a third set added
later is the only one translated; a bad set fails in one line naming it. Real Ray, MLflow
(SQLite), sentencepiece and sacreBLEU."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from helpers.stage_folders import finished_folder, tiny_sentences

from evaluation.bleu import score_texts
from serving.translator import Translator
from tasks.framework.config import DataConfig, DecodeConfig, MlflowConfig, RayConfig, RunConfig
from tasks.framework.config_eval import EvalConfig, EvalSet
from tasks.framework.results import StageError
from tasks.framework.runner import run_stage
from transformer_core import presets

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    # Its time budget: 60 s alone on 2 cores under load (the default suite keeps the flow test).
    pytest.mark.timeout(300),
]

PRIMARY = tiny_sentences(20, seed=1)
SHIFTED = [s.replace("the", "a") for s in tiny_sentences(16, seed=11)]
"""The shifted set: other sentences, another article (a copy model: its target is its source)."""
THIRD = tiny_sentences(12, seed=12)
SEEN = SHIFTED[:4]
"""Shifted sentences the training split holds too (its overlap)."""


def _write(path: Path, lines: list[str], *, gz: bool = False) -> None:
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data) if gz else data)


def _parts(tmp: Path, texts: list[str]) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp / "train").mkdir()
    pq.write_table(pa.table({"src": texts, "tgt": texts}), tmp / "train" / "part-00000.parquet")
    for lang in ("en", "de"):
        _write(tmp / f"test.{lang}", PRIMARY)
    return {}


def _scores(tmp: Path) -> dict:
    result = {**score_texts(PRIMARY, PRIMARY, "de"), "test_set": "synthetic", "test_segments": 20}
    (tmp / "scores.json").write_text(json.dumps(result), encoding="utf-8")
    return {}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_model, tiny_tokenizer) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("evaluate")
    clean = [*tiny_sentences(30, seed=3), *SEEN]
    return {
        "average": tiny_model,
        "tokenizer": tiny_tokenizer,
        "score": finished_folder(root / "score", "score", {"n": 20}, _scores),
        "clean": finished_folder(root / "clean", "clean", {"n": 34}, lambda t: _parts(t, clean)),
    }


def _config(root: Path, *sets: EvalSet) -> RunConfig:
    return RunConfig(
        name="ev",
        workdir=str(root / "run"),
        model=presets.debug(),
        data=DataConfig(source="synthetic"),
        decode=DecodeConfig(num_actors=1, max_tokens_per_batch=64, max_len_offset=6),
        eval=EvalConfig(test_sets=(EvalSet(name="synthetic"), *sets)),
        ray=RayConfig(num_cpus=2),
        mlflow=MlflowConfig(tracking_uri=f"sqlite:///{root / 'mlflow.db'}"),
    )


def _shifted(root: Path, *, holdout: bool = False) -> EvalSet:
    _write(root / "shifted.en.gz", SHIFTED, gz=True)
    _write(root / "shifted.de", SHIFTED)
    return EvalSet(name="shifted", prefix=str(root / "shifted"), holdout=holdout)


def test_each_set_is_scored_and_logged_and_a_later_set_alone_is_translated(
    ray_local, inputs, tmp_path
):
    import mlflow

    from tasks.framework import mlflow_runs

    config = _config(tmp_path, _shifted(tmp_path))
    with mlflow_runs.stage_run(config, "evaluate") as run:
        first = run_stage(config, "evaluate", inputs)
    assert first.stats["translated"] == "shifted" and first.stats["reused"] == ""
    shifted = json.loads((first.path / "sets/shifted/scores.json").read_text(encoding="utf-8"))
    hyps = (first.path / "sets/shifted/hyp.de").read_text(encoding="utf-8").splitlines()
    alone = Translator.load(inputs["average"], inputs["tokenizer"], config.decoding)
    assert hyps == alone.translate(SHIFTED)  # the corpus translator, as one process decodes
    assert shifted["bleu_sacre"] == pytest.approx(score_texts(hyps, SHIFTED, "de")["bleu_sacre"])
    assert "tok:13a" in shifted["bleu_sacre_signature"] and shifted["chrf_signature"]
    assert shifted["sources_seen"] == shifted["targets_seen"] == pytest.approx(4 / 16)
    table = json.loads((first.path / "scores.json").read_text(encoding="utf-8"))["sets"]
    assert [(r["test_set"], r["held_out"]) for r in table] == [
        ("synthetic", True),
        ("shifted", False),
    ]
    assert table[0]["bleu_sacre"] == pytest.approx(100.0)  # the score stage's, read

    assert run.drain() and run.run_id is not None
    client = mlflow.MlflowClient(config.tracking_uri)
    metrics = client.get_run(run.run_id).data.metrics
    assert metrics["bleu_sacre/shifted"] == pytest.approx(shifted["bleu_sacre"])
    assert metrics["chrf/synthetic"] == pytest.approx(table[0]["chrf"])
    assert metrics["sources_seen/shifted"] == pytest.approx(0.25)
    assert "evaluate/scores.tsv" in {a.path for a in client.list_artifacts(run.run_id, "evaluate")}

    from pipelines.evaluate_command import config_extra_sets  # tfm evaluate --config's sets

    (read,) = config_extra_sets(config)  # as the stage read them into its folder
    assert (read.name, read.sources, read.refs) == ("shifted", SHIFTED, SHIFTED)
    assert read.origin.endswith("evaluate/sets/shifted")

    _write(tmp_path / "third.tsv", [f"{s}\t{s}" for s in THIRD])
    third = EvalSet(name="third", prefix=str(tmp_path / "third"), holdout=False)
    second = run_stage(_config(tmp_path, _shifted(tmp_path), third), "evaluate", inputs)
    assert second.ran and second.stats["translated"] == "third"
    assert second.stats["reused"] == "shifted"
    again = json.loads((second.path / "sets/shifted/scores.json").read_text(encoding="utf-8"))
    assert again["bleu_sacre"] == shifted["bleu_sacre"] and again["reused"]
    assert (second.path / "sets/third/hyp.de").read_text(encoding="utf-8").count("\n") == 12


@pytest.mark.parametrize(
    ("files", "says"),
    [
        ({"bad.en": SHIFTED, "bad.de": SHIFTED[:-1]}, r"bad\.en \(en\) has 16 lines, .*bad\.de"),
        ({"bad.en": SHIFTED}, r"missing file\(s\): \S*bad\.de"),
    ],
)
def test_a_bad_set_fails_in_one_line_naming_it_and_its_file(inputs, tmp_path, files, says):
    for name, lines in files.items():
        _write(tmp_path / name, lines)
    config = _config(tmp_path, EvalSet(name="bad", prefix=str(tmp_path / "bad"), holdout=False))
    with pytest.raises(StageError, match=rf"^test set 'bad': .*{says}") as info:
        run_stage(config, "evaluate", inputs)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "run" / "evaluate").exists()


def test_holdout_removes_the_pairs_of_a_held_out_set_from_training(inputs, tmp_path):
    """A held-out set (``holdout``, the default): the holdout stage drops every training pair
    that holds one of its sentences on either side, and keeps clean's dev and test sets."""
    import pyarrow.parquet as pq

    from tasks.framework import graph

    config = _config(tmp_path, _shifted(tmp_path, holdout=True))
    assert [s.inputs for s in graph.pipeline(config) if s.name == "evaluate"] == [
        {"average": "average", "tokenizer": "tokenizer", "score": "score", "clean": "holdout"}
    ]
    out = run_stage(config, "holdout", {"clean": inputs["clean"]})
    kept = pq.read_table(out.path / "train" / "part-00000.parquet").to_pylist()
    assert out.stats["dropped"] == len(SEEN) and out.stats["kept"] == len(kept) == 30
    assert not {row["src"] for row in kept} & set(SHIFTED)
    assert (out.path / "test.de").read_text(encoding="utf-8") == "".join(s + "\n" for s in PRIMARY)
