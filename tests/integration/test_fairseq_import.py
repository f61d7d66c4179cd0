"""``tfm import fairseq`` on a checkpoint written with fairseq's layout (helpers.fairseq_files),
into a real MLflow registry on SQLite: registered once with the file it came from, translated
through the registered model as ``tfm translate`` does, and exported to CTranslate2."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
import yaml
from helpers import fairseq_files as fs

from pipelines.cli import main
from serving.translator import DecodeConfig, Translator
from tasks.framework.manifest import read_manifest
from transformer_core.folders import sha256_file

pytestmark = pytest.mark.integration

TEXTS = ["A man rides a red bike.", "Two children play on the beach!"]
NAME = "fairseq-tiny"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A fairseq model's files, a run config for them and its MLflow store."""
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("fairseq")
    codes, symbols = fs.write_bpe(root)
    s = fs.settings()
    state = fs.state_dict(s, len(fs.SPECIALS) + len(symbols), "0.12")
    checkpoint = fs.write_checkpoint(root / "checkpoint_best.pt", s, state, "0.12")
    tracking = f"sqlite:///{root / 'mlflow.db'}"
    config = {
        "name": "imported",
        "workdir": str(root / "run"),
        "data": {"pair": "en-de"},
        "tokenizer": {"lowercase": True, "moses": True},
        "decode": {"beam_size": 2, "max_len_offset": 4},
        "register": {"model_name": NAME},
        "mlflow": {"tracking_uri": tracking},
    }
    (root / "import.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    # Artifacts under root: a new experiment's default location is ./mlruns in the CWD.
    MlflowClient(tracking_uri=tracking).create_experiment(
        "transformer", artifact_location=(root / "mlartifacts").as_uri()
    )
    return {"root": root, "checkpoint": checkpoint, "codes": codes, "tracking": tracking}


def tfm(capfd, *args: str) -> list[str]:
    """``tfm`` with ``args``: its exit status must be 0; the lines it printed."""
    capfd.readouterr()
    assert main(list(args)) == 0
    return capfd.readouterr().out.splitlines()


def import_args(files: dict[str, Path]) -> list[str]:
    return [
        "import",
        "fairseq",
        str(files["checkpoint"]),
        "--dict",
        str(files["root"]),
        "--bpe",
        str(files["codes"]),
        "--config",
        str(files["root"] / "import.yaml"),
    ]


def test_import_registers_once_and_translates(files, capfd, monkeypatch):
    from mlflow.tracking import MlflowClient

    lines = tfm(capfd, *import_args(files))
    assert lines[0].startswith("fairseq_import: ran") and lines[1].startswith("register: ran")
    assert (
        lines[-1] == f"registered: {NAME} version 1 (aliases: candidate, champion; no champion yet)"
    )
    again = tfm(capfd, *import_args(files))  # the same files: nothing to do
    assert again[0].startswith("fairseq_import: up to date") and again[-1] == lines[-1]

    folder = files["root"] / "run" / "fairseq_import"
    tags = MlflowClient(files["tracking"], files["tracking"]).get_model_version(NAME, "1").tags
    assert tags["imported_from.file"] == "checkpoint_best.pt"
    assert tags["imported_from.sha256"] == sha256_file(files["checkpoint"])
    assert tags["lineage.fairseq_import"] == read_manifest(folder)["fingerprint"]

    # tfm translate through the registered model: what the import's folder translates.
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("\n".join(TEXTS).encode())))
    served = tfm(
        capfd,
        "translate",
        "--model",
        f"models:/{NAME}@champion",
        "--tracking-uri",
        files["tracking"],
    )
    here = Translator.load(folder, folder, DecodeConfig(beam_size=2, max_len_offset=4)).translate(
        TEXTS
    )
    assert served == here and any(here)


def test_an_import_is_one_parent_run_with_a_child_run_per_stage(files, capfd):
    """As ``tfm run``'s flows: the command's MLflow parent run (tagged with the stages that
    ran) holds each stage's run."""
    from mlflow.tracking import MlflowClient

    lines = tfm(capfd, *import_args(files))
    ran = [line.split(":")[0] for line in lines if ": ran (" in line]
    client = MlflowClient(files["tracking"])
    experiment = client.get_experiment_by_name("transformer").experiment_id
    runs = client.search_runs([experiment], max_results=200)
    parent = max(
        (r for r in runs if r.data.tags.get("pipeline") == "fairseq"),
        key=lambda r: r.info.start_time,
    )
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.data.tags["stage"] for r in children) == ["fairseq_import", "register"]
    assert parent.data.tags["stages.ran"] == ",".join(ran)


def test_the_registered_import_exports_to_ctranslate2(files, capfd):
    pytest.importorskip("ctranslate2")
    if not (files["root"] / "run" / "register").exists():
        tfm(capfd, *import_args(files))
    out = files["root"] / "ct2"
    lines = tfm(
        capfd, "export", "--to", "ctranslate2", "--model", f"models:/{NAME}/1",
        "--out", str(out), "--tracking-uri", files["tracking"],
    )  # fmt: skip
    assert lines == [str(out)] and (out / "model.bin").is_file()
    decode = DecodeConfig(beam_size=1, max_len_offset=4)
    folder = files["root"] / "run" / "fairseq_import"
    theirs = Translator.load(
        folder,
        folder,
        DecodeConfig(engine="ctranslate2", beam_size=1, max_len_offset=4),
        export_dir=out,
    )
    assert theirs.translate(TEXTS) == Translator.load(folder, folder, decode).translate(TEXTS)


def test_another_checkpoint_is_a_candidate_beside_the_champion(files, capfd, tmp_path):
    if not (files["root"] / "run" / "register").exists():
        tfm(capfd, *import_args(files))
    s = fs.settings()
    state = fs.state_dict(s, len(fs.read_dictionary(files["root"])) + 4, "0.12", seed=1)
    args = import_args(files)
    args[2] = str(fs.write_checkpoint(tmp_path / "checkpoint_last.pt", s, state, "0.12"))
    lines = tfm(capfd, *args)  # another file: imported and registered again
    assert lines[0].startswith("fairseq_import: ran (config changed (source.checkpoint.")
    assert lines[-1] == (
        f"registered: {NAME} version 2 (aliases: candidate; "
        "not compared: this version has no bleu_sacre; champion kept)"
    )


def test_a_work_dir_of_another_pipeline_is_refused(files, capfd, tmp_path):
    config = yaml.safe_load((files["root"] / "import.yaml").read_text(encoding="utf-8"))
    config["workdir"] = str(tmp_path / "trained")
    (tmp_path / "trained" / "train").mkdir(parents=True)  # a trained model's run
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    args = import_args(files)
    args[-1] = str(tmp_path / "other.yaml")
    assert main(args) == 2
    assert "holds another pipeline's stages" in capfd.readouterr().err
