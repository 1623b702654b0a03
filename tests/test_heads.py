"""Downstream heads on stand-in hidden states (the encoder is not needed)."""

import pytest
import torch
import torch.nn.functional as F

from mm_ds.model.heads import ClassificationHead, SpanHead, build_head
from mm_ds.tokens import IGNORE_INDEX


def test_classification_head_uses_first_token_and_hf_names():
    torch.manual_seed(0)
    head = ClassificationHead(hidden=16, num_labels=3, dropout=0.1).eval()
    assert set(head.state_dict()) == {"dense.weight", "dense.bias", "out_proj.weight", "out_proj.bias"}
    h = torch.randn(2, 5, 16)
    logits = head(h)
    assert logits.shape == (2, 3)
    h2 = h.clone()
    h2[:, 1:] = 0  # only <s> matters
    assert torch.equal(head(h2), logits)
    expected = head.out_proj(torch.tanh(head.dense(h[:, 0])))
    assert torch.allclose(logits, expected)
    labels = torch.tensor([2, IGNORE_INDEX])
    assert torch.allclose(head.loss(logits, labels), F.cross_entropy(logits[:1], labels[:1]))


def test_span_head_mask_and_loss():
    torch.manual_seed(0)
    head = SpanHead(hidden=8)
    assert set(head.state_dict()) == {"qa_outputs.weight", "qa_outputs.bias"}
    h = torch.randn(2, 6, 8)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    start, end = head(h, mask)
    assert start.shape == end.shape == (2, 6)
    assert (start[1, 4:] < -1e30).all() and start.softmax(-1)[1, 4:].sum() == 0
    # positions past the sequence (answer cut off by the window) are ignored, like IGNORE_INDEX
    s_pos, e_pos = torch.tensor([1, 9]), torch.tensor([2, IGNORE_INDEX])
    expected = (F.cross_entropy(start[:1], s_pos[:1]) + F.cross_entropy(end[:1], e_pos[:1])) / 2
    assert torch.allclose(head.loss(start, end, s_pos, e_pos), expected)
    loss = head.loss(start, end, torch.tensor([1, 2]), torch.tensor([2, 3]))
    loss.backward()
    assert head.qa_outputs.weight.grad is not None and torch.isfinite(loss)


def test_build_head_from_task_kind():
    assert isinstance(build_head("pair_classification", 8, 3), ClassificationHead)
    assert isinstance(build_head("extractive_qa", 8), SpanHead)
    with pytest.raises(ValueError, match="'ner'"):
        build_head("ner", 8)
    with pytest.raises(ValueError, match="num_labels=1"):
        build_head("pair_classification", 8, 1)
