"""A fairseq checkpoint written with fairseq's key names and layout, imported: the model computes
fairseq's logits (a forward pass written here from the fairseq weights), the tokenizer gives
fairseq's ids, and what cannot be mapped is refused in one line naming the file."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import fairseq_files as fs

from corpora.pretokenize import Pretokenizer
from serving import ServingError, tokenizer
from tasks.fairseq_import import Source, write
from transformer_core import checkpoint

PRETOKENIZER = Pretokenizer(fs.LANGUAGES, moses=True, lowercase=True)


def make_files(folder: Path, layout: str = "0.12", **changes) -> tuple[Source, dict, Any, list]:
    """A fairseq model's files in ``folder``: the source, its weights, its settings and its
    dictionary's symbols."""
    codes, symbols = fs.write_bpe(folder)
    s = fs.settings(**changes)
    state = fs.state_dict(s, len(fs.SPECIALS) + len(symbols), layout)
    fs.write_checkpoint(folder / "checkpoint_best.pt", s, state, layout)
    return Source(folder / "checkpoint_best.pt", folder, codes), state, s, symbols


def imported(folder: Path, source: Source) -> Path:
    """``source`` imported into a new folder under ``folder``."""
    out = Path(tempfile.mkdtemp(prefix="imported-", dir=folder))
    write(out, source, PRETOKENIZER)
    return out


def padded(rows: list[list[int]], pad: int, left: bool = False) -> torch.Tensor:
    width = max(map(len, rows))
    return torch.tensor(
        [[pad] * (width - len(r)) * left + r + [pad] * (width - len(r)) * (not left) for r in rows]
    )


def fairseq_column(out: Path, symbols: list[str]) -> list[int]:
    """For each of our ids, the fairseq id whose logit it is, found by name: specials by their
    symbol, pieces by their text in the dictionary."""
    sp = tokenizer.load(out).sp
    index = {s: i for i, s in enumerate(fs.SPECIALS + symbols)}
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    return [index[p] if p in index else index[p.removeprefix("\u2581")] for p in pieces]


@pytest.mark.parametrize(
    "layout,changes",
    [
        ("0.12", {}),  # fairseq 0.12's cfg, all embeddings shared, post-norm
        ("0.9", {"arch": "transformer_tiny", "encoder_normalize_before": True,
                 "decoder_normalize_before": True, "share_all_embeddings": False,
                 "share_decoder_input_output_embed": False}),  # args, pre-norm, nothing shared
    ],
)  # fmt: skip
def test_imported_model_computes_fairseqs_logits(tmp_path, layout, changes):
    source, state, s, symbols = make_files(tmp_path, layout, **changes)
    out = imported(tmp_path, source)
    model = checkpoint.load_model(out / checkpoint.MODEL_FILE)
    tok = tokenizer.load(out)

    sources, targets = fs.TEXTS[:3], fs.TEXTS[3:6]
    src = [tok.encode(t, side=0) for t in sources]
    tgt = [tok.encode(t, side=1) for t in targets]
    column = fairseq_column(out, symbols)
    # Our ids, named in fairseq's dictionary, are the ids fairseq's own pipeline gives.
    assert [[column[i] for i in ids] for ids in src] == fs.fairseq_ids(
        sources, "en", source.bpe_codes, symbols
    )
    fs_tgt = fs.fairseq_ids(targets, "de", source.bpe_codes, symbols)
    assert [[column[i] for i in ids] for ids in tgt] == fs_tgt

    with torch.no_grad():
        ours = model(padded(src, 0), padded([[2] + t[:-1] for t in tgt], 0))
        theirs = fs.forward(
            state, s,
            padded(fs.fairseq_ids(sources, "en", source.bpe_codes, symbols), fs.PAD, left=True),
            padded([[fs.EOS] + t[:-1] for t in fs_tgt], fs.PAD),
        )  # fmt: skip
    assert ours.shape[-1] == theirs.shape[-1]  # every fairseq id is one of ours
    for row, t in enumerate(tgt):
        n = len(t)  # the real target positions; the rest is padding in both
        torch.testing.assert_close(ours[row, :n], theirs[row, :n, column], atol=1e-5, rtol=1e-5)


def test_refuses_what_our_model_cannot_express(tmp_path):
    cases = {
        "layernorm_embedding=True": {"layernorm_embedding": True},
        "encoder_learned_pos=True": {"encoder_learned_pos": True},
        "no_scale_embedding=True": {"no_scale_embedding": True},
        "encoder_layers=2 but decoder_layers=1": {"decoder_layers": 1},
        "activation_fn='gelu'": {"activation_fn": "gelu"},
        "arch 'lstm'": {"arch": "lstm"},
    }
    for setting, changes in cases.items():
        folder = tmp_path / setting.split("=")[0].split()[-1]
        folder.mkdir()
        source, _, _, _ = make_files(folder, **changes)
        with pytest.raises(ServingError) as err:
            imported(folder, source)
        line = str(err.value)
        assert "\n" not in line and str(source.checkpoint) in line and setting in line, line


def test_refuses_a_dictionary_that_is_not_the_checkpoints(tmp_path):
    source, _, _, _ = make_files(tmp_path)
    for lang in fs.LANGUAGES:  # one symbol more than the embeddings have rows
        with open(tmp_path / f"dict.{lang}.txt", "a", encoding="utf-8") as f:
            f.write("extra@@ 1\n")
    with pytest.raises(ServingError, match=r"checkpoint_best\.pt: the embeddings have \d+ rows"):
        imported(tmp_path, source)
    (tmp_path / "dict.de.txt").write_text("other 1\n", encoding="utf-8")
    with pytest.raises(ServingError, match=r"dict\.en\.txt and .*dict\.de\.txt differ"):
        imported(tmp_path, source)


def test_refuses_missing_files_and_checkpoints_without_a_model(tmp_path):
    source, _, _, _ = make_files(tmp_path)
    missing = Source(tmp_path / "nothing.pt", tmp_path, source.bpe_codes)
    with pytest.raises(ServingError, match=r"nothing\.pt does not exist"):
        imported(tmp_path, missing)
    torch.save({"cfg": {}, "extra_state": {}}, tmp_path / "empty.pt")
    with pytest.raises(ServingError, match=r"empty\.pt holds no model state"):
        imported(tmp_path, Source(tmp_path / "empty.pt", tmp_path, source.bpe_codes))
    with pytest.raises(ServingError, match=r"nowhere/dict\.en\.txt does not exist"):
        imported(tmp_path, Source(source.checkpoint, tmp_path / "nowhere", source.bpe_codes))
    with pytest.raises(ServingError, match=r"nothing\.codes does not exist"):
        imported(tmp_path, Source(source.checkpoint, tmp_path, tmp_path / "nothing.codes"))


class Payload:
    """Any class a pickle may name: loading it would run its code."""

    def __reduce__(self):
        return (print, ("unpickled!",))


def test_reads_weights_only(tmp_path, capsys):
    source, state, s, _ = make_files(tmp_path)
    evil = tmp_path / "evil.pt"
    torch.save({"args": s, "model": state, "extra_state": Payload()}, evil)
    # The refused callable is named (builtins.print, or what Ray put in its place once imported).
    with pytest.raises(ServingError, match=r"evil\.pt holds pickled objects .*\(\S*print\)"):
        imported(tmp_path, Source(evil, tmp_path, source.bpe_codes))
    assert "unpickled!" not in capsys.readouterr().out
    torch.load(evil, weights_only=False)  # what the refusal kept from running
    assert "unpickled!" in capsys.readouterr().out
