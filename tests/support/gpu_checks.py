"""The GPU suite's checks that need no GPU to run, so that CPU tests (tests/test_gpu_checks.py) prove they can fail:
tests/gpu/test_gpu.py applies them to what the GPUs produce.

- `frozen_mismatches`: the frozen weights an engine trained beside (MM_DS_DUMP_FROZEN, mm_ds/runtime/faults.py: the live
  module's, in the training dtype) against the parent's fp32 weights rounded to that dtype.
- `attention_calls` / `sdpa_backend` / `fused_attention_problems`: what F.scaled_dot_product_attention receives
  from mm_ds/model/model.py for a batch, and which kernel torch's default dispatcher picks for it
  (`torch._fused_sdp_choice`, the choice F.scaled_dot_product_attention makes when no backend is forced);
  `sdpa_kernels_run`: the SDPA kernels that did run (the aten ops torch's profiler saw).
- `nccl_transports`: how NCCL connected the GPUs, read from its NCCL_DEBUG=INFO lines.
- `summary`: the lines a person pastes after `make test-gpu` (tests/gpu/conftest.py prints them).
The paper-shape update's floor and ceiling are tests/gpu/gpu_thresholds.py's, the host's waits for the device
tests/gpu/device_waits.py's: scripts in tests/gpu import them too.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
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


# The aten op each SDPA backend dispatches to (what torch's profiler records), CPU's flash kernel included.
SDPA_OPS = {"aten::_scaled_dot_product_flash_attention": SDPBackend.FLASH_ATTENTION,
            "aten::_scaled_dot_product_flash_attention_for_cpu": SDPBackend.FLASH_ATTENTION,
            "aten::_scaled_dot_product_efficient_attention": SDPBackend.EFFICIENT_ATTENTION,
            "aten::_scaled_dot_product_cudnn_attention": SDPBackend.CUDNN_ATTENTION,
            "aten::_scaled_dot_product_attention_math": SDPBackend.MATH}


def sdpa_kernels_run(fn) -> Counter:
    """The SDPA backends whose kernels ran while `fn()` ran (forward ops; their backward ops are not counted),
    read from torch's profiler: the dispatcher's real choice, not a prediction."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return Counter(SDPA_OPS[e.name].name for e in prof.events() if e.name in SDPA_OPS)


# ---------------------------------------------------------------- NCCL's transports

# NCCL_DEBUG=INFO lines (NCCL_DEBUG_SUBSYS=INIT,GRAPH), as NCCL 2.x's transport/{p2p,shm,net}.cc and
# graph/search.cc print them:
#   ... NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
#   ... NCCL INFO Channel 00 : 1[1] -> 0[0] via SHM/direct/direct
#   ... NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA
#   ... NCCL INFO Pattern 4, crossNic 0, nChannels 24, bw 40.000000/40.000000, type NVL/PIX, sameChannels 1
_CHANNEL = re.compile(r"NCCL INFO Channel \d+(?:/\d+)? : \d+\[[0-9a-fx]+\] -> \d+\[[0-9a-fx]+\]"
                      r"(?: \[(?:send|receive)\])? via (\w+)(?:/(\w+))?")
_PATTERN = re.compile(r"NCCL INFO Pattern \d+, crossNic \d+, nChannels \d+, \w+ [\d.]+/[\d.]+, type (\w+)/(\w+)")
INTRA_NODE = {"P2P", "SHM"}  # GPU to GPU inside a node: NVLink or PCIe peer access, else host shared memory


def nccl_transports(log: str) -> dict:
    """{"connections": Counter of "P2P/CUMEM", "SHM/direct", "NET/IB", "NET/Socket" ..., "paths": Counter of the
    graph's intra-node path types ("NVL": NVLink; "PIX", "PXB", "PHB", "SYS": PCIe and the host)} of a run's
    NCCL_DEBUG=INFO output."""
    conns = Counter("/".join(p for p in m.groups() if p) for m in _CHANNEL.finditer(log))
    paths = Counter(m.group(1) for m in _PATTERN.finditer(log))
    return {"connections": conns, "paths": paths}


def transport_problems(found: dict, nodes: int = 1) -> list[str]:
    """On one node every connection between GPUs is P2P or SHM: NET there means peer access and shared memory
    both failed (a container without IPC, NCCL_P2P_DISABLE and NCCL_SHM_DISABLE), traffic through a NIC or TCP."""
    if not found["connections"]:
        return ["no NCCL connection lines: was NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,GRAPH) set for the ranks?"]
    if nodes == 1:
        return [f"{n} connection(s) via {kind} between GPUs of one node" for kind, n in found["connections"].items()
                if kind.split("/")[0] not in INTRA_NODE]
    return []


def describe_transports(found: dict) -> str:
    conns = ", ".join(f"{k} x{n}" for k, n in sorted(found["connections"].items()))
    paths = ", ".join(sorted(found["paths"])) or "?"
    nvlink = "NVLink" if "NVL" in found["paths"] else "no NVLink path" if found["paths"] else "path unknown"
    return f"{conns or 'none'}; graph path {paths} ({nvlink})"


# ---------------------------------------------------------------- the summary a person pastes

def summary(env: dict, rows: list[dict], budget_s: float = 480.0) -> str:
    """`make test-gpu`'s closing lines: the machine, then per test its outcome, time and measured numbers
    (each row: {name, outcome: passed/failed/skipped, seconds, numbers: {label: text}, reason}), then the total
    against the 8-minute budget of one GPU."""
    total = sum(r["seconds"] for r in rows)
    lines = ["---- mm-ds GPU suite (paste from here) ----",
             f"GPU: {env['gpu']} x {env['gpus']}; driver {env.get('driver', '?')}; torch {env['torch']} "
             f"(CUDA {env['cuda']}, NCCL {env.get('nccl', '?')}); DeepSpeed {env['deepspeed']}; "
             f"Python {env['python']}; mm-ds {env.get('commit', '?')}"]
    for r in rows:
        numbers = "; ".join(f"{k} {v}" for k, v in r.get("numbers", {}).items())
        why = f" [{r['reason']}]" if r.get("reason") else ""
        lines.append(f"{r['outcome'].upper():7} {r['name']} ({r['seconds']:.0f} s){': ' + numbers if numbers else ''}"
                     f"{why}")
    counts = Counter(r["outcome"] for r in rows)
    over = "" if total <= budget_s else f" - OVER the {budget_s / 60:.0f}-minute budget of one GPU"
    errors = f", {counts['error']} errors" if counts["error"] else ""
    lines.append(f"{counts['passed']} passed, {counts['failed']} failed{errors}, {counts['skipped']} skipped in "
                 f"{total / 60:.1f} min{over}")
    lines.append("---- end ----")
    return "\n".join(lines)
