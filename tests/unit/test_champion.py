"""evaluation.champion: which version takes the champion alias, by evidence or by one figure."""

from __future__ import annotations

import random
from pathlib import Path

from evaluation.bleu import score_texts
from evaluation.champion import Rule, against_parent, choose, row_tags
from evaluation.evidence import SetOutputs, digest, read_evidence, write_evidence

WORDS = "the a cat dog house tree red big old new sees walks to on in".split()
SIGNATURE = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.5.1"


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))) for _ in range(n)]


def damaged(texts: list[str], share: float, seed: int) -> list[str]:
    """``texts`` with a word dropped from each of a ``share`` of them."""
    rng = random.Random(seed)
    return [" ".join(t.split()[1:]) if rng.random() < share else t for t in texts]


PRIMARY, OTHER = sentences(80, seed=0), sentences(80, seed=1)
RULE = Rule("bleu_sacre", "evidence", 0.05, "test2016")


def scores(hyps: list[str]) -> dict:
    """A scores.json of the primary set (its protocol and its figure)."""
    return {**score_texts(hyps, PRIMARY, "en"), "test_set": "test2016", "signature": SIGNATURE}


def stored(tmp: Path, primary: list[str], other: list[str] | None = None) -> dict:
    """The champion's evidence as register keeps it and reads it back."""
    sets = [SetOutputs("test2016", PRIMARY, primary)]
    if other is not None:
        sets.append(SetOutputs("mscoco", OTHER, other))
    return read_evidence(write_evidence(tmp / "evidence", sets))


def decide(tmp: Path, cand: tuple[list, list], champ: tuple[list, list], **options):
    candidate = [SetOutputs("test2016", PRIMARY, cand[0]), SetOutputs("mscoco", OTHER, cand[1])]
    return choose(
        options.pop("rule", RULE),
        scores(cand[0]),
        {k: str(v) for k, v in scores(champ[0]).items()},
        candidate,
        options.pop("stored", stored(tmp, *champ)),
        "en",
        **options,
    )


def test_a_clearly_better_candidate_no_worse_elsewhere_is_promoted_with_its_evidence(tmp_path):
    champion = (damaged(PRIMARY, 0.8, seed=2), damaged(OTHER, 0.3, seed=3))
    decision = decide(tmp_path, (damaged(PRIMARY, 0.1, seed=4), champion[1]), champion)
    assert decision.take
    assert decision.reason.startswith("bleu_sacre on test2016 +")
    assert "better with p < 0.05; not significantly worse on mscoco" in decision.reason
    first, other = decision.sets
    assert first["set"] == "test2016" and first["p_value"] < 0.05 and first["low"] > 0
    assert other["set"] == "mscoco" and other["difference"] == 0 and other["p_value"] == 1.0
    tags = decision.tags("3")
    assert tags["evidence.against"] == "3" and tags["champion_decision"] == decision.reason
    assert float(tags["evidence.test2016.p_value"]) == round(first["p_value"], 4)
    assert len(decision.lines()) == 2 and decision.lines()[1].startswith("mscoco: bleu_sacre")


def test_better_on_the_primary_set_but_worse_on_another_is_not_promoted(tmp_path):
    champion = (damaged(PRIMARY, 0.8, seed=2), damaged(OTHER, 0.1, seed=3))
    candidate = (damaged(PRIMARY, 0.1, seed=4), damaged(OTHER, 0.9, seed=5))
    decision = decide(tmp_path, candidate, champion)
    assert not decision.take
    assert "but significantly worse on mscoco -" in decision.reason
    assert decision.reason.endswith("champion kept")


def test_a_difference_within_the_noise_keeps_the_champion_though_its_figure_is_higher(tmp_path):
    base = damaged(PRIMARY, 0.4, seed=2)
    i = next(i for i, (b, r) in enumerate(zip(base, PRIMARY, strict=True)) if b != r)
    better_by_one = [*base[:i], PRIMARY[i], *base[i + 1 :]]  # one sentence mended
    champion, candidate = (base, OTHER), (better_by_one, OTHER)
    assert scores(candidate[0])["bleu_sacre"] > scores(champion[0])["bleu_sacre"]
    decision = decide(tmp_path, candidate, champion)
    assert not decision.take and "not better with p < 0.05 (register.max_p)" in decision.reason
    # The old rule, one figure against another, takes it.
    higher = decide(tmp_path, candidate, champion, rule=Rule("bleu_sacre", "higher"))
    assert higher.take and higher.sets == [] and "beats the champion's" in higher.reason


def test_only_sets_with_the_same_references_are_compared(tmp_path):
    champion = (damaged(PRIMARY, 0.8, seed=2), None)  # the champion was never judged on mscoco
    decision = decide(tmp_path, (damaged(PRIMARY, 0.1, seed=4), OTHER), champion)
    assert decision.take and [r["set"] for r in decision.sets] == ["test2016"]
    assert "(not compared, the champion has no hypotheses on: mscoco)" in decision.reason
    # Other references under the primary set's name: nothing to compare by.
    moved = read_evidence(
        write_evidence(tmp_path / "moved", [SetOutputs("test2016", OTHER, OTHER)])
    )
    fallback = decide(tmp_path, (damaged(PRIMARY, 0.1, seed=4), OTHER), champion, stored=moved)
    assert (
        fallback.sets == [] and "hypotheses on test2016 are of other references" in fallback.reason
    )
    # A candidate without hypotheses (a score folder from before they were read) says so.
    bare = choose(
        RULE, scores(OTHER), {k: str(v) for k, v in scores(PRIMARY).items()}, [], moved, "en"
    )
    assert bare.reason.endswith(
        "(by the higher figure: this version has no hypotheses on test2016)"
    )


def test_a_champion_without_hypotheses_is_judged_by_the_figure_and_its_weights_take_them(
    tmp_path,
):
    same = (damaged(PRIMARY, 0.5, seed=2), OTHER)
    kept = decide(tmp_path, same, same, stored=None)
    assert not kept.take
    assert kept.reason.endswith(
        "(by the higher figure: the champion kept no hypotheses on test2016)"
    )
    again = decide(tmp_path, same, same, stored=None, same_weights=True)
    assert again.take and again.reason.startswith("the champion's own weights, registered again")
    # The same weights under the evidence rule with hypotheses kept: nothing to gain.
    assert not decide(tmp_path, same, same, same_weights=True).take


def test_evidence_a_file_does_not_match_is_left_out(tmp_path):
    folder = write_evidence(tmp_path / "e", [SetOutputs("a b/c", ["x", "y"], ["x", "z"])])
    assert read_evidence(folder) == {"a b/c": (digest(["x", "y"]), ["x", "z"])}
    (folder / "a_b_c.hyp").write_text("x\n", encoding="utf-8")  # a line short
    assert read_evidence(folder) == {}


def test_a_child_is_compared_with_its_parent_on_the_parents_references_whatever_their_name(
    tmp_path,
):
    """Fine-tuned: better on the new domain's set, worse on the parent's own set (named
    otherwise by the child), and a set the parent never saw is not compared."""
    news = sentences(80, seed=7)
    parent = read_evidence(
        write_evidence(
            tmp_path / "parent",
            [
                SetOutputs("test2016", PRIMARY, PRIMARY),
                SetOutputs("news", news, damaged(news, 0.9, 8)),
            ],
        )
    )
    child = {
        "newstest": SetOutputs("newstest", news, damaged(news, 0.1, seed=9)),
        "captions": SetOutputs("captions", PRIMARY, damaged(PRIMARY, 0.9, seed=10)),
        "unseen": SetOutputs("unseen", OTHER, OTHER),
    }
    rows = {r["set"]: r for r in against_parent("bleu_sacre", child, parent, "en")}
    assert sorted(rows) == ["captions", "newstest"]
    assert rows["newstest"]["difference"] > 0 and rows["newstest"]["p_value"] < 0.05
    assert rows["captions"]["difference"] < 0 and rows["captions"]["p_value"] < 0.05
    tags = row_tags("parent.evidence", list(rows.values()))
    assert float(tags["parent.evidence.captions.difference"]) < 0
