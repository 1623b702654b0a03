"""The generated world: determinism, exact translations, word order, overlap, labels that need syntax."""

import json
import lzma
import math
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from mm_ds.data.world import LEXICON, NP, Event, Renderer, Sampler, build_wordmap, generate_world, get_language, main
from mm_ds.data.world.grammar import pronoun
from mm_ds.data.world.tasks import nli_items, nli_label, paws_items, paws_label

LANGS = ("t1", "t2", "t3", "t4")
ALL = ("en",) + LANGS
SIZES = {"nli_train": 1800, "paws_train": 1200, "qa_train": 200, "dev": 60, "test": 150}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = tmp_path_factory.mktemp("world")
    manifest = generate_world(out, seed=3, languages=LANGS, sentences=3000, target_sentences=1500,
                              task_sizes=SIZES)
    return out, manifest


def _tsv(path: Path) -> list[dict]:
    header, *rows = path.read_text(encoding="utf-8").rstrip("\n").split("\n")
    cols = header.split("\t")
    assert all(len(r.split("\t")) == len(cols) for r in rows), path
    return [dict(zip(cols, r.split("\t"))) for r in rows]


def _squad(path: Path) -> list[tuple[str, str, str, int]]:
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["version"] == "1.1"
    out = []
    for art in doc["data"]:
        assert set(art) == {"title", "paragraphs"}
        for para in art["paragraphs"]:
            for qa in para["qas"]:
                (ans,) = qa["answers"]
                assert para["context"][ans["answer_start"]:ans["answer_start"] + len(ans["text"])] == ans["text"]
                out.append((qa["id"], qa["question"], ans["text"], ans["answer_start"]))
    return out


# ------------------------------------------------------------------------------------------ the files


def test_layout_and_formats(world):
    out, m = world
    for rel in m["files"]:
        assert (out / rel).is_file(), rel
    for code in ALL:
        for split in ("dev", "test"):
            rows = _tsv(out / f"xnli/xnli.{split}.{code}.tsv")
            assert list(rows[0]) == ["language", "gold_label", "sentence1", "sentence2", "genre", "pairID"]
            assert {r["language"] for r in rows} == {code}
            assert {r["gold_label"] for r in rows} == {"entailment", "neutral", "contradiction"}
            assert list(_tsv(out / f"paws-x/{split}.{code}.tsv")[0]) == ["id", "sentence1", "sentence2", "label"]
        mlqa = out / f"mlqa/test-context-{code}-question-{code}.json"
        assert _squad(out / f"xquad/xquad.{code}.json") == _squad(mlqa)
    train = [json.loads(l) for l in (out / "mnli/multinli_1.0_train.jsonl").read_text().splitlines()]
    assert len(train) == SIZES["nli_train"] and {"gold_label", "sentence1", "sentence2"} <= set(train[0])
    assert len(_squad(out / "squad/train-v1.1.json")) == SIZES["qa_train"]


def test_the_task_tables_world_chance_is_a_constant_answer_on_the_worlds_test_files(world):
    """Captions and curves print it as the chance level of a generated-world run (mm_ds/data/tasks.py)."""
    from collections import Counter

    from mm_ds.data.tasks import TASKS

    out, _ = world
    for task, path, column in (("xnli", "xnli/xnli.test.t2.tsv", "gold_label"), ("pawsx", "paws-x/test.t2.tsv", "label")):
        labels = Counter(r[column] for r in _tsv(out / path))
        assert TASKS[task].world_chance == pytest.approx(100 * max(labels.values()) / SIZES["test"], abs=1.0), task


def test_project_loaders_read_the_world(world):
    tasks = pytest.importorskip("mm_ds.data.task_files")
    out, _ = world
    spec = pytest.importorskip("mm_ds.data.tasks").TASKS
    ex, rep = tasks.read_mnli_jsonl(out / "mnli/multinli_1.0_train.jsonl", spec["xnli"], "en")
    assert len(ex) == SIZES["nli_train"] and not rep.skipped
    ex, rep = tasks.read_xnli_tsv(out / "xnli/xnli.test.t2.tsv", spec["xnli"], "t2")
    assert len(ex) == SIZES["test"] and not rep.skipped
    ex, rep = tasks.read_pawsx_tsv(out / "paws-x/train.en.tsv", spec["pawsx"], "en")
    assert len(ex) == SIZES["paws_train"] and not rep.skipped
    ex, rep = tasks.read_squad_json(out / "xquad/xquad.t3.json", spec["xquad"], "t3")
    assert len(ex) == SIZES["test"] and not rep.skipped


def test_text_layout(world):
    out, m = world
    for code in ALL:
        text = (out / f"text/{code}.txt").read_text(encoding="utf-8")
        assert text.endswith(".\n\n") and "\n\n\n" not in text and "\t" not in text
        lines = [l for l in text.split("\n") if l]
        assert len(lines) == m["languages"][code]["sentences"]


def test_deterministic_by_seed(tmp_path):
    def make(name, seed, compress=False):
        generate_world(tmp_path / name, seed=seed, languages=("t1", "t3"), sentences=300, target_sentences=200,
                       task_sizes={"nli_train": 30, "paws_train": 30, "qa_train": 20, "dev": 10, "test": 10},
                       compress=compress)
        return {p.relative_to(tmp_path / name): p.read_bytes() for p in sorted((tmp_path / name).rglob("*"))
                if p.is_file()}

    a, b, c = make("a", 1), make("b", 1), make("c", 2)
    assert a == b
    assert a.keys() == c.keys() and all(a[k] != c[k] for k in a if k.parts[0] in ("text", "xnli", "squad"))
    assert main(["--out", str(tmp_path / "cli"), "--langs", "t1,t3", "--seed", "1", "--sentences", "300",
                 "--target-sentences", "200", "--nli-train", "30", "--paws-train", "30", "--qa-train", "20",
                 "--dev", "10", "--test", "10"]) == 0
    assert (tmp_path / "cli/text/t3.txt").read_bytes() == a[Path("text/t3.txt")]
    xz = make("xz", 1, compress=True)
    assert lzma.decompress(xz[Path("text/t3.txt.xz")]) == a[Path("text/t3.txt")]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="unknown world language 'xx'"):
        generate_world("/nonexistent", languages=("xx",))
    with pytest.raises(ValueError, match="unknown task size"):
        generate_world("/nonexistent", task_sizes={"nli": 3})


# ------------------------------------------------------------------------------------- translations


def test_test_sets_are_exact_translations(world):
    out, _ = world
    for split in ("dev", "test"):
        en_nli = _tsv(out / f"xnli/xnli.{split}.en.tsv")
        en_paws = _tsv(out / f"paws-x/{split}.en.tsv")
        en_qa = _squad(out / f"mlqa/{split}-context-en-question-en.json")
        for code in LANGS:
            nli = _tsv(out / f"xnli/xnli.{split}.{code}.tsv")
            assert [(r["pairID"], r["gold_label"]) for r in nli] == [(r["pairID"], r["gold_label"]) for r in en_nli]
            assert all(r["sentence1"] != e["sentence1"] for r, e in zip(nli, en_nli))
            paws = _tsv(out / f"paws-x/{split}.{code}.tsv")
            assert [(r["id"], r["label"]) for r in paws] == [(r["id"], r["label"]) for r in en_paws]
            qa = _squad(out / f"mlqa/{split}-context-{code}-question-{code}.json")  # checks answer_start
            assert [q[0] for q in qa] == [q[0] for q in en_qa]
            # one token per English token: the answer has as many words in every language
            assert [len(q[2].split()) for q in qa] == [len(q[2].split()) for q in en_qa]


def test_word_order_presets():
    dog, cat = NP("dog", "animal", True, "the", "old"), NP("cat", "animal", False, "a")
    ev = Event("chase", dog, cat, past=False, adjuncts=(("in", NP("park", "place", False, "the")),))
    en = Renderer(get_language("en"), 0)
    assert en.text(ev) == "the old dogs chase a cat in the park ."
    assert en.text(replace(ev, passive=True, past=True)) == "a cat was chased by the old dogs in the park ."
    tokens = {}
    for code in ("t1", "t2", "t3", "t4"):
        r = Renderer(get_language(code), 0)
        inv = {v: k for k, v in r.map.items() if k != "an"}
        tokens[code] = [inv[t] for t in r.tokens(ev)[0]]
        tokens[code + "p"] = [inv[t] for t in r.tokens(replace(ev, passive=True, past=True))[0]]
    assert tokens["t1"] == "the old dogs chase a cat in the park .".split()
    # SOV, case particles, postpositions; the passive's auxiliary second, after the subject
    assert tokens["t2"] == "the old dogs <nom> the park in a cat <acc> chase .".split()
    assert tokens["t2p"] == "a cat <nom> was the park in the old dogs by chased .".split()
    assert tokens["t3"] == "the dogs old the park in a cat chase .".split()  # SOV, N-Adj, postpositions
    assert tokens["t3p"] == "a cat the park in the dogs old by chased was .".split()
    assert tokens["t4"] == "chase the dogs old a cat in the park .".split()  # VSO


def test_verb_final_in_sov_text(world):
    out, _ = world
    verbs = {f for f, _, kind in LEXICON.forms() if kind.startswith("verb")} | {"is", "are", "was", "were"}

    def verb_last_share(code):
        inv = {v: k for k, v in build_wordmap(get_language(code), 3).items()}
        lines = [l.split() for l in (out / f"text/{code}.txt").read_text().splitlines() if l]
        return sum(inv[l[-2]] in verbs for l in lines) / len(lines)

    assert verb_last_share("t2") > 0.95 and verb_last_share("t3") > 0.95
    assert verb_last_share("t1") < 0.4 and verb_last_share("t4") < 0.4


def _clauses(ev: Event, head: NP | None = None):
    """(clause, its subject, its active object) for a clause and every clause inside it; a relative clause's
    gap is its head, which carries the head's own role's particle, not the clause's."""
    subj, obj = (ev.patient, None) if ev.passive else (ev.agent, ev.patient)
    yield ev, subj, obj
    for np in (ev.agent, ev.patient):
        if np is not None and np.rel is not None:
            yield from _clauses(np.rel, np)
    if ev.sub is not None:
        yield from _clauses(ev.sub[1])


def test_case_particles_mark_every_subject_and_object():
    """t2 marks roles the way Japanese or Korean do: a particle after every subject's noun phrase (the passive's
    patient included) and another after every active object, in every clause; the passive's agent keeps its
    by-postposition; no other word is a particle, and the languages without case have none."""
    s, rng = Sampler(0), random.Random(11)
    t2 = Renderer(get_language("t2"), 0)
    nom, acc, by = t2.map["<nom>"], t2.map["<acc>"], t2.map["by"]
    assert len({nom, acc, by}) == 3
    clauses = subjects = objects = passives = 0
    for _ in range(600):
        ev = s.event(rng)
        toks, spans = t2.tokens(ev)
        marked = 0
        for clause, subj, obj in _clauses(ev):
            clauses += 1
            if subj is not None:
                assert toks[spans[id(subj)][1]] == nom, (t2.text(ev), subj)
                subjects += 1
                marked += 1
            if obj is not None:
                assert toks[spans[id(obj)][1]] == acc, (t2.text(ev), obj)
                objects += 1
                marked += 1
            if clause.passive and clause.agent is not None and clause.agent.rel is None:
                passives += 1  # (a postposition follows a relative clause, a particle the head noun)
                assert toks[spans[id(clause.agent)][1]] == by, t2.text(ev)
        assert toks.count(nom) + toks.count(acc) == marked, t2.text(ev)
    assert clauses > 700 and subjects > 500 and objects > 350 and passives > 80
    for code in ("en", "t1", "t3", "t4"):
        assert not {"<nom>", "<acc>"} & set(Renderer(get_language(code), 0).map)


def test_passive_auxiliary_follows_the_subject():
    """t2's passive auxiliary is the clause's second constituent (after the subject with its particle and any
    relative clause); the participle stays verb-final. Agreement is the patient's, as in English."""
    dog, cats = NP("dog", "animal", False, "the"), NP("cat", "animal", True, "some", rel=Event("bark", None, None, True))
    ev = Event("chase", dog, cats, past=True, passive=True)
    r = Renderer(get_language("t2"), 0)
    inv = {v: k for k, v in r.map.items() if k != "an"}
    assert [inv[t] for t in r.tokens(ev)[0]] == "some cats <nom> that barked were the dog by chased .".split()
    rel = Event("bark", NP("cat", "animal", False, "a", rel=Event("chase", dog, None, past=False, passive=True)),
                None, past=True)
    assert [inv[t] for t in r.tokens(rel)[0]] == "a cat <nom> that is the dog by chased barked .".split()


# ------------------------------------------------------------------------------------------- lexicon


def test_overlap_share_and_no_accidental_collisions(world):
    _, m = world
    en_forms = {f for f, _, _ in LEXICON.forms()}
    content = {lemma for _, lemma, kind in LEXICON.forms() if kind.split(".")[0] in ("noun", "verb", "adj")}
    for code in LANGS:
        lang = get_language(code)
        wm = build_wordmap(lang, 3)
        particles = {"<nom>", "<acc>"} if lang.case == "nom-acc" else set()
        assert set(wm) == en_forms | particles
        shared = {k for k in content if wm[k] == k}
        assert len(shared) == round(lang.share_words * len(content))
        # a new form never equals an English word by accident, and distinct English words stay distinct
        assert all(v == k or v not in en_forms for k, v in wm.items())
        assert len({v for k, v in wm.items() if k != "an"}) == len(wm) - 1
    langs = m["languages"]
    assert langs["t3"]["token_overlap"] < langs["t4"]["token_overlap"] < langs["t1"]["token_overlap"] < 0.35
    assert all("a" <= ch <= "z" or not ch.isalpha() for ch in build_wordmap(get_language("t1"), 3)["dog"])
    assert all("\u0400" <= ch <= "\u04ff" for ch in build_wordmap(get_language("t3"), 3)["dog"])
    no_numbers = build_wordmap(replace(get_language("t3"), share_numbers=False), 3)
    assert all("\u0400" <= ch <= "\u04ff" for ch in no_numbers["7"]) and not (set(no_numbers.values()) & en_forms - {".", ",", "?"})


def test_lexicon_files_map_the_particles(world):
    """lexicon/t2.tsv maps the case particles to t2's words, new forms that are no other word of t2; every other
    English form has the same t2 word as t1 (t2 = t1's words, other grammar); t1 has no particles."""
    out, _ = world
    lex = {code: {r["en"]: r[code] for r in _tsv(out / f"lexicon/{code}.tsv")} for code in ("t1", "t2")}
    particles = {k: v for k, v in lex["t2"].items() if k.startswith("<")}
    assert set(particles) == {"<nom>", "<acc>"} and len(set(particles.values())) == 2
    assert not set(particles.values()) & (set(lex["t1"].values()) | {f for f, _, _ in LEXICON.forms()})
    assert {k: v for k, v in lex["t2"].items() if k not in particles} == lex["t1"]
    text = (out / "text/t2.txt").read_text(encoding="utf-8").split()
    assert text.count(particles["<nom>"]) > text.count(particles["<acc>"]) > 0.03 * len(text)


def test_noun_classes_unequal_and_grammar_rates(world):
    _, m = world
    sizes = list(m["english"]["noun_class_sizes"].values())
    assert len(set(sizes)) == len(sizes)  # equal sizes let Step 2 converge to a permuted class mapping
    s, rng = Sampler(0), random.Random(0)
    events = [s.event(rng) for _ in range(3000)]
    trans = [e for e in events if e.patient is not None]
    assert 0.15 < sum(e.passive for e in trans) / len(trans) < 0.25
    assert sum(e.sub is not None for e in events) > 100
    assert sum(any(n is not None and n.rel is not None for n in (e.agent, e.patient)) for e in events) > 300


# ------------------------------------------------------------------------------------------- labels


def test_label_balance(world):
    out, _ = world
    nli = Counter(json.loads(l)["gold_label"] for l in (out / "mnli/multinli_1.0_train.jsonl").read_text().splitlines())
    assert nli["entailment"] == nli["neutral"] + nli["contradiction"] and abs(nli["neutral"] - nli["contradiction"]) <= 1
    paws = Counter(r["label"] for r in _tsv(out / "paws-x/train.en.tsv"))
    assert abs(paws["0"] - paws["1"]) <= 0.02 * SIZES["paws_train"]


def test_swapping_roles_keeps_the_bag_of_words_and_changes_the_label():
    """Same words, different label: the structural reason no bag-of-words model can solve the pair tasks.
    (Past tense, so that agreement does not change a word.)"""
    s, rng, en = Sampler(0), random.Random(5), Renderer(get_language("en"), 0)
    swap = lambda e: replace(e, agent=e.patient, patient=e.agent)  # noqa: E731
    bag = lambda x, y: Counter(en.text(x).split() + en.text(y).split())  # noqa: E731
    flipped = 0
    for it, label in [(it, nli_label) for it in nli_items(s, rng, 300, "x")] + \
                     [(it, paws_label) for it in paws_items(s, rng, 300, "y")]:
        if label is paws_label and it.a.agent.plural != it.a.patient.plural:
            continue  # the passive auxiliary agrees with the patient; numbers are independent of roles
        if it.a.agent.cls == it.a.patient.cls and it.a.agent.plural == it.a.patient.plural:
            continue  # same class: swapping cannot change the label
        swapped = (swap(it.a), swap(it.b))
        if label(*swapped) == it.label:
            continue  # e.g. number differs but the label only asks for animacy
        assert label(it.a, it.b) == it.label
        assert bag(it.a, it.b) == bag(*swapped)
        flipped += 1
    assert flipped > 300


def _naive_bayes_accuracy(train, test):
    """Multinomial naive Bayes over unigrams of sentence 1 and sentence 2 (separate vocabularies)."""
    feats = lambda a, b: [f"1:{w}" for w in a.split()] + [f"2:{w}" for w in b.split()]  # noqa: E731
    counts, prior = {}, Counter()
    for a, b, y in train:
        prior[y] += 1
        counts.setdefault(y, Counter()).update(feats(a, b))
    vocab = {f for c in counts.values() for f in c}
    totals = {y: sum(c.values()) + len(vocab) for y, c in counts.items()}

    def predict(a, b):
        return max(prior, key=lambda y: math.log(prior[y]) + sum(math.log((counts[y][f] + 1) / totals[y])
                                                                 for f in feats(a, b)))
    return sum(predict(a, b) == y for a, b, y in test) / len(test)


def test_pawsx_doer_is_the_subject_of_an_active_sentence_1():
    """Sentence 1 is active, so its subject is the doer in every word order; the passive goes in sentence 2
    (with a passive sentence 1, BL_BASE's t2 transfer depended on the finetuning seed: mm_ds/data/world/tasks.py)."""
    items = paws_items(Sampler(0), random.Random(3), 200, "p")
    assert all(not it.a.passive and it.b == replace(it.a, passive=it.b.passive) for it in items)
    assert 70 < sum(it.b.passive for it in items) < 130


def test_bag_of_words_is_near_chance(world):
    out, _ = world
    nli_train = [(d["sentence1"], d["sentence2"], d["gold_label"])
                 for d in map(json.loads, (out / "mnli/multinli_1.0_train.jsonl").read_text().splitlines())]
    nli_test = [(r["sentence1"], r["sentence2"], r["gold_label"]) for r in _tsv(out / "xnli/xnli.test.en.tsv")]
    paws = lambda p: [(r["sentence1"], r["sentence2"], r["label"]) for r in _tsv(p)]  # noqa: E731
    assert _naive_bayes_accuracy(nli_train, nli_test) < 0.58  # majority class 0.5
    assert _naive_bayes_accuracy(paws(out / "paws-x/train.en.tsv"), paws(out / "paws-x/test.en.tsv")) < 0.62


def test_question_answers_follow_roles():
    """Under a passive, the agent question's answer is the by-phrase noun phrase."""
    from mm_ds.data.world.tasks import QAItem, qa_paragraph

    dog, cat = NP("dog", "animal", False, "the"), NP("cat", "animal", True, "some", "hungry")
    ev = Event("chase", dog, cat, past=True, passive=True)
    q = Event("chase", pronoun("who"), replace(cat, adj=None), past=True)
    for code in ("en", "t2"):
        r = Renderer(get_language(code), 0)
        para = qa_paragraph(r, QAItem("p", (ev,), (("q", q, dog),)))
        ans = para["qas"][0]["answers"][0]
        assert ans["text"] == " ".join(r.map[w] for w in ("the", "dog"))
        if code == "en":
            assert para["context"] == "some hungry cats were chased by the dog ."
            assert para["qas"][0]["question"] == "who chased some cats ?"
