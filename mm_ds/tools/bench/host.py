"""`mm-ds bench`'s host-side figure: does the host keep a GPU busy at the paper's shapes?

On a GPU the host queues kernels ahead of the device and costs time only when it waits for the device (a
read of a device value: the loop has none outside log and checkpoint updates, tests/test_host_side.py) or
cannot keep up. Per micro-step it must do two things faster than the device runs that micro-step:

  loop     the training thread: take the next batch from the prefetcher (mm_ds/runtime/training/prefetch.py), issue its
           copies, the loop's bookkeeping, and the Python and dispatch work of forward, backward and (once per
           update, shared by its micro-steps) DeepSpeed's optimizer step;
  builder  the prefetcher's thread: pack and mask one micro-batch of the paper's shape.

Method. `loop` is `engine.train_step` timed on one CPU rank with the compute taken out: the paper's architecture (12
layers and their ops; the 4-layer MINIJOINT mini-model for Step 2) at near-zero width (hidden 12, one dimension per
head, FFN 12) and near-zero vocabulary (a `HOST_VOCAB`-piece corpus of the bench's text: the kernels a step issues
over the vocabulary are the same few whatever its size, and their size is device work), 16 tokens per micro-batch,
one thread, ZeRO 1 (the paper's optimizer path; in fp32, because this CPU's bf16 kernels cost milliseconds per call
even at this width and would count as host time: the paper's bf16 runs DeepSpeed's BF16_Optimizer, which on every
micro-step also casts and adds each trainable tensor's gradient into its fp32 copy, ~10 us per tensor here, not
counted; Step 2 trains 2 tensors, Step 1 about 150) and the gradient accumulation of the stage as `mm-ds run paper`
launches it (`paper_shapes`: 2048 sequences on 8 ranks, Step 1 BL_BASE at 32 per micro-step, 8 micro-steps per
update; Step 2 over the mini-model at 64, 4), batches from the prefetcher. The model issues the calls its GPU path
issues (`gpu_op_path`): dropout as one `native_dropout` (what `F.dropout` dispatches to on a GPU, one autograd node;
not the CPU path's cheaper-mask ops) and attention as one fused SDPA call (on a GPU the kernel applies attention
dropout inside; CPU SDPA with dropout would fall back to its composite math, so here it runs without). What remains
of the wall time is host work: this CPU's op dispatch stands in for a GPU's kernel launches, which cost about as
much per op; the tiny kernels' own CPU time is counted too, so the figure still errs high (a CPU `native_dropout`
dispatches its mask ops one by one where a GPU launches one kernel). The loop is timed in 5 rounds of 3 updates, the
two shapes in turn, and the figure is the median round: op dispatch on these vCPUs swings ~1.5x from minute to
minute. `builder` is `MLMBatches` building micro-batches of the stage's shape (micro batch x 512) over the bench
corpus.
Both are compared with the device time per micro-step that `mm-ds plan`'s model predicts for an H100: the analytic
FLOPs of the stage's micro batch (A1 for Step 1 BL_BASE, A3 over 4 layers for Step 2) over its bf16 peak at the
plan's default MFU. PASS when each is below half of it: then even if the two threads never overlapped (Python's
lock), the host stays ahead with margin. At 32 sequences the mini-model's micro-step is 5.9 ms on an H100, and this
loop took 44-71% of that on these vCPUs (docs/results.md, 2026-11-26): the paper recipe runs its 4-6-layer stages
at 64 (presets/paper/bl_small.yaml).
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from ...data.mlm import MLMBatches
from ...data.shards import TokenCorpus
from ...model import flops, model
from ...pipeline.recipe import load_recipe
from ...pipeline.stage_runs import stage_configs
from ...runtime.training import compiled
from ...runtime.training import engine as eng
from ...runtime.training.ds_config import Geometry, geometry
from ...runtime.training.prefetch import Prefetcher
from ..plan.plan import Cluster

SHAPES = {  # bench stage -> (what, FLOPs kind, the paper recipe's stage run (its first language's), device layers)
    "pretrain": ("Step 1, BL_BASE", "pretrain", "pretrain/bl_base", None),
    "adapt_mini": ("Step 2, MINIJOINT mini-model", "adapt", "adapt/minijoint/", "mini"),
}
THRESHOLD = 0.5
COMPILED_THRESHOLD = 0.25
"""The compiled loop's target (train.compile): a quarter of the device's micro-step, so that with compile on a GPU
keeps the host's dispatch well out of the way (eager: 33-45% for Step 1, docs/results.md)."""
HOST_VOCAB = 256  # pieces of the loop's corpus; the paper's 250k-piece rows are device work (docstring)


@dataclass(frozen=True)
class Shape:
    """A bench stage's micro-step as `mm-ds run paper` launches it."""

    geo: Geometry
    seq: int


def paper_shapes() -> dict[str, Shape]:
    """Each shape's batch geometry and sequence length in the paper recipe's stage config, on its launch's ranks."""
    cfgs = stage_configs(load_recipe("paper"))
    out = {}
    for name, (_, _, run, _) in SHAPES.items():
        cfg = next(c for key, c in cfgs.items() if key.startswith(run))
        out[name] = Shape(geometry(cfg, cfg.launch.world_size), cfg.data.seq_len)
    return out


def device_seconds(kind: str, hidden: int, vocab: int, layers: int, shape: Shape, cluster: Cluster) -> float:
    """One micro-step (micro batch x sequence) on one GPU at the plan's peak and MFU."""
    f = flops.stage_flops_per_step(kind, hidden=hidden, vocab=vocab, layers=layers, seq_len=shape.seq,
                                   mask_prob=0.15, global_batch=shape.geo.micro_batch)
    return f / (cluster.peak_tflops * 1e12 * cluster.mfu)


@contextlib.contextmanager
def gpu_op_path():
    """mm_ds.model.model issues the calls its GPU path issues (see the module docstring), then its own again."""
    saved = model.dropout, model._attention_with_dropout
    model.dropout = lambda x, p, training: torch.native_dropout(x, p, True)[0] if training and p > 0.0 else x
    model._attention_with_dropout = lambda q, k, v, mask, p: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    try:
        yield
    finally:
        model.dropout, model._attention_with_dropout = saved


def loop_seconds(builder, accum: dict[str, int], rounds: int, updates: int, rank: int,
                 backend: str | None = None) -> dict[str, list[float]]:
    """Wall seconds per micro-step of `engine.train_step` for each bench stage of `builder` (a `bench.Stages`
    over a near-zero-width model) in `accum`, at its micro-steps per update, batches from a `Prefetcher`: per
    round, the median over `updates` updates of each stage in turn, so that a slow spell of the machine (this
    figure is all op dispatch, which swings ~1.5x on these vCPUs from minute to minute) hits every stage and only
    some rounds. With `backend`, each stage also compiled (train.compile), timed in the same rounds under
    "NAME compiled"."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the host's work is one thread's; a thread pool's barriers per tiny op are not it
    runs = {name: (name, None) for name in accum} | ({f"{name} compiled": (name, backend) for name in accum}
                                                    if backend else {})
    try:
        with gpu_op_path(), contextlib.ExitStack() as stack:
            loops = {key: _Loop(builder, name, accum[name], rounds * updates + 1, rank, stack, compile_backend)
                     for key, (name, compile_backend) in runs.items()}
            times: dict[str, list[float]] = {key: [] for key in runs}
            for _ in range(rounds):
                for name, loop in loops.items():
                    times[name].append(statistics.median(loop.update() for _ in range(updates)))
            return times
    finally:
        torch.set_num_threads(threads)


class _Loop:
    """One bench stage's engine and prefetched batches; `update()` times the next update per micro-step."""

    def __init__(self, builder, name: str, accum: int, updates: int, rank: int, stack: contextlib.ExitStack,
                 compile_backend: str | None = None):
        self.eng, self.rank = eng, rank
        self.stage = builder.timed(name, updates)
        self.stage.cfg.train = replace(self.stage.cfg.train, global_batch=accum * builder.micro_batch,
                                       compile=compile_backend is not None,
                                       compile_backend=compile_backend or self.stage.cfg.train.compile_backend)
        built = eng.build_engine(self.stage, 1)
        self.engine, self.geo = built.engine, built.geo
        self.engine.train()
        if built.compiled is not None:
            stack.callback(compiled.release, self.engine.module)
        self.ahead = stack.enter_context(Prefetcher(self.stage.batches, rank, self.geo, 0, updates,
                                                    ahead=self.stage.cfg.data.prefetch))
        self.step = 0
        self.update()  # the first builds DeepSpeed's buffers (and compiles)

    def update(self) -> float:
        """Seconds per micro-step of the next update, less any compiling in it (a later mask's graph)."""
        t0, k0 = time.perf_counter(), compiled.seconds()
        with contextlib.redirect_stdout(sys.stderr):  # compile lines: to the log
            sums, _, _ = self.eng.train_step(self.engine, self.stage, self.step, self.rank, self.geo, self.ahead.get)
        float(sums["loss"])  # the update's work is done (on a GPU the loop would not wait here)
        self.step += 1
        return (time.perf_counter() - t0 - (compiled.seconds() - k0)) / self.geo.grad_accum


def builder_seconds(corpus_dir, vocab: int, shape: Shape, reps: int = 5) -> float:
    """Median seconds to build one micro-batch of `shape` (packing, masking, masked positions)."""
    mlm = MLMBatches(TokenCorpus(corpus_dir), shape.seq, seed=0, vocab_size=vocab)
    g = shape.geo
    times = []
    for s in range(reps + 1):
        t0 = time.perf_counter()
        mlm.batch(s, 0, 0, g.world_size, g.micro_batch, g.grad_accum)
        if s:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(stages_for, corpus_dir, host_corpus, paper_cfg, mini_layers: int, rank: int, log,
            rounds: int = 5, updates: int = 3, backend: str | None = None) -> dict:
    """The host-side figure for both shapes. `stages_for(mcfg, corpus, seq, micro, ds_config)` gives a
    `bench.Stages` over a corpus: the loop runs over `host_corpus` (`HOST_VOCAB` pieces), the batch builder over
    `corpus_dir` (the model's vocabulary); `paper_cfg` is the paper's primary model (models/base). The loop
    figure is the median over `rounds` rounds of `updates` updates, the shapes in turn (`loop_seconds`); with
    `backend`, the compiled loop's too (train.compile: what a GPU would see of the host with the model compiled)."""
    cluster, shapes = Cluster(), paper_shapes()
    tiny = replace(paper_cfg, hidden_size=12, num_heads=12, ffn_size=12,
                   vocab_size=TokenCorpus(host_corpus).vocab_size)
    builder = stages_for(tiny, host_corpus, 16, 1, "fp32_zero1.json")
    log(f"host side: timing the loop at near-zero width, {', '.join(v[0] for v in SHAPES.values())} in turn ...")
    loops = loop_seconds(builder, {name: shape.geo.grad_accum for name, shape in shapes.items()}, rounds, updates,
                         rank, backend)
    rows = {}
    for name, (what, kind, _, depth) in SHAPES.items():
        shape = shapes[name]
        layers = mini_layers if depth == "mini" else paper_cfg.num_layers
        dev = device_seconds(kind, paper_cfg.hidden_size, paper_cfg.vocab_size, layers, shape, cluster)
        build = builder_seconds(corpus_dir, paper_cfg.vocab_size, shape)
        loop = statistics.median(loops[name])
        rows[name] = {"what": what, "layers": layers, "micro_batch": shape.geo.micro_batch, "seq": shape.seq,
                      "grad_accum": shape.geo.grad_accum, "device_s": dev, "loop_s": loop,
                      "loop_rounds_s": loops[name], "builder_s": build, "loop_share": loop / dev,
                      "builder_share": build / dev}
        if backend:
            compiled_loop = statistics.median(loops[f"{name} compiled"])
            rows[name] |= {"loop_compiled_s": compiled_loop, "loop_compiled_rounds_s": loops[f"{name} compiled"],
                           "loop_compiled_share": compiled_loop / dev}
    return {"rows": rows, "gpu": f"H100 at {cluster.peak_tflops:g} TFLOP/s bf16, MFU {cluster.mfu:g}",
            "loop_vocab": tiny.vocab_size, "rounds": rounds, "updates": updates, "threshold": THRESHOLD,
            "compiled_threshold": COMPILED_THRESHOLD, "backend": backend}


def table(host: dict) -> str:
    comp = bool(host.get("backend"))
    lines = [f"host side per micro-step, at `mm-ds run paper`'s micro batch and sequence, against {host['gpu']}; "
             f"loop: median of {host['rounds']} rounds of {host['updates']} updates, the shapes in turn"
             + (f"; compiled: train.compile ({host['backend']}) in the same rounds:" if comp else ":"),
             "| shape | layers | micro x seq | micro-steps | device ms | loop ms | rounds' range | loop share | "
             + ("compiled loop ms | compiled share | " if comp else "") + "builder ms | builder share |",
             "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if comp else "") + "---:|---:|"]
    for r in host["rows"].values():
        lo, hi = min(r["loop_rounds_s"]), max(r["loop_rounds_s"])
        compiled_cells = (f"{1e3 * r['loop_compiled_s']:.2f} | {100 * r['loop_compiled_share']:.0f}% | "
                          if comp else "")
        lines.append(f"| {r['what']} | {r['layers']} | {r['micro_batch']} x {r['seq']} | {r['grad_accum']} | "
                     f"{1e3 * r['device_s']:.2f} | {1e3 * r['loop_s']:.2f} | {1e3 * lo:.2f}-{1e3 * hi:.2f} | "
                     f"{100 * r['loop_share']:.0f}% | {compiled_cells}{1e3 * r['builder_s']:.2f} | "
                     f"{100 * r['builder_share']:.0f}% |")
    return "\n".join(lines)


def worst_share(host: dict) -> tuple[float, str]:
    """The largest share of the device time any host part needs, and what it is."""
    return max((r[f"{part}_share"], f"{r['what']}: {part} {1e3 * r[f'{part}_s']:.2f} ms vs device "
                                    f"{1e3 * r['device_s']:.2f} ms")
               for r in host["rows"].values() for part in ("loop", "builder"))

