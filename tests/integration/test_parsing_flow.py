"""The whole parsing flow on a tiny treebank made by the test, under Prefect's test harness.

treebank -> linearize -> tokenizer -> shard -> train -> average -> translate -> parse_score, with
real Ray, real Prefect, real MLflow (SQLite) and real sentencepiece, on ~40 small trees written
as PTB ``.mrg`` files (empty root bracket, function tags, a ``-NONE-`` trace). The model is far
too small and too briefly trained to parse: the test checks that every stage runs and hands its
output on, not the F1. The flow runs in the slow suite (the WMT14 flow keeps the flow mechanics
in the default one; the parsing stages have their own tests).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml
from helpers.shared_data import SHARED_DATA
from helpers.stage_folders import TINY_TRAINING

from tasks.framework.runner import run_stage

pytestmark = pytest.mark.integration

PARSING_STAGES = [
    "treebank", "linearize", "tokenizer", "shard", "train", "average", "translate", "parse_score",
]  # fmt: skip

NOUNS = [("dog", "NN"), ("cat", "NN"), ("bird", "NN"), ("children", "NNS"), ("stocks", "NNS")]
NAMES = ["John", "Mary", "Smith"]
ADJECTIVES = ["big", "old", "red"]
VERBS = ["saw", "liked", "bought"]
INTRANSITIVE = ["slept", "fell", "rose"]
PREPOSITIONS = ["on", "near", "with"]


def noun_phrase(rng: random.Random, label: str = "NP") -> str:
    """A determiner-(adjective)-noun phrase or a proper name."""
    if rng.random() < 0.3:
        return f"({label} (NNP {rng.choice(NAMES)}))"
    word, tag = rng.choice(NOUNS)
    adjective = f" (JJ {rng.choice(ADJECTIVES)})" if rng.random() < 0.4 else ""
    return f"({label} (DT the){adjective} ({tag} {word}))"


def sentence(rng: random.Random) -> str:
    """One .mrg tree: ``( (S (NP-SBJ ...) (VP ...) (. .)) )`` from one of four templates."""
    subject = noun_phrase(rng, "NP-SBJ")
    kind = rng.randrange(4)
    if kind == 0:
        vp = f"(VP (VBD {rng.choice(INTRANSITIVE)}))"
    elif kind == 1:
        vp = f"(VP (VBD {rng.choice(VERBS)}) {noun_phrase(rng)})"
    elif kind == 2:
        pp = f"(PP-LOC (IN {rng.choice(PREPOSITIONS)}) {noun_phrase(rng)})"
        vp = f"(VP (VBD {rng.choice(VERBS)}) {noun_phrase(rng)} {pp})"
    else:  # a relative clause with a trace that cleaning removes
        verb = rng.choice(INTRANSITIVE)
        rel = f"(SBAR (WHNP-1 (WDT that)) (S (NP-SBJ (-NONE- *T*-1)) (VP (VBD {verb}))))"
        vp = f"(VP (VBD {rng.choice(VERBS)}) (NP (NP (DT the) (NN dog)) {rel}))"
    return f"( (S {subject}\n    {vp}\n    (. .)) )\n"


def write_treebank(folder: Path, seed: int = 3) -> dict[str, int]:
    """``wsj_0001..0004.mrg`` train (8 trees each), ``wsj_0005`` dev (4), ``wsj_0006`` test (6)."""
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    counts = {
        "wsj_0001": 8,
        "wsj_0002": 8,
        "wsj_0003": 8,
        "wsj_0004": 8,
        "wsj_0005": 4,
        "wsj_0006": 6,
    }
    for stem, n in counts.items():
        (folder / f"{stem}.mrg").write_text("".join(sentence(rng) for _ in range(n)))
    return {"train": 32, "dev": 4, "test": 6}


def tiny_config(workdir: Path, treebank_dir: Path) -> dict:
    return {
        "name": "parseflow",
        "seed": 7,
        "workdir": str(workdir / "{name}"),
        "data": {"source": "treebank", "pair": "words-tree"},
        "parsing": {
            "treebank_dir": str(treebank_dir),
            "train_files": ["wsj_000[1-4].mrg"],
            "dev_files": ["wsj_0005.mrg"],
            "test_files": ["wsj_0006.mrg"],
            "form": "t2t",
            # Small on purpose (the paper: 21, 0.3, +300): an untrained model rarely stops.
            "beam_size": 2,
            "alpha": 0.3,
            "max_len_offset": 8,
        },
        "tokenizer": {"kind": "bpe", "vocab_size": 80, "sample_size": 1000, "threads": 1},
        "shard": {"rows_per_shard": 100, "num_actors": 1, "cpus_per_actor": 0.5},
        **TINY_TRAINING,
        # These must not apply: the parsing pipeline decodes with parsing.beam_size and co.
        "decode": {"beam_size": 5, "alpha": 0.6, "max_len_offset": 50},
        "mlflow": {"experiment": "parsing-test"},
        "ray": {"num_cpus": 2},
    }


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, harness, ray_local):
    from pipelines.flows import pipeline_flow

    workdir = tmp_path_factory.mktemp("parsing")
    sizes = write_treebank(workdir / "treebank")
    path = workdir / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config(workdir, workdir / "treebank")))
    outcomes = pipeline_flow(config_path=str(path))
    return workdir, str(path), sizes, outcomes


def ran(results) -> list[str]:
    return [r.stage for r in results if r.ran]


def stats(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())["stats"]


@pytest.mark.slow  # the whole parsing flow: ~30 s
def test_every_stage_runs_and_hands_its_output_on(first_run):
    from tasks.framework.config import load_config

    _, path, sizes, outcomes = first_run
    assert [r.stage for r in outcomes] == PARSING_STAGES
    assert ran(outcomes) == PARSING_STAGES
    root = load_config(path).root
    for name in PARSING_STAGES:
        assert (root / name / "manifest.json").is_file(), name

    tb = stats(root / "treebank")
    assert (tb["train_trees"], tb["dev_trees"], tb["test_trees"]) == (
        sizes["train"], sizes["dev"], sizes["test"],
    )  # fmt: skip
    # Cleaning: no trace, function tag or index survives into the training targets.
    import pyarrow.parquet as pq

    targets = pq.read_table(root / "linearize" / "train" / "part-00000.parquet").column("tgt")
    assert targets[0].as_py().startswith("S NP")
    assert not any("-NONE-" in t or "NP-SBJ" in t or "WHNP-1" in t for t in targets.to_pylist())

    assert stats(root / "shard")["vocab_size"] == stats(root / "train")["vocab_size"] == 80
    assert stats(root / "train")["step"] == 6
    # The parsing decoding settings, not the translation ones.
    decode = stats(root / "translate")["decode"]
    assert (decode["beam_size"], decode["alpha"], decode["max_len_offset"]) == (2, 0.3, 8)
    hyps = (root / "translate" / "hyp.tree").read_text().split("\n")[:-1]
    assert len(hyps) == sizes["test"]

    scores = json.loads((root / "parse_score" / "scores.json").read_text())
    assert scores["sentences"] == sizes["test"]
    assert scores["form"] == "t2t"
    # Repair makes every prediction a tree over exactly its sentence's words, so EVALB scores
    # every sentence (the scorer itself is checked against real EVALB in tests/unit/test_evalb.py).
    from parsing.trees import read_trees

    repaired = list(read_trees(root / "parse_score" / "repaired.trees"))
    gold = list(read_trees(root / "linearize" / "gold.trees"))
    assert [t.words() for t in repaired] == [t.words() for t in gold]
    assert scores["valid_sentences"] == sizes["test"] and 0.0 <= scores["f1"] <= 100.0


@pytest.mark.slow  # the whole parsing flow: ~30 s
def test_mlflow_holds_the_parse_f1_in_the_parse_score_child_run(first_run):
    from mlflow import MlflowClient

    from tasks.framework.config import load_config

    _, path, _, _ = first_run
    config = load_config(path)
    assert config.tracking_uri.startswith("sqlite:///") and str(config.root) in config.tracking_uri
    client = MlflowClient(tracking_uri=config.tracking_uri)
    experiment = client.get_experiment_by_name("parsing-test")
    runs = client.search_runs([experiment.experiment_id], max_results=200)
    parents = [r for r in runs if r.data.tags.get("pipeline") == "parsing"]
    assert len(parents) == 1
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert sorted(r.data.tags["stage"] for r in children) == sorted(PARSING_STAGES)
    score_run = next(r for r in children if r.data.tags["stage"] == "parse_score")
    scores = json.loads((config.root / "parse_score" / "scores.json").read_text())
    metrics = score_run.data.metrics
    assert metrics["f1"] == pytest.approx(scores["f1"])
    assert metrics["precision"] == pytest.approx(scores["precision"])
    assert metrics["recall"] == pytest.approx(scores["recall"])
    assert "repaired_sentences" in metrics


@pytest.mark.slow  # the whole parsing flow: ~30 s
def test_second_run_skips_every_stage(first_run):
    from pipelines.flows import pipeline_flow

    _, path, _, _ = first_run
    outcomes = pipeline_flow(config_path=path)
    assert [r.stage for r in outcomes] == PARSING_STAGES
    assert ran(outcomes) == []


CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SAMPLE = SHARED_DATA / "ptb_sample" / "combined"


def test_shipped_parsing_configs_hold_the_papers_settings():
    from tasks.framework.config import load_config
    from tasks.framework.graph import pipeline_name
    from transformer_core import presets

    wsj = load_config(CONFIGS / "wsj_parsing.yaml")
    semi = load_config(CONFIGS / "wsj_parsing_semi.yaml")
    sample = load_config(CONFIGS / "ptb_sample.yaml")
    for config in (wsj, semi, sample):
        assert pipeline_name(config) == "parsing" and config.data.pair == "words-tree"
        decode = config.decoding
        assert (decode.beam_size, decode.max_len_offset) == (21, 300)
    # The sample's alpha was chosen on its dev split (configs/ptb_sample.yaml); WSJ keeps 0.3.
    assert wsj.decoding.alpha == semi.decoding.alpha == 0.3
    for config in (wsj, semi):
        assert config.model == presets.parsing()
        assert (config.model.n_layers, config.model.d_model) == (4, 1024)
        assert config.parsing.test_files == ("23/*.mrg",) and config.parsing.dev_files == (
            "22/*.mrg",
        )
    assert (wsj.tokenizer.vocab_size, semi.tokenizer.vocab_size) == (16000, 32000)
    assert wsj.parsing.silver_corpus is None and semi.parsing.silver_corpus
    assert semi.train.steps > wsj.train.steps
    # The sample's longest target (984 pieces) must fit the model and one batch.
    assert sample.model.max_len >= 1024 and not sample.train.use_gpu
    assert sample.train.max_tokens_per_batch >= 984


@pytest.mark.shared_data("ptb_sample/combined")
def test_ptb_sample_config_splits_the_sample_by_file(tmp_path):
    from tasks.framework.config import load_config

    overrides = {"workdir": str(tmp_path / "run"), "parsing.treebank_dir": str(SAMPLE)}
    config = load_config(CONFIGS / "ptb_sample.yaml", overrides)
    got = run_stage(config, "treebank", {}).stats
    assert (got["train_files"], got["dev_files"], got["test_files"]) == (169, 11, 19)
    assert (got["train_trees"], got["dev_trees"], got["test_trees"]) == (3501, 176, 237)
