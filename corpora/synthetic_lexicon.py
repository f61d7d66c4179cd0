"""The synthetic English-German grammar's lexicon: nouns, verbs and the function words with
their German inflection tables (a data table: exempt from the module size limit)."""

from __future__ import annotations

from dataclasses import dataclass

# (english singular, english plural, gender, german singular, german plural, class)
NOUNS = """
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

# A domain's own nouns (``data.synthetic_domain``): words the general grammar never uses, for a
# corpus to adapt a model to (configs/quickstart_finetune.yaml). Same columns as NOUNS.
OFFICE_NOUNS = """
engineer engineers m Ingenieur Ingenieure person
manager managers m Manager Manager person
developer developers m Entwickler Entwickler person
technician technicians m Techniker Techniker person
secretary secretaries f Sekretärin Sekretärinnen person
boss bosses f Chefin Chefinnen person
user users m Benutzer Benutzer person
accountant accountants f Buchhalterin Buchhalterinnen person
printer printers m Drucker Drucker thing
screen screens m Bildschirm Bildschirme thing
keyboard keyboards f Tastatur Tastaturen thing
invoice invoices f Rechnung Rechnungen thing
file files f Datei Dateien thing
password passwords n Passwort Passwörter thing
server servers m Server Server thing
cable cables n Kabel Kabel thing
report reports m Bericht Berichte thing
contract contracts m Vertrag Verträge thing
folder folders m Ordner Ordner thing
message messages f Nachricht Nachrichten thing
document documents n Dokument Dokumente thing
warehouse warehouses n Lager Lager place
factory factories f Fabrik Fabriken place
bank banks f Bank Banken place
library libraries f Bibliothek Bibliotheken place
airport airports m Flughafen Flughäfen place
"""
DOMAIN_NOUNS = {"office": OFFICE_NOUNS}
"""``data.synthetic_domain`` -> its nouns."""

# (english, german predicative form, german stem that takes endings)
ADJECTIVES = """
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

# english: base|3sg|past|participle ; german: infinitive|ich|du|er/sie|participle|aux ;
# frame ; object class. An indented line continues the verb above it.
# A separable German verb is written prefix+infinitive with a "+": an+rufen; its present forms
# are those of the stem verb (rufe, rufst, ruft).
VERBS = """
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
repair|repairs|repaired|repaired ;
    reparieren|repariere|reparierst|repariert|repariert|haben ; tr ; object
draw|draws|drew|drawn ; zeichnen|zeichne|zeichnest|zeichnet|gezeichnet|haben ; tr ; any
hold|holds|held|held ; halten|halte|hältst|hält|gehalten|haben ; tr ; object
call|calls|called|called ; an+rufen|rufe|rufst|ruft|angerufen|haben ; tr ; person
pick up|picks up|picked up|picked up ; ab+holen|hole|holst|holt|abgeholt|haben ; tr ; animate
invite|invites|invited|invited ; ein+laden|lade|lädst|lädt|eingeladen|haben ; tr ; person
put on|puts on|put on|put on ; an+ziehen|ziehe|ziehst|zieht|angezogen|haben ; tr ; clothing
switch on|switches on|switched on|switched on ;
    ein+schalten|schalte|schaltest|schaltet|eingeschaltet|haben ; tr ; device
bring back|brings back|brought back|brought back ;
    zurück+bringen|bringe|bringst|bringt|zurückgebracht|haben ; tr ; object
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
fall asleep|falls asleep|fell asleep|fallen asleep ;
    ein+schlafen|schlafe|schläfst|schläft|eingeschlafen|sein ; intr ;
"""

# verbs that take a "that" clause: english base|3sg ; german infinitive|ich|du|er
SAY_VERBS = """
think|thinks ; denken|denke|denkst|denkt
know|knows ; wissen|weiß|weißt|weiß
say|says ; sagen|sage|sagst|sagt
hope|hopes ; hoffen|hoffe|hoffst|hofft
believe|believes ; glauben|glaube|glaubst|glaubt
"""

# which noun classes each object class allows
OBJECT_CLASSES = {
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
PRONOUNS = (
    ("I", "ich", "1sg"),
    ("you", "du", "2sg"),
    ("he", "er", "3sg"),
    ("she", "sie", "3sg"),
    ("we", "wir", "1pl"),
    ("they", "sie", "3pl"),
)
# object pronouns: english, german accusative, german dative
OBJECT_PRONOUNS = (
    ("me", "mich", "mir"),
    ("you", "dich", "dir"),
    ("him", "ihn", "ihm"),
    ("her", "sie", "ihr"),
    ("us", "uns", "uns"),
    ("them", "sie", "ihnen"),
)
POSSESSIVES = (
    ("my", "mein"),
    ("your", "dein"),
    ("his", "sein"),
    ("her", "ihr"),
    ("our", "unser"),
    ("their", "ihr"),
)
NUMBERS = (
    "two zwei",
    "three drei",
    "four vier",
    "five fünf",
    "six sechs",
    "seven sieben",
    "eight acht",
    "nine neun",
    "ten zehn",
    "eleven elf",
    "twelve zwölf",
    "thirteen dreizehn",
    "fourteen vierzehn",
    "fifteen fünfzehn",
    "sixteen sechzehn",
    "seventeen siebzehn",
    "eighteen achtzehn",
    "nineteen neunzehn",
    "twenty zwanzig",
)
# (english, german, case, noun classes)
PREPOSITIONS = (
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
ADVERBS = {
    "present": (
        ("today", "heute"),
        ("now", "jetzt"),
        ("often", "oft"),
        ("sometimes", "manchmal"),
        ("every day", "jeden Tag"),
        ("in the morning", "am Morgen"),
        ("in the evening", "am Abend"),
    ),
    "past": (
        ("yesterday", "gestern"),
        ("last week", "letzte Woche"),
        ("last year", "letztes Jahr"),
        ("on Sunday", "am Sonntag"),
    ),
    "future": (
        ("tomorrow", "morgen"),
        ("next week", "nächste Woche"),
        ("next year", "nächstes Jahr"),
        ("soon", "bald"),
    ),
}
CONTRACTIONS = {
    ("in", "dem"): "im",
    ("von", "dem"): "vom",
    ("in", "das"): "ins",
    ("zu", "dem"): "zum",
}

# German declension: case index nom=0, acc=1, dat=2; gender m/f/n or pl
CASES = {"nom": 0, "acc": 1, "dat": 2}
DER = {
    "m": ("der", "den", "dem"),
    "f": ("die", "die", "der"),
    "n": ("das", "das", "dem"),
    "pl": ("die", "die", "den"),
}
DIES = {
    "m": ("dieser", "diesen", "diesem"),
    "f": ("diese", "diese", "dieser"),
    "n": ("dieses", "dieses", "diesem"),
    "pl": ("diese", "diese", "diesen"),
}
EIN_ENDINGS = {
    "m": ("", "en", "em"),
    "f": ("e", "e", "er"),
    "n": ("", "", "em"),
    "pl": ("e", "e", "en"),
}
WEAK = {
    "m": ("e", "en", "en"),
    "f": ("e", "e", "en"),
    "n": ("e", "e", "en"),
    "pl": ("en", "en", "en"),
}
MIXED = {
    "m": ("er", "en", "en"),
    "f": ("e", "e", "en"),
    "n": ("es", "es", "en"),
    "pl": ("en", "en", "en"),
}
STRONG_PL = ("e", "e", "en")


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


def parse_nouns(table: str = NOUNS) -> tuple[Noun, ...]:
    return tuple(Noun(*line.split()) for line in table.strip().splitlines())


def _records(table: str) -> list[str]:
    """The table's lines, each indented line joined to the record above it."""
    records: list[str] = []
    for line in table.strip().splitlines():
        if line[:1].isspace() and records:
            records[-1] += " " + line.strip()
        else:
            records.append(line)
    return records


def parse_verbs() -> tuple[Verb, ...]:
    verbs = []
    for line in _records(VERBS):
        en, de, frame, obj = (part.strip() for part in line.split(";"))
        inf, ich, du, er, participle, aux = de.split("|")
        prefix, _, stem_inf = inf.rpartition("+")
        forms: dict[str, str] = {"1sg": ich, "2sg": du, "3sg": er, "1pl": stem_inf, "3pl": stem_inf}
        base, third, past, en_participle = en.split("|")
        verbs.append(
            Verb(
                (base, third, past, en_participle),
                prefix + stem_inf,
                prefix,
                forms,
                participle,
                aux,
                frame,
                obj,
            )
        )
    return tuple(verbs)


def parse_say_verbs() -> tuple[tuple[tuple[str, str], dict[str, str]], ...]:
    out: list[tuple[tuple[str, str], dict[str, str]]] = []
    for line in SAY_VERBS.strip().splitlines():
        en, de = (part.strip() for part in line.split(";"))
        inf, ich, du, er = de.split("|")
        base, third = en.split("|")
        out.append(((base, third), {"1sg": ich, "2sg": du, "3sg": er, "1pl": inf, "3pl": inf}))
    return tuple(out)


HABEN = {"1sg": "habe", "2sg": "hast", "3sg": "hat", "1pl": "haben", "3pl": "haben"}
SEIN = {"1sg": "bin", "2sg": "bist", "3sg": "ist", "1pl": "sind", "3pl": "sind"}
WERDEN = {"1sg": "werde", "2sg": "wirst", "3sg": "wird", "1pl": "werden", "3pl": "werden"}
EN_BE = {"1sg": "am", "2sg": "are", "3sg": "is", "1pl": "are", "3pl": "are"}
