"""What a translation request may hold and ask (serving.scoring_protocol): each bad request is
refused with its status and a message naming the limit, the param or the input; good ones give
the decoding they ask for."""

from __future__ import annotations

import pytest

from serving.decode_config import DecodeConfig
from serving.scoring_protocol import (
    Decoding,
    RequestError,
    RequestLimits,
    check_params,
    check_pieces,
    check_texts,
    piece_limit,
    texts_and_params,
)
from serving.serve_config import Autoscaling, ServeConfig
from transformer_core.config_checks import ConfigError

LIMITS = RequestLimits(max_sentences=3, max_chars=20, max_beam=8)
DECODE = DecodeConfig(beam_size=5, alpha=1.3)


def refused(call, *args) -> RequestError:
    with pytest.raises(RequestError) as caught:
        call(*args)
    return caught.value


@pytest.mark.parametrize(
    "body, texts, params",
    [
        ({"inputs": ["a", "b"]}, ["a", "b"], {}),
        ({"instances": ["a"], "params": {"beam_size": 2}}, ["a"], {"beam_size": 2}),
        ({"dataframe_split": {"columns": ["text"], "data": [["a"], ["b"]]}}, ["a", "b"], {}),
        ({"dataframe_records": [{"text": "a"}, {"text": "b"}]}, ["a", "b"], {}),
        ({"inputs": [], "params": None}, [], {}),
    ],
)
def test_mlflow_shapes_give_texts_and_params(body, texts, params):
    assert texts_and_params(body) == (texts, params)


@pytest.mark.parametrize(
    "body, words",
    [
        (["a"], "JSON object"),
        ({"inputs": "a"}, "inputs must be a list"),
        ({"inputs": ["a"], "instances": ["b"]}, "one of inputs"),
        ({}, "one of inputs"),
        ({"inputs": ["a"], "extra": 1}, "unknown field 'extra'"),
        ({"inputs": ["a"], "params": [1]}, "params must be a JSON object"),
        ({"dataframe_split": {"columns": ["a", "b"], "data": [["x", "y"]]}}, "one column"),
        ({"dataframe_records": [{"a": 1, "b": 2}]}, "one field each"),
    ],
)
def test_malformed_bodies_are_refused_with_400(body, words):
    error = refused(texts_and_params, body)
    assert error.status == 400 and words in str(error)


def test_texts_are_strings_within_the_limits():
    assert check_texts(["a man", ""], LIMITS) == ["a man", ""]
    error = refused(check_texts, ["a", "b", "c", "d"], LIMITS)
    assert error.status == 413 and "4 texts" in str(error)
    assert "serve.limits.max_sentences" in str(error) and "limit is 3" in str(error)
    error = refused(check_texts, ["ok", "x" * 21], LIMITS)
    assert error.status == 413 and str(error).startswith("input 1 has 21 characters")
    for value, kind in ((None, "null"), (42, "a number"), (["a"], "a list"), (True, "a boolean")):
        error = refused(check_texts, ["ok", value], LIMITS)
        assert error.status == 400 and str(error) == f"input 1 is {kind}, not a string"


def test_params_change_the_decoding_within_the_limits():
    assert check_params({}, DECODE, LIMITS) == Decoding(DECODE, 1)
    found = check_params({"beam_size": 8, "alpha": 0, "n_best": 3}, DECODE, LIMITS)
    assert found.decode.beam_size == 8 and found.decode.alpha == 0.0 and found.n_best == 3
    assert found.decode.max_len_offset == DECODE.max_len_offset  # the rest is the version's
    # A null param keeps the version's value; MLflow's filled-in defaults pass, even a beam
    # above the limit when it is the version's own.
    assert check_params({"beam_size": None}, DECODE, LIMITS).decode == DECODE
    wide = DecodeConfig(beam_size=21)
    assert check_params({"beam_size": 21, "n_best": 1}, wide, LIMITS).decode == wide


@pytest.mark.parametrize(
    "params, words",
    [
        ({"beam_size": 10000}, "beam_size 10000 must be within 1..8 (serve.limits.max_beam)"),
        ({"beam_size": 0}, "beam_size 0 must be within 1..8"),
        ({"n_best": 6}, "n_best 6 must be within 1..5"),
        ({"n_best": 0}, "n_best 0 must be within 1..5"),
        ({"beam": 4, "temperature": 1}, "unknown param 'beam', 'temperature'"),
        ({"beam_size": "4"}, "param beam_size must be an integer, not str"),
        ({"beam_size": 4.0}, "param beam_size must be an integer, not a number"),
        ({"beam_size": True}, "param beam_size must be an integer, not a boolean"),
        ({"alpha": -1}, "alpha -1.0 must be >= 0"),
        ({"length_norm": "x"}, "length_norm 'x' is not one of 'gnmt', 'fairseq'"),
        ({"max_len_offset": -3}, "max_len_offset -3 must be >= 0"),
    ],
)
def test_bad_params_are_refused_with_400(params, words):
    error = refused(check_params, params, DECODE, LIMITS)
    assert error.status == 400 and words in str(error)


def test_pieces_are_refused_over_the_limit_never_cut():
    assert piece_limit(RequestLimits(), max_len=256) == 255
    assert piece_limit(RequestLimits(max_pieces=100), max_len=256) == 100
    with pytest.raises(ConfigError, match="max_pieces: 300 is more than the model's 256"):
        piece_limit(RequestLimits(max_pieces=300), max_len=256)
    check_pieces([[5, 6, 3], [7, 3]], limit=2)  # pieces + EOS
    error = refused(check_pieces, [[5, 3], [5, 6, 7, 3]], 2)
    assert error.status == 413 and str(error).startswith("input 1 is 3 subword pieces")


def test_limits_and_serve_settings_are_checked_where_they_are_made():
    with pytest.raises(ConfigError, match="max_beam"):
        RequestLimits(max_beam=0)
    with pytest.raises(ConfigError, match="token_file"):
        ServeConfig(token_env="A", token_file="b")
    with pytest.raises(ConfigError, match="replicas"):
        ServeConfig(replicas=2, autoscaling=Autoscaling(max_replicas=3))
    assert RequestLimits.from_dict({"max_beam": 4, "later_field": 1}).max_beam == 4
    assert ServeConfig(cpus_per_replica=1.5).engine_threads == 2
    assert ServeConfig(cpus_per_replica=0.5).engine_threads == 1
    assert ServeConfig(threads=3).engine_threads == 3
