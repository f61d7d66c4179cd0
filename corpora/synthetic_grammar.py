"""The synthetic corpus's grammar: English-German sentence pairs from a small bilingual lexicon
(``corpora.synthetic_lexicon``), all randomness from the ``random.Random`` it is given.

German articles and adjective endings agree with the noun's gender, number and case; the finite
verb goes second in main clauses (also after a fronted adverb or subordinate clause), last in
``dass`` / ``weil`` / ``wenn`` clauses; participles, infinitives after ``werden`` and separable
prefixes go to the end; English simple past becomes the German perfect with ``haben`` or
``sein``. With a domain (``corpora.synthetic.DOMAINS``), that domain's nouns fill most noun slots.
"""

from __future__ import annotations

import random
from typing import Any

from corpora import synthetic_lexicon as lex

__all__ = ["DOMAIN_SHARE", "Grammar"]

DOMAIN_SHARE = 0.6
"""How often a noun of a domain's corpus is one of the domain's (where one fits the slot)."""


def _en_third(person: str) -> bool:
    return person == "3sg"


def _dative_plural(noun: str) -> str:
    return noun if noun.endswith(("n", "s")) else noun + "n"


def _an(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


# ----------------------------------------------------------------------------- grammar


class Grammar:
    """Random sentence pairs from the lexicon; all randomness from the ``rng`` it is given."""

    def __init__(self, rng: random.Random, domain: str | None = None):
        self.rng = rng
        self.nouns = lex.parse_nouns()
        self.domain_nouns = lex.parse_nouns(lex.DOMAIN_NOUNS[domain]) if domain else ()
        self.adjectives = tuple(tuple(line.split()) for line in lex.ADJECTIVES.strip().splitlines())
        self.verbs = lex.parse_verbs()
        self.say_verbs = lex.parse_say_verbs()
        self.numbers = tuple(tuple(n.split()) for n in lex.NUMBERS)
        self._by_class: dict[str, tuple[lex.Noun, ...]] = {}
        self._domain_by_class: dict[str, tuple[lex.Noun, ...]] = {}

    # --- lexicon lookups

    def nouns_for(self, classes: tuple[str, ...]) -> tuple[lex.Noun, ...]:
        """Nouns whose class or English name is in ``classes`` (a class name or a noun)."""
        key = ",".join(classes)
        if key not in self._by_class:
            self._by_class[key] = tuple(
                n for n in self.nouns if n.cls in classes or n.en in classes
            )
        return self._by_class[key]

    def noun(self, classes: tuple[str, ...]) -> lex.Noun:
        """A noun for the slot; in a domain's corpus, one of the domain's ``DOMAIN_SHARE`` of the
        time where one fits (the general corpus draws exactly as before domains existed)."""
        rng = self.rng
        if self.domain_nouns:
            key = ",".join(classes)
            if key not in self._domain_by_class:
                self._domain_by_class[key] = tuple(n for n in self.domain_nouns if n.cls in classes)
            fitting = self._domain_by_class[key]
            if fitting and rng.random() < DOMAIN_SHARE:
                return rng.choice(fitting)
        return rng.choice(self.nouns_for(classes))

    # --- noun phrases

    def noun_phrase(
        self,
        case: str,
        classes: tuple[str, ...],
        *,
        allow_pronoun: bool = False,
        subject: bool = False,
    ) -> lex.Phrase:
        """A determiner, maybe an adjective, and a noun, declined for ``case``."""
        rng = self.rng
        if allow_pronoun and rng.random() < 0.3:
            if subject:
                en, de, person = rng.choice(lex.PRONOUNS)
                return lex.Phrase(en, de, person, pronoun=True)
            en, acc, dat = rng.choice(lex.OBJECT_PRONOUNS)
            return lex.Phrase(en, acc if case == "acc" else dat, "3sg", pronoun=True)
        noun = self.noun(classes)
        det = rng.choices(
            ("the", "a", "poss", "this", "no", "number", "digits", "bare"),
            weights=(30, 18, 14, 8, 4, 10, 6, 6),
        )[0]
        if det == "no" and subject:
            det = "the"
        plural = det in ("number", "digits", "bare") or (
            det in ("the", "poss", "this", "no") and rng.random() < 0.35
        )
        adjective = rng.choice(self.adjectives) if rng.random() < 0.45 else None
        return self._decline(noun, det, plural, adjective, case)

    def _decline(
        self, noun: lex.Noun, det: str, plural: bool, adjective: tuple[str, ...] | None, case: str
    ) -> lex.Phrase:
        rng = self.rng
        c = lex.CASES[case]
        g = "pl" if plural else noun.gender
        en_noun = noun.en_pl if plural else noun.en
        de_noun = noun.de_pl if plural else noun.de
        if plural and case == "dat":
            de_noun = _dative_plural(de_noun)
        if det == "the":
            en_det, de_det, endings = "the", lex.DER[g][c], lex.WEAK
        elif det == "this":
            en_det, de_det, endings = ("these" if plural else "this"), lex.DIES[g][c], lex.WEAK
        elif det == "a":
            en_det, de_det, endings = "a", "ein" + lex.EIN_ENDINGS[g][c], lex.MIXED
        elif det == "no":
            en_det, de_det, endings = "no", "kein" + lex.EIN_ENDINGS[g][c], lex.MIXED
        elif det == "poss":
            en_det, stem = rng.choice(lex.POSSESSIVES)
            de_det, endings = stem + lex.EIN_ENDINGS[g][c], lex.MIXED
        elif det == "number":
            en_det, de_det = rng.choice(self.numbers)
            endings = None
        elif det == "digits":
            en_det = de_det = str(rng.randint(2, 99))
            endings = None
        else:  # bare plural
            en_det = de_det = ""
            endings = None
        en_words = [en_det] if en_det else []
        de_words = [de_det] if de_det else []
        if adjective is not None:
            en_adj, _, de_stem = adjective
            ending = lex.STRONG_PL[c] if endings is None else endings[g][c]
            en_words.append(en_adj)
            de_words.append(de_stem + ending)
        en_words.append(en_noun)
        de_words.append(de_noun)
        if en_words[0] == "a":
            en_words[0] = _an(en_words[1])
        return lex.Phrase(" ".join(en_words), " ".join(de_words), "3pl" if plural else "3sg")

    def prep_phrase(self) -> tuple[str, str]:
        en, de, case, classes = self.rng.choice(lex.PREPOSITIONS)
        np = self.noun_phrase(case, classes)
        return f"{en} {np.en}", f"{de} {np.de}"

    # --- clauses

    def clause(self, *, tense: str | None = None, adverb: bool = True) -> dict[str, Any]:
        """The parts of one clause, language by language, before word order is applied."""
        rng = self.rng
        tense = (
            tense
            or rng.choices(("present", "past", "perfect", "future"), weights=(45, 20, 20, 15))[0]
        )
        subject = self.noun_phrase("nom", ("person", "animal"), allow_pronoun=True, subject=True)
        person = subject.person
        parts: dict[str, Any] = {"subject": subject, "tense": tense, "adverb": None, "pp": None}
        if rng.random() < 0.15:  # copula: the dog is tired / der Hund ist müde
            tense = "future" if tense == "future" else "present"
            parts["tense"] = tense
            en_adj, de_adj, _ = rng.choice(self.adjectives)
            parts.update(
                kind="copula",
                en_verb="be",
                de_fin=lex.SEIN[person],
                de_end=[],
                en_obj=[en_adj],
                de_mid=[de_adj],
            )
            if tense == "future":
                parts.update(
                    en_aux="will", en_main="be", de_fin=lex.WERDEN[person], de_end=["sein"]
                )
            else:
                parts.update(en_aux=None, en_main=lex.EN_BE[person])
        else:
            parts.update(self._verb_parts(person, tense))
        if rng.random() < 0.35:
            parts["pp"] = self.prep_phrase()
        if adverb and rng.random() < 0.4:
            parts["adverb"] = rng.choice(
                lex.ADVERBS["past" if tense in ("past", "perfect") else tense]
            )
            if tense == "perfect":  # "yesterday" goes with the simple past in English
                parts["tense"] = "past"
                if parts["kind"] == "verb":
                    parts["en_aux"], parts["en_main"] = None, parts["verb"].en[2]
        return parts

    def _verb_parts(self, person: str, tense: str) -> dict[str, Any]:
        """A clause's verb, its objects and its forms for ``person`` in ``tense``."""
        rng = self.rng
        verb = rng.choice(self.verbs)
        en_base, en_3sg, en_past, en_pp = verb.en
        en_mid: list[str] = []
        de_mid: list[str] = []
        parts: dict[str, Any] = {}
        if verb.frame == "ditr":
            recipient = self.noun_phrase("dat", ("person", "animal"), allow_pronoun=True)
            theme = self.noun_phrase("acc", lex.OBJECT_CLASSES[verb.obj])
            en_mid = [recipient.en, theme.en]
            # dative before accusative (the theme is never a pronoun)
            de_mid = [recipient.de, theme.de]
            parts["pronoun_object"] = recipient.pronoun
        elif verb.frame == "tr":
            obj = self.noun_phrase("acc", lex.OBJECT_CLASSES[verb.obj], allow_pronoun=True)
            en_mid = [obj.en]
            de_mid = [obj.de]
            parts["pronoun_object"] = obj.pronoun
        if tense == "present":
            en_aux, en_main = None, (en_3sg if _en_third(person) else en_base)
            de_fin, de_end = verb.forms[person], ([verb.prefix] if verb.prefix else [])
            de_sub_fin = verb.prefix + verb.forms[person]
        elif tense in ("past", "perfect"):
            aux = lex.HABEN if verb.aux == "haben" else lex.SEIN
            if tense == "past":
                en_aux, en_main = None, en_past
            else:
                en_aux, en_main = ("has" if _en_third(person) else "have"), en_pp
            de_fin, de_end = aux[person], [verb.participle]
            de_sub_fin = aux[person]
        else:
            en_aux, en_main = "will", en_base
            de_fin, de_end = lex.WERDEN[person], [verb.inf]
            de_sub_fin = lex.WERDEN[person]
        parts.update(
            kind="verb",
            en_aux=en_aux,
            en_main=en_main,
            de_fin=de_fin,
            de_end=de_end,
            de_sub_fin=de_sub_fin,
            en_obj=en_mid,
            de_mid=de_mid,
            en_base=en_base,
            en_do=("does" if _en_third(person) else "do"),
            verb=verb,
        )
        return parts

    # --- word order

    @staticmethod
    def _en_words(p: dict[str, Any], *, front_adverb: bool) -> list[str]:
        words = [p["subject"].en]
        if p["en_aux"]:
            words.append(p["en_aux"])
        words.append(p["en_main"])
        words += p["en_obj"]
        if p["pp"]:
            words.append(p["pp"][0])
        if p["adverb"] and not front_adverb:
            words.append(p["adverb"][0])
        return words

    @staticmethod
    def _de_middle(p: dict[str, Any]) -> list[str]:
        """Objects, time adverb and prepositional phrase in German middle-field order."""
        words: list[str] = []
        mid = list(p["de_mid"])
        if p.get("pronoun_object") and mid:  # pronoun objects come before the time adverb
            words.append(mid.pop(0))
        if p["adverb"] and not p.get("adverb_fronted"):
            words.append(p["adverb"][1])
        if p["kind"] == "copula":
            if p["pp"]:
                words.append(p["pp"][1])
            return words + mid
        words += mid
        if p["pp"]:
            words.append(p["pp"][1])
        return words

    def main_clause(
        self, p: dict[str, Any], *, front_adverb: bool = False
    ) -> tuple[list[str], list[str]]:
        """Verb-second order; a fronted adverb moves the German subject behind the verb."""
        p["adverb_fronted"] = front_adverb and p["adverb"] is not None
        en = self._en_words(p, front_adverb=p["adverb_fronted"])
        if p["adverb_fronted"]:
            en = [p["adverb"][0]] + en
            de = [p["adverb"][1], p["de_fin"], p["subject"].de] + self._de_middle(p) + p["de_end"]
        else:
            de = [p["subject"].de, p["de_fin"]] + self._de_middle(p) + p["de_end"]
        return en, de

    def inverted_clause(self, p: dict[str, Any], first_de: str) -> list[str]:
        """German order after a fronted subordinate clause: finite verb, subject, rest."""
        p["adverb_fronted"] = False
        return [first_de, p["de_fin"], p["subject"].de] + self._de_middle(p) + p["de_end"]

    def subordinate_clause(self, p: dict[str, Any]) -> tuple[list[str], list[str]]:
        """Verb-final order: the finite verb after participle, infinitive or joined prefix."""
        p["adverb_fronted"] = False
        en = self._en_words(p, front_adverb=False)
        if p["kind"] == "copula":
            end = p["de_end"] + [p["de_fin"]]
        elif p["tense"] == "present":
            end = [p["de_sub_fin"]]
        else:
            end = p["de_end"] + [p["de_sub_fin"]]
        de = [p["subject"].de] + self._de_middle(p) + end
        return en, de

    def question(self, p: dict[str, Any]) -> tuple[list[str], list[str]]:
        """Yes/no question: English do-support or inverted auxiliary; German verb-first."""
        p["adverb_fronted"] = False
        subj = p["subject"]
        if p["kind"] == "copula":
            en_head = (
                [p["en_aux"], subj.en, p["en_main"]] if p["en_aux"] else [p["en_main"], subj.en]
            )
        elif p["en_aux"]:
            en_head = [p["en_aux"], subj.en, p["en_main"]]
        elif p["tense"] == "past":
            en_head = ["did", subj.en, p["en_base"]]
        else:
            en_head = [p["en_do"], subj.en, p["en_base"]]
        en = (
            en_head
            + p["en_obj"]
            + ([p["pp"][0]] if p["pp"] else [])
            + ([p["adverb"][0]] if p["adverb"] else [])
        )
        de = [p["de_fin"], subj.de] + self._de_middle(p) + p["de_end"]
        return en, de

    # --- sentences

    def sentence(self) -> tuple[str, str]:
        """One English-German pair, detokenized, first letter capitalised."""
        rng = self.rng
        kind = rng.choices(
            ("main", "fronted", "that", "because", "if_front", "question"),
            weights=(34, 16, 16, 14, 8, 12),
        )[0]
        end = "."
        if kind in ("main", "fronted"):
            p = self.clause()
            en, de = self.main_clause(p, front_adverb=kind == "fronted")
        elif kind == "that":
            subj_en, subj_de, person = rng.choice(lex.PRONOUNS)
            (en_base, en_3sg), de_forms = rng.choice(self.say_verbs)
            sub_en, sub_de = self.subordinate_clause(self.clause())
            en = [subj_en, en_3sg if person == "3sg" else en_base, "that"] + sub_en
            de = [subj_de, de_forms[person] + ",", "dass"] + sub_de
        elif kind == "because":
            main_en, main_de = self.main_clause(self.clause(adverb=False))
            sub_en, sub_de = self.subordinate_clause(self.clause(adverb=False))
            main_de[-1] += ","
            en = main_en + ["because"] + sub_en
            de = main_de + ["weil"] + sub_de
        elif kind == "if_front":
            sub_en, sub_de = self.subordinate_clause(self.clause(tense="present", adverb=False))
            p = self.clause(tense=rng.choice(("present", "future")), adverb=False)
            main_en, _ = self.main_clause(p)
            sub_de[-1] += ","
            en = ["if"] + sub_en[:-1] + [sub_en[-1] + ","] + main_en
            de = ["wenn"] + sub_de[:-1] + self.inverted_clause(p, sub_de[-1])
        else:
            en, de = self.question(self.clause())
            end = "?"
        return _finish(en, end), _finish(_contract(de), end)


def _contract(words: list[str]) -> list[str]:
    """German preposition + article contractions: in dem -> im, von dem -> vom, in das -> ins."""
    flat = " ".join(w for w in words if w).split()
    out: list[str] = []
    for word in flat:
        if out and (out[-1], word) in lex.CONTRACTIONS:
            out[-1] = lex.CONTRACTIONS[(out[-1], word)]
        else:
            out.append(word)
    return out


def _finish(words: list[str], end: str) -> str:
    text = " ".join(w for w in words if w)
    text = " ".join(text.split())
    return text[:1].upper() + text[1:] + end
