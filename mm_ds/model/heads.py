"""Downstream heads on the encoder's final hidden states `(B, T, h)`; independent of the encoder itself.

Module and parameter names follow HF RoBERTa (`dense`, `out_proj`, `qa_outputs`) so fine-tuned weights
map one to one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mm_ds.config import ModelConfig
from mm_ds.data.tasks import EXTRACTIVE_QA, PAIR_CLASSIFICATION
from mm_ds.model.model import Encoder
from mm_ds.tokens import IGNORE_INDEX


class ClassificationHead(nn.Module):
    """Sentence(-pair) classification from the `<s>` token: dropout, dense+tanh, dropout, projection."""

    def __init__(self, hidden: int, num_labels: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(hidden, num_labels)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = self.dropout(hidden_states[:, 0])  # (B, h): the <s> token
        x = self.dropout(torch.tanh(self.dense(x)))
        return self.out_proj(x)  # (B, num_labels)

    @staticmethod
    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy; labels equal to IGNORE_INDEX do not count."""
        return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX)


class SpanHead(nn.Module):
    """Extractive QA: a start and an end logit per token."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.qa_outputs = nn.Linear(hidden, 2)

    def forward(self, hidden_states: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.qa_outputs(hidden_states)  # (B, T, 2)
        start, end = logits.unbind(dim=-1)  # (B, T) each
        if attention_mask is not None:  # padding can never be an answer boundary
            start = start.masked_fill(attention_mask == 0, torch.finfo(start.dtype).min)
            end = end.masked_fill(attention_mask == 0, torch.finfo(end.dtype).min)
        return start, end

    @staticmethod
    def loss(start_logits: torch.Tensor, end_logits: torch.Tensor, start_positions: torch.Tensor,
             end_positions: torch.Tensor) -> torch.Tensor:
        """Mean of the start and end cross-entropies. Positions outside the sequence (a window cut
        before the answer ends) or equal to IGNORE_INDEX do not count, as in HF's QA heads."""
        T = start_logits.size(1)

        def ce(logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            positions = positions.masked_fill((positions < 0) | (positions >= T), IGNORE_INDEX)
            return F.cross_entropy(logits.float(), positions, ignore_index=IGNORE_INDEX)

        return (ce(start_logits, start_positions) + ce(end_logits, end_positions)) / 2


def build_head(task_type: str, hidden: int, num_labels: int = 0, dropout: float = 0.1) -> nn.Module:
    """The head for a task type (mm_ds.data.tasks.TaskSpec.task_type)."""
    if task_type == PAIR_CLASSIFICATION:
        if num_labels < 2:
            raise ValueError(f"a classification head needs at least 2 labels, got num_labels={num_labels}")
        return ClassificationHead(hidden, num_labels, dropout)
    if task_type == EXTRACTIVE_QA:
        return SpanHead(hidden)
    raise ValueError(f"no head for task type {task_type!r}; types: {PAIR_CLASSIFICATION}, {EXTRACTIVE_QA}")


class RobertaForTask(Encoder):
    """The primary model for Steps 3-4: the encoder body plus one task head (`task_head.*`).

    Body keys are the MLM's (`embed.*`, `layers.*`), so embeddings swap between the two unchanged."""

    def __init__(self, cfg: ModelConfig, task_type: str, num_labels: int = 0) -> None:
        super().__init__(cfg)
        self.task_type = task_type
        self.task_head = build_head(task_type, cfg.hidden_size, num_labels, cfg.dropout)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, start_positions: torch.Tensor | None = None,
                end_positions: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        # Pair/QA batches are padded: the mask must reach attention (None only when nothing is padding).
        hidden, _ = self.encode(input_ids, attention_mask)
        if self.task_type == PAIR_CLASSIFICATION:
            logits = self.task_head(hidden)
            out = {"logits": logits}
            if labels is not None:
                out["loss"] = self.task_head.loss(logits, labels)
                out["correct"] = (logits.argmax(-1) == labels).sum()
                out["examples"] = labels.new_full((), labels.numel())  # a fill, not a copy from the host
            return out
        start, end = self.task_head(hidden, attention_mask)
        out = {"start_logits": start, "end_logits": end}
        if start_positions is not None:
            out["loss"] = self.task_head.loss(start, end, start_positions, end_positions)
        return out
