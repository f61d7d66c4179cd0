"""The synthetic grammar corpus: deterministic, sized, distinct splits, real agreement and
reordering."""

from __future__ import annotations

import random

from corpora import synthetic, synthetic_grammar, synthetic_lexicon


def config(seed: int = 5, train: int = 300, dev: int = 40, test: int = 40) -> dict:
    return {"pair": "en-de", "seed": seed, "train": train, "dev": dev, "test": test}


def read(folder, name):
    return (folder / name).read_text(encoding="utf-8").splitlines()


def test_same_seed_same_corpus_and_sizes(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    stats = synthetic.write_corpus(a, **config())
    synthetic.write_corpus(b, **config())
    synthetic.write_corpus(c, **config(seed=6))
    assert stats == {"corpus": "synthetic", "train": 300, "dev": 40, "test": 40}
    names = ["train/synthetic.en", "train/synthetic.de", "dev.en", "dev.de", "test.en", "test.de"]
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert read(a, "train/synthetic.en") != read(c, "train/synthetic.en")
    for name, n in zip(names, (300, 300, 40, 40, 40, 40), strict=True):
        assert len(read(a, name)) == n
    for line in read(a, "train/synthetic.en") + read(a, "train/synthetic.de"):
        assert synthetic.MIN_WORDS <= len(line.split()) <= synthetic.MAX_WORDS


def test_dev_and_test_share_nothing_with_train(tmp_path):
    synthetic.write_corpus(tmp_path, **config(train=2000, dev=200, test=200))
    train = set(read(tmp_path, "train/synthetic.en")) | set(read(tmp_path, "train/synthetic.de"))
    dev = set(read(tmp_path, "dev.en")) | set(read(tmp_path, "dev.de"))
    test = set(read(tmp_path, "test.en")) | set(read(tmp_path, "test.de"))
    assert not train & test and not train & dev and not dev & test
    assert len(set(read(tmp_path, "test.en"))) == 200


def grammar(seed: int = 0) -> synthetic.Grammar:
    return synthetic.Grammar(random.Random(seed))


def noun(g: synthetic.Grammar, en: str) -> synthetic_lexicon.Noun:
    return next(n for n in g.nouns if n.en == en)


def test_article_and_adjective_agree_with_gender_number_case():
    g = grammar()
    adj = next(a for a in g.adjectives if a[0] == "big")
    man, woman, child = noun(g, "man"), noun(g, "woman"), noun(g, "child")
    assert g._decline(man, "the", False, adj, "nom").de == "der große Mann"
    assert g._decline(man, "the", False, adj, "acc").de == "den großen Mann"
    assert g._decline(man, "a", False, adj, "nom").de == "ein großer Mann"
    assert g._decline(man, "a", False, adj, "acc").de == "einen großen Mann"
    assert g._decline(woman, "a", False, adj, "dat").de == "einer großen Frau"
    assert g._decline(child, "a", False, adj, "nom").de == "ein großes Kind"
    assert g._decline(child, "the", True, adj, "dat").de == "den großen Kindern"
    assert g._decline(child, "the", True, None, "dat").en == "the children"
    apple = noun(g, "apple")
    old = next(a for a in g.adjectives if a[0] == "old")
    assert g._decline(apple, "a", False, old, "acc").en == "an old apple"
    dark = next(a for a in g.adjectives if a[0] == "dark")
    assert g._decline(noun(g, "room"), "this", False, dark, "nom").de == "dieses dunkle Zimmer"


def sample(n: int = 3000) -> list[tuple[str, str]]:
    return synthetic.generate_pairs(n, "unit")


def test_verb_second_verb_final_and_sentence_bracket():
    pairs = sample()
    # subordinate clauses end with the finite verb: "..., dass ... hat." / "..., weil ... ist."
    dass = [de for _, de in pairs if ", dass " in de]
    finite = synthetic_finite_forms()
    assert dass and all(de.split()[-1].rstrip(".?") in finite for de in dass)
    # perfect: English "has <participle>" keeps verbs together; German puts the participle last
    perfect = [
        (en, de)
        for en, de in pairs
        if " has seen " in en
        and "dass" not in de
        and "weil" not in de
        and not de.startswith("Wenn")
    ]
    assert perfect and all(de.rstrip(".?").endswith("gesehen") for _, de in perfect)
    # fronted time adverb: German inverts subject and verb
    gestern = [de for en, de in pairs if en.startswith("Yesterday ")]
    assert gestern and all(
        de.startswith("Gestern ")
        and de.split()[1] in ("hat", "haben", "habe", "hast", "ist", "sind", "bin", "bist")
        for de in gestern
    )
    # separable verbs: the prefix goes to the end of a main clause
    calls = [de for en, de in pairs if en.split()[1:2] == ["calls"] and "," not in de]
    assert calls and all(" ruft " in de and de.rstrip(".?").endswith(" an") for de in calls)


def synthetic_finite_forms() -> set[str]:
    g = grammar()
    forms = {f for v in g.verbs for f in v.forms.values()}
    forms |= {v.prefix + f for v in g.verbs for f in v.forms.values()}
    forms |= (
        set(synthetic_lexicon.HABEN.values())
        | set(synthetic_lexicon.SEIN.values())
        | set(synthetic_lexicon.WERDEN.values())
    )
    return forms


def test_subordinate_clause_is_verb_final_on_a_fixed_construction():
    g = grammar()
    p = g.clause(tense="perfect", adverb=False)
    en, de = g.subordinate_clause(p)
    assert de[-1] in synthetic_finite_forms()
    main_en, main_de = g.main_clause(g.clause(tense="present", adverb=False))
    assert main_de[1] in synthetic_finite_forms()  # verb second


def test_contractions():
    assert synthetic_grammar._contract(["in", "dem", "Garten"]) == ["im", "Garten"]
    assert synthetic_grammar._contract(["von dem", "Mann"]) == ["vom", "Mann"]
    assert synthetic_grammar._contract(["mit", "dem", "Mann"]) == ["mit", "dem", "Mann"]


def words_of(nouns) -> set[str]:
    return {w for n in nouns for w in (n.de, n.de_pl)}


def test_a_domain_fills_most_noun_slots_with_its_own_words_and_the_general_corpus_none(tmp_path):
    office = words_of(synthetic_lexicon.parse_nouns(synthetic_lexicon.OFFICE_NOUNS))
    general_words = words_of(synthetic_lexicon.parse_nouns())
    assert not office & general_words  # a domain's words are new to a general model
    general, shifted = tmp_path / "general", tmp_path / "office"
    synthetic.write_corpus(general, **config(train=1000))
    synthetic.write_corpus(shifted, **config(train=1000), domain="office")

    def share(folder) -> float:
        lines = read(folder, "train/synthetic.de")
        return sum(any(w.strip(",.?") in office for w in s.split()) for s in lines) / len(lines)

    assert share(general) == 0
    assert share(shifted) > 0.6
    # not the general corpus with words swapped: another draw of the grammar
    assert len(set(read(general, "test.en")) & set(read(shifted, "test.en"))) < 5


def test_a_domain_noun_declines_as_any_other():
    g = synthetic.Grammar(random.Random(0), "office")
    adj = next(a for a in g.adjectives if a[0] == "big")
    invoice = next(n for n in g.domain_nouns if n.en == "invoice")
    printer = next(n for n in g.domain_nouns if n.en == "printer")
    assert g._decline(invoice, "a", False, adj, "acc").de == "eine große Rechnung"
    assert g._decline(printer, "the", True, adj, "dat").de == "den großen Druckern"
    assert g._decline(invoice, "a", False, None, "nom").en == "an invoice"
