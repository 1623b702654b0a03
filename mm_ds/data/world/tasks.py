"""The world's labelled tasks, decided by the generator's semantics (labels never follow from word presence).

A ~1M-parameter model learned single-sentence semantic properties ("is the agent plural / animate?", half
of the sentences passive) but not subject/object-swap paraphrase pairs (50-53% even in English).
A first design here that checked a second sentence's claim against the first (an XOR of two readings,
with template words absent from the pretraining text) stayed at chance after 600 finetuning updates at any
learning rate. So both pair tasks ask for the class of the DOER (agent) of sentence 1, which needs its
structure: which noun phrase is the subject (English: by order; t2: by case particle).

Bag-of-words proofing: events use the verbs whose agent and patient classes are the same set (follow,
watch, chase, scare: people and animals in both roles) and always pair one person with one animal, so
neither nouns nor verb say who acts; both sentences are past tense (active verbs do not agree).
- PAWS-like (2-way, label 1 = the doer is a person). Sentence 1 is active; sentence 2 tells the same event,
  half the time in the passive voice. Numbers are independent of roles, so the passive auxiliary (which agrees
  with the patient) says nothing about the doer's class. (With sentence 2 in the other voice of a half-passive
  sentence 1 the task stayed at chance after 600 updates.) The passive goes in sentence 2, not sentence 1: with
  a half-passive sentence 1 and an active sentence 2, English has two readings that agree on every item
  (sentence 1's by-phrase, sentence 2's subject), and the finetuning seed picked one. On t2 (case-marked,
  verb-final, agent before a postposition) BL_BASE then got the active half right (85-100%) and the passive
  half at 3-48%, inverted on some seeds: 51-72% per seed, 62 +- 9 over 5 seeds (control 50.5); no finetuning
  rate or length tried made it robust. The doer of an active sentence 1 is its subject in every language, as in the
  XNLI-like task: 95-99% per seed, control 57 (docs/results.md, 2026-11-26). So sentence 2 is a paraphrase a
  model may ignore, and both pair tasks test reading sentence 1's subject; passives are read in QA only.
- NLI (XNLI-like in format, 3-way): the doer is singular (entailment), several people (neutral), or
  several animals (contradiction). Agent and patient
  always differ in number, and both sentences are active (no auxiliary), so every bag of words fits two
  doers with different labels; labels are 1/2, 1/4, 1/4, and bag-of-words stays at the majority rate.
- QA (SQuAD-v1.1-like). Context: 3-5 simple sentences (no relative or subordinate clauses) with distinct
  verbs (40% passive). With clauses, a tiny model reached only 50 F1 in English after 1000 updates; without,
  61 after 1000 and 96 after 2500. Question: "who/what <verb>ed <patient> ?" (answer: the agent NP) or
  "who/what was <verb>ed by <agent> ?" (answer: the patient NP). The answer is the NP's determiner +
  adjective + noun (or name), a contiguous span in every word order.

Swapping agent and patient keeps a pair's bag of words and changes its label (tests check it). Every item
is a semantic object; each language renders it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from .grammar import LEXICON, NP, Event, Sampler, pronoun
from .languages import Renderer

NLI_LABELS = ("entailment", "neutral", "contradiction")
SYMMETRIC_VERBS = tuple(sorted(v for v, (agents, patients) in LEXICON.transitive.items() if agents == patients))
"""Verbs whose agents and patients come from the same classes: the verb cannot tell who acts."""


@dataclass(frozen=True)
class PairItem:
    id: str
    a: Event
    b: Event
    label: str
    genre: str


@dataclass(frozen=True)
class QAItem:
    title: str
    events: tuple[Event, ...]
    questions: tuple[tuple[str, Event, NP], ...]  # (id, question, the answer NP object inside `events`)


def _person(np: NP) -> bool:
    return np.cls == "person"


def nli_label(a: Event, b: Event) -> str:
    """The gold label of a pair from meaning alone: the class of sentence 1's doer."""
    if not a.agent.plural:
        return "entailment"
    return "neutral" if _person(a.agent) else "contradiction"


def paws_label(a: Event, b: Event) -> str:
    return "1" if _person(a.agent) else "0"


def _event(sampler: Sampler, rng: random.Random, person: bool, plural: bool | None, passive_p: float) -> Event:
    """A past-tense event of a symmetric verb: one person and one animal, the doer of the asked kind; with
    `plural` set, the patient has the other number."""
    while True:
        ev = sampler.event(rng, transitive=True, passive_p=passive_p, names=False, clauses=False,
                           exclude_verbs=frozenset(LEXICON.transitive) - frozenset(SYMMETRIC_VERBS))
        a, p = ev.agent, ev.patient
        if _person(a) != person or _person(p) == person or ev.verbs().count(ev.verb) != 1:
            continue
        if plural is not None and (a.plural != plural or p.plural == plural):
            continue
        return replace(ev, past=True)


def nli_items(sampler: Sampler, rng: random.Random, n: int, prefix: str) -> list[PairItem]:
    items = []
    for i in range(n):
        kind = ("person-sg", "animal-sg", "person-pl", "animal-pl")[i % 4]
        ev = _event(sampler, rng, kind.startswith("person"), kind.endswith("pl"), passive_p=0.0)
        items.append(PairItem(f"{prefix}{i}", ev, ev, nli_label(ev, ev), kind))
    rng.shuffle(items)
    return items


def paws_items(sampler: Sampler, rng: random.Random, n: int, prefix: str) -> list[PairItem]:
    items = []
    for i in range(n):
        ev = _event(sampler, rng, person=i % 2 == 0, plural=None, passive_p=0.5)  # sentence 2's voice
        items.append(PairItem(f"{prefix}{i}", replace(ev, passive=False), ev, paws_label(ev, ev), "doer-class"))
    rng.shuffle(items)
    return items


def qa_items(sampler: Sampler, rng: random.Random, n_questions: int, prefix: str) -> list[QAItem]:
    """Paragraphs with 1-2 questions each, `n_questions` questions in all."""
    items, total, p = [], 0, 0
    while total < n_questions:
        events, used = [], set()
        for k in range(rng.randint(3, 5)):
            while True:
                ev = sampler.event(rng, transitive=k < 2 or rng.random() < 0.7, passive_p=0.4,
                                   exclude_verbs=frozenset(used), clauses=False)
                verbs = ev.verbs()
                if len(set(verbs)) == len(verbs) and not used.intersection(verbs):
                    break
            used.update(verbs)
            events.append(ev)
        asked = [e for e in events if e.patient is not None]
        qs = []
        for j, ev in enumerate(rng.sample(asked, min(len(asked), rng.choice((1, 2)), n_questions - total))):
            if rng.random() < 0.5:  # ask for the agent
                ans, other = ev.agent, ev.patient
                wh = pronoun("who" if ans.animate else "what")
                q = Event(ev.verb, wh, _mention(other, rng), ev.past)
            else:
                ans, other = ev.patient, ev.agent
                wh = pronoun("who" if ans.animate else "what")
                q = Event(ev.verb, _mention(other, rng), wh, ev.past, passive=True)
            qs.append((f"{prefix}{p}-{j}", q, ans))
        items.append(QAItem(f"{prefix}{p}", tuple(events), tuple(qs)))
        total += len(qs)
        p += 1
    return items


def _mention(np: NP, rng: random.Random) -> NP:
    """How a question refers to a context NP: no relative clause, adjective sometimes dropped."""
    return replace(np, rel=None, adj=np.adj if rng.random() < 0.5 else None)


# ------------------------------------------------------------------------------- rendering to records


def pair_texts(r: Renderer, item: PairItem) -> tuple[str, str]:
    return r.text(item.a), r.text(item.b)


def qa_paragraph(r: Renderer, item: QAItem) -> dict:
    """One SQuAD paragraph {context, qas} in `r`'s language; answer_start points at the answer NP."""
    words: list[str] = []
    where: dict[int, tuple[int, int]] = {}
    for ev in item.events:
        toks, spans = r.tokens(ev)
        base = len(words)
        where.update({k: (s + base, e + base) for k, (s, e) in spans.items()})
        words += toks
    starts, pos = [], 0
    for w in words:
        starts.append(pos)
        pos += len(w) + 1
    context = " ".join(words)
    qas = []
    for qid, q, ans in item.questions:
        s, e = where[id(ans)]
        text = " ".join(words[s:e])
        qas.append({"id": qid, "question": r.text(q, "?"),
                    "answers": [{"text": text, "answer_start": starts[s]}]})
    return {"context": context, "qas": qas}
