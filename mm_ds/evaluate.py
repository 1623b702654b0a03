"""Per-task, per-language evaluation of a downstream model: predict, then score with the task's metric.

Runs in one process without DeepSpeed (evaluation is cheap next to Step 2), so Step 4 can swap many
Step-2 checkpoints into each finetuned model in a loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import sentencepiece as spm
import torch

from . import metrics
from .data import features as feats
from .data.tasks import EXTRACTIVE_QA, TaskSpec

# MLQA's normalisation branches by language; generated-world languages (no articles, space-separated
# words) are scored with the whitespace branch that has no article list.
_MLQA_LANGS = {"en", "es", "de", "vi", "ar", "hi", "zh"}


def metric_lang(lang: str) -> str:
    return lang if lang in _MLQA_LANGS else "hi"


@dataclass
class Score:
    score: float
    """The headline number: accuracy for classification, F1 for QA (x100)."""
    details: dict


def length_batches(features, batch_size: int) -> list[list[int]]:
    """Feature indices in batches of similar length: a batch is padded to its longest row, and in file
    order a third of the world's pair-task tokens were padding. Results are put back in file order."""
    order = sorted(range(len(features)), key=lambda i: len(features[i].input_ids))
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


@torch.no_grad()
def predict(model, spec: TaskSpec, examples, sp: spm.SentencePieceProcessor, batch_size: int = 64,
            max_length: int | None = None):
    """QA: ({example id: answer text}, features); classification: (one label id per feature, features)."""
    model.eval()
    # Never encode past the model's position table (tiny models have fewer positions than the task's length).
    max_length = min(max_length or spec.max_length, model.cfg.max_positions)
    spec = spec.fitted(max_length)
    if spec.kind == EXTRACTIVE_QA:
        features = feats.qa_features(examples, sp, spec)
        starts, ends = [None] * len(features), [None] * len(features)
        for idx in length_batches(features, batch_size):
            b = feats.collate_qa([features[i] for i in idx])
            out = model(b["input_ids"], b["attention_mask"])
            for i, s, e in zip(idx, out["start_logits"], out["end_logits"]):
                starts[i], ends[i] = s, e
        return feats.decode_spans(starts, ends, features, max_answer_len=spec.max_answer_length), features
    features = feats.pair_features(examples, sp, max_length)
    labels = [0] * len(features)
    for idx in length_batches(features, batch_size):
        b = feats.collate_pairs([features[i] for i in idx])
        for i, label in zip(idx, model(b["input_ids"], b["attention_mask"])["logits"].argmax(-1).tolist()):
            labels[i] = label
    return labels, features


def evaluate(model, spec: TaskSpec, examples, sp: spm.SentencePieceProcessor, lang: str,
             batch_size: int = 64, max_length: int | None = None) -> Score:
    preds, features = predict(model, spec, examples, sp, batch_size, max_length)
    if spec.kind == EXTRACTIVE_QA:
        golds = {ex.id: [a for a, _ in ex.answers] for ex in examples}
        s = metrics.qa_scores(golds, preds, metrics.normalizer(spec.metric, metric_lang(lang)))
        return Score(s["f1"], s)
    acc = metrics.accuracy(preds, [f.label for f in features])
    return Score(acc, {"accuracy": acc, "count": len(features)})
