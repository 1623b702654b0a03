"""The world's labelled tasks, decided by the generator's semantics (labels never follow from word presence).

A ~1M-parameter model learned single-sentence semantic properties ("is the agent plural / animate?", half
of the sentences passive) but not subject/object-swap paraphrase pairs (notes/generated-world-findings.md).
So every task here reduces to finding the AGENT of a clause (the by-phrase of a passive, the subject of an
active, never a relative clause's noun) and reading one bit of it, combined with a second bit:

- NLI (XNLI-like, 3-way). Premise: a transitive sentence, half passive. Hypothesis: "it was <verb>ed by
  {one | many | someone | something} ." about the premise's main verb. entailment: the pronoun states the
  agent's true number (one/many) or animacy (someone/something); contradiction: the false one; neutral:
  the hypothesis verb does not occur in the premise. Premises are drawn so that agent and patient differ in
  the asked property ~80% of the time, so "the first noun" is no shortcut.
- PAWS-like (2-way, label 1 = "same"). Sentence 2 re-renders sentence 1's event in the other voice with
  at most one change: the agent's number flipped (label 0, 50%), the patient's number flipped (label 1,
  30%), or none (label 1, 20%: a true paraphrase). The label asks "do both say
  the same number of doers?": both sentences have one mismatching word in 80% of pairs, and only its role
  decides the label.
- QA (SQuAD-v1.1-like). Context: 3-5 sentences with distinct verbs (40% passive). Question: "who/what
  <verb>ed <patient> ?" (answer: the agent NP) or "who/what was <verb>ed by <agent> ?" (answer: the
  patient NP). The answer is the NP's determiner + adjective + noun (or name), a contiguous span in every
  word order.

Swapping agent and patient keeps a pair's bag of words and changes its label (tests check it), so unigram
models stay near chance. Every item is a semantic object; each language renders the same objects.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from .grammar import NP, Event, Sampler, flip_number, pronoun
from .languages import Renderer

NLI_LABELS = ("entailment", "neutral", "contradiction")
PAWS_LABELS = ("0", "1")
HYPOTHESIS_WORD = {("number", True): "many", ("number", False): "one",
                   ("animacy", True): "someone", ("animacy", False): "something"}


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


def agent_value(ev: Event, prop: str) -> bool:
    """The asked bit of the main clause's agent: plural (number) or animate (animacy)."""
    return _value(ev.agent, prop)


def _value(np: NP, prop: str) -> bool:
    return np.plural if prop == "number" else np.animate


def nli_label(premise: Event, hypothesis: Event) -> str:
    """The gold label of a (premise, hypothesis) pair, from meaning alone."""
    if hypothesis.verb not in premise.verbs():
        return "neutral"
    word = hypothesis.agent.noun
    prop = "number" if word in ("one", "many") else "animacy"
    claimed = _value(hypothesis.agent, prop)
    return "entailment" if claimed == agent_value(premise, prop) else "contradiction"


def paws_label(a: Event, b: Event) -> str:
    return "1" if a.agent.plural == b.agent.plural else "0"


def _premise(sampler: Sampler, rng: random.Random, prop: str | None, truth: bool | None = None, **kw) -> Event:
    """A transitive sentence, half passive, whose main verb occurs once and whose agent has `prop` ==
    `truth`; agent and patient differ in `prop` ~80% of the time (so a first-noun heuristic fails on
    the passives)."""
    while True:
        ev = sampler.event(rng, transitive=True, passive_p=0.5, **kw)
        if ev.verbs().count(ev.verb) != 1:
            continue
        if prop is None:
            return ev
        if agent_value(ev, prop) == truth and (_value(ev.patient, prop) != truth or rng.random() < 0.25):
            return ev


def nli_items(sampler: Sampler, rng: random.Random, n: int, prefix: str) -> list[PairItem]:
    """Premise truth and claimed value are each 50/50 within every (label, property), and a neutral
    hypothesis borrows the verb of another premise drawn the same way: no single word predicts a label."""
    items = []
    for i in range(n):
        label, prop = NLI_LABELS[i % 3], ("number", "animacy")[(i // 3) % 2]
        truth, claim = rng.random() < 0.5, rng.random() < 0.5
        if label != "neutral":
            truth = claim == (label == "entailment")
        ev = _premise(sampler, rng, prop, truth)
        verb = ev.verb
        while label == "neutral" and verb in ev.verbs():
            verb = _premise(sampler, rng, prop, rng.random() < 0.5).verb
        hyp = Event(verb, pronoun(HYPOTHESIS_WORD[prop, claim]), pronoun("it"), ev.past, passive=True)
        items.append(PairItem(f"{prefix}{i}", ev, hyp, nli_label(ev, hyp), prop))
    rng.shuffle(items)
    return items


def paws_items(sampler: Sampler, rng: random.Random, n: int, prefix: str) -> list[PairItem]:
    """Sentence 2 always has the other voice, so voice patterns say nothing about the label."""
    items = []
    kinds = ("agent",) * 5 + ("patient",) * 3 + ("none",) * 2
    for i in range(n):
        kind = kinds[i % 10]
        ev = _premise(sampler, rng, None, names=False)
        ev2 = replace(ev, passive=not ev.passive,
                      agent=flip_number(ev.agent, rng) if kind == "agent" else ev.agent,
                      patient=flip_number(ev.patient, rng) if kind == "patient" else ev.patient)
        items.append(PairItem(f"{prefix}{i}", ev, ev2, paws_label(ev, ev2), kind))
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
                                   exclude_verbs=frozenset(used))
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
