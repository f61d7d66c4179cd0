"""The quickstart's offline corpus: English-German pairs generated from a small bilingual grammar.

It is honest about what it is: a deterministic grammar, not real text. But it is not a cipher
either. German articles and adjective endings agree with the noun's gender, number and case;
the finite verb goes second in main clauses (also after a fronted adverb or subordinate clause),
last in ``dass`` / ``weil`` / ``wenn`` clauses; participles, infinitives after ``werden`` and
separable prefixes go to the end; English simple past becomes the German perfect with ``haben``
or ``sein``. A small Transformer has to learn reordering and agreement, not word-for-word copying.

``write_corpus(out_dir, ...)`` writes the raw corpus layout (``corpora.assemble``) for corpus ``synthetic``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corpora import CorpusError

__all__ = ["write_corpus", "generate_pairs", "Grammar", "CORPUS", "PAIRS"]

PAIRS = ("en-de", "de-en")
"""The directions the grammar writes."""

CORPUS = "synthetic"
MIN_WORDS, MAX_WORDS = 4, 30

# ----------------------------------------------------------------------------- lexicon

# (english singular, english plural, gender, german singular, german plural, class)
_NOUNS = """
man men m Mann Männer person
woman women f Frau Frauen person
child children n Kind Kinder person
girl girls n Mädchen Mädchen person
teacher teachers m Lehrer Lehrer person
doctor doctors m Arzt Ärzte person
friend friends m Freund Freunde person
sister sisters f Schwester Schwestern person
brother brothers m Bruder Brüder person
mother mothers f Mutter Mütter person
father fathers m Vater Väter person
cook cooks m Koch Köche person
king kings m König Könige person
queen queens f Königin Königinnen person
baker bakers m Bäcker Bäcker person
driver drivers m Fahrer Fahrer person
singer singers f Sängerin Sängerinnen person
pupil pupils m Schüler Schüler person
guest guests m Gast Gäste person
uncle uncles m Onkel Onkel person
aunt aunts f Tante Tanten person
painter painters m Maler Maler person
worker workers m Arbeiter Arbeiter person
waiter waiters m Kellner Kellner person
nurse nurses f Krankenschwester Krankenschwestern person
dog dogs m Hund Hunde animal
cat cats f Katze Katzen animal
horse horses n Pferd Pferde animal
bird birds m Vogel Vögel animal
cow cows f Kuh Kühe animal
mouse mice f Maus Mäuse animal
fish fish m Fisch Fische animal
sheep sheep n Schaf Schafe animal
pig pigs n Schwein Schweine animal
book books n Buch Bücher thing
letter letters m Brief Briefe thing
car cars n Auto Autos thing
table tables m Tisch Tische thing
chair chairs m Stuhl Stühle thing
door doors f Tür Türen thing
window windows n Fenster Fenster thing
glass glasses n Glas Gläser thing
cup cups f Tasse Tassen thing
bottle bottles f Flasche Flaschen thing
key keys m Schlüssel Schlüssel thing
bag bags f Tasche Taschen thing
ball balls m Ball Bälle thing
picture pictures n Bild Bilder thing
song songs n Lied Lieder thing
newspaper newspapers f Zeitung Zeitungen thing
computer computers m Computer Computer thing
phone phones n Telefon Telefone thing
shoe shoes m Schuh Schuhe thing
hat hats m Hut Hüte thing
coat coats m Mantel Mäntel thing
box boxes f Kiste Kisten thing
bicycle bicycles n Fahrrad Fahrräder thing
lamp lamps f Lampe Lampen thing
pen pens m Stift Stifte thing
clock clocks f Uhr Uhren thing
map maps f Karte Karten thing
gift gifts n Geschenk Geschenke thing
stone stones m Stein Steine thing
plate plates m Teller Teller thing
spoon spoons m Löffel Löffel thing
knife knives n Messer Messer thing
shirt shirts n Hemd Hemden thing
dress dresses n Kleid Kleider thing
ring rings m Ring Ringe thing
flower flowers f Blume Blumen thing
apple apples m Apfel Äpfel food
egg eggs n Ei Eier food
cake cakes m Kuchen Kuchen food
banana bananas f Banane Bananen food
pear pears f Birne Birnen food
tomato tomatoes f Tomate Tomaten food
potato potatoes f Kartoffel Kartoffeln food
carrot carrots f Karotte Karotten food
sausage sausages f Wurst Würste food
house houses n Haus Häuser place
garden gardens m Garten Gärten place
city cities f Stadt Städte place
street streets f Straße Straßen place
school schools f Schule Schulen place
church churches f Kirche Kirchen place
room rooms n Zimmer Zimmer place
kitchen kitchens f Küche Küchen place
shop shops m Laden Läden place
village villages n Dorf Dörfer place
forest forests m Wald Wälder place
park parks m Park Parks place
train trains m Zug Züge place
ship ships n Schiff Schiffe place
boat boats n Boot Boote place
bridge bridges f Brücke Brücken place
island islands f Insel Inseln place
office offices n Büro Büros place
hotel hotels n Hotel Hotels place
station stations m Bahnhof Bahnhöfe place
"""

# (english, german predicative form, german stem that takes endings)
_ADJECTIVES = """
big groß groß
small klein klein
old alt alt
young jung jung
new neu neu
good gut gut
bad schlecht schlecht
beautiful schön schön
red rot rot
blue blau blau
green grün grün
black schwarz schwarz
white weiß weiß
yellow gelb gelb
long lang lang
short kurz kurz
happy glücklich glücklich
sad traurig traurig
tired müde müd
fast schnell schnell
slow langsam langsam
cold kalt kalt
warm warm warm
heavy schwer schwer
light leicht leicht
clean sauber sauber
dirty schmutzig schmutzig
quiet leise leis
loud laut laut
rich reich reich
poor arm arm
strong stark stark
friendly freundlich freundlich
clever klug klug
funny lustig lustig
brave mutig mutig
cheap billig billig
expensive teuer teur
dark dunkel dunkl
hungry hungrig hungrig
famous berühmt berühmt
strange seltsam seltsam
wild wild wild
dry trocken trocken
wet nass nass
empty leer leer
full voll voll
round rund rund
soft weich weich
sweet süß süß
fresh frisch frisch
"""

# english: base|3sg|past|participle ; german: infinitive|ich|du|er/sie|participle|aux ; frame ; object class
# A separable German verb is written prefix+infinitive with a "+": an+rufen; its present forms
# are those of the stem verb (rufe, rufst, ruft).
_VERBS = """
see|sees|saw|seen ; sehen|sehe|siehst|sieht|gesehen|haben ; tr ; any
find|finds|found|found ; finden|finde|findest|findet|gefunden|haben ; tr ; any
buy|buys|bought|bought ; kaufen|kaufe|kaufst|kauft|gekauft|haben ; tr ; object
read|reads|read|read ; lesen|lese|liest|liest|gelesen|haben ; tr ; readable
write|writes|wrote|written ; schreiben|schreibe|schreibst|schreibt|geschrieben|haben ; tr ; readable
eat|eats|ate|eaten ; essen|esse|isst|isst|gegessen|haben ; tr ; food
take|takes|took|taken ; nehmen|nehme|nimmst|nimmt|genommen|haben ; tr ; object
carry|carries|carried|carried ; tragen|trage|trägst|trägt|getragen|haben ; tr ; object
open|opens|opened|opened ; öffnen|öffne|öffnest|öffnet|geöffnet|haben ; tr ; openable
close|closes|closed|closed ; schließen|schließe|schließt|schließt|geschlossen|haben ; tr ; openable
love|loves|loved|loved ; lieben|liebe|liebst|liebt|geliebt|haben ; tr ; any
like|likes|liked|liked ; mögen|mag|magst|mag|gemocht|haben ; tr ; any
need|needs|needed|needed ; brauchen|brauche|brauchst|braucht|gebraucht|haben ; tr ; object
visit|visits|visited|visited ; besuchen|besuche|besuchst|besucht|besucht|haben ; tr ; person
wash|washes|washed|washed ; waschen|wasche|wäschst|wäscht|gewaschen|haben ; tr ; object
paint|paints|painted|painted ; malen|male|malst|malt|gemalt|haben ; tr ; any
sell|sells|sold|sold ; verkaufen|verkaufe|verkaufst|verkauft|verkauft|haben ; tr ; object
hear|hears|heard|heard ; hören|höre|hörst|hört|gehört|haben ; tr ; animate
know|knows|knew|known ; kennen|kenne|kennst|kennt|gekannt|haben ; tr ; person
look for|looks for|looked for|looked for ; suchen|suche|suchst|sucht|gesucht|haben ; tr ; any
forget|forgets|forgot|forgotten ; vergessen|vergesse|vergisst|vergisst|vergessen|haben ; tr ; object
catch|catches|caught|caught ; fangen|fange|fängst|fängt|gefangen|haben ; tr ; throwable
cook|cooks|cooked|cooked ; kochen|koche|kochst|kocht|gekocht|haben ; tr ; food
repair|repairs|repaired|repaired ; reparieren|repariere|reparierst|repariert|repariert|haben ; tr ; object
draw|draws|drew|drawn ; zeichnen|zeichne|zeichnest|zeichnet|gezeichnet|haben ; tr ; any
hold|holds|held|held ; halten|halte|hältst|hält|gehalten|haben ; tr ; object
call|calls|called|called ; an+rufen|rufe|rufst|ruft|angerufen|haben ; tr ; person
pick up|picks up|picked up|picked up ; ab+holen|hole|holst|holt|abgeholt|haben ; tr ; animate
invite|invites|invited|invited ; ein+laden|lade|lädst|lädt|eingeladen|haben ; tr ; person
put on|puts on|put on|put on ; an+ziehen|ziehe|ziehst|zieht|angezogen|haben ; tr ; clothing
switch on|switches on|switched on|switched on ; ein+schalten|schalte|schaltest|schaltet|eingeschaltet|haben ; tr ; device
bring back|brings back|brought back|brought back ; zurück+bringen|bringe|bringst|bringt|zurückgebracht|haben ; tr ; object
give|gives|gave|given ; geben|gebe|gibst|gibt|gegeben|haben ; ditr ; object
show|shows|showed|shown ; zeigen|zeige|zeigst|zeigt|gezeigt|haben ; ditr ; object
send|sends|sent|sent ; schicken|schicke|schickst|schickt|geschickt|haben ; ditr ; object
bring|brings|brought|brought ; bringen|bringe|bringst|bringt|gebracht|haben ; ditr ; object
sleep|sleeps|slept|slept ; schlafen|schlafe|schläfst|schläft|geschlafen|haben ; intr ;
run|runs|ran|run ; laufen|laufe|läufst|läuft|gelaufen|sein ; intr ;
come|comes|came|come ; kommen|komme|kommst|kommt|gekommen|sein ; intr ;
go|goes|went|gone ; gehen|gehe|gehst|geht|gegangen|sein ; intr ;
swim|swims|swam|swum ; schwimmen|schwimme|schwimmst|schwimmt|geschwommen|sein ; intr ;
laugh|laughs|laughed|laughed ; lachen|lache|lachst|lacht|gelacht|haben ; intr ;
sing|sings|sang|sung ; singen|singe|singst|singt|gesungen|haben ; intr ;
dance|dances|danced|danced ; tanzen|tanze|tanzt|tanzt|getanzt|haben ; intr ;
work|works|worked|worked ; arbeiten|arbeite|arbeitest|arbeitet|gearbeitet|haben ; intr ;
wait|waits|waited|waited ; warten|warte|wartest|wartet|gewartet|haben ; intr ;
play|plays|played|played ; spielen|spiele|spielst|spielt|gespielt|haben ; intr ;
travel|travels|travelled|travelled ; reisen|reise|reist|reist|gereist|sein ; intr ;
cry|cries|cried|cried ; weinen|weine|weinst|weint|geweint|haben ; intr ;
live|lives|lived|lived ; wohnen|wohne|wohnst|wohnt|gewohnt|haben ; intr ;
get up|gets up|got up|got up ; auf+stehen|stehe|stehst|steht|aufgestanden|sein ; intr ;
arrive|arrives|arrived|arrived ; an+kommen|komme|kommst|kommt|angekommen|sein ; intr ;
fall asleep|falls asleep|fell asleep|fallen asleep ; ein+schlafen|schlafe|schläfst|schläft|eingeschlafen|sein ; intr ;
"""

# verbs that take a "that" clause: english base|3sg ; german infinitive|ich|du|er
_SAY_VERBS = """
think|thinks ; denken|denke|denkst|denkt
know|knows ; wissen|weiß|weißt|weiß
say|says ; sagen|sage|sagst|sagt
hope|hopes ; hoffen|hoffe|hoffst|hofft
believe|believes ; glauben|glaube|glaubst|glaubt
"""

# which noun classes each object class allows
_OBJECT_CLASSES = {
    "any": ("person", "animal", "thing", "food", "place"),
    "object": ("thing", "food"),
    "readable": ("book", "letter", "newspaper", "map"),
    "food": ("food",),
    "openable": ("door", "window", "box", "bottle", "bag", "book"),
    "person": ("person",),
    "animate": ("person", "animal"),
    "throwable": ("ball", "fish", "mouse", "bird", "apple", "key"),
    "clothing": ("shoe", "hat", "coat", "shirt", "dress", "ring"),
    "device": ("computer", "phone", "lamp"),
}

# subject pronouns: english, german nominative, person key (ich/du/er/wir/sie), english 3sg?
_PRONOUNS = (
    ("I", "ich", "1sg"),
    ("you", "du", "2sg"),
    ("he", "er", "3sg"),
    ("she", "sie", "3sg"),
    ("we", "wir", "1pl"),
    ("they", "sie", "3pl"),
)
# object pronouns: english, german accusative, german dative
_OBJECT_PRONOUNS = (
    ("me", "mich", "mir"),
    ("you", "dich", "dir"),
    ("him", "ihn", "ihm"),
    ("her", "sie", "ihr"),
    ("us", "uns", "uns"),
    ("them", "sie", "ihnen"),
)
_POSSESSIVES = (("my", "mein"), ("your", "dein"), ("his", "sein"), ("her", "ihr"), ("our", "unser"), ("their", "ihr"))
_NUMBERS = (
    "two zwei", "three drei", "four vier", "five fünf", "six sechs", "seven sieben", "eight acht",
    "nine neun", "ten zehn", "eleven elf", "twelve zwölf", "thirteen dreizehn", "fourteen vierzehn",
    "fifteen fünfzehn", "sixteen sechzehn", "seventeen siebzehn", "eighteen achtzehn",
    "nineteen neunzehn", "twenty zwanzig",
)
# (english, german, case, noun classes)
_PREPOSITIONS = (
    ("in", "in", "dat", ("place",)),
    ("on", "auf", "dat", ("table", "chair", "street", "bridge", "island", "ship", "train", "boat")),
    ("under", "unter", "dat", ("table", "chair", "bridge", "tree")),
    ("next to", "neben", "dat", ("person", "animal", "thing", "place")),
    ("behind", "hinter", "dat", ("person", "animal", "place")),
    ("in front of", "vor", "dat", ("person", "animal", "place")),
    ("with", "mit", "dat", ("person", "animal")),
    ("from", "von", "dat", ("person",)),
    ("for", "für", "acc", ("person", "animal")),
    ("without", "ohne", "acc", ("person", "animal", "thing")),
)
# time adverbs by tense: (english, german)
_ADVERBS = {
    "present": (("today", "heute"), ("now", "jetzt"), ("often", "oft"), ("sometimes", "manchmal"),
                ("every day", "jeden Tag"), ("in the morning", "am Morgen"), ("in the evening", "am Abend")),
    "past": (("yesterday", "gestern"), ("last week", "letzte Woche"), ("last year", "letztes Jahr"),
             ("on Sunday", "am Sonntag")),
    "future": (("tomorrow", "morgen"), ("next week", "nächste Woche"), ("next year", "nächstes Jahr"),
               ("soon", "bald")),
}
_CONTRACTIONS = {("in", "dem"): "im", ("von", "dem"): "vom", ("in", "das"): "ins", ("zu", "dem"): "zum"}

# German declension: case index nom=0, acc=1, dat=2; gender m/f/n or pl
_CASES = {"nom": 0, "acc": 1, "dat": 2}
_DER = {"m": ("der", "den", "dem"), "f": ("die", "die", "der"), "n": ("das", "das", "dem"), "pl": ("die", "die", "den")}
_DIES = {"m": ("dieser", "diesen", "diesem"), "f": ("diese", "diese", "dieser"), "n": ("dieses", "dieses", "diesem"),
         "pl": ("diese", "diese", "diesen")}
_EIN_ENDINGS = {"m": ("", "en", "em"), "f": ("e", "e", "er"), "n": ("", "", "em"), "pl": ("e", "e", "en")}
_WEAK = {"m": ("e", "en", "en"), "f": ("e", "e", "en"), "n": ("e", "e", "en"), "pl": ("en", "en", "en")}
_MIXED = {"m": ("er", "en", "en"), "f": ("e", "e", "en"), "n": ("es", "es", "en"), "pl": ("en", "en", "en")}
_STRONG_PL = ("e", "e", "en")


@dataclass(frozen=True)
class Noun:
    en: str
    en_pl: str
    gender: str
    de: str
    de_pl: str
    cls: str


@dataclass(frozen=True)
class Verb:
    en: tuple[str, str, str, str]
    """base, 3sg, past, participle."""
    inf: str
    """German infinitive (separable prefix attached)."""
    prefix: str
    """Separable prefix, or empty."""
    forms: dict[str, str]
    """Present tense by person key (without the separable prefix)."""
    participle: str
    aux: str
    frame: str
    obj: str


@dataclass
class Phrase:
    """A noun phrase or pronoun in both languages; German already declined for its case."""

    en: str
    de: str
    person: str
    """Agreement key of a subject: 1sg, 2sg, 3sg, 1pl, 3pl."""
    pronoun: bool = False


def _parse_nouns() -> tuple[Noun, ...]:
    return tuple(Noun(*line.split()) for line in _NOUNS.strip().splitlines())


def _parse_verbs() -> tuple[Verb, ...]:
    verbs = []
    for line in _VERBS.strip().splitlines():
        en, de, frame, obj = (part.strip() for part in line.split(";"))
        inf, ich, du, er, participle, aux = de.split("|")
        prefix, _, stem_inf = inf.rpartition("+")
        forms = {"1sg": ich, "2sg": du, "3sg": er, "1pl": stem_inf, "3pl": stem_inf}
        verbs.append(Verb(tuple(en.split("|")), prefix + stem_inf, prefix, forms, participle, aux, frame, obj))
    return tuple(verbs)


def _parse_say_verbs() -> tuple[tuple[tuple[str, str], dict[str, str]], ...]:
    out = []
    for line in _SAY_VERBS.strip().splitlines():
        en, de = (part.strip() for part in line.split(";"))
        inf, ich, du, er = de.split("|")
        out.append((tuple(en.split("|")), {"1sg": ich, "2sg": du, "3sg": er, "1pl": inf, "3pl": inf}))
    return tuple(out)


_HABEN = {"1sg": "habe", "2sg": "hast", "3sg": "hat", "1pl": "haben", "3pl": "haben"}
_SEIN = {"1sg": "bin", "2sg": "bist", "3sg": "ist", "1pl": "sind", "3pl": "sind"}
_WERDEN = {"1sg": "werde", "2sg": "wirst", "3sg": "wird", "1pl": "werden", "3pl": "werden"}
_EN_BE = {"1sg": "am", "2sg": "are", "3sg": "is", "1pl": "are", "3pl": "are"}


def _en_third(person: str) -> bool:
    return person == "3sg"


def _dative_plural(noun: str) -> str:
    return noun if noun.endswith(("n", "s")) else noun + "n"


def _an(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


# ----------------------------------------------------------------------------- grammar


class Grammar:
    """Random sentence pairs from the lexicon; all randomness from the ``rng`` it is given."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.nouns = _parse_nouns()
        self.adjectives = tuple(tuple(line.split()) for line in _ADJECTIVES.strip().splitlines())
        self.verbs = _parse_verbs()
        self.say_verbs = _parse_say_verbs()
        self.numbers = tuple(tuple(n.split()) for n in _NUMBERS)
        self._by_class: dict[str, tuple[Noun, ...]] = {}

    # --- lexicon lookups

    def nouns_for(self, classes: tuple[str, ...]) -> tuple[Noun, ...]:
        """Nouns whose class or English name is in ``classes`` (a class name or a noun)."""
        key = ",".join(classes)
        if key not in self._by_class:
            self._by_class[key] = tuple(n for n in self.nouns if n.cls in classes or n.en in classes)
        return self._by_class[key]

    # --- noun phrases

    def noun_phrase(self, case: str, classes: tuple[str, ...], *, allow_pronoun: bool = False,
                    subject: bool = False) -> Phrase:
        """A determiner, maybe an adjective, and a noun, declined for ``case``."""
        rng = self.rng
        if allow_pronoun and rng.random() < 0.3:
            if subject:
                en, de, person = rng.choice(_PRONOUNS)
                return Phrase(en, de, person, pronoun=True)
            en, acc, dat = rng.choice(_OBJECT_PRONOUNS)
            return Phrase(en, acc if case == "acc" else dat, "3sg", pronoun=True)
        noun = rng.choice(self.nouns_for(classes))
        det = rng.choices(("the", "a", "poss", "this", "no", "number", "digits", "bare"),
                          weights=(30, 18, 14, 8, 4, 10, 6, 6))[0]
        if det == "no" and subject:
            det = "the"
        plural = det in ("number", "digits", "bare") or (det in ("the", "poss", "this", "no") and rng.random() < 0.35)
        adjective = rng.choice(self.adjectives) if rng.random() < 0.45 else None
        return self._decline(noun, det, plural, adjective, case)

    def _decline(self, noun: Noun, det: str, plural: bool, adjective: tuple[str, ...] | None, case: str) -> Phrase:
        rng = self.rng
        c = _CASES[case]
        g = "pl" if plural else noun.gender
        en_noun = noun.en_pl if plural else noun.en
        de_noun = noun.de_pl if plural else noun.de
        if plural and case == "dat":
            de_noun = _dative_plural(de_noun)
        if det == "the":
            en_det, de_det, endings = "the", _DER[g][c], _WEAK
        elif det == "this":
            en_det, de_det, endings = ("these" if plural else "this"), _DIES[g][c], _WEAK
        elif det == "a":
            en_det, de_det, endings = "a", "ein" + _EIN_ENDINGS[g][c], _MIXED
        elif det == "no":
            en_det, de_det, endings = "no", "kein" + _EIN_ENDINGS[g][c], _MIXED
        elif det == "poss":
            en_det, stem = rng.choice(_POSSESSIVES)
            de_det, endings = stem + _EIN_ENDINGS[g][c], _MIXED
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
            ending = (_STRONG_PL[c] if endings is None else endings[g][c])
            en_words.append(en_adj)
            de_words.append(de_stem + ending)
        en_words.append(en_noun)
        de_words.append(de_noun)
        if en_words[0] == "a":
            en_words[0] = _an(en_words[1])
        return Phrase(" ".join(en_words), " ".join(de_words), "3pl" if plural else "3sg")

    def prep_phrase(self) -> tuple[str, str]:
        en, de, case, classes = self.rng.choice(_PREPOSITIONS)
        np = self.noun_phrase(case, classes)
        return f"{en} {np.en}", f"{de} {np.de}"

    # --- clauses

    def clause(self, *, tense: str | None = None, adverb: bool = True) -> dict[str, Any]:
        """The parts of one clause, language by language, before word order is applied."""
        rng = self.rng
        tense = tense or rng.choices(("present", "past", "perfect", "future"), weights=(45, 20, 20, 15))[0]
        subject = self.noun_phrase("nom", ("person", "animal"), allow_pronoun=True, subject=True)
        person = subject.person
        parts: dict[str, Any] = {"subject": subject, "tense": tense, "adverb": None, "pp": None}
        if rng.random() < 0.15:  # copula: the dog is tired / der Hund ist müde
            tense = "future" if tense == "future" else "present"
            parts["tense"] = tense
            en_adj, de_adj, _ = rng.choice(self.adjectives)
            parts.update(kind="copula", en_verb="be", de_fin=_SEIN[person], de_end=[], en_obj=[en_adj], de_mid=[de_adj])
            if tense == "future":
                parts.update(en_aux="will", en_main="be", de_fin=_WERDEN[person], de_end=["sein"])
            else:
                parts.update(en_aux=None, en_main=_EN_BE[person])
        else:
            verb = rng.choice(self.verbs)
            en_base, en_3sg, en_past, en_pp = verb.en
            en_mid: list[str] = []
            de_mid: list[str] = []
            if verb.frame == "ditr":
                recipient = self.noun_phrase("dat", ("person", "animal"), allow_pronoun=True)
                theme = self.noun_phrase("acc", _OBJECT_CLASSES[verb.obj])
                en_mid = [recipient.en, theme.en]
                de_mid = [recipient.de, theme.de]  # dative before accusative (the theme is never a pronoun)
                parts["pronoun_object"] = recipient.pronoun
            elif verb.frame == "tr":
                obj = self.noun_phrase("acc", _OBJECT_CLASSES[verb.obj], allow_pronoun=True)
                en_mid = [obj.en]
                de_mid = [obj.de]
                parts["pronoun_object"] = obj.pronoun
            if tense == "present":
                en_aux, en_main = None, (en_3sg if _en_third(person) else en_base)
                de_fin, de_end = verb.forms[person], ([verb.prefix] if verb.prefix else [])
                de_sub_fin = verb.prefix + verb.forms[person]
            elif tense in ("past", "perfect"):
                aux = _HABEN if verb.aux == "haben" else _SEIN
                if tense == "past":
                    en_aux, en_main = None, en_past
                else:
                    en_aux, en_main = ("has" if _en_third(person) else "have"), en_pp
                de_fin, de_end = aux[person], [verb.participle]
                de_sub_fin = aux[person]
            else:
                en_aux, en_main = "will", en_base
                de_fin, de_end = _WERDEN[person], [verb.inf]
                de_sub_fin = _WERDEN[person]
            parts.update(kind="verb", en_aux=en_aux, en_main=en_main, de_fin=de_fin, de_end=de_end,
                         de_sub_fin=de_sub_fin, en_obj=en_mid, de_mid=de_mid, en_base=en_base,
                         en_do=("does" if _en_third(person) else "do"), verb=verb)
        if rng.random() < 0.35:
            parts["pp"] = self.prep_phrase()
        if adverb and rng.random() < 0.4:
            parts["adverb"] = rng.choice(_ADVERBS["past" if tense in ("past", "perfect") else tense])
            if tense == "perfect":  # "yesterday" goes with the simple past in English
                parts["tense"] = "past"
                if parts["kind"] == "verb":
                    parts["en_aux"], parts["en_main"] = None, parts["verb"].en[2]
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

    def main_clause(self, p: dict[str, Any], *, front_adverb: bool = False) -> tuple[list[str], list[str]]:
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
            en_head = [p["en_aux"], subj.en, p["en_main"]] if p["en_aux"] else [p["en_main"], subj.en]
        elif p["en_aux"]:
            en_head = [p["en_aux"], subj.en, p["en_main"]]
        elif p["tense"] == "past":
            en_head = ["did", subj.en, p["en_base"]]
        else:
            en_head = [p["en_do"], subj.en, p["en_base"]]
        en = en_head + p["en_obj"] + ([p["pp"][0]] if p["pp"] else []) + ([p["adverb"][0]] if p["adverb"] else [])
        de = [p["de_fin"], subj.de] + self._de_middle(p) + p["de_end"]
        return en, de

    # --- sentences

    def sentence(self) -> tuple[str, str]:
        """One English-German pair, detokenized, first letter capitalised."""
        rng = self.rng
        kind = rng.choices(("main", "fronted", "that", "because", "if_front", "question"),
                           weights=(34, 16, 16, 14, 8, 12))[0]
        end = "."
        if kind in ("main", "fronted"):
            p = self.clause()
            en, de = self.main_clause(p, front_adverb=kind == "fronted")
        elif kind == "that":
            subj_en, subj_de, person = rng.choice(_PRONOUNS)
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
        if out and (out[-1], word) in _CONTRACTIONS:
            out[-1] = _CONTRACTIONS[(out[-1], word)]
        else:
            out.append(word)
    return out


def _finish(words: list[str], end: str) -> str:
    text = " ".join(w for w in words if w)
    text = " ".join(text.split())
    return text[:1].upper() + text[1:] + end


# ----------------------------------------------------------------------------- corpus


def generate_pairs(n: int, seed: int | str, *, exclude: set[str] | None = None) -> list[tuple[str, str]]:
    """``n`` pairs of 4..30 words per side from the seed's own stream.

    With ``exclude``, no sentence (either side) is in it, and each accepted sentence is added to
    it, so the pairs are also distinct among themselves.
    """
    rng = random.Random(f"synthetic:{seed}")
    grammar = Grammar(rng)
    pairs: list[tuple[str, str]] = []
    attempts = 0
    while len(pairs) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise CorpusError(f"synthetic grammar could not make {n} distinct pairs (got {len(pairs)})")
        en, de = grammar.sentence()
        if not (MIN_WORDS <= len(en.split()) <= MAX_WORDS and MIN_WORDS <= len(de.split()) <= MAX_WORDS):
            continue
        if exclude is not None:
            if en in exclude or de in exclude:
                continue
            exclude.update((en, de))
        pairs.append((en, de))
    return pairs


def write_corpus(
    out_dir: Path, *, pair: str, seed: int, train: int, dev: int, test: int
) -> dict[str, Any]:
    """Write ``train/synthetic.{en,de}``, ``dev.{en,de}``, ``test.{en,de}``; returns line counts.

    Train, dev and test come from separate streams of ``seed``; dev and test share no sentence
    (on either side) with train or with each other.
    """
    if pair not in PAIRS:
        raise CorpusError(f"data.pair: the synthetic corpus is English-German, not {pair!r}")
    out_dir = Path(out_dir)
    (out_dir / "train").mkdir(parents=True, exist_ok=True)
    train_pairs = generate_pairs(train, f"{seed}:train")
    seen = {s for p in train_pairs for s in p}
    dev_pairs = generate_pairs(dev, f"{seed}:dev", exclude=seen)
    seen.update(s for p in dev_pairs for s in p)
    test_pairs = generate_pairs(test, f"{seed}:test", exclude=seen)
    for name, pairs in ((f"train/{CORPUS}", train_pairs), ("dev", dev_pairs), ("test", test_pairs)):
        for i, lang in enumerate(("en", "de")):
            text = "".join(p[i] + "\n" for p in pairs)
            (out_dir / f"{name}.{lang}").write_text(text, encoding="utf-8")
    return {"corpus": CORPUS, "train": len(train_pairs), "dev": len(dev_pairs), "test": len(test_pairs)}
