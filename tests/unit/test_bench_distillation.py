"""benchmarks/distillation.py's table: every model decoded in every search its pair's configs
name, each speed read against the teacher's at the same search."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import distillation as bench  # noqa: E402

from serving.decode_config import DecodeConfig  # noqa: E402

REFS = ["ein Hund läuft .", "eine Frau liest ein Buch ."]
WRONG = ["eine Katze .", "ein Mann ."]


def _info(decoding: DecodeConfig, label: str, bleu: float) -> dict:
    return {
        "config": SimpleNamespace(decoding=decoding),
        "layers": "2+2",
        "parameters": 1000,
        "decoding": label,
        "bleu_sacre": bleu,
        "stage_minutes": 3.0,
    }


def _timing(seconds: dict[tuple[str, str], float]) -> dict:
    """Each (role, search) took these seconds a pass in both engines; the student's greedy
    output is the reference, every other output wrong."""
    keys = [(run, engine) for run in seconds for engine in bench.ENGINES]
    return {
        "seconds": {(run, e): [seconds[run], 99.0, seconds[run]] for run, e in keys},
        "outputs": {(run, e): REFS if run == ("student", "greedy") else WRONG for run, e in keys},
    }


def test_the_searches_are_the_teachers_first_each_once():
    infos = {
        "teacher": _info(DecodeConfig(beam_size=4, alpha=0.6), "beam 4, alpha 0.6", 90.0),
        "student": _info(DecodeConfig(beam_size=1), "greedy", 88.0),
        "baseline": _info(DecodeConfig(beam_size=1), "greedy", 85.0),
    }

    found = bench.searches(infos)

    assert list(found) == ["beam 4, alpha 0.6", "greedy"]
    assert (found["beam 4, alpha 0.6"]["beam_size"], found["greedy"]["beam_size"]) == (4, 1)


def test_each_speed_is_read_against_the_teachers_at_the_same_search():
    infos = {
        "teacher": _info(DecodeConfig(beam_size=4), "beam 4, alpha 0.6", 90.0),
        "student": _info(DecodeConfig(beam_size=1), "greedy", 88.0),
    }
    flows = [SimpleNamespace(role="teacher"), SimpleNamespace(role="student")]
    timing = _timing(  # the median of each run's three passes is its first
        {
            ("teacher", "beam 4, alpha 0.6"): 4.0,
            ("student", "beam 4, alpha 0.6"): 2.0,
            ("teacher", "greedy"): 1.0,
            ("student", "greedy"): 0.5,
        }
    )
    runs = {"student": {"wall_minutes": 7.0, "fresh": True}}

    table = bench.rows(flows, infos, runs, timing, REFS, "de")

    by = {(row["search"], row["model"]): row for row in table}
    assert [(row["search"], row["model"]) for row in table] == [
        ("beam 4, alpha 0.6", "teacher"),
        ("beam 4, alpha 0.6", "student"),
        ("greedy", "teacher"),
        ("greedy", "student"),
    ]
    assert by["greedy", "student"]["sent/s torch"] == 4.0  # 2 sentences in 0.5 s
    assert by["greedy", "student"]["x teacher torch"] == 2.0  # not 8.0, against beam 4
    assert by["beam 4, alpha 0.6", "student"]["x teacher CT2 int8"] == 2.0
    assert by["greedy", "teacher"]["x teacher torch"] == 1.0
    assert by["greedy", "student"]["sacreBLEU, torch"] == pytest.approx(100.0)
    assert by["greedy", "teacher"]["sacreBLEU, CT2 int8"] < 10.0
    # the score stage's BLEU and the flow's minutes belong to each model's own search
    own = bench.own_rows(table)
    assert (own["teacher"]["search"], own["student"]["search"]) == ("beam 4, alpha 0.6", "greedy")
    assert by["beam 4, alpha 0.6", "student"]["test sacreBLEU"] is None
    assert own["student"]["flow minutes"] == 7.0
    assert by["beam 4, alpha 0.6", "student"]["flow minutes"] is None
