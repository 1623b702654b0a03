"""Features: pair encoding/truncation, QA windows with character offsets, and span decoding round trips.

SentencePiece models are trained here, in memory, on XQuAD contexts (a few seconds, no downloads), with
the project's fixed special ids.
"""

import dataclasses
import io
import re

import numpy as np
import pytest
import sentencepiece as spm
import torch

from mm_ds.data.features import (collate_pairs, collate_qa, context_pieces, decode_spans, encode_pair, pair_features,
                                 qa_features, truncate_longest_first)
from mm_ds.data.task_files import PairExample, QAExample, load_split
from mm_ds.data.tasks import TASKS
from mm_ds.tokens import BOS, EOS, MASK, PAD
from support.paths import SHARED_DATA

XQUAD = TASKS["xquad"]


def train_spm(lines: list[str], vocab_size: int) -> spm.SentencePieceProcessor:
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buf, vocab_size=vocab_size, model_type="unigram",
        bos_id=BOS, pad_id=PAD, eos_id=EOS, unk_id=3, user_defined_symbols=["<mask>"], byte_fallback=True,
        character_coverage=0.9995, num_threads=2, minloglevel=2, hard_vocab_limit=False)
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    assert sp.piece_to_id("<mask>") == MASK
    return sp


@pytest.fixture(scope="module", params=["en", "zh"])
def xquad_lang(request):
    """(lang, examples, sp): an SPM model trained on that language's XQuAD contexts, split into sentences."""
    if not (SHARED_DATA / "xquad").is_dir():
        pytest.skip(f"XQuAD data not found at {SHARED_DATA}/xquad; set MM_DS_SHARED_DATA to run these tests")
    examples, _ = load_split(XQUAD, "test", request.param, SHARED_DATA)
    contexts = sorted({ex.context for ex in examples})
    lines = [s for c in contexts for s in re.split(r"(?<=[。！？.])\s*", c) if s.strip()]
    assert len(lines) > 1000
    return request.param, examples, train_spm(lines, vocab_size=3000)


# --------------------------------------------------------------------------------- pair classification


def _longest_first_reference(la: int, lb: int, budget: int) -> tuple[int, int]:
    """One token at a time from the longer side, B on ties (HF `longest_first`)."""
    while la + lb > budget:
        if la > lb:
            la -= 1
        else:
            lb -= 1
    return la, lb


def test_truncate_longest_first_matches_token_by_token():
    for la in range(0, 30):
        for lb in range(0, 30):
            for budget in (1, 7, 12, 20, 41):
                a, b = truncate_longest_first(list(range(la)), list(range(100, 100 + lb)), budget)
                assert (len(a), len(b)) == _longest_first_reference(la, lb, budget), (la, lb, budget)
                assert a == list(range(len(a))) and b == list(range(100, 100 + len(b)))  # cut from the end


def test_pair_layout_and_collate(xquad_lang):
    lang, examples, sp = xquad_lang
    a, b = examples[0].question, examples[1].question
    ids = encode_pair(sp, a, b, 128)
    assert ids == [BOS, *sp.encode(a), EOS, EOS, *sp.encode(b), EOS]
    long, short = examples[0].context, min((ex.question for ex in examples), key=lambda q: len(sp.encode(q)))
    cut = encode_pair(sp, long, short, 48)  # only the long side is cut
    assert len(cut) == 48 and cut[-len(sp.encode(short)) - 3:] == [EOS, EOS, *sp.encode(short), EOS]
    assert cut[:5] == [BOS, *sp.encode(long)[:4]]
    feats = pair_features([PairExample("1", a, b, 2), PairExample("2", long, long, 0)], sp, 64)
    batch = collate_pairs(feats)
    assert batch["input_ids"].shape == (2, 64) and batch["labels"].tolist() == [2, 0]
    n = len(ids)
    assert batch["attention_mask"][0].tolist() == [1] * n + [0] * (64 - n)
    assert (batch["input_ids"][0, n:] == PAD).all()
    with pytest.raises(ValueError, match="max_length=5"):
        encode_pair(sp, a, b, 5)


# ------------------------------------------------------------------------------------ extractive QA


def test_context_offsets_cover_the_text():
    sp = train_spm(["the denver broncos won super bowl fifty"] * 50 + ["x y z"] * 20, vocab_size=300)
    text = "The Denver  Broncos won 😀!"
    ids, spans = context_pieces(sp, text)
    assert len(ids) == len(spans)
    for begin, end in spans:
        assert 0 <= begin <= end <= len(text) and not text[begin:end][:1].isspace()
    # the emoji is 4 byte-fallback pieces, all given the emoji's one-character span
    emoji = text.index("😀")
    assert [s for i, s in zip(ids, spans) if sp.is_byte(i) and s[0] == emoji] == [(emoji, emoji + 1)] * 4
    # the distinct spans tile the text, whitespace aside
    assert "".join(text[b:e] for b, e in dict.fromkeys(spans)).replace(" ", "") == text.replace(" ", "")


def _one_hot_decode(examples, features, max_answer_len=30):
    """Decode logits that are 10 at the gold start/end of every window holding the answer, 0 elsewhere."""
    starts, ends = [], []
    for f in features:
        s, e = np.zeros(len(f.input_ids) + 3), np.zeros(len(f.input_ids) + 3)  # + padding, ignored
        if f.start_position:
            s[f.start_position], e[f.end_position] = 10.0, 10.0
        starts.append(s)
        ends.append(e)
    return decode_spans(starts, ends, features, max_answer_len=max_answer_len)


@pytest.mark.parametrize("geometry", [{}, {"max_length": 64, "doc_stride": 24, "max_query_length": 16}])
def test_one_hot_logits_decode_the_gold_answer(xquad_lang, geometry):
    lang, examples, sp = xquad_lang
    spec = dataclasses.replace(XQUAD, **geometry)
    features = qa_features(examples, sp, spec)
    assert {f.example_id for f in features} == {ex.id for ex in examples}
    assert all(len(f.input_ids) <= spec.max_length for f in features)
    by_id = {ex.id: ex for ex in examples}
    # An answer decodes exactly when its pieces start and end on its boundaries ("1943," can be one
    # piece), it fits max_answer_len tokens, and a window holding all of it is its start token's
    # max-context window (always so with the real 384/128 geometry; tiny windows lose long answers).
    exact = set()
    for f in features:
        if f.start_position:
            text = by_id[f.example_id].answers[0][0]
            span = f.context[f.offsets[f.start_position][0]:f.offsets[f.end_position][1]]
            assert text in span
            if span == text and f.end_position - f.start_position < 30 and f.max_context[f.start_position]:
                exact.add(f.example_id)
    assert len(exact) > (0.9 if not geometry else 0.75) * len(examples), (lang, len(exact))
    decoded = _one_hot_decode(examples, features)
    assert set(decoded) == set(by_id)
    for qid in exact:
        assert decoded[qid] == by_id[qid].answers[0][0]


def test_windows_overlap_and_max_context(xquad_lang):
    lang, examples, sp = xquad_lang
    spec = dataclasses.replace(XQUAD, max_length=64, doc_stride=24, max_query_length=16)
    features = [f for f in qa_features(examples[:40], sp, spec) if f.example_id == examples[0].id]
    assert len(features) > 2  # a paragraph needs several 64-token windows
    seen: dict[tuple[int, int], int] = {}
    for f in features:
        q = f.offsets.index(next(o for o in f.offsets if o is not None))  # first context token
        assert f.input_ids[:1] == [BOS] and f.input_ids[q - 2:q] == [EOS, EOS] and f.input_ids[-1] == EOS
        assert f.offsets[-1] is None and all(o is None for o in f.offsets[:q])
        for o, best in zip(f.offsets, f.max_context):
            if o is not None and best:
                seen[o] = seen.get(o, 0) + 1
        if f.start_position == 0:
            assert f.end_position == 0
    # every context piece is max-context in exactly one window
    ids, spans = context_pieces(sp, examples[0].context)
    assert sum(seen.values()) == len(spans)
    # consecutive windows start doc_stride tokens apart
    firsts = [next(o for o in f.offsets if o is not None) for f in features]
    assert [spans.index(x) for x in firsts][:3] == [0, 24, 48]
    batch = collate_qa(features)
    assert batch["input_ids"].shape[0] == len(features) and batch["start_positions"].dtype == torch.long


def test_decode_respects_max_answer_len_and_checks_rows():
    sp = train_spm(["one two three four five six seven eight nine ten"] * 50, vocab_size=300)
    context = "one two three four five six seven eight nine ten"
    ex = QAExample("q", "which?", context, (("two three four", 4),))
    (f,) = qa_features([ex], sp, XQUAD)
    s, e = np.zeros(len(f.input_ids)), np.zeros(len(f.input_ids))
    s[f.start_position], e[f.end_position] = 5.0, 5.0
    assert decode_spans([s], [e], [f]) == {"q": "two three four"}
    width = f.end_position - f.start_position + 1
    # too long: the best allowed span pairs the gold start or end with a zero-logit token
    assert decode_spans([s], [e], [f], max_answer_len=width - 1)["q"] != "two three four"
    # a start logit on a question token is never chosen
    s2 = s.copy()
    s2[1] = 100.0
    assert decode_spans([s2], [e], [f]) == {"q": "two three four"}
    with pytest.raises(ValueError, match="one row per feature"):
        decode_spans([s, s], [e], [f])
    assert decode_spans(torch.tensor(np.stack([s])), torch.tensor(np.stack([e])), [f]) == {"q": "two three four"}
