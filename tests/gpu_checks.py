"""The GPU suite's checks that need no GPU to run, so that CPU tests (tests/test_gpu_checks.py) prove they can fail:
tests/gpu/test_gpu.py applies them to what the GPUs produce.

- `frozen_mismatches`: the frozen weights an engine trained beside (MM_DS_DUMP_FROZEN, mm_ds/runtime/faults.py: the live
  module's, in the training dtype) against the parent's fp32 weights rounded to that dtype.
- `attention_calls` / `sdpa_backend` / `fused_attention_problems`: what F.scaled_dot_product_attention receives
  from mm_ds/model/model.py for a batch, and which kernel torch's default dispatcher picks for it
  (`torch._fused_sdp_choice`, the choice F.scaled_dot_product_attention makes when no backend is forced).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

FUSED = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION)


def frozen_mismatches(live: dict[str, torch.Tensor], parent: dict[str, torch.Tensor], trainable) -> list[str]:
    """Problems with `live` (a frozen-parameter dump) against `parent` (fp32): a parameter that should be frozen
    and is missing, one that trains but was dumped, or one whose value is not the parent's rounded to its dtype."""
    frozen = {k for k in parent if not trainable(k)}
    problems = [f"{k}: frozen but not in the dump" for k in sorted(frozen - set(live))]
    problems += [f"{k}: in the dump but not a frozen parameter of the parent" for k in sorted(set(live) - frozen)]
    for k in sorted(frozen & set(live)):
        want = parent[k].to(live[k].dtype)
        if live[k].shape != want.shape or not torch.equal(live[k].cpu(), want.cpu()):
            diff = (live[k].float().cpu() - want.float().cpu()).abs().max().item() if live[k].shape == want.shape else None
            problems.append(f"{k}: not the parent's weights in {live[k].dtype} (max difference {diff})")
    return problems


@dataclass
class AttentionCall:
    q: torch.Tensor  # (B, nh, T, hs)
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor | None  # what the model passes as attn_mask
    dropout_p: float
    is_causal: bool


@contextlib.contextmanager
def attention_calls():
    """Record every F.scaled_dot_product_attention call (its inputs) made inside the block."""
    calls: list[AttentionCall] = []
    real = F.scaled_dot_product_attention

    def record(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        calls.append(AttentionCall(q.detach(), k.detach(), v.detach(),
                                   None if attn_mask is None else attn_mask.detach(), dropout_p, is_causal))
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kw)

    F.scaled_dot_product_attention = record
    try:
        yield calls
    finally:
        F.scaled_dot_product_attention = real


def sdpa_backend(call: AttentionCall) -> SDPBackend:
    """The kernel the default dispatcher picks for `call` (on its device)."""
    return SDPBackend(torch._fused_sdp_choice(call.q, call.k, call.v, call.mask, call.dropout_p, call.is_causal))


def fused_attention_problems(calls: list[AttentionCall]) -> list[str]:
    """Calls the default dispatcher would serve with the math fallback, each with torch's reasons."""
    import warnings

    import torch.backends.cuda as tbc

    problems = []
    for i, call in enumerate(calls):
        chosen = sdpa_backend(call)
        if chosen in FUSED:
            continue
        params = tbc.SDPAParams(call.q, call.k, call.v, call.mask, call.dropout_p, call.is_causal, False)
        with warnings.catch_warnings(record=True) as why:
            warnings.simplefilter("always")
            tbc.can_use_flash_attention(params, True)
            tbc.can_use_efficient_attention(params, True)
        mask = "no mask" if call.mask is None else f"mask {call.mask.dtype} {tuple(call.mask.shape)}"
        problems.append(f"call {i}: {chosen.name} for q {call.q.dtype} {tuple(call.q.shape)} on {call.q.device}, "
                        f"{mask}, dropout {call.dropout_p}; torch says: {'; '.join(str(w.message) for w in why)}")
    return problems
