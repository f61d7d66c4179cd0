"""docs/your-data.md's config, ``configs/your_data.yaml``, on a team's own corpus the test writes:
the training pairs as a gzipped TSV, dev as gzipped aligned files, the test set as a plain TSV
under its own prefix. The whole flow runs (real Ray, Prefect, MLflow, sentencepiece), shrunk by
``--set``-style overrides, and the scores and the registry name the test set by its prefix.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from helpers.flow_configs import WMT14_STAGES, ran
from helpers.stage_folders import TINY_TRAINING, tiny_sentences

pytestmark = pytest.mark.integration

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "your_data.yaml"
TEST_PREFIX = "heldout"


def _pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """English-like sentences and a 'German' side the model can learn: the words reversed."""
    return [(s, " ".join(reversed(s.split()))) for s in tiny_sentences(n, seed)]


def _text(lines: list[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode()


def write_corpus(folder: Path) -> Path:
    """train.tsv.gz, dev.en.gz + dev.de.gz and heldout.tsv in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    train, dev, test = _pairs(300, 1), _pairs(30, 2), _pairs(30, 3)
    (folder / "train.tsv.gz").write_bytes(gzip.compress(_text([f"{s}\t{t}" for s, t in train])))
    for i, lang in enumerate(("en", "de")):
        (folder / f"dev.{lang}.gz").write_bytes(gzip.compress(_text([p[i] for p in dev])))
    (folder / f"{TEST_PREFIX}.tsv").write_bytes(_text([f"{s}\t{t}" for s, t in test]))
    return folder


def shrunk(root: Path, corpus: Path) -> dict:
    """The overrides that shrink the guide's config to seconds, as ``--set key=value`` would."""
    sections = {
        "model": {**TINY_TRAINING["model"]},
        "train": {**TINY_TRAINING["train"], "num_workers": 1, "bleu_sentences": 10},
        "average": TINY_TRAINING["average"],
        "tokenizer": {"vocab_size": 100, "sample_size": 1000, "threads": 1},
        "shard": {"rows_per_shard": 200, "cpus_per_actor": 0.5},
        "decode": {"beam_size": 2, "max_len_offset": 5},
    }
    overrides = {f"{s}.{k}": v for s, keys in sections.items() for k, v in keys.items()}
    return {
        **overrides,
        "workdir": str(root / "{name}"),
        "data.local_dir": str(corpus),
        "data.local_test": TEST_PREFIX,
        "register.model_name": "your-data-test",
    }


@pytest.mark.slow  # ~45 s on 2 cores (and the session's Prefect harness): every stage once
def test_the_guides_config_runs_end_to_end_on_gzip_and_tsv_files(tmp_path, harness, ray_local):
    from mlflow import MlflowClient

    from pipelines.flows import Loaded, pipeline_flow
    from tasks.framework.config import load_config

    corpus = write_corpus(tmp_path / "corpus")
    config = load_config(CONFIG, shrunk(tmp_path, corpus))
    assert (config.data.source, config.data.test) == ("local", TEST_PREFIX)
    outcomes = pipeline_flow(config_path=str(CONFIG), loaded=Loaded(config))
    assert ran(outcomes) == WMT14_STAGES

    download = json.loads((config.root / "download" / "manifest.json").read_text())["stats"]
    assert (download["train_lines"], download["dev_lines"], download["test_lines"]) == (300, 30, 30)
    assert download["corpora"]["train"]["format"] == "tsv"
    scores = json.loads((config.root / "score" / "scores.json").read_text())
    assert scores["test_set"] == TEST_PREFIX and scores["test_segments"] == 30

    client = MlflowClient(tracking_uri=config.tracking_uri, registry_uri=config.tracking_uri)
    champion = client.get_model_version_by_alias("your-data-test", "champion")
    assert champion.tags["test_set"] == TEST_PREFIX


def test_a_ragged_tsv_fails_in_one_line_and_the_rerun_after_the_fix_works(tmp_path, capsys):
    from pipelines.cli import main

    corpus = write_corpus(tmp_path / "corpus")
    rows = gzip.decompress((corpus / "train.tsv.gz").read_bytes()).decode().splitlines()
    rows[6] += "\tan extra column"
    (corpus / "train.tsv.gz").write_bytes(gzip.compress(_text(rows)))
    sets = [f"--set={k}={json.dumps(v)}" for k, v in shrunk(tmp_path, corpus).items()]
    command = ["stage", "download", "--config", str(CONFIG), *sets]
    assert main(command) == 1
    ours = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tfm:")]
    assert ours == [
        f"tfm: stage download failed: {corpus / 'train.tsv.gz'}, line 7: 3 tab-separated "
        "fields, expected 2 (each line is source<TAB>target; to drop such lines: "
        "zcat train.tsv.gz | awk -F'\\t' 'NF==2' > fixed.tsv)"
    ]
    assert not (tmp_path / "your_data" / "download").exists()
    rows[6] = rows[6].rsplit("\t", 1)[0]
    (corpus / "train.tsv.gz").write_bytes(gzip.compress(_text(rows)))
    assert main(command) == 0
    assert "download: ran" in capsys.readouterr().out
