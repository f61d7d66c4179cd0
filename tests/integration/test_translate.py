"""The translate stage: Ray Data actors equal single-process decoding, in input order."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.stage_folders import encoded_split, finished_folder, tiny_sentences

from corpora import CorpusError
from corpora.text import read_lines
from serving.translator import Translator
from tasks import translate
from tasks.framework.config import DataConfig, DecodeConfig, RayConfig, RunConfig
from tasks.framework.manifest import read_manifest
from tasks.framework.results import StageError
from tasks.framework.runner import run_stage
from transformer_core import presets

pytestmark = pytest.mark.integration

TEST_SOURCE = tiny_sentences(40, seed=1)
"""The test split: 40 sentences, over three Parquet parts (16 rows each)."""


def make_shard(root: Path, test_src: list[str], tokenizer_dir: Path, name: str = "shard") -> Path:
    """A shard folder whose test split encodes ``test_src`` as the shard stage does."""

    def build(tmp: Path) -> dict:
        encoded_split(tmp / "test", test_src, tokenizer_dir)
        return {}

    return finished_folder(root / name, "shard", {"n": len(test_src), "name": name}, build)


def run_config(root: Path, **decode) -> RunConfig:
    decode = {"num_actors": 2, "max_tokens_per_batch": 48, "max_len_offset": 6, **decode}
    return RunConfig(
        name="t",
        workdir=str(root),
        model=presets.debug(),
        decode=DecodeConfig(**decode),
        ray=RayConfig(num_cpus=2),
    )


def translate_here(inputs: dict[str, Path], texts: list[str], decode: DecodeConfig) -> list[str]:
    """In this process, without Ray: the reference the distributed stage must equal."""
    return Translator.load(inputs["average"], inputs["tokenizer"], decode).translate(texts)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_model, tiny_tokenizer) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("translate")
    return {
        "average": tiny_model,
        "tokenizer": tiny_tokenizer,
        "shard": make_shard(root, TEST_SOURCE, tiny_tokenizer),
    }


def test_distributed_equals_single_process_in_input_order(ray_local, inputs, tmp_path) -> None:
    config = run_config(tmp_path)
    out = run_stage(config, "translate", inputs).path
    texts = TEST_SOURCE
    hyps = read_lines(out / "hyp.de")
    reference = translate_here(inputs, texts, config.decode)

    assert len(hyps) == len(texts) == 40
    assert hyps == reference
    # The outputs depend on the input, so a shuffled order could not pass the equality above.
    assert len(set(reference)) > 25

    stats = read_manifest(out)["stats"]
    assert stats["segments"] == 40
    assert stats["model_fingerprint"] == read_manifest(inputs["average"])["fingerprint"]
    assert stats["decode"]["beam_size"] == 4 and stats["decode"]["alpha"] == 0.6
    assert stats["actors"] == 2 and stats["batches"] > 2
    assert stats["hyp_tokens"] > 0 and stats["tokens_per_s"] > 0
    # The attention maps of the first short sentences, for people (logged by the flow).
    assert stats["attention_plot_sentences"] == 4
    assert (out / "attention.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Up to date: a second call returns at once without decoding again.
    started = read_manifest(out)["started"]
    assert not run_stage(config, "translate", inputs).ran
    assert read_manifest(out)["started"] == started


def test_single_process_batching_does_not_change_the_order(inputs) -> None:
    """One sentence per batch and one big batch give the same per-line results on short inputs."""
    texts = ["the cat", "a big red house sees the dog", "dog", "the old tree walks"]
    one_by_one = [translate_here(inputs, [t], DecodeConfig(max_len_offset=6))[0] for t in texts]
    small = translate_here(inputs, texts, DecodeConfig(max_len_offset=6, max_tokens_per_batch=1))
    assert small == one_by_one


@pytest.mark.parametrize("engine", ["torch", "ctranslate2"])
def test_an_empty_line_is_an_empty_translation(inputs, tmp_path, monkeypatch, engine) -> None:
    """Nothing is decoded for a line without a piece (decoding its lone EOS made a sentence up):
    through the text API (tfm translate, the registered model) and a stage actor's batches."""
    import numpy as np

    from serving.corpus_translation import CorpusTranslator

    texts = ["the cat", "", "a big red house sees the dog", "   "]
    decode = DecodeConfig(max_len_offset=6, engine=engine)
    translator = Translator.load(
        inputs["average"], inputs["tokenizer"], decode, export_dir=tmp_path / "ct2"
    )
    searched = []  # the sources the engine is asked to decode: never a lone EOS
    search = translator.engine.search

    def recorded(src_ids, settings):
        searched.extend(src_ids)
        return search(src_ids, settings)

    monkeypatch.setattr(translator.engine, "search", recorded)
    alone = [translator.translate([t])[0] for t in texts]
    assert len(searched) == 2 and all(len(ids) > 1 for ids in searched)
    assert translator.translate(texts) == alone and alone[1] == alone[3] == ""
    assert alone[0] and alone[2]  # the others are translated
    assert translator.translate_nbest(["", "the cat"], 2)[0] == [("", 0.0)]
    source = [str(f) for f in encoded_split(tmp_path / "test", texts, inputs["tokenizer"])]
    actor = CorpusTranslator(
        str(inputs["average"]),
        str(inputs["tokenizer"]),
        decode.__dict__,
        source,
        export_dir=str(tmp_path / "ct2"),
    )
    piece = {"piece": np.array([0]), "rows": np.array([np.arange(len(texts))], dtype=object)}
    out = actor(piece)
    assert out["tgt"].tolist() == alone and out["tgt_len"].tolist()[1] == 0
    # The distill stage's actors are given the texts, not an encoded split.
    actor = CorpusTranslator(
        str(inputs["average"]),
        str(inputs["tokenizer"]),
        decode.__dict__,
        export_dir=str(tmp_path / "ct2"),
    )
    out = actor({**piece, "src": np.array([np.array(texts, dtype=object)], dtype=object)})
    assert out["tgt"].tolist() == alone and out["score"].tolist()[1] == 0.0


def test_empty_test_set_is_a_clear_error(ray_local, inputs, tmp_path) -> None:
    empty = make_shard(tmp_path, [], inputs["tokenizer"], name="shard_empty")
    with pytest.raises(StageError, match=r"test holds 0 rows \(an empty test set\)"):
        run_stage(run_config(tmp_path), "translate", {**inputs, "shard": empty})
    assert not (tmp_path / "translate").exists()


def test_missing_test_split_is_a_clear_error(inputs, tmp_path) -> None:
    no_test = finished_folder(
        tmp_path / "shard_no_test", "shard", {"name": "no test"}, lambda tmp: {}
    )
    with pytest.raises(CorpusError, match=r"no part-\*\.parquet files in .*shard_no_test/test"):
        run_stage(run_config(tmp_path), "translate", {**inputs, "shard": no_test})


def test_parsing_pipeline_decodes_with_the_parsing_settings(tmp_path) -> None:
    """Section 6.3: beam 21, alpha 0.3, max output = input + 300 when the data is a treebank."""
    wmt = run_config(tmp_path, num_actors=3)
    assert wmt.decoding == wmt.decode
    parsing = wmt.replace(data=DataConfig(source="treebank", pair="words-tree"))
    decode = parsing.decoding
    assert (decode.beam_size, decode.alpha, decode.max_len_offset) == (21, 0.3, 300)
    assert decode.num_actors == 3  # the execution settings stay the decode section's
    assert translate.stage_config(parsing)["decode"]["beam_size"] == 21


def test_bfloat16_decoding_agrees_with_float32(inputs) -> None:
    """decode.dtype bfloat16 casts the weights and decodes to (nearly) the float32 outputs."""
    import torch

    texts = TEST_SOURCE
    fp32 = translate_here(inputs, texts, DecodeConfig(max_len_offset=6))
    bf16_config = DecodeConfig(max_len_offset=6, dtype="bfloat16")
    bf16 = translate_here(inputs, texts, bf16_config)
    loaded = Translator.load(inputs["average"], inputs["tokenizer"], bf16_config, device="cpu")
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    agree = sum(a == b for a, b in zip(fp32, bf16, strict=True))
    print(f"bfloat16 equals float32 on {agree} of {len(texts)} sentences")
    # This copy model had 100 steps of training, so its top beams are close calls; the trained
    # quickstart model agrees on 291 of 300 (docs/benchmarks.md).
    assert agree >= 0.6 * len(texts)


def test_tfm_translate_from_a_checkpoint_stops_at_a_line_that_is_not_utf8(
    inputs, monkeypatch, capsys
):
    import io
    import sys

    from pipelines.cli import main

    lines = [b"the cat", b"a big red house", b"bad \xff byte", b"dog"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\n".join(lines) + b"\n")))
    args = [
        "--checkpoint",
        str(inputs["average"]),
        "--tokenizer",
        str(inputs["tokenizer"]),
        "--beam",
        "2",
        "--length-norm",
        "fairseq",
    ]
    assert main(["translate", *args]) == 1
    out, err = capsys.readouterr()
    # The lines before the bad one are translated (beam 2, fairseq's penalty, as asked), then one
    # line names it.
    asked = DecodeConfig(beam_size=2, length_norm="fairseq")
    assert out.splitlines() == translate_here(inputs, ["the cat", "a big red house"], asked)
    assert "tfm: input line 3 is not UTF-8 (byte 5 of the line is b'\\xff')" in err
