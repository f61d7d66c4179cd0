"""``tokenizer.model_file``: a team's own sentencepiece model, or subword-nmt codes with their
vocabulary (``tokenizer.vocab_file``), used as it is by the tokenizer stage (no sample, no
training), checked for the pipeline's special ids and the config's vocabulary size,
fingerprinted by its content; a config without it fingerprints as before."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import sentencepiece as spm
from helpers.stage_folders import finished_folder, tiny_sentences

from corpora import CorpusError
from corpora.pretokenize import Pretokenizer
from corpora.subwords import learn_codes
from pipelines.cli import error_line
from serving import tokenizer
from tasks import tokenizer as tokenizer_stage
from tasks.framework.config import ConfigError, config_from_dict, flatten, to_dict
from tasks.framework.runner import run_stage
from tasks.train import vocab_size

PIPELINE_IDS = {"pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3}
SENTENCES = tiny_sentences(300, seed=3)


def team_model(path: Path, vocab_size: int = 40, **ids: int) -> Path:
    """A sentencepiece model trained on the tiny sentences, as a team would bring it."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SENTENCES),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="bpe",
        num_threads=1,
        minloglevel=2,
        **(ids or PIPELINE_IDS),
    )
    path.write_bytes(model.getvalue())
    return path


def team_codes(folder: Path, merges: int = 30) -> tuple[Path, Path, list[str]]:
    """subword-nmt codes learned on the tiny sentences and their vocabulary (``get-vocab``'s
    ``piece count`` lines, most frequent first), as a team would bring them; the pieces."""
    codes = learn_codes(SENTENCES, merges)
    segmented = Pretokenizer(("en", "de"), bpe_codes=codes).segment(SENTENCES)
    counts: dict[str, int] = {}
    for piece in " ".join(segmented).split():
        counts[piece] = counts.get(piece, 0) + 1
    pieces = sorted(counts, key=lambda p: (-counts[p], p))
    (folder / "bpe.codes").write_text(codes, encoding="utf-8")
    (folder / "vocab.txt").write_text("".join(f"{p} {counts[p]}\n" for p in pieces))
    return folder / "bpe.codes", folder / "vocab.txt", pieces


def config(tmp_path: Path, **tokenizer):
    return config_from_dict(
        {
            "name": "team",
            "workdir": str(tmp_path / "run"),
            "model": {"preset": "debug"},
            "tokenizer": {"vocab_size": 40, **tokenizer},
        }
    )


def run_tokenizer(tmp_path: Path, cfg) -> Path:
    """The tokenizer stage of ``cfg`` through the stage contract, on an empty clean folder."""
    clean = finished_folder(tmp_path / "run" / "clean", "clean", {}, lambda tmp: {})
    return run_stage(cfg, "tokenizer", {"clean": clean}).path


def test_the_stage_copies_the_model_and_encodes_as_the_file(tmp_path):
    team = team_model(tmp_path / "team.model")
    cfg = config(tmp_path, model_file=str(team))
    out = run_tokenizer(tmp_path, cfg)
    assert (out / tokenizer.MODEL_FILE).read_bytes() == team.read_bytes()
    assert len((out / tokenizer.VOCAB_FILE).read_text().splitlines()) == 40
    assert vocab_size(cfg, {"tokenizer": out, "shard": out}, {}) == 40  # train takes it
    ours, theirs = tokenizer.load(out), spm.SentencePieceProcessor(model_file=str(team))
    for sentence in SENTENCES[:20] + ["a cat never seen zebra"]:
        assert ours.encode(sentence) == theirs.encode(sentence) + [3]
        assert ours.decode(ours.encode(sentence)) == theirs.decode(theirs.encode(sentence))


def test_subword_nmt_codes_and_their_vocabulary_segment_and_number_as_given(tmp_path):
    codes, vocab, pieces = team_codes(tmp_path)
    settings = {"kind": "subword-nmt", "model_file": str(codes), "vocab_file": str(vocab)}
    cfg = config(tmp_path, **settings, vocab_size=len(pieces) + 4)
    out = run_tokenizer(tmp_path, cfg)
    assert vocab_size(cfg, {"tokenizer": out, "shard": out}, {}) == len(pieces) + 4
    ours = tokenizer.load(out)
    assert ours.pretokenizer.bpe_codes == codes.read_text()  # the folder applies the codes
    applied = Pretokenizer(("en", "de"), bpe_codes=codes.read_text())
    for sentence in SENTENCES[:20]:
        ids = ours.encode(sentence)[:-1]
        assert [ours.sp.id_to_piece(i) for i in ids] == [
            "\u2581" + p for p in applied.segment([sentence])[0].split()
        ]
        assert ours.decode(ids) == sentence
    assert 1 in ours.encode("a zebra")  # a piece the vocabulary lacks is <unk>
    with pytest.raises(CorpusError) as caught:
        run_tokenizer(tmp_path, config(tmp_path, **settings, vocab_size=40))
    assert str(caught.value) == (
        f"tokenizer.vocab_size: the config says 40 but tokenizer.vocab_file {vocab} has "
        f"{len(pieces)} pieces and 4 special ids: set tokenizer.vocab_size: {len(pieces) + 4}"
    )


def test_a_relative_path_is_from_where_tfm_runs(tmp_path, monkeypatch):
    team_model(tmp_path / "team.model")
    monkeypatch.chdir(tmp_path)
    assert config(tmp_path, model_file="team.model").tokenizer.model_file == str(
        tmp_path / "team.model"
    )


BAD_FILES = {
    "missing": (lambda path: None, "does not exist"),
    "text": (
        lambda path: path.write_text("not a model\n"),
        "is not a sentencepiece model (subword-nmt codes take kind: subword-nmt and a vocab_file)",
    ),
    "sentencepiece's own ids": (  # its defaults: unk 0, bos 1, eos 2, no pad
        lambda path: team_model(path, unk_id=0, bos_id=1, eos_id=2, pad_id=-1),
        "has the special ids (pad, unk, bos, eos) (-1, 0, 1, 2) (-1: none); the model needs "
        "(0, 1, 2, 3): train it with --pad_id=0 --unk_id=1 --bos_id=2 --eos_id=3",
    ),
}


@pytest.mark.parametrize("bad", list(BAD_FILES))
def test_a_file_that_cannot_be_the_tokenizer_is_one_line_naming_key_and_file(tmp_path, bad):
    make, words = BAD_FILES[bad]
    path = tmp_path / "team.model"
    make(path)
    with pytest.raises(CorpusError) as caught:
        run_tokenizer(tmp_path, config(tmp_path, model_file=str(path)))
    line = error_line(caught.value)
    assert line == f"stage tokenizer failed: tokenizer.model_file: {path} {words}"


@pytest.mark.parametrize("bad", ["codes", "vocab"])
def test_codes_or_a_vocabulary_that_are_not_are_one_line(tmp_path, bad):
    codes, vocab, pieces = team_codes(tmp_path)
    (codes if bad == "codes" else vocab).write_text("one two three\n")
    settings = {"kind": "subword-nmt", "model_file": str(codes), "vocab_file": str(vocab)}
    with pytest.raises(CorpusError) as caught:
        run_tokenizer(tmp_path, config(tmp_path, **settings, vocab_size=len(pieces) + 4))
    assert (
        str(caught.value)
        == {
            "codes": f"tokenizer.model_file: {codes} is not subword-nmt codes (learn-bpe's "
            "'left right' lines)",
            "vocab": f"tokenizer.vocab_file: {vocab}:1: not a fairseq dictionary line "
            "('<symbol> <count>')",
        }[bad]
    )


def test_a_vocab_size_that_is_not_the_files_names_both(tmp_path):
    team = team_model(tmp_path / "team.model")
    with pytest.raises(CorpusError) as caught:
        run_tokenizer(tmp_path, config(tmp_path, model_file=str(team), vocab_size=64))
    assert str(caught.value) == (
        f"tokenizer.vocab_size: the config says 64 but tokenizer.model_file {team} has 40 "
        "pieces: set tokenizer.vocab_size: 40"
    )


def test_without_the_key_the_stage_config_is_the_one_before_it(tmp_path):
    plain = config(tmp_path)
    assert "model_file" not in to_dict(plain.tokenizer)
    assert "tokenizer.model_file" not in flatten(plain)
    # exactly the form every earlier tokenizer folder was fingerprinted with
    assert tokenizer_stage.stage_config(plain) == {
        "tokenizer": {
            "kind": "bpe",
            "vocab_size": 40,
            "merges": None,
            "sample_size": 2_000_000,
            "threads": 2,
            "character_coverage": 1.0,
            "target_symbols": False,
            "lowercase": False,
            "moses": False,
        },
        "seed": 1234,
    }


def test_a_changed_file_changes_the_stage_config(tmp_path):
    team = team_model(tmp_path / "team.model")
    cfg = config(tmp_path, model_file=str(team))
    first = tokenizer_stage.stage_config(cfg)
    assert first["tokenizer"]["model_file"]["file"] == "team.model"
    assert len(first["tokenizer"]["model_file"]["sha256"]) == 64 and "seed" not in first
    assert tokenizer_stage.stage_config(cfg) == first
    team_model(team, vocab_size=48)
    assert tokenizer_stage.stage_config(cfg) != first


@pytest.mark.parametrize(
    ("settings", "key", "words"),
    [
        ({"train": {"init_from": "models:/general@champion"}}, "tokenizer.model_file", "parent"),
        (
            {"fairseq": {"checkpoint": "ckpt.pt", "dict_dir": "dicts", "bpe_codes": "codes"}},
            "tokenizer.model_file",
            "imported checkpoint",
        ),
        ({"tokenizer": {"target_symbols": True}}, "tokenizer.target_symbols", "model_file"),
        ({"tokenizer": {"kind": "subword-nmt"}}, "tokenizer.vocab_file", "get-vocab"),
        ({"tokenizer": {"vocab_file": "v.txt"}}, "tokenizer.vocab_file", "kind: subword-nmt"),
        (
            {"tokenizer": {"kind": "subword-nmt", "merges": 9, "vocab_file": "v"}},
            "tokenizer.merges",
            "the codes hold",
        ),
    ],
)
def test_keys_that_contradict_it_are_one_line(tmp_path, settings, key, words):
    data = {"name": "team", "workdir": str(tmp_path), **settings}
    data["tokenizer"] = {**data.get("tokenizer", {}), "model_file": "team.model"}
    with pytest.raises(ConfigError) as caught:
        config_from_dict(data)
    assert caught.value.key == key and words in caught.value.message
    assert "\n" not in str(caught.value)
