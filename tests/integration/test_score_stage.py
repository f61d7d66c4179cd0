"""The score stage on tiny files: outputs, manifest, skipping, bad inputs, MLflow logging."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.bleu import score_texts
from tasks.framework.config import DataConfig, MlflowConfig, RunConfig
from tasks.framework.manifest import read_manifest
from tasks.framework.results import StageError
from tasks.framework.runner import build_folder, run_stage

pytestmark = pytest.mark.integration

SOURCES = [
    "The board chairman said: we are growing.",
    "It is raining in Berlin today.",
    "The e-mail address is new.",
    "Short.",
]
REFERENCES = [
    "Der Vorstands-Vorsitzende sagte: Wir wachsen.",
    "Heute regnet es in Berlin.",
    "Die E-Mail-Adresse ist neu.",
    "Kurz.",
]
HYPOTHESES = [
    "Der Vorstands-Chef sagte: Wir wachsen.",
    "Es regnet heute in Berlin.",
    "Die E-Mail-Adresse ist neu.",
    "Kurz.",
]


def _folder(root: Path, stage: str, files: dict[str, list[str]]) -> Path:
    """A finished stage folder (with a manifest) holding the given text files."""

    def build(tmp: Path) -> dict:
        for name, lines in files.items():
            (tmp / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        return {}

    return build_folder(stage, root / stage, {"files": files}, {}, build).path


def _config(root: Path, **data) -> RunConfig:
    data = {
        "source": "wmt14",
        "pair": "en-de",
        "test": "newstest2014",
        "test_variant": "full",
        **data,
    }
    return RunConfig(
        name="score-test",
        workdir=str(root / "run"),
        data=DataConfig(**data),
        mlflow=MlflowConfig(tracking_uri=f"sqlite:///{root / 'mlflow.db'}"),
    )


def _inputs(root: Path, hyps=HYPOTHESES, refs=REFERENCES, sources=SOURCES) -> dict[str, Path]:
    download = _folder(root, "download", {"test.en": sources, "test.de": refs})
    translate = _folder(root, "translate", {"hyp.de": hyps})
    return {"translate": translate, "download": download}


def test_stage_writes_scores_sentences_plot_and_manifest(tmp_path):
    config = _config(tmp_path)
    out = run_stage(config, "score", _inputs(tmp_path)).path
    assert out == config.root / "score"

    scores = json.loads((out / "scores.json").read_text(encoding="utf-8"))
    direct = score_texts(HYPOTHESES, REFERENCES, "de")
    for key in ("bleu_sacre", "bleu_tok_compound", "chrf"):
        assert scores[key] == pytest.approx(direct[key])
    assert 0 < scores["bleu_sacre"] < 100
    assert scores["bleu_tok_compound"] != scores["bleu_sacre"]
    assert scores["test_set"] == "newstest2014" and scores["test_variant"] == "full"
    assert scores["test_segments"] == 4
    assert "tok:13a" in scores["bleu_sacre_signature"]
    assert scores["signature"] == scores["bleu_sacre_signature"]
    assert sum(row["segments"] for row in scores["bleu_by_length"]) == 4

    rows = (out / "sentences.tsv").read_text(encoding="utf-8").splitlines()
    assert rows[0].split("\t") == ["index", "source", "reference", "hypothesis", "sentence_bleu"]
    assert len(rows) == 5
    last = rows[4].split("\t")
    assert last[1:4] == [SOURCES[3], REFERENCES[3], HYPOTHESES[3]]
    assert float(last[4]) == pytest.approx(100.0)

    assert (out / "bleu_by_length.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    manifest = read_manifest(out)
    assert manifest["stage"] == "score"
    assert set(manifest["files"]) == {"scores.json", "sentences.tsv", "bleu_by_length.png"}
    assert set(manifest["inputs"]) == {"translate", "download"}
    assert manifest["stats"]["test_segments"] == 4


def test_synthetic_test_split_is_not_named_as_newstest(tmp_path):
    scores = json.loads(
        (
            run_stage(_config(tmp_path, source="synthetic"), "score", _inputs(tmp_path)).path
            / "scores.json"
        ).read_text()
    )
    assert scores["test_set"] == "synthetic" and scores["test_variant"] == "synthetic"


def test_second_run_is_skipped_and_force_reruns(tmp_path):
    config = _config(tmp_path)
    inputs = _inputs(tmp_path)
    first = read_manifest(run_stage(config, "score", inputs).path)
    skipped = run_stage(config, "score", inputs)
    assert not skipped.ran and read_manifest(skipped.path)["started"] == first["started"]
    assert skipped.stats == first["stats"]
    assert (
        read_manifest(run_stage(config, "score", inputs, force=True).path)["started"]
        != first["started"]
    )


def test_empty_test_set_is_an_error(tmp_path):
    with pytest.raises(StageError, match=r"test\.de is empty \(0 segments\)"):
        run_stage(_config(tmp_path), "score", _inputs(tmp_path, hyps=[], refs=[], sources=[]))
    assert not (tmp_path / "run" / "score").exists()


def test_line_count_mismatch_names_both_files(tmp_path):
    with pytest.raises(StageError) as info:
        run_stage(_config(tmp_path), "score", _inputs(tmp_path, hyps=HYPOTHESES[:3]))
    message = str(info.value)
    assert "hyp.de has 3 lines" in message and "test.de has 4" in message
    assert not (tmp_path / "run" / "score").exists()


def test_missing_hypothesis_file(tmp_path):
    inputs = _inputs(tmp_path)
    (inputs["translate"] / "hyp.de").unlink()
    with pytest.raises(StageError, match=r"input 'translate' .* is damaged: hyp\.de is missing"):
        run_stage(_config(tmp_path), "score", inputs)


def test_the_result_reaches_the_stage_run_in_mlflow_once(tmp_path):
    mlflow = pytest.importorskip("mlflow")
    from tasks.framework import mlflow_runs

    config = _config(tmp_path)
    with mlflow_runs.stage_run(config, "score") as run:
        # The stage itself logs nothing: the runner logs its result into the stage's run, once.
        result = run_stage(config, "score", _inputs(tmp_path))
    assert run.drain() and run.run_id is not None  # the journal reached the server
    scores = json.loads((result.path / "scores.json").read_text(encoding="utf-8"))
    client = mlflow.MlflowClient(config.tracking_uri)
    logged = client.get_run(run.run_id).data
    for key in ("bleu_sacre", "bleu_tok_compound", "chrf"):
        assert logged.metrics[key] == pytest.approx(scores[key])
    assert logged.metrics["test_segments"] == 4
    assert len(client.get_metric_history(run.run_id, "bleu_sacre")) == 1
    assert logged.tags["stats.test_set"] == "newstest2014"
    assert (
        logged.tags["skipped"] == "false"
        and logged.tags["fingerprint"] == read_manifest(result.path)["fingerprint"]
    )
    assert logged.tags["input.translate"] and logged.tags["input.download"]
    artifacts = {a.path for a in client.list_artifacts(run.run_id, "score")}
    assert {
        "score/manifest.json",
        "score/scores.json",
        "score/sentences.tsv",
        "score/bleu_by_length.png",
    } <= artifacts
