"""The CTranslate2 engine on small random models: the weight mapping (greedy outputs equal ours
for every layout), the settings' validation, quantized exports, atomic writes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.tiny_models import V, best_tokens, tiny_model

from serving import ServingError, ct2, ct2_export
from serving.translator import DecodeConfig
from transformer_core import EOS_ID, PAD_ID, ConfigError

pytest.importorskip("ctranslate2")  # the "serve" extra (also in "dev")

PIECES = ["<pad>", "<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(4, V)]
"""A vocabulary for ``tiny_model``: the pipeline's special pieces, then one piece per symbol."""


def sources(n: int = 32, seed: int = 2) -> list[list[int]]:
    """Symbols of 1..12 tokens, then EOS: lengths differ, so the output limits do too."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 13, (n,), generator=g).tolist()
    return [torch.randint(4, V, (k,), generator=g).tolist() + [EOS_ID] for k in lengths]


def padded(src_ids: list[list[int]]) -> torch.Tensor:
    src = torch.full((len(src_ids), max(map(len, src_ids))), PAD_ID)
    for i, seq in enumerate(src_ids):
        src[i, : len(seq)] = torch.tensor(seq)
    return src


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"norm_first": True},
        {"positional": "learned"},
        {"d_k": 8, "d_v": 8},
        {"n_layers": 3, "decoder_layers": 1},
    ],
    ids=["post-norm", "pre-norm", "learned-positions", "narrow-heads", "shallow-decoder"],
)
def test_greedy_outputs_equal_ours_for_every_layout(tmp_path: Path, changes: dict) -> None:
    """Argmax decoding compares the logits of both implementations at every step, so equal
    outputs on random weights (no ties to hide behind) mean the mapping is exact."""
    model = tiny_model(seed=3, **changes)
    engine = ct2.CTranslate2Engine(ct2_export.save_model(model, PIECES, tmp_path / "m"))
    src_ids = sources()
    decode = DecodeConfig(beam_size=1, max_len_offset=3)
    ours = best_tokens(model, padded(src_ids), beam_size=1, max_len_offset=3)
    assert engine.search(src_ids, decode) == ours
    # The per-sentence limit (source length + offset) was reached, and kept, by many outputs.
    reached = [len(o) == len(s) + 3 for o, s in zip(ours, src_ids, strict=True)]
    assert sum(reached) > 8


def test_beam_outputs_mostly_equal_ours_on_random_weights(tmp_path: Path) -> None:
    """Beam search differs only where CTranslate2 renormalises after masking <pad> and <s>
    (ours masks after the softmax): large on random weights, negligible on trained ones
    (tests/integration/test_ctranslate2_serving.py holds the >= 99% check)."""
    model = tiny_model(seed=3)
    engine = ct2.CTranslate2Engine(ct2_export.save_model(model, PIECES, tmp_path / "m"))
    src_ids = sources(64)
    ours = best_tokens(model, padded(src_ids), beam_size=4, alpha=0.6, max_len_offset=5)
    theirs = engine.search(src_ids, DecodeConfig(max_len_offset=5))
    assert sum(a == b for a, b in zip(ours, theirs, strict=True)) >= 0.85 * len(ours)


def test_n_best_is_sorted_by_the_gnmt_score(tmp_path: Path) -> None:
    engine = ct2.CTranslate2Engine(
        ct2_export.save_model(tiny_model(seed=3), PIECES, tmp_path / "m")
    )
    found = engine.hypotheses(sources(8), beam_size=4, alpha=0.6, max_len_offset=5, n_best=4)
    for hyps in found:
        assert len(hyps) == 4
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
    with pytest.raises(ValueError, match="n_best: 5 must be in"):
        engine.hypotheses(sources(1), beam_size=4, n_best=5)


def test_n_best_lists_mostly_equal_ours(tmp_path: Path) -> None:
    """The same n-best list (outputs, order) from both engines through their common interface."""
    from serving.translator import TorchEngine

    model = tiny_model(seed=3)
    engine = ct2.CTranslate2Engine(ct2_export.save_model(model, PIECES, tmp_path / "m"))
    src_ids = sources(32)
    decode = DecodeConfig(max_len_offset=5)
    ours = TorchEngine(model).nbest(src_ids, decode, 3)
    theirs = engine.nbest(src_ids, decode, 3)
    same = [
        [h.tokens for h in a] == [h.tokens for h in b] for a, b in zip(ours, theirs, strict=True)
    ]
    assert all(len(hyps) == 3 for hyps in ours + theirs)
    assert sum(same) >= 0.75 * len(same)  # random weights: see the beam test above


def test_fixed_length_outputs(tmp_path: Path) -> None:
    """min_len = max_len: every output has that length (the benchmark relies on it)."""
    engine = ct2.CTranslate2Engine(
        ct2_export.save_model(tiny_model(seed=3), PIECES, tmp_path / "m")
    )
    found = engine.hypotheses(sources(8), beam_size=4, max_len=7, min_len=7)
    assert {len(hyps[0].tokens) for hyps in found} == {7}


def raw_translate(out: Path, src_ids: list[list[int]]) -> list[list[int]]:
    """What a CTranslate2 user does with the export: the pieces of each source (no EOS: the
    model appends it) through ``translate_batch`` with ``export.json``'s options."""
    import ctranslate2

    options = ct2_export.read_info(out)["translate_batch"]
    pieces = [[PIECES[t] for t in ids if t != EOS_ID] for ids in src_ids]
    results = ctranslate2.Translator(str(out)).translate_batch(pieces, **options)
    return [[PIECES.index(p) for p in r.hypotheses[0]] for r in results]


@pytest.mark.parametrize(
    "decode",
    [
        DecodeConfig(beam_size=1, max_len_offset=64),
        DecodeConfig(beam_size=4, alpha=1.0, length_norm="fairseq", max_len_offset=64),
        DecodeConfig(
            beam_size=4, alpha=1.0, length_norm="fairseq", length_rule="fairseq", max_len_offset=64
        ),
    ],
    ids=["greedy", "beam-fairseq", "beam-fairseq-ends"],
)
def test_the_exports_options_decode_as_the_engine(tmp_path: Path, decode: DecodeConfig) -> None:
    """Raw CTranslate2 with ``export.json``'s ``translate_batch`` gives the engine's outputs
    where the settings map exactly (greedy; fairseq's penalty; every limit at max_len)."""
    model = tiny_model(seed=3)
    out = ct2_export.save_model(model, PIECES, tmp_path / "m", decode=decode)
    src_ids = sources(48)
    engine = ct2.CTranslate2Engine(out)
    assert raw_translate(out, src_ids) == engine.search(src_ids, decode)
    if decode.beam_size == 1:  # and greedy is ours too
        ours = best_tokens(model, padded(src_ids), beam_size=1, max_len_offset=64)
        assert raw_translate(out, src_ids) == ours


def test_fairseq_ends_never_let_ctranslate2_end_first() -> None:
    from serving.ct2_options import min_length, translate_batch_options

    pieces = [str(i) for i in range(8)]
    ends = DecodeConfig(length_rule="fairseq")
    config = tiny_model().config
    assert translate_batch_options(ends, config, pieces)["min_decoding_length"] == 1
    assert translate_batch_options(DecodeConfig(), config, pieces)["min_decoding_length"] == 0
    assert (min_length(ends), min_length(DecodeConfig(length_norm="fairseq"))) == (1, 0)


def test_the_exports_options_say_the_settings(tmp_path: Path) -> None:
    from transformer_core.search_settings import fitted_penalty_exponent

    decode = DecodeConfig(beam_size=5, alpha=1.3, max_len_offset=30, max_tokens_per_batch=999)
    out = ct2_export.save_model(tiny_model(), PIECES, tmp_path / "m", decode=decode)
    info = ct2_export.read_info(out)
    assert info["decoding"] == {
        "beam_size": 5,
        "alpha": 1.3,
        "length_norm": "gnmt",
        "max_len_offset": 30,
        "length_rule": "ours",
    }
    options = info["translate_batch"]
    assert options["beam_size"] == 5 and options["max_decoding_length"] == 64  # the model's max_len
    assert options["length_penalty"] == fitted_penalty_exponent(1.3)  # GNMT's, fitted
    assert options["suppress_sequences"] == [["<pad>"], ["<s>"]]
    assert options["min_decoding_length"] == 0
    assert (options["max_batch_size"], options["batch_type"]) == (999, "tokens")


def test_an_empty_source_translates_to_nothing(tmp_path: Path) -> None:
    out = ct2_export.save_model(tiny_model(seed=3), PIECES, tmp_path / "m")
    assert raw_translate(out, [[EOS_ID], [5, 6, EOS_ID]])[0] == []


def test_the_export_carries_the_tokenizer_files(tmp_path: Path) -> None:
    from serving.tokenizer import FILES

    folder = tmp_path / "tokenizer"
    folder.mkdir()
    for name in (*FILES, "notes.txt"):
        (folder / name).write_text(name)
    out = ct2_export.save_model(tiny_model(), PIECES, tmp_path / "m", tokenizer_dir=folder)
    assert ct2_export.read_info(out)["tokenizer_files"] == sorted(FILES)
    assert all((out / name).read_text() == name for name in FILES)
    assert not (out / "notes.txt").exists()


@pytest.mark.parametrize("quantization", ct2_export.QUANTIZATIONS)
def test_every_quantization_loads_and_translates(tmp_path: Path, quantization: str) -> None:
    out = ct2_export.save_model(tiny_model(seed=3), PIECES, tmp_path / "m", quantization)
    assert ct2_export.read_info(out)["quantization"] == quantization
    engine = ct2.CTranslate2Engine(out)  # "default": the stored type, or the nearest one here
    outputs = engine.search(sources(4), DecodeConfig(max_len_offset=2))
    assert len(outputs) == 4 and all(len(o) <= 15 for o in outputs)


def test_an_unknown_quantization_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^quantization: 'int4' is not one of float32, ") as err:
        ct2_export.save_model(tiny_model(), PIECES, tmp_path / "m", "int4")
    assert "\n" not in str(err.value)
    # Refused before anything is read or written.
    with pytest.raises(ConfigError, match="^quantization"):
        ct2_export.export_ctranslate2(tmp_path / "none.pt", tmp_path, tmp_path / "out", "fp8")
    assert list(tmp_path.iterdir()) == []


def test_a_compute_type_the_device_lacks_is_one_clear_error(tmp_path: Path) -> None:
    import ctranslate2

    if "float16" in ctranslate2.get_supported_compute_types("cpu"):
        pytest.skip("this CPU computes in float16")
    out = ct2_export.save_model(tiny_model(), PIECES, tmp_path / "m")
    with pytest.raises(ConfigError, match=r"^compute_type: 'float16' on cpu: ") as err:
        ct2.CTranslate2Engine(out, compute_type="float16")
    assert "\n" not in str(err.value)


def test_different_key_and_value_widths_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ServingError, match="d_k=8 differs from d_v=16"):
        ct2_export.save_model(tiny_model(d_k=8), PIECES, tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_a_vocabulary_of_another_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ServingError, match="source vocabulary has 40 ids but the tokenizer 39"):
        ct2_export.save_model(tiny_model(), PIECES[:-1], tmp_path / "m")


def test_saving_again_replaces_the_folder_through_a_temporary_sibling(tmp_path: Path) -> None:
    import subprocess

    finished = subprocess.Popen(["true"])
    finished.wait()
    (tmp_path / f".m.tmp-{finished.pid}-0badc0de").mkdir()  # what a killed export leaves
    out = ct2_export.save_model(tiny_model(seed=1), PIECES, tmp_path / "m", identity={"run": 1})
    ct2_export.save_model(tiny_model(seed=2), PIECES, out, identity={"run": 2})
    assert ct2_export.read_info(out)["run"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temporary folder left
    assert {p.name for p in out.iterdir()} >= {"model.bin", "config.json", "export.json"}


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"engine": "onnx"}, "engine"),
        ({"engine": "ctranslate2", "compute_type": "int4"}, "compute_type"),
        ({"threads": -1}, "threads"),
        ({"threads": 1.5}, "threads"),
        ({"compute_type": "int8"}, "compute_type"),  # torch has dtype instead
        ({"engine": "ctranslate2", "dtype": "bfloat16"}, "dtype"),  # and ctranslate2 compute_type
    ],
)
def test_decode_config_names_the_bad_field(fields: dict, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        DecodeConfig(**fields)
    assert err.value.key == key


def test_decode_config_defaults_to_torch_and_reads_the_new_fields() -> None:
    default = DecodeConfig()
    assert (default.engine, default.compute_type, default.threads) == ("torch", "default", 0)
    stored = {"engine": "ctranslate2", "compute_type": "int8", "threads": 2, "unknown": 1}
    loaded = DecodeConfig.from_dict(stored)
    assert (loaded.engine, loaded.compute_type, loaded.threads) == ("ctranslate2", "int8", 2)
