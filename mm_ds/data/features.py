"""Task examples -> model features, and QA logits -> answer strings.

Sequences are RoBERTa pairs, `<s> A </s></s> B </s>`, in the ids of the language's own SentencePiece
model (special ids are shared, mm_ds.tokens). For QA, A is the question and B one window of the context;
every context token carries its character span in the original context (SentencePiece maps pieces back
through its normaliser), so a decoded answer is always a verbatim substring of the context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import sentencepiece as spm
import torch

from mm_ds.data.task_files import PairExample, QAExample
from mm_ds.data.tasks import TaskSpec
from mm_ds.tokens import BOS, EOS, PAD

PAIR_SPECIALS = 4  # <s> A </s></s> B </s>


@dataclass(frozen=True)
class PairFeature:
    input_ids: list[int]
    label: int


@dataclass(frozen=True)
class QAFeature:
    example_id: str
    input_ids: list[int]
    offsets: list[tuple[int, int] | None]
    """Per token: (begin, end) characters in the context, None for question and special tokens."""
    max_context: list[bool]
    """Per token: this window gives the token its most surrounding context of all windows (BERT); only
    such tokens may start an answer, so overlapping windows do not compete for the same span."""
    start_position: int
    """Token index of the first gold answer's start; 0 (`<s>`) when the answer is not in this window."""
    end_position: int
    context: str = field(repr=False)
    """The example's context (shared, not copied) for decoding."""


# --------------------------------------------------------------------------------- pair classification


def truncate_longest_first(a: list[int], b: list[int], budget: int) -> tuple[list[int], list[int]]:
    """Cut tokens from the end of the longer side, one at a time, B on ties, until both fit `budget`
    (HF `longest_first`), computed in closed form: the longer side comes down to the shorter one, then
    both shrink in turn, so an odd budget leaves A one token longer."""
    if len(a) + len(b) <= budget:
        return a, b
    if len(a) > len(b):
        keep_a = max(budget - len(b), (budget + 1) // 2)
        return a[:keep_a], b[:budget - keep_a]
    keep_b = max(budget - len(a), budget // 2)
    return a[:budget - keep_b], b[:keep_b]


def encode_pair(sp: spm.SentencePieceProcessor, text_a: str, text_b: str, max_length: int) -> list[int]:
    """`<s> A </s></s> B </s>`, cut longest-first to at most `max_length` tokens."""
    if max_length <= PAIR_SPECIALS + 1:
        raise ValueError(f"max_length={max_length} leaves no room for text; use at least {PAIR_SPECIALS + 2}")
    a, b = truncate_longest_first(sp.encode(text_a), sp.encode(text_b), max_length - PAIR_SPECIALS)
    return [BOS, *a, EOS, EOS, *b, EOS]


def pair_features(examples: Sequence[PairExample], sp: spm.SentencePieceProcessor,
                  max_length: int) -> list[PairFeature]:
    return [PairFeature(encode_pair(sp, ex.text_a, ex.text_b, max_length), ex.label) for ex in examples]


def _pad(rows: Sequence[Sequence[int]], width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), right-padded with PAD to `width` (a compiled model's one shape; rows are never
    longer), by default to the longest row of the batch."""
    width = width or max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, :len(row)] = 1
    return ids, mask


def collate_pairs(batch: Sequence[PairFeature], width: int | None = None) -> dict[str, torch.Tensor]:
    ids, mask = _pad([f.input_ids for f in batch], width)
    return {"input_ids": ids, "attention_mask": mask,
            "labels": torch.tensor([f.label for f in batch], dtype=torch.long)}


# ------------------------------------------------------------------------------------ extractive QA


def context_pieces(sp: spm.SentencePieceProcessor, context: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Piece ids of `context` and each piece's character span in it.

    Two adjustments make spans usable as answer boundaries: byte-fallback pieces of one character have
    empty spans except the last, so all of them take the character's span; and a span's leading
    whitespace (the "▁" SentencePiece glues onto a word) is dropped, so answers never start with a space.
    """
    try:
        enc = sp.encode(context, return_type="offset_mapping")  # character (not byte) offsets
    except (ValueError, TypeError) as e:
        raise RuntimeError(f"sentencepiece {spm.__version__} cannot return offset mappings ({e}); "
                           f"install sentencepiece>=0.2.3") from None
    ids: list[int] = list(enc["ids"])
    spans = [tuple(o) for o in enc["offsets"]]
    for i in range(len(spans) - 2, -1, -1):
        begin, end = spans[i]
        if begin == end and sp.is_byte(ids[i]) and spans[i + 1][0] == begin:
            spans[i] = (begin, spans[i + 1][1])
    out = []
    for begin, end in spans:
        while begin < end and context[begin].isspace():
            begin += 1
        out.append((begin, end))
    return ids, out


def _window_starts(n: int, window: int, stride: int) -> list[int]:
    starts = [0]
    while starts[-1] + window < n:
        starts.append(starts[-1] + min(window, stride))
    return starts


def _token_span(spans: Sequence[tuple[int, int]], start_char: int, end_char: int) -> tuple[int, int] | None:
    """First and last context piece overlapping the answer's characters [start_char, end_char)."""
    covering = [i for i, (b, e) in enumerate(spans) if e > b and e > start_char and b < end_char]
    return (covering[0], covering[-1]) if covering else None


def qa_features(examples: Sequence[QAExample], sp: spm.SentencePieceProcessor, spec: TaskSpec) -> list[QAFeature]:
    """Sliding windows of `spec.max_length` tokens over each context, `spec.doc_stride` tokens apart.

    Every example gives at least one feature. Positions label the first gold answer (SQuAD train has one);
    windows that do not hold it whole point at `<s>` (index 0), as in BERT/RoBERTa SQuAD training.
    """
    if spec.max_length - spec.max_query_length - PAIR_SPECIALS < 16:
        raise ValueError(f"{spec.name}: max_length={spec.max_length} leaves fewer than 16 context tokens "
                         f"after a {spec.max_query_length}-token question; raise max_length")
    out: list[QAFeature] = []
    for ex in examples:
        question = sp.encode(ex.question)[:spec.max_query_length]
        ids, spans = context_pieces(sp, ex.context)
        window = spec.max_length - len(question) - PAIR_SPECIALS
        text, start_char = ex.answers[0]
        answer = _token_span(spans, start_char, start_char + len(text))
        starts = _window_starts(len(ids), window, spec.doc_stride)
        lengths = [min(window, len(ids) - s) for s in starts]
        best_window = _max_context_window(starts, lengths, len(ids))
        prefix = len(question) + 3  # <s> Q </s></s>
        for w, (s, n) in enumerate(zip(starts, lengths)):
            offsets: list[tuple[int, int] | None] = [None] * prefix + list(spans[s:s + n]) + [None]
            max_context = [False] * prefix + (best_window[s:s + n] == w).tolist() + [False]
            start_pos = end_pos = 0
            if answer is not None and s <= answer[0] and answer[1] < s + n:
                start_pos, end_pos = prefix + answer[0] - s, prefix + answer[1] - s
            out.append(QAFeature(ex.id, [BOS, *question, EOS, EOS, *ids[s:s + n], EOS], offsets, max_context,
                                 start_pos, end_pos, ex.context))
    return out


def _max_context_window(starts: Sequence[int], lengths: Sequence[int], n: int) -> np.ndarray:
    """Per context token, the window that gives it the most context on its shorter side, with a small
    bonus for longer windows (BERT's run_squad rule); earlier windows win ties."""
    best = np.zeros(n, dtype=np.int64)
    best_score = np.full(n, -np.inf)
    for w, (s, length) in enumerate(zip(starts, lengths)):
        j = np.arange(s, s + length)
        score = np.minimum(j - s, s + length - 1 - j) + 0.01 * length
        better = score > best_score[s:s + length]
        best_score[s:s + length][better] = score[better]
        best[s:s + length][better] = w
    return best


def collate_qa(batch: Sequence[QAFeature], width: int | None = None) -> dict[str, torch.Tensor]:
    ids, mask = _pad([f.input_ids for f in batch], width)
    return {"input_ids": ids, "attention_mask": mask,
            "start_positions": torch.tensor([f.start_position for f in batch], dtype=torch.long),
            "end_positions": torch.tensor([f.end_position for f in batch], dtype=torch.long)}


def _as_row(x: Any, n: int) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().float().cpu().numpy()
    row = np.asarray(x, dtype=np.float64)
    if row.ndim != 1 or row.shape[0] < n:
        raise ValueError(f"logits row of shape {row.shape} for a feature of {n} tokens")
    return row[:n]


def decode_spans(start_logits: Any, end_logits: Any, features: Sequence[QAFeature], n_best: int = 20,
                 max_answer_len: int = 30) -> dict[str, str]:
    """{example id: answer text}: the highest start+end logit span over all windows of each example.

    `start_logits`/`end_logits`: one row per feature, in feature order (a (N, T) tensor/array or a list of
    rows; padding beyond a feature's length is ignored). Candidates are the `n_best` best starts and ends
    among context tokens; a span must start in a max-context token, end at or after its start and be at
    most `max_answer_len` tokens. An example with no valid span gets "" (it scores 0, as unanswered).
    """
    if len(start_logits) != len(features) or len(end_logits) != len(features):
        raise ValueError(f"{len(start_logits)} start / {len(end_logits)} end logit rows for "
                         f"{len(features)} features; pass one row per feature, in order")
    best: dict[str, tuple[float, str]] = {}
    for f, s_row, e_row in zip(features, start_logits, end_logits):
        n = len(f.input_ids)
        s_row, e_row = _as_row(s_row, n), _as_row(e_row, n)
        is_context = np.array([o is not None for o in f.offsets])
        can_start = is_context & np.array(f.max_context)
        starts = [int(i) for i in np.argsort(-np.where(can_start, s_row, -np.inf), kind="stable")[:n_best]
                  if can_start[i]]
        ends = [int(i) for i in np.argsort(-np.where(is_context, e_row, -np.inf), kind="stable")[:n_best]
                if is_context[i]]
        best.setdefault(f.example_id, (-np.inf, ""))
        for i in starts:
            for j in ends:
                if j < i or j - i + 1 > max_answer_len:
                    continue
                score = float(s_row[i] + e_row[j])
                if score > best[f.example_id][0]:
                    best[f.example_id] = (score, f.context[f.offsets[i][0]:f.offsets[j][1]])
    return {qid: text for qid, (_, text) in best.items()}
