"""One decoding-settings type: the search's settings, a translator's decode config and the parsing
section are all ``BeamSettings``, checked by one ``__post_init__`` and named in one line."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import yaml

from serving.decode_config import DecodeConfig
from tasks.framework.config import ParsingConfig, load_config
from training.config import TrainConfig
from transformer_core import ConfigError
from transformer_core.config import ModelConfig
from transformer_core.search_settings import (
    BeamSettings,
    SearchSettings,
    beam_fields,
    fitted_penalty_exponent,
    length_penalty,
    penalty_exponent,
)

KINDS = (BeamSettings, SearchSettings, DecodeConfig, ParsingConfig)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"beam_size": 0}, "beam_size: 0 must be >= 1"),
        ({"alpha": -0.5}, "alpha: -0.5 must be >= 0"),
        ({"max_len_offset": -1}, "max_len_offset: -1 must be >= 0"),
        ({"length_norm": "t2t"}, "length_norm: 't2t' is not one of 'gnmt', 'fairseq'"),
    ],
)
def test_every_kind_refuses_a_bad_setting_with_the_same_line(kind, fields, message) -> None:
    with pytest.raises(ConfigError) as err:
        kind(**fields)
    assert str(err.value).startswith(message)
    assert err.value.key == next(iter(fields))


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("decode", "beam_size", 0, "decode.beam_size: 0 must be >= 1"),
        ("parsing", "beam_size", 0, "parsing.beam_size: 0 must be >= 1"),
        ("parsing", "max_len_offset", -3, "parsing.max_len_offset: -3 must be >= 0"),
        ("parsing", "length_norm", "t2t", "parsing.length_norm: 't2t' is not one of 'gnmt', "),
        ("decode", "engine", "onnx", "decode.engine: 'onnx' is not one of 'torch', 'ctranslate2'"),
    ],
)
def test_a_config_file_names_the_key_of_a_bad_setting(tmp_path: Path, section, key, value, message):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"name": "x", section: {key: value}}))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_an_optional_enumeration_also_takes_null() -> None:
    assert DecodeConfig(tree_constraint=None).tree_constraint is None
    with pytest.raises(ConfigError, match="^tree_constraint: 'xx' is not one of 't2t', .* or null"):
        DecodeConfig(tree_constraint="xx")


def test_the_rules_between_fields_stay_with_their_kind() -> None:
    with pytest.raises(ConfigError, match="^n_best: 5 must be in"):
        SearchSettings(beam_size=4, n_best=5)
    with pytest.raises(ConfigError, match="^greedy: "):
        SearchSettings(beam_size=2, greedy=True)
    with pytest.raises(ConfigError, match="^tree_constraint: needs engine torch"):
        DecodeConfig(tree_constraint="t2t", engine="ctranslate2")


def test_the_shared_fields_travel_between_kinds() -> None:
    decode = DecodeConfig(beam_size=5, alpha=1.3, length_norm="fairseq", max_len_offset=7)
    search = SearchSettings(**beam_fields(decode), n_best=2)
    assert beam_fields(search) == beam_fields(decode) and search.n_best == 2
    assert set(beam_fields(decode)) == {f.name for f in dataclasses.fields(BeamSettings)}


def test_the_parsing_section_keeps_the_papers_parsing_defaults() -> None:
    parsing = ParsingConfig()
    assert (parsing.beam_size, parsing.alpha, parsing.max_len_offset) == (21, 0.3, 300)


def test_penalty_exponents_rank_as_our_penalty() -> None:
    # fairseq's penalty is a power of the length: exactly.
    assert penalty_exponent(1.3, "fairseq", 20) == fitted_penalty_exponent(1.3, "fairseq") == 1.3
    # GNMT's: the slope of log lp against log |Y| at the length, by a finite difference.
    length, h = 20, 1e-4
    ratio = length_penalty(length * (1 + h), 0.6) / length_penalty(length, 0.6)
    assert penalty_exponent(0.6, "gnmt", length) == pytest.approx(
        math.log(ratio) / math.log(1 + h), rel=1e-3
    )
    # The fit over 1..100 lies between the slopes at its ends and scales with alpha.
    fitted = fitted_penalty_exponent(0.6)
    assert penalty_exponent(0.6, "gnmt", 1) < fitted < penalty_exponent(0.6, "gnmt", 100)
    assert fitted_penalty_exponent(1.2) == pytest.approx(2 * fitted, abs=1e-4)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: TrainConfig(batching="xx"), "batching: 'xx' is not one of 'fill', 'fairseq'"),
        (lambda: ModelConfig(init="xavier"), "init: 'xavier' is not one of 'torch', 'fairseq'"),
    ],
)
def test_a_literal_field_made_in_code_is_checked_as_a_files(make, message) -> None:
    """One check of a ``Literal`` (``check_choices``) for every config, in the loader's words."""
    with pytest.raises(ConfigError, match=f"^{message}$"):
        make()
