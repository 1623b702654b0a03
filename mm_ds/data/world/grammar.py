"""The source language "en": its lexicon, the semantic representation of a sentence, and a seeded sampler.

A sentence is an `Event` (verb, agent, patient, tense, voice, adjuncts, subordinate clause); every noun
phrase (`NP`) carries its class, number and animacy. Task labels are computed from these objects, never
from surface words, and every language renders the same objects (so translations are exact).
"""

from __future__ import annotations

import itertools
import random
from bisect import bisect
from dataclasses import dataclass

# ------------------------------------------------------------------------------------------ the lexicon

# Noun classes. Their sizes are deliberately unequal: with equal classes, Step 2 once converged to a
# permuted class mapping (zero-shot 0.5%, systematically inverted). "word:plural" gives irregular plurals.
NOUNS = {
    "person": """man:men woman:women boy girl child:children teacher doctor farmer baker driver nurse soldier
        pilot singer painter dancer student lawyer king queen guard sailor miner hunter cook waiter judge clerk
        writer player captain merchant priest tailor porter actor pupil neighbor scientist""",
    "animal": """dog cat horse cow goat pig bird fox wolf:wolves bear rabbit mouse:mice duck goose:geese frog
        snake lion tiger monkey donkey owl hen chicken crow rat parrot camel""",
    "food": """apple cake pie egg banana orange carrot potato:potatoes tomato:tomatoes sandwich cookie lemon
        pear plum onion melon biscuit""",
    "thing": """box chair table book cup bottle door window lamp basket bag hammer knife:knives spoon plate
        bowl clock key ball bell bucket brush coin candle fence gate ladder rope shoe hat coat shirt blanket
        pillow pencil letter map mirror jar kettle pan pot drum flute guitar boat wagon bicycle wheel sign
        statue toy doll kite umbrella wallet ring necklace helmet shield sword spear net tent barrel crate
        sack bench shelf:shelves desk bed sofa carpet""",
    "place": """garden house park river kitchen school market forest field village street bridge church farm
        harbor station square hill valley beach yard shop library castle""",
    "force": """truck wind storm machine wave flood fire rock train car engine tractor boulder bulldozer
        avalanche""",
}
ANIMATE_CLASSES = frozenset({"person", "animal"})

# Proper names: singular, animate, class "person"; identical in languages that share names.
NAMES = """Anna Boris Clara David Elena Felix Greta Hugo Ines Jonas Karla Leon Maria Nico Olga Pavel Rosa
    Simon Tanja Viktor Wanda Yuri Zora Emil Lena Otto Ida Mira Tomas Vera""".split()

# Transitive verbs select agent and patient classes; most accept animate AND inanimate agents, so the
# verb alone does not give away the agent's animacy.
TRANSITIVE = """
    help thank greet invite warn call    : person | person animal
    visit                                : person | person place
    follow watch chase scare             : person animal | person animal
    carry push pull lift move drop touch : person animal force | thing food person animal
    hit knock block                      : person animal force | person animal thing
    crush damage destroy smash wreck bury : force person animal | thing place food
    clean paint fix wash open close polish repair : person | thing place
    cook bake taste slice peel           : person | food
    sniff lick                           : animal | food thing person
"""
INTRANSITIVE = """
    laugh smile shout dance cry wait rest yawn sneeze whistle : person
    jump bark growl play wander rest     : animal
    crash stop roll rattle explode collapse vanish : force
"""
ADJECTIVES = """
    happy sad angry tired young old tall brave clever busy : person
    wild hungry tiny fierce furry young old sleepy          : animal
    red blue green heavy broken wooden shiny old new small big : thing
    fresh sweet ripe warm salty                             : food
    quiet busy dark empty old big small                     : place
    loud strong huge fast old                               : force
"""
PREPOSITIONS = {"in": "place", "near": "place", "behind": "place", "beside": "place", "under": "place",
                "with": "thing", "for": "person"}
CONJUNCTIONS = ("because", "while", "after", "before", "when")
COUNTS = tuple(str(n) for n in range(2, 13))  # numeral determiners of plural NPs: shared tokens
YEARS = tuple(str(y) for y in range(1950, 2020))  # "in 1987": more shared number tokens
PUNCT = (".", ",", "?")
# Function words of the tasks: hypothesis pronouns (NLI) and question words (QA).
PRONOUNS = {"one": (False, None), "many": (True, None), "someone": (False, True), "something": (False, False),
            "it": (False, None), "who": (False, True), "what": (False, False)}
FUNCTION = ("the", "a", "an", "some", "that", "by", "is", "are", "was", "were")
DOUBLED = {"drop", "stop"}  # consonant doubling before -ed


def _table(text: str) -> dict[str, tuple[frozenset, ...]]:
    """`words : cls cls | cls` lines -> {word: (classes, classes)}, merging repeated words."""
    out: dict[str, tuple[frozenset, ...]] = {}
    for line in text.strip().splitlines():
        words, sel = line.split(":")
        groups = tuple(frozenset(g.split()) for g in sel.split("|"))
        for w in words.split():
            old = out.get(w)
            out[w] = groups if old is None else tuple(a | b for a, b in zip(old, groups))
    return out


def third_singular(v: str) -> str:
    if v.endswith(("s", "sh", "ch", "x", "z")):
        return v + "es"
    if v.endswith("y") and v[-2] not in "aeiou":
        return v[:-1] + "ies"
    return v + "s"


def past(v: str) -> str:
    if v.endswith("e"):
        return v + "d"
    if v.endswith("y") and v[-2] not in "aeiou":
        return v[:-1] + "ied"
    return v + (v[-1] if v in DOUBLED else "") + "ed"


def plural(n: str) -> str:
    return n + "es" if n.endswith(("s", "sh", "ch", "x")) else n + "s"


@dataclass(frozen=True)
class Lexicon:
    """English lemmas by category, with their surface forms."""

    nouns: dict[str, list[str]]          # class -> lemmas
    noun_plural: dict[str, str]          # lemma -> plural form
    noun_class: dict[str, str]           # lemma -> class
    transitive: dict[str, tuple[frozenset, frozenset]]
    intransitive: dict[str, frozenset]
    adjectives: dict[str, frozenset]

    def forms(self) -> list[tuple[str, str, str]]:
        """Every English surface type as (form, lemma, kind); kind names the inflection (for word forms)."""
        out = [(p, p, "punct") for p in PUNCT] + [(c, c, "number") for c in COUNTS + YEARS]
        out += [(n, n, "name") for n in NAMES]
        out += [(w, w, "function") for w in FUNCTION + tuple(PREPOSITIONS) + CONJUNCTIONS + tuple(PRONOUNS)]
        for cls in self.nouns.values():
            for n in cls:
                out += [(n, n, "noun.sg"), (self.noun_plural[n], n, "noun.pl")]
        for v in sorted(set(self.transitive) | set(self.intransitive)):
            out += [(v, v, "verb.base"), (third_singular(v), v, "verb.3sg"), (past(v), v, "verb.past")]
        out += [(a, a, "adj") for a in self.adjectives]
        return out


def build_lexicon() -> Lexicon:
    nouns, noun_plural, noun_class = {}, {}, {}
    for cls, text in NOUNS.items():
        nouns[cls] = []
        for item in text.split():
            sg, _, pl = item.partition(":")
            nouns[cls].append(sg)
            noun_plural[sg] = pl or plural(sg)
            noun_class[sg] = cls
    tr = {v: (g[0], g[1]) for v, g in _table(TRANSITIVE).items()}
    intr = {v: g[0] for v, g in _table(INTRANSITIVE).items()}
    adj = {a: g[0] for a, g in _table(ADJECTIVES).items()}
    return Lexicon(nouns, noun_plural, noun_class, tr, intr, adj)


LEXICON = build_lexicon()
# Class sets in a fixed order, so seeded draws do not depend on set iteration order.
_SORTED = {cs: tuple(sorted(cs)) for sel in (*LEXICON.transitive.values(), *LEXICON.intransitive.values())
           for cs in (sel if isinstance(sel, tuple) else (sel,))}

# ----------------------------------------------------------------------------- semantic representation


@dataclass(frozen=True, slots=True)
class NP:
    """A noun phrase: `det` is "the" | "a" | "some" | a numeral | "name" | "pro" (pronoun: noun is the word)."""

    noun: str
    cls: str
    plural: bool
    det: str
    adj: str | None = None
    rel: "Event | None" = None  # subject-gap relative clause: the head is the clause's subject

    @property
    def animate(self) -> bool:
        if self.det == "pro":
            return bool(PRONOUNS[self.noun][1])
        return self.cls in ANIMATE_CLASSES


@dataclass(frozen=True, slots=True)
class Event:
    """One clause. `agent`/`patient` are None for the gap of a relative clause (and patient for intransitives)."""

    verb: str
    agent: NP | None
    patient: NP | None
    past: bool
    passive: bool = False
    adjuncts: tuple[tuple[str, NP], ...] = ()  # (preposition, NP)
    sub: tuple[str, "Event"] | None = None      # (conjunction, subordinate clause)

    def verbs(self) -> list[str]:
        """Every verb lemma in the clause, its relative clauses and subordinate clause."""
        out = [self.verb]
        for np in (self.agent, self.patient, *(n for _, n in self.adjuncts)):
            if np is not None and np.rel is not None:
                out += np.rel.verbs()
        if self.sub is not None:
            out += self.sub[1].verbs()
        return out


def pronoun(word: str) -> NP:
    return NP(word, "pro", PRONOUNS[word][0], "pro")


def _determiner(rng: random.Random, plural: bool) -> str:
    if plural:
        r = rng.random()
        return "the" if r < 0.55 else "some" if r < 0.75 else rng.choice(COUNTS)
    return "the" if rng.random() < 0.65 else "a"


# --------------------------------------------------------------------------------------------- sampler


def zipf_cum(n: int, a: float = 1.0) -> list[float]:
    return list(itertools.accumulate(1.0 / (r + 1) ** a for r in range(n)))


class Sampler:
    """Draws events with Zipfian word choice. The seed fixes the frequency ranks of the lexicon (world
    identity); the rng passed to each call draws sentences (so corpora and tasks use separate streams)."""

    def __init__(self, seed: int, *, passive_p: float = 0.2, rel_p: float = 0.12, sub_p: float = 0.1,
                 adjunct_p: float = 0.25, year_p: float = 0.06, adj_p: float = 0.3, plural_p: float = 0.4,
                 name_p: float = 0.2, intransitive_p: float = 0.2):
        rank = random.Random(f"{seed}:ranks")
        lex = LEXICON

        def ranked(words):
            words = list(words)
            rank.shuffle(words)
            return words, zipf_cum(len(words))

        self.nouns = {cls: ranked(ws) for cls, ws in lex.nouns.items()}
        self.names = ranked(NAMES)
        self.transitive = ranked(sorted(lex.transitive))
        self.intransitive = ranked(sorted(lex.intransitive))
        self.adjs = {cls: ranked(sorted(a for a, cs in lex.adjectives.items() if cls in cs)) for cls in NOUNS}
        self.agent_verbs = {cls: ranked(sorted(v for v, (ag, _) in lex.transitive.items() if cls in ag))
                            for cls in NOUNS}
        self.patient_verbs = {cls: ranked(sorted(v for v, (_, pa) in lex.transitive.items() if cls in pa))
                              for cls in NOUNS}
        self.intr_verbs = {cls: ranked(sorted(v for v, s in lex.intransitive.items() if cls in s))
                           for cls in NOUNS}
        self.p = dict(passive=passive_p, rel=rel_p, sub=sub_p, adjunct=adjunct_p, year=year_p, adj=adj_p,
                      plural=plural_p, name=name_p, intransitive=intransitive_p)
        self.cast: dict[str, list[str]] = {}  # per-document recurring nouns (set by the corpus writer)

    @staticmethod
    def pick(rng: random.Random, table) -> str:
        words, cum = table  # what rng.choices(words, cum_weights=cum) does, without its overhead
        return words[bisect(cum, rng.random() * cum[-1], 0, len(cum) - 1)]

    def noun_phrase(self, rng: random.Random, cls: str, depth: int = 0, *, names: bool = True) -> NP:
        p = self.p
        if cls == "person" and names and rng.random() < p["name"]:
            return NP(self.pick(rng, self.names), cls, False, "name")
        cast = self.cast.get(cls)
        noun = rng.choice(cast) if cast and rng.random() < 0.35 else self.pick(rng, self.nouns[cls])
        pl = rng.random() < p["plural"]
        det = _determiner(rng, pl)
        adj = self.pick(rng, self.adjs[cls]) if rng.random() < p["adj"] else None
        rel = None
        if depth == 0 and rng.random() < p["rel"]:
            rel = self.relative(rng, cls)
        return NP(noun, cls, pl, det, adj, rel)

    def relative(self, rng: random.Random, cls: str) -> Event:
        """A subject-gap relative clause on a head of class `cls` (object-gap clauses would be ambiguous in
        verb-final languages without case marking, such as t3)."""
        past_t = rng.random() < 0.5
        can_agent = self.agent_verbs[cls][0]
        r = rng.random()
        if self.intr_verbs[cls][0] and r < 0.3:
            return Event(self.pick(rng, self.intr_verbs[cls]), None, None, past_t)
        if can_agent and (r < 0.75 or not self.patient_verbs[cls][0]):
            verb = self.pick(rng, self.agent_verbs[cls])
            return Event(verb, None, self._np_for(rng, self.lexicon_patients(verb), 1), past_t)
        verb = self.pick(rng, self.patient_verbs[cls])
        return Event(verb, self._np_for(rng, self.lexicon_agents(verb), 1), None, past_t, passive=True)

    @staticmethod
    def lexicon_agents(verb: str) -> frozenset:
        return LEXICON.transitive[verb][0]

    @staticmethod
    def lexicon_patients(verb: str) -> frozenset:
        return LEXICON.transitive[verb][1]

    def _np_for(self, rng, classes: frozenset, depth: int, **kw) -> NP:
        return self.noun_phrase(rng, rng.choice(_SORTED[classes]), depth, **kw)

    def event(self, rng: random.Random, depth: int = 0, *, transitive: bool | None = None,
              passive_p: float | None = None, names: bool = True, clauses: bool = True,
              exclude_verbs: frozenset = frozenset()) -> Event:
        """A random clause. `clauses=False` gives no relative or subordinate clauses."""
        p = self.p
        nd = depth if clauses else 1
        if transitive is None:
            transitive = rng.random() >= p["intransitive"]
        past_t = rng.random() < 0.5
        if transitive:
            verb = self.pick(rng, self.transitive)
            while verb in exclude_verbs:
                verb = self.pick(rng, self.transitive)
            agents, patients = LEXICON.transitive[verb]
            agent = self._np_for(rng, agents, nd, names=names)
            patient = self._np_for(rng, patients, nd, names=names)
            passive = rng.random() < (p["passive"] if passive_p is None else passive_p)
        else:
            verb = self.pick(rng, self.intransitive)
            while verb in exclude_verbs:
                verb = self.pick(rng, self.intransitive)
            agent = self._np_for(rng, LEXICON.intransitive[verb], nd, names=names)
            patient, passive = None, False
        adjuncts = []
        if rng.random() < p["adjunct"]:
            prep = rng.choice(tuple(PREPOSITIONS))
            adjuncts.append((prep, self.noun_phrase(rng, PREPOSITIONS[prep], 1)))
        if rng.random() < p["year"]:
            adjuncts.append(("in", NP(rng.choice(YEARS), "year", False, "name")))
        sub = None
        if depth == 0 and clauses and rng.random() < p["sub"]:
            sub = (rng.choice(CONJUNCTIONS), self.event(rng, 1))
        return Event(verb, agent, patient, past_t, passive, tuple(adjuncts), sub)
