"""Task metrics, implemented from the official evaluators' published definitions (data/SOURCES.md).

- accuracy: XNLI, PAWS-X.
- SQuAD v1.1 (`evaluate-v1.1.py`): English-only normalisation; XQuAD uses it for every language (its README).
- MLQA (`mlqa_evaluation_v1.py`): all Unicode punctuation, per-language articles, zh mixed segmentation.

Both QA metrics: exact match of normalised strings and bag-of-tokens F1, each maxed over the gold answers,
averaged over every gold question (unanswered ones score 0), times 100.
"""

from __future__ import annotations

import re
import string
import sys
import unicodedata
from collections import Counter
from functools import lru_cache
from typing import Callable, Mapping, Sequence

Normalizer = Callable[[str], str]

_ASCII_PUNCT = frozenset(string.punctuation)
_EN_ARTICLES = re.compile(r"\b(a|an|the)\b")


def squad_normalize(text: str) -> str:
    """lower -> delete the 32 ASCII punctuation chars -> English articles to spaces -> collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _ASCII_PUNCT)
    return " ".join(_EN_ARTICLES.sub(" ", text).split())


@lru_cache(maxsize=1)
def mlqa_punctuation() -> frozenset[str]:
    """Every code point below sys.maxunicode in a Unicode P* category, plus string.punctuation (which adds
    the ASCII symbols $ + < = > ^ ` | ~ that Unicode files under S*)."""
    return frozenset(chr(i) for i in range(sys.maxunicode)
                     if unicodedata.category(chr(i)).startswith("P")) | _ASCII_PUNCT


# Article patterns, applied after lower-casing and punctuation removal and replaced by a space.
# ar's official pattern `\sال^|ال` can only ever match through its second branch, so in practice every
# "ال" -- word-initial or not -- becomes a space; we keep that behaviour to reproduce published numbers.
_MLQA_ARTICLES: dict[str, re.Pattern | None] = {
    "en": _EN_ARTICLES,
    "es": re.compile(r"\b(un|una|unos|unas|el|la|los|las)\b"),
    "de": re.compile(r"\b(ein|eine|einen|einem|eines|einer|der|die|das|den|dem|des)\b"),
    "vi": re.compile(r"\b(của|là|cái|chiếc|những)\b"),
    "ar": re.compile("ال"),
    "hi": None,
    "zh": None,
}
MLQA_LANGUAGES = tuple(_MLQA_ARTICLES)
_HAN = re.compile("[\u4e00-\u9fa5]")  # the basic CJK Unified Ideographs block only, as the official script


def _mixed_segmentation(text: str) -> list[str]:
    """zh: each basic-block Han character or punctuation mark is a token; runs of anything else (Latin
    words, digits) are whitespace-split, so "iPhone手机" -> ["iphone", "手", "机"] after lower-casing."""
    punct = mlqa_punctuation()
    tokens: list[str] = []
    run: list[str] = []
    for ch in text:
        if _HAN.match(ch) or ch in punct:
            tokens += "".join(run).split()
            run = []
            tokens.append(ch)
        else:
            run.append(ch)
    return tokens + "".join(run).split()


def mlqa_normalize(text: str, lang: str) -> str:
    """lower -> delete Unicode+ASCII punctuation -> articles(lang) to spaces -> tokenise(lang) -> join."""
    if lang not in _MLQA_ARTICLES:
        raise ValueError(f"MLQA normalisation has no rules for language {lang!r}; the official evaluator "
                         f"knows {', '.join(MLQA_LANGUAGES)}")
    punct = mlqa_punctuation()
    text = "".join(ch for ch in text.lower() if ch not in punct)
    articles = _MLQA_ARTICLES[lang]
    if articles is not None:
        text = articles.sub(" ", text)
    tokens = _mixed_segmentation(text) if lang == "zh" else text.split()
    return " ".join(t for t in tokens if t.strip())


def normalizer(metric: str, lang: str) -> Normalizer:
    """The answer normaliser of a QA metric ("squad" or "mlqa"); `lang` is the context language."""
    if metric == "squad":
        return squad_normalize
    if metric == "mlqa":
        mlqa_normalize("", lang)  # fail now, naming the language, not on the first answer
        return lambda text: mlqa_normalize(text, lang)
    raise ValueError(f"{metric!r} is not a QA metric; use 'squad' or 'mlqa'")


def exact_match(prediction: str, gold: str, normalize: Normalizer) -> float:
    return float(normalize(prediction) == normalize(gold))


def f1(prediction: str, gold: str, normalize: Normalizer) -> float:
    """Token-bag F1. As in the official scripts, a gold answer that normalises to nothing (e.g. "the")
    gives F1 0 even against an empty prediction, whose exact match is 1."""
    pred, ref = normalize(prediction).split(), normalize(gold).split()
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def qa_scores(golds: Mapping[str, Sequence[str]], predictions: Mapping[str, str],
              normalize: Normalizer) -> dict[str, float | int]:
    """EM and F1 (x100) over every gold question; `missing` questions without a prediction score 0,
    `unknown` prediction ids not in the gold set are ignored (both counted so neither goes unnoticed)."""
    em_sum = f1_sum = 0.0
    missing = 0
    for qid, answers in golds.items():
        if qid not in predictions:
            missing += 1
            continue
        pred = predictions[qid]
        em_sum += max(exact_match(pred, g, normalize) for g in answers)
        f1_sum += max(f1(pred, g, normalize) for g in answers)
    count = len(golds)
    return {
        "exact_match": 100.0 * em_sum / count if count else 0.0,
        "f1": 100.0 * f1_sum / count if count else 0.0,
        "count": count,
        "missing": missing,
        "unknown": sum(1 for qid in predictions if qid not in golds),
    }


def accuracy(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """Percentage of predictions equal to the gold label index."""
    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} predictions for {len(labels)} labels")
    if not labels:
        raise ValueError("accuracy of an empty set is undefined")
    return 100.0 * sum(int(p) == int(y) for p, y in zip(predictions, labels)) / len(labels)
