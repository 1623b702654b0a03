"""Per-task, per-language evaluation of a downstream model: predict, then score with the task's metric.

No DeepSpeed: a plain forward pass on the model's device (bf16 autocast on a GPU), so Step 4 can swap many
Step-2 checkpoints into each finetuned model in a loop, on every rank of a launch (mm_ds/eval/transfer.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import sentencepiece as spm
import torch

from ..data import features as feats
from ..data.tasks import EXTRACTIVE_QA, TASKS, TaskSpec
from . import metrics


def metric_lang(lang: str) -> str:
    """MLQA's normalisation branches by language (one per MLQA language); generated-world languages (no
    articles, space-separated words) are scored with the whitespace branch that has no article list."""
    return lang if lang in TASKS["mlqa"].languages else "hi"


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


def features_for(model_cfg, spec: TaskSpec, examples, sp: spm.SentencePieceProcessor,
                 max_length: int | None = None) -> list:
    """The model inputs of `examples`: encode once, score with every seed and checkpoint that shares `sp`.
    Never past the model's position table (tiny models have fewer positions than the task's length)."""
    max_length = min(max_length or spec.max_length, model_cfg.max_positions)
    if spec.task_type == EXTRACTIVE_QA:
        return feats.qa_features(examples, sp, spec.fitted(max_length))
    return feats.pair_features(examples, sp, max_length)


def scoring_precision(device) -> str:
    """What a model on `device` is scored in: bf16 autocast on a GPU, fp32 elsewhere."""
    return "bf16" if torch.device(device).type == "cuda" else "fp32"


def _forward(model, batch: dict) -> dict:
    device = next(model.parameters()).device
    ids, mask = batch["input_ids"].to(device, non_blocking=True), batch["attention_mask"].to(device, non_blocking=True)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=scoring_precision(device) == "bf16"):
        out = model(ids, mask)
    return {k: v.float().cpu() for k, v in out.items()}


@torch.no_grad()
def predict(model, spec: TaskSpec, examples, sp: spm.SentencePieceProcessor, batch_size: int = 64,
            max_length: int | None = None, features: list | None = None):
    """QA: ({example id: answer text}, features); classification: (one label id per feature, features)."""
    model.eval()
    if features is None:
        features = features_for(model.cfg, spec, examples, sp, max_length)
    if spec.task_type == EXTRACTIVE_QA:
        fitted = spec.fitted(min(max_length or spec.max_length, model.cfg.max_positions))
        starts, ends = [None] * len(features), [None] * len(features)
        for idx in length_batches(features, batch_size):
            out = _forward(model, feats.collate_qa([features[i] for i in idx]))
            for i, s, e in zip(idx, out["start_logits"], out["end_logits"]):
                starts[i], ends[i] = s, e
        return feats.decode_spans(starts, ends, features, max_answer_len=fitted.max_answer_length), features
    labels = [0] * len(features)
    for idx in length_batches(features, batch_size):
        out = _forward(model, feats.collate_pairs([features[i] for i in idx]))
        for i, label in zip(idx, out["logits"].argmax(-1).tolist()):
            labels[i] = label
    return labels, features


def evaluate(model, spec: TaskSpec, examples, sp: spm.SentencePieceProcessor, lang: str,
             batch_size: int = 64, max_length: int | None = None, features: list | None = None) -> Score:
    preds, features = predict(model, spec, examples, sp, batch_size, max_length, features)
    if spec.task_type == EXTRACTIVE_QA:
        golds = {ex.id: [a for a, _ in ex.answers] for ex in examples}
        s = metrics.qa_scores(golds, preds, metrics.normalizer(spec.metric, metric_lang(lang)))
        return Score(s["f1"], s)
    acc = metrics.accuracy(preds, [f.label for f in features])
    return Score(acc, {"accuracy": acc, "count": len(features)})
