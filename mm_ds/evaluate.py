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


@torch.no_grad()
def evaluate(model, spec: TaskSpec, examples, sp: spm.SentencePieceProcessor, lang: str,
             batch_size: int = 64, max_length: int | None = None) -> Score:
    model.eval()
    # Never encode past the model's position table (tiny models have fewer positions than the task's length).
    max_length = min(max_length or spec.max_length, model.cfg.max_positions)
    spec = spec.fitted(max_length)
    if spec.kind == EXTRACTIVE_QA:
        features = feats.qa_features(examples, sp, spec)
        starts, ends = [], []
        for i in range(0, len(features), batch_size):
            b = feats.collate_qa(features[i:i + batch_size])
            out = model(b["input_ids"], b["attention_mask"])
            starts += list(out["start_logits"])
            ends += list(out["end_logits"])
        preds = feats.decode_spans(starts, ends, features, max_answer_len=spec.max_answer_length)
        golds = {ex.id: [a for a, _ in ex.answers] for ex in examples}
        norm = metrics.normalizer(spec.metric, metric_lang(lang))
        s = metrics.qa_scores(golds, preds, norm)
        return Score(s["f1"], s)
    features = feats.pair_features(examples, sp, max_length)
    predictions = []
    for i in range(0, len(features), batch_size):
        b = feats.collate_pairs(features[i:i + batch_size])
        predictions += model(b["input_ids"], b["attention_mask"])["logits"].argmax(-1).tolist()
    acc = metrics.accuracy(predictions, [f.label for f in features])
    return Score(acc, {"accuracy": acc, "count": len(features)})
