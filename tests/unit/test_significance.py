"""benchmarks/significance.py: the score stage's bleu_tok_lc, and sacreBLEU's paired test on it."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from evaluation.bleu import score_texts

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import significance  # noqa: E402

WORDS = "ein mann eine frau kind hund läuft sitzt auf dem gras vor einer roten wand im park".split()


def _refs(n: int = 60) -> list[str]:
    rng = random.Random(7)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 12))) + "." for _ in range(n)]


def _drop_one(lines: list[str], seed: int) -> list[str]:
    """Each line with one word, drawn at random, left out: outputs of one quality."""
    rng = random.Random(seed)
    out = []
    for line in lines:
        words = line.split()
        del words[rng.randrange(len(words))]
        out.append(" ".join(words))
    return out


def _run(root: Path, name: str, hyps: list[str], refs: list[str]) -> Path:
    workdir = root / name
    (workdir / "translate").mkdir(parents=True)
    (workdir / "download").mkdir()
    (workdir / "translate" / "hyp.de").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    (workdir / "download" / "test.de").write_text("\n".join(refs) + "\n", encoding="utf-8")
    return workdir


def test_scores_are_the_score_stages_and_only_a_real_difference_is_significant(tmp_path):
    refs = _refs()
    good, close = _drop_one(refs, seed=1), _drop_one(refs, seed=2)
    worse = [" ".join(line.split()[::2]) for line in refs]
    rows = significance.compare(
        [
            _run(tmp_path, "a", good, refs),
            _run(tmp_path, "close", close, refs),
            _run(tmp_path, "worse", worse, refs),
        ],
        trials=500,
        bootstrap=200,
    )
    assert [row["bleu_tok_lc"] for row in rows] == [
        round(score_texts(h, refs, "de")["bleu_tok_lc"], 2) for h in (good, close, worse)
    ]
    base, close_row, other = rows
    assert base["p_ar_vs_first"] is None
    assert close_row["p_ar_vs_first"] > 0.2 and close_row["bleu_tok_lc"] != base["bleu_tok_lc"]
    assert other["p_ar_vs_first"] < 0.01 and other["bleu_tok_lc"] < base["bleu_tok_lc"] - 20
    assert 0 < base["ci95_half"] < 20
    assert base["lines_as_first"] == 60 and other["lines_as_first"] == 0
    assert other["length_ratio"] < base["length_ratio"] < 1


def test_a_run_against_itself_is_no_difference(tmp_path):
    refs = _refs()
    hyps = _drop_one(refs, seed=1)
    rows = significance.compare(
        [_run(tmp_path, "a", hyps, refs), _run(tmp_path, "again", hyps, refs)], trials=100
    )
    assert rows[1]["p_ar_vs_first"] == 1.0 and rows[1]["lines_as_first"] == 60


def test_runs_with_other_references_are_refused_in_one_line(tmp_path):
    refs = _refs()
    other_refs = [line.upper() for line in refs]
    first = _run(tmp_path, "a", refs, refs)
    second = _run(tmp_path, "b", refs, other_refs)
    with pytest.raises(SystemExit) as exc:
        significance.compare([first, second], trials=10)
    assert str(exc.value) == (
        f"significance: {second / 'download'} holds other references than "
        f"{first / 'download'}; the runs must share a test set"
    )


def test_an_unfinished_run_is_named(tmp_path):
    refs = _refs()
    first = _run(tmp_path, "a", refs, refs)
    (tmp_path / "b" / "translate").mkdir(parents=True)
    with pytest.raises(SystemExit, match=r"b/translate holds 0 hyp.<lang> files"):
        significance.compare([first, tmp_path / "b"], trials=10)


@pytest.mark.parametrize("test", ["ar", "bs"])
def test_one_run_alone_gets_its_figure_and_interval(tmp_path, test):
    refs = _refs()
    hyps, other = _drop_one(refs, seed=1), _drop_one(refs, seed=2)
    alone = significance.compare([_run(tmp_path, "a", hyps, refs)], test=test, trials=100)
    paired = significance.compare(
        [tmp_path / "a", _run(tmp_path, "b", other, refs)], test=test, trials=100
    )
    assert alone == paired[:1]
    assert alone[0]["bleu_tok_lc"] == round(score_texts(hyps, refs, "de")["bleu_tok_lc"], 2)
    assert alone[0][f"p_{test}_vs_first"] is None and 0 < alone[0]["ci95_half"] < 20


def test_the_spread_of_seeds_places_a_published_figure():
    line = significance.spread([40.0, 41.0, 42.0], reference=43.5)
    assert line == (
        "bleu_tok_lc over 3 runs: mean 41.00, standard deviation 1.00; "
        "the reference 43.5 is 2.50 of them above"
    )
    assert significance.spread([40.0, 42.0]).endswith("mean 41.00, standard deviation 1.41")
    assert significance.spread([40.0, 40.0], reference=39.0).endswith("is -1.00 from it")
    with pytest.raises(ValueError, match="two or more runs"):
        significance.spread([40.0], reference=41.0)
