"""serving.marian_export and weight_adapters.marian: a checkpoint as a Hugging Face MarianMTModel
folder.

The export itself needs no transformers; the parity tests (logits, tokenizer ids, beam search)
load the folder with transformers and skip where it is not installed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from serving import ServingError
from serving import tokenizer as tokenizer_lib
from serving.marian_export import WEIGHTS_FILE, export_marian, marian_length_penalty
from transformer_core import Transformer, checkpoint, presets
from transformer_core.model import sinusoids
from transformer_core.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from weight_adapters.marian import marian_state_dict, permuted_state_dict, residual_permutation

SENTENCES = [
    f"the {a} cat sat on the {b} mat, number {i}."
    for i, (a, b) in enumerate(
        zip(
            ["big", "small", "red", "blue", "green"] * 40,
            ["old", "new", "warm", "cold"] * 50,
            strict=True,
        )
    )
]
MAX_LEN = 64


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    """A tiny sentencepiece model trained the pipeline's way (our special ids)."""
    from corpora.subwords import TokenizerConfig, train

    folder = tmp_path_factory.mktemp("tokenizer")
    model = train(SENTENCES, TokenizerConfig(vocab_size=60, threads=1))
    (folder / tokenizer_lib.MODEL_FILE).write_bytes(model.proto)
    return folder


@pytest.fixture(scope="module")
def tok(tokenizer_dir) -> tokenizer_lib.Tokenizer:
    return tokenizer_lib.load(tokenizer_dir)


def make_model(vocab_size: int, seed: int = 0, **changes) -> Transformer:
    """A debug-preset model with every weight perturbed (layer-norm gains and biases included,
    so that a wrongly mapped vector shows)."""
    torch.manual_seed(seed)
    config = presets.debug().replace(max_len=MAX_LEN, **changes)
    model = Transformer(config, vocab_size).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def save_checkpoint(model: Transformer, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return checkpoint.save(
        folder / "model.pt", model, model.config, vocab_size=model.src_vocab_size
    )


def padded(rows: list[list[int]]) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [PAD_ID] * (width - len(r)) for r in rows])


def batch(tok) -> tuple[torch.Tensor, torch.Tensor]:
    """A source batch and a teacher-forced decoder input, both with padding."""
    src = padded([tok.encode("the big cat sat on the old mat, number 7."), tok.encode("red cat")])
    tgt_in = padded(
        [[BOS_ID, *tok.encode("the cold mat")[:-1]], [BOS_ID, *tok.encode("a warm new cat sat")]]
    )
    assert (src == PAD_ID).any() and (tgt_in == PAD_ID).any()
    return src, tgt_in


def test_the_weights_file_holds_the_mapped_weights_and_no_pickle(tmp_path, tokenizer_dir, tok):
    from safetensors import safe_open

    model = make_model(tok.vocab_size)
    out = export_marian(save_checkpoint(model, tmp_path / "ckpt"), tokenizer_dir, tmp_path / "hf")
    path = out / WEIGHTS_FILE
    assert not path.read_bytes().startswith(b"\x80")  # not a pickle
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
    expected = marian_state_dict(model)
    assert set(tensors) == set(expected)
    assert "model.shared.weight" in tensors and "lm_head.weight" not in tensors
    for name, tensor in expected.items():
        assert torch.equal(tensors[name], tensor), name
    assert torch.equal(tensors["final_logits_bias"], torch.zeros(1, tok.vocab_size))


def test_safetensors_package_reads_the_weights(tmp_path, tokenizer_dir, tok):
    import safetensors.torch as safetensors_torch

    model = make_model(tok.vocab_size, share_embeddings=False)
    out = export_marian(save_checkpoint(model, tmp_path / "ckpt"), tokenizer_dir, tmp_path / "hf")
    expected = marian_state_dict(model)
    assert {"lm_head.weight", "model.decoder.embed_tokens.weight"} <= set(expected)
    loaded = safetensors_torch.load_file(str(out / WEIGHTS_FILE))
    assert set(loaded) == set(expected)
    assert all(torch.equal(loaded[k], v) for k, v in expected.items())


@pytest.mark.parametrize("d_model", [64, 7])
def test_permutation_turns_our_sinusoids_into_marians(d_model):
    """Marian's table: sines of the frequencies in the first ceil(D/2) columns, cosines after."""
    length = 50
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    freq = torch.pow(10000.0, torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    half = (d_model + 1) // 2
    marian = torch.cat([torch.sin(pos / freq), torch.cos(pos / freq)[:, : d_model - half]], 1)
    perm = residual_permutation(d_model)
    assert sorted(perm) == list(range(d_model))
    torch.testing.assert_close(
        sinusoids(length, d_model)[:, perm], marian.float(), atol=2e-5, rtol=0
    )


@pytest.mark.parametrize("share_embeddings", [True, False])
def test_permuted_weights_compute_the_same_logits(tok, share_embeddings):
    """The permuted residual stream, with the position table permuted alike, is the same model."""
    model = make_model(tok.vocab_size, share_embeddings=share_embeddings)
    permuted = Transformer(model.config, tok.vocab_size).eval()
    permuted.load_state_dict(permuted_state_dict(model))
    permuted.pos_table = model.pos_table[:, residual_permutation(model.config.d_model)]
    src, tgt_in = batch(tok)
    with torch.no_grad():
        torch.testing.assert_close(permuted(src, tgt_in), model(src, tgt_in), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"norm_first": True}, "pre-norm"),
        ({"positional": "learned"}, "positional='learned'"),
        ({"d_k": 8, "d_v": 8}, "d_k=8"),
    ],
)
def test_refuses_what_marian_cannot_express(tmp_path, tokenizer_dir, tok, changes, words):
    ckpt = save_checkpoint(make_model(tok.vocab_size, **changes), tmp_path / "ckpt")
    with pytest.raises(ServingError, match=words) as caught:
        export_marian(ckpt, tokenizer_dir, tmp_path / "hf")
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "hf").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_refuses_a_tokenizer_of_another_size(tmp_path, tokenizer_dir, tok):
    ckpt = save_checkpoint(make_model(tok.vocab_size + 1), tmp_path / "ckpt")
    with pytest.raises(ServingError, match="vocabulary has 61 ids but the tokenizer has 60"):
        export_marian(ckpt, tokenizer_dir, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_refuses_a_tokenizer_that_pretokenizes(tmp_path, tokenizer_dir, tok):
    import shutil

    from corpora.pretokenize import Pretokenizer
    from serving.export import export

    folder = shutil.copytree(tokenizer_dir, tmp_path / "tokenizer")
    Pretokenizer(("en", "de"), moses=True, lowercase=True).save(folder)
    ckpt = save_checkpoint(make_model(tok.vocab_size), tmp_path / "ckpt")
    with pytest.raises(
        ServingError, match="pretokenizes its text .moses.lowercase., which MarianTokenizer cannot"
    ):
        export("marian", ckpt, folder, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_export_replaces_an_existing_folder(tmp_path, tokenizer_dir, tok):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    first = make_model(tok.vocab_size, seed=1)
    export_marian(save_checkpoint(first, tmp_path / "ckpt"), tokenizer_dir, out, beam_size=5)
    assert not (out / "stale.txt").exists()
    assert json.loads((out / "generation_config.json").read_text())["num_beams"] == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "hf"]


def test_length_penalty_fits_ours():
    assert marian_length_penalty(0.0) == 0.0
    beta = marian_length_penalty(0.6)
    assert beta == pytest.approx(0.4509, abs=1e-4)
    # Relative penalty between a 10- and a 30-token output, ours and Hugging Face's.
    ours = math.log((5 + 30) / (5 + 10)) * 0.6
    theirs = math.log(30 / 10) * beta
    assert abs(ours - theirs) / ours < 0.1


# ----------------------------------------------------------------------------- with transformers


@pytest.mark.parametrize("share_embeddings", [True, False])
def test_marian_logits_match_ours(tmp_path, tokenizer_dir, tok, share_embeddings):
    transformers = pytest.importorskip("transformers")
    model = make_model(tok.vocab_size, share_embeddings=share_embeddings)
    out = export_marian(save_checkpoint(model, tmp_path / "ckpt"), tokenizer_dir, tmp_path / "hf")
    hf, info = transformers.MarianMTModel.from_pretrained(out, output_loading_info=True)
    hf.eval()
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    tied = hf.lm_head.weight.data_ptr() == hf.model.encoder.embed_tokens.weight.data_ptr()
    assert tied == share_embeddings

    src, tgt_in = batch(tok)
    with torch.no_grad():
        ours = model(src, tgt_in)
        theirs = hf(input_ids=src, attention_mask=src.ne(PAD_ID), decoder_input_ids=tgt_in).logits
    assert theirs.shape == ours.shape
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)


def test_marian_tokenizer_gives_our_ids(tmp_path, tokenizer_dir, tok):
    transformers = pytest.importorskip("transformers")
    model = make_model(tok.vocab_size)
    out = export_marian(save_checkpoint(model, tmp_path / "ckpt"), tokenizer_dir, tmp_path / "hf")
    hf_tok = transformers.MarianTokenizer.from_pretrained(out)
    assert (hf_tok.pad_token_id, hf_tok.unk_token_id, hf_tok.eos_token_id) == (
        PAD_ID,
        UNK_ID,
        EOS_ID,
    )
    texts = ["the big cat sat on the old mat, number 7.", "the red cat é zq", "  two  spaces"]
    for text in texts:
        ids = tok.encode(text)
        assert hf_tok(text).input_ids == ids
        if UNK_ID not in ids:  # Hugging Face drops <unk> as a special token; ours shows " ⁇ "
            assert hf_tok.decode(ids, skip_special_tokens=True) == tok.decode(ids)
    encoded = hf_tok(texts, padding=True, return_tensors="pt")
    assert torch.equal(encoded.input_ids, padded([tok.encode(t) for t in texts]))


def test_marian_generate_matches_our_beam_search(tmp_path, tokenizer_dir, tok):
    """With alpha 0 both length penalties are 1, so beam search must pick the same outputs."""
    transformers = pytest.importorskip("transformers")
    from helpers.tiny_models import best_tokens

    model = make_model(tok.vocab_size, seed=3)
    ckpt = save_checkpoint(model, tmp_path / "ckpt")
    out = export_marian(ckpt, tokenizer_dir, tmp_path / "hf", alpha=0.0)
    hf = transformers.MarianMTModel.from_pretrained(out).eval()
    src, _ = batch(tok)
    limit = 12
    ours = best_tokens(model, src, beam_size=4, alpha=0.0, max_len=limit)
    with torch.no_grad():
        generated = hf.generate(input_ids=src, attention_mask=src.ne(PAD_ID), max_length=limit + 1)
    theirs = [[t for t in row[1:] if t not in (EOS_ID, PAD_ID)] for row in generated.tolist()]
    assert generated[:, 0].tolist() == [BOS_ID, BOS_ID]
    assert theirs == ours
