"""The pipeline a config runs: named by its ``pipeline`` key, or, left out (every config written
before the key), by the keys it sets; a config whose keys name two pipelines, or another one
than its ``pipeline``, is refused in one line. The pipelines' tables share their rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tasks.framework import graph
from tasks.framework.config import ConfigError, config_from_dict, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

RUNS_TODAY = {
    "multi30k_en_de": "wmt14",
    "multi30k_en_de_distill": "distill",
    "multi30k_en_de_gpu": "wmt14",
    "multi30k_en_de_tiny": "wmt14",
    "multi30k_to_news": "wmt14",  # a fine-tuning: its parent stage first
    "ptb_sample": "parsing",
    "quickstart": "wmt14",
    "quickstart_finetune": "wmt14",  # a fine-tuning of the quickstart's champion
    "quickstart_distill": "distill",
    "wmt14_en_de_base": "wmt14",
    "wmt14_en_de_big": "wmt14",
    "wmt14_en_fr_big": "wmt14",
    "wsj_parsing": "parsing",
    "wsj_parsing_semi": "parsing",
    "your_data": "wmt14",
}
"""The pipeline each shipped config ran before the key (inferred from its sections)."""

TEACHER = {"distill": {"teacher": "models:/t@champion"}}
FAIRSEQ = {"fairseq": {"checkpoint": "c.pt", "dict_dir": "d", "bpe_codes": "b"}}
TREEBANK = {"data": {"source": "treebank", "pair": "words-tree"}}


def test_every_shipped_config_runs_the_pipeline_it_ran_before_the_key():
    assert sorted(p.stem for p in CONFIGS.glob("*.yaml")) == sorted(RUNS_TODAY)
    for stem, name in RUNS_TODAY.items():
        config = load_config(CONFIGS / f"{stem}.yaml")
        assert (stem, graph.pipeline_name(config)) == (stem, name)
        stages = {s.name: s for s in graph.PIPELINES[name]}
        for s in graph.pipeline(config):  # its pipeline's stages, with no other input roles
            assert s.inputs.keys() <= stages[s.name].inputs.keys(), (stem, s.name)


@pytest.mark.parametrize(
    ("written", "name"),
    [
        ({}, "wmt14"),
        ({"pipeline": "wmt14"}, "wmt14"),
        (TEACHER, "distill"),
        ({"pipeline": "distill", **TEACHER}, "distill"),
        (FAIRSEQ, "fairseq"),
        ({"pipeline": "fairseq", **FAIRSEQ}, "fairseq"),
        (TREEBANK, "parsing"),
        ({"pipeline": "parsing", **TREEBANK}, "parsing"),
    ],
)
def test_the_key_names_the_pipeline_and_left_out_the_sections_do(written, name):
    config = config_from_dict({"name": "r", **written})
    assert config.pipeline == written.get("pipeline") and graph.pipeline_name(config) == name


@pytest.mark.parametrize(
    ("written", "line"),
    [
        (
            {**FAIRSEQ, **TEACHER},
            "distill.teacher: names the distill pipeline and fairseq.checkpoint the fairseq "
            "pipeline; a config runs one: leave one of them out",
        ),
        (
            {"pipeline": "distill", **FAIRSEQ, **TEACHER},
            "fairseq.checkpoint: names the fairseq pipeline, but pipeline is distill: leave it "
            "out or set pipeline: fairseq",
        ),
        (
            {"pipeline": "wmt14", **TEACHER},
            "distill.teacher: names the distill pipeline, but pipeline is wmt14: leave it out or "
            "set pipeline: distill",
        ),
        ({"pipeline": "distill"}, "pipeline: distill needs distill.teacher"),
        ({"pipeline": "fairseq"}, "pipeline: fairseq needs fairseq.checkpoint"),
        ({"pipeline": "parsing"}, "pipeline: parsing needs data.source: treebank"),
        (
            {"pipeline": "translation"},
            "pipeline: 'translation' is not one of 'wmt14', 'distill', 'fairseq', 'parsing'",
        ),
    ],
)
def test_a_config_whose_keys_name_another_pipeline_is_refused_in_one_line(tmp_path, written, line):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(written), encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{line} (in {path})"


def test_the_pipelines_share_the_rows_of_the_stages_they_share():
    wmt14, parsing, distill = (
        {s.name: s for s in stages} for stages in (graph.WMT14, graph.PARSING, graph.DISTILL)
    )
    for name in ("train", "average", "translate"):
        assert wmt14[name] == parsing[name] == distill[name]
    for name in ("download", "clean", "score"):
        assert wmt14[name] == distill[name]
    # The shared rows read the corpus each pipeline makes, in the role clean.
    assert [t["tokenizer"].inputs for t in (wmt14, parsing, distill)] == [
        {"clean": "clean"},
        {"clean": "linearize"},
        {"clean": "filter"},
    ]
    assert distill["register"].inputs == {**wmt14["register"].inputs, "teacher": "teacher"}
