"""Languages of the world: word-order presets, generated word forms, and rendering of events into text.

Every language renders the same `Event` objects: a word-order pass builds a sequence of English surface
tokens, then a per-type lexical map turns them into the language's words (identity for English). So a
perfect word-by-word mapping exists (written to `lexicon/<lang>.tsv`) and translations are exact.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from .grammar import LEXICON, NP, Event, past, third_singular


@dataclass(frozen=True)
class Language:
    """A language preset. Order and script knobs set how far it is from English."""

    code: str
    order: str = "SVO"
    """Clause order: SVO (English), SOV (verb-final; a passive's auxiliary after the participle, unless aux="second")
    or VSO."""
    adj: str = "pre"
    """Adjective before ("pre") or after ("post") the noun."""
    adpos: str = "pre"
    """Prepositions ("pre") or postpositions ("post")."""
    sub: str = "after"
    """Subordinate clause after the main clause ("after": main conj sub) or before it (sub conj , main)."""
    case: str = "none"
    """Role marking (CASES): none (English: word order alone says who acts), or nom-acc: a particle after every
    subject and another after every active object, as Japanese ga/o or Korean i/eul."""
    aux: str = "verb"
    """Where a passive's auxiliary goes: beside the participle ("verb": English "was chased", verb-final
    "chased was") or right after the subject ("second": a second-position auxiliary, as in Croatian or
    Warlpiri; the participle stays in the verb's place)."""
    script: str = "latin"
    """Script of generated word forms: latin | cyrillic | greek."""
    lexicon: str = ""
    """Word-form stream: languages with the same name share word forms (t2 = t1's words, other order)."""
    share_words: float = 0.0
    """Share of content lemmas (nouns, verbs, adjectives) kept identical to English, like loanwords."""
    share_names: bool = True
    """Proper names identical to English (else transliterated into `script`)."""
    share_numbers: bool = True
    """Numerals identical to English (else each numeral is a generated word). Punctuation is always shared."""
    description: str = ""

    def check(self) -> None:
        bad = [(k, v) for k, v, ok in (("order", self.order, ("SVO", "SOV", "VSO")),
                                       ("adj", self.adj, ("pre", "post")), ("adpos", self.adpos, ("pre", "post")),
                                       ("sub", self.sub, ("after", "before")), ("script", self.script, SCRIPTS),
                                       ("case", self.case, CASES), ("aux", self.aux, ("verb", "second")))
               if v not in ok]
        if bad or not 0.0 <= self.share_words <= 1.0:
            raise ValueError(f"language {self.code!r}: bad setting(s) {bad or ('share_words', self.share_words)}")

    def as_dict(self) -> dict:
        return asdict(self)


ENGLISH = Language("en", description="source language")
# Presets from easy to hard. Codes contain a digit so they cannot collide with ISO 639 codes.
PRESETS = {lang.code: lang for lang in (
    Language("t1", lexicon="a", share_words=0.1, description="renamed words, English order, Latin script"),
    Language("t2", order="SOV", adpos="post", sub="before", case="nom-acc", aux="second", lexicon="a",
             share_words=0.1, description="t1's words; verb-final, nominative and accusative particles, "
                                          "postpositions, subordinate clause first, passive auxiliary second"),
    Language("t3", order="SOV", adj="post", adpos="post", sub="before", script="cyrillic", lexicon="c",
             share_names=False, description="Cyrillic script, verb-final, only numbers and punctuation shared"),
    Language("t4", order="VSO", adj="post", script="greek", lexicon="g", share_words=0.05,
             description="Greek script, verb-initial, noun-adjective, names and numbers shared"),
)}


def get_language(code: str) -> Language:
    if code == "en":
        return ENGLISH
    if code not in PRESETS:
        raise ValueError(f"unknown world language {code!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[code]


# ------------------------------------------------------------------------------------------ word forms

CASES = {"none": {}, "nom-acc": {"subject": "<nom>", "object": "<acc>"}}
"""Role-marking systems: the particle a noun phrase takes by its function (a passive's agent keeps the by-adposition).
The keys are not English words: the word map, and so lexicon/<lang>.tsv, maps them to the language's particles."""

LATIN_C, LATIN_V = "ptkbdgmnlrsvz", "aeiou"
SCRIPTS = {
    "latin": {},
    "cyrillic": dict(zip("ptkbdgmnlrsvzaeiou", "пткбдгмнлрсвзаеиоу")),
    "greek": dict(zip("ptkbdgmnlrsvzaeiou", "πτκβδγμνλρσφζαειου")),
}
# Latin letters the transliteration of names may meet beyond the syllable inventory.
NAME_EXTRA = {"cyrillic": dict(zip("cfhjwyx", "цфхжвйкс")), "greek": dict(zip("cfhjwyx", "κφχζβυξ"))}


def transliterate(word: str, script: str) -> str:
    table = {**SCRIPTS[script], **NAME_EXTRA.get(script, {})}
    out = "".join(table.get(ch, ch) for ch in word.lower())
    return out[:1].upper() + out[1:] if word[:1].isupper() else out


class _Forms:
    """Draws fresh pseudo-words (CV/CVC syllables) that collide with no English form and no earlier draw."""

    def __init__(self, rng: random.Random, taken: set[str], consonants: str):
        self.rng, self.taken, self.cons = rng, taken, consonants

    def syllable(self, closed_p: float = 0.3) -> str:
        r = self.rng
        s = r.choice(self.cons) + r.choice(LATIN_V)
        return s + r.choice("nlrsm") if r.random() < closed_p else s

    def word(self, syllables: tuple[int, int], suffixes: tuple[str, ...] = ("",)) -> str:
        """A stem whose every `stem + suffix` is new; all of them are reserved."""
        while True:
            stem = "".join(self.syllable() for _ in range(self.rng.randint(*syllables)))
            forms = [stem + s for s in suffixes]
            if not any(f in self.taken for f in forms):
                self.taken.update(forms)
                return stem


def build_wordmap(lang: Language, seed: int) -> dict[str, str]:
    """English surface form -> this language's form. Deterministic in (seed, lang.lexicon, lang settings).

    Inflection is regular in the new language: one suffix per inflection kind, so "dogs"/"cats" share a
    plural ending the way English shares "-s". English "a"/"an" map to one word.
    """
    if lang.code == "en":
        return {f: f for f, _, _ in LEXICON.forms()}
    forms = LEXICON.forms()
    rng = random.Random(f"{seed}:lexicon:{lang.lexicon or lang.code}")
    taken = {f.lower() for f, _, _ in forms}
    gen = _Forms(rng, taken, rng.choice((LATIN_C, LATIN_C[:-2], LATIN_C[2:])))
    sfx = {k: gen.word((1, 1)) for k in ("noun.pl", "verb.3sg", "verb.past")}
    sfx["verb.base"] = gen.word((1, 1))[:1] + "a"  # plural-agreement present: a short ending
    endings = {"noun": ("", sfx["noun.pl"]), "verb": (sfx["verb.base"], sfx["verb.3sg"], sfx["verb.past"])}
    content = sorted({lemma for _, lemma, kind in forms if kind.split(".")[0] in ("noun", "verb", "adj")})
    shared = set(rng.sample(content, round(lang.share_words * len(content))))
    stems: dict[str, str] = {}
    out: dict[str, str] = {}
    for form, lemma, kind in forms:
        pos, _, infl = kind.partition(".")
        if kind == "punct" or (kind == "number" and lang.share_numbers) or lemma in shared:
            out[form] = form
        elif kind == "name":
            out[form] = form if lang.share_names else transliterate(form, lang.script)
        elif kind == "function" or kind == "number":  # an unshared numeral becomes a number word
            out[form] = out["a"] if form == "an" else gen.word((1, 2))
        else:
            if lemma not in stems:
                stems[lemma] = gen.word((2, 3), endings.get(pos, ("",)))
            stem = stems[lemma]
            out[form] = stem if pos == "adj" or infl == "sg" else stem + sfx[kind]
    particles = sorted(CASES[lang.case].values())
    for key in particles:  # drawn last, so every other form is the same as in a language without case
        out[key] = gen.word((1, 1))
    if lang.script != "latin":
        form_kind = {f: kind for f, _, kind in forms} | dict.fromkeys(particles, "function")
        for k, v in out.items():
            if v != k and form_kind[k] != "name":  # names were transliterated above
                out[k] = transliterate(v, lang.script)
    return out


# ------------------------------------------------------------------------------------------- rendering


class Renderer:
    """Renders events in one language; `tokens` returns the words and the token span of every NP core."""

    def __init__(self, lang: Language, seed: int):
        lang.check()
        self.lang = lang
        self.map = build_wordmap(lang, seed)
        self.cases = CASES[lang.case]
        self.is_source = lang.code == "en"

    # -- noun phrases
    def _np(self, np: NP, out: list[str], spans: dict[int, tuple[int, int]], role: str | None = None) -> None:
        """`role` ("subject", "object"): its case particle, if the language has one, follows the noun phrase's
        core, before any relative clause (next to the head noun, like a Turkish case suffix)."""
        start = len(out)
        if np.det in ("name", "pro"):
            out.append(np.noun)
        else:
            noun = LEXICON.noun_plural[np.noun] if np.plural else np.noun
            out.append(np.det)
            if np.adj is None:
                out.append(noun)
            elif self.lang.adj == "pre":
                out += (np.adj, noun)
            else:
                out += (noun, np.adj)
        spans[id(np)] = (start, len(out))
        if role in self.cases:
            out.append(self.cases[role])
        if np.rel is not None:
            out.append("that")
            self._clause(np.rel, out, spans, head=np)

    def _pp(self, prep: str, np: NP, out: list[str], spans) -> None:
        if self.lang.adpos == "pre":
            out.append(prep)
            self._np(np, out, spans)
        else:
            self._np(np, out, spans)
            out.append(prep)

    # -- clauses
    def _clause(self, ev: Event, out: list[str], spans, head: NP | None = None) -> None:
        subj, obj = (ev.patient, ev.agent) if ev.passive else (ev.agent, ev.patient)
        pl = (head if subj is None else subj).plural
        aux = None
        if ev.passive:
            aux = ("were" if pl else "was") if ev.past else ("are" if pl else "is")
            if self.lang.aux == "second":
                verb = [past(ev.verb)]
            else:
                verb = [past(ev.verb), aux] if self.lang.order == "SOV" else [aux, past(ev.verb)]
                aux = None
        else:
            verb = [past(ev.verb) if ev.past else ev.verb if pl else third_singular(ev.verb)]

        def S():
            if subj is not None:
                self._np(subj, out, spans, "subject")
            if aux is not None:  # a second-position auxiliary
                out.append(aux)

        def O():  # the object, or the passive's by-phrase
            if obj is not None:
                if ev.passive:
                    self._pp("by", obj, out, spans)
                else:
                    self._np(obj, out, spans, "object")

        def A():
            for prep, np in ev.adjuncts:
                self._pp(prep, np, out, spans)

        def V():
            out.extend(verb)

        order = {"SVO": (S, V, O, A), "SOV": (S, A, O, V), "VSO": (V, S, O, A)}[self.lang.order]
        if ev.sub is not None and self.lang.sub == "before":
            self._clause(ev.sub[1], out, spans)
            out += (ev.sub[0], ",")
        for part in order:
            part()
        if ev.sub is not None and self.lang.sub == "after":
            out.append(ev.sub[0])
            self._clause(ev.sub[1], out, spans)

    def tokens(self, ev: Event, end: str = ".") -> tuple[list[str], dict[int, tuple[int, int]]]:
        out: list[str] = []
        spans: dict[int, tuple[int, int]] = {}
        self._clause(ev, out, spans)
        out.append(end)
        if self.is_source:  # English "a" -> "an" before a vowel; other languages map both to one word
            for i, t in enumerate(out[:-1]):
                if t == "a" and out[i + 1][0] in "aeiou":
                    out[i] = "an"
        m = self.map
        return [m[t] for t in out], spans

    def text(self, ev: Event, end: str = ".") -> str:
        return " ".join(self.tokens(ev, end)[0])
