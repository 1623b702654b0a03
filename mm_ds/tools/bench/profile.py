"""`mm-ds bench --profile`: where one update of Step 1 (BL_BASE pretraining) spends its time on this CPU, eager and
with train.compile, against the analytic FLOPs of each part: what keeps its MFU from the matmul peak.

One update after `WARMUP` (the compiled side's compiles among them) runs under torch's profiler with input shapes.
Its forward, backward and optimizer step are timed as wholes (record_function around the engine's own calls), and
every op's self time is put in one part by what it is:

  layer matmuls        the four projections of each layer and the MLM head's dense (mm/addmm/linear on h or ffn)
  attention            the score and context matmuls (bmm), softmax, SDPA kernels
  vocabulary           the tied output projection at the masked positions (a matmul with a V-sized side), the
                       log-softmax and loss, and the token embeddings' gradient (embedding backward)
  optimizer            what runs inside DeepSpeed's step (AdamW over every parameter, its copies)
  elementwise, other   the rest: GELU, LayerNorm, dropout, residual adds, copies and views; a compiled graph's fused
                       kernels (inductor's cpp_fused_*) land here too

The matmul parts get their analytic FLOPs (2 per multiply-add, forward and both backward products) and so their
achieved rate, to compare with the run's matmul peak.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import replace

from torch.profiler import ProfilerActivity, profile, record_function

from .pairs import EngineSteps

WARMUP = 3
PARTS = ("layer matmuls", "attention", "vocabulary", "optimizer", "elementwise, other")
MATMULS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm"}


def _part(name: str, shapes, vocab: int) -> str:
    dims = {d for s in shapes or () for d in (s or ()) if isinstance(d, int)}
    if "log_softmax" in name or "nll_loss" in name or "cross_entropy" in name or (
            "embedding" in name and "backward" in name) or (name in MATMULS and vocab in dims):
        return "vocabulary"
    if "attention" in name or "softmax" in name or name in ("aten::bmm", "aten::baddbmm"):
        return "attention"
    if name in MATMULS:
        return "layer matmuls"
    return "elementwise, other"


@contextlib.contextmanager
def _named_calls(engine):
    """The engine's forward, backward and step, each inside a record_function of its name (instance attributes,
    removed after)."""
    for name in ("forward", "backward", "step"):
        method = getattr(engine, name)

        def call(*args, _m=method, _n=name, **kwargs):
            with record_function(f"mm-ds {_n}"):
                return _m(*args, **kwargs)

        setattr(engine, name, call)
    try:
        yield
    finally:
        for name in ("forward", "backward", "step"):
            delattr(engine, name)


def profile_update(steps_of, vocab: int) -> dict:
    """Seconds per part (module docstring) of one update of `steps_of` (a pairs.py `EngineSteps`)."""
    for step in range(WARMUP):
        steps_of(step)
    engine = steps_of.built.engine
    with _named_calls(engine), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        wall = steps_of(WARMUP)[0]
    parts: dict[str, float] = defaultdict(float)
    phases: dict[str, float] = defaultdict(float)
    inside_step = set()
    for ev in prof.events():
        if ev.name.startswith("mm-ds "):
            phases[ev.name[len("mm-ds "):]] += ev.cpu_time_total / 1e6
            if ev.name == "mm-ds step":
                inside_step.add((ev.time_range.start, ev.time_range.end))
    for ev in prof.events():  # self times: every microsecond once, in the op that spent it
        if ev.name.startswith("mm-ds "):
            continue
        if any(a <= ev.time_range.start and ev.time_range.end <= b for a, b in inside_step):
            parts["optimizer"] += ev.self_cpu_time_total / 1e6
        else:
            parts[_part(ev.name, ev.input_shapes, vocab)] += ev.self_cpu_time_total / 1e6
    return {"wall_s": wall, "phases": dict(phases), "parts": {p: parts.get(p, 0.0) for p in PARTS}}


def matmul_flops(model_cfg, micro_batch: int, seq: int, masked: int) -> dict[str, float]:
    """Analytic FLOPs of one micro-step's matmul parts, forward and backward (3 products per weight matmul)."""
    h, f, layers, v = model_cfg.hidden_size, model_cfg.ffn_size, model_cfg.num_layers, model_cfg.vocab_size
    tokens = micro_batch * seq
    return {"layer matmuls": 3 * 2 * tokens * (4 * h * h + 2 * h * f) * layers + 3 * 2 * masked * h * h,
            "attention": 3 * 2 * 2 * micro_batch * seq * seq * h * layers,
            "vocabulary": 3 * 2 * masked * h * v}


def table(prof: dict, peak: float) -> str:
    sides = list(prof["sides"])
    lines = [f"one update of {prof['stage']} (micro batch {prof['micro_batch']} x {prof['seq']}, "
             f"{prof['masked']} masked positions per micro-step), by part (bench_profile.py); matmul peak "
             f"{peak / 1e9:.1f} GFLOP/s:",
             "| part | " + " | ".join(f"{s} s | {s} share | {s} GFLOP/s" for s in sides) + " |",
             "|---|" + "---:|---:|---:|" * len(sides)]
    for part in PARTS:
        cells = []
        for s in sides:
            r = prof["sides"][s]
            t, fl = r["parts"][part], prof["flops"].get(part)
            rate = f"{fl / t / 1e9:.1f} ({100 * fl / t / peak:.0f}%)" if fl and t else "-"
            cells.append(f"{t:.3f} | {100 * t / r['wall_s']:.0f}% | {rate}")
        lines.append(f"| {part} | " + " | ".join(cells) + " |")
    lines.append("| update (wall) | " + " | ".join(f"{prof['sides'][s]['wall_s']:.3f} | 100% | "
                                                   f"{prof['total_flops'] / prof['sides'][s]['wall_s'] / 1e9:.1f} "
                                                   f"({100 * prof['total_flops'] / prof['sides'][s]['wall_s'] / peak:.0f}%)"
                                                   for s in sides) + " |")
    return "\n".join(lines)


def measure(builder, backend: str | None, rank: int, world: int, log) -> dict:
    """Step 1 (bench stage `pretrain`) profiled eager and, with `backend`, compiled: each side's parts, the
    matmul parts' analytic FLOPs and the update's (A1, the bench's MFU basis)."""
    sides = {}
    for side, comp in (("eager", None), ("compiled", backend))[:2 if backend else 1]:
        log(f"profile: one update of pretrain, {side} ...")
        stage = builder.timed("pretrain", WARMUP + 1)
        if comp:
            stage.cfg.train = replace(stage.cfg.train, compile=True, compile_backend=comp)
        steps_of = EngineSteps(stage, world, rank)
        try:
            sides[side] = profile_update(steps_of, stage.cfg.model.vocab_size)
        finally:
            steps_of.close()
    cfg, micro, seq = stage.cfg, builder.micro_batch, builder.seq
    masked = micro * min(int(cfg.data.mask_prob * (seq - 1)) + 1, seq - 1)  # MLMBatches.max_masked, padded
    return {"stage": "pretrain", "micro_batch": micro, "seq": seq, "masked": masked, "sides": sides,
            "flops": matmul_flops(cfg.model, micro, seq, masked), "total_flops": stage.flops_per_step(micro)}
