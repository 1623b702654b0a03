"""`mm-ds bench`: time every stage kind through the real training step, against a same-run matmul peak
and a Hugging Face `transformers` peer, and check the CPU speed targets.

    mm-ds bench --preset base --micro-batch 2 --json bench.json
    mm-ds bench --preset tiny --steps 2 --no-peer

What runs. Each stage is the stage's real model after its real surgery, its real trainable set, frozen
before a DeepSpeed engine that `mm_ds.engine` builds the same way (`resolve_ds_config`, same ds config,
fp32 on CPU, one in-process rank), stepped by `engine.train_step`, the function `engine.train` loops over:

    pretrain       Step 1, one MLM head, all layers (BL_BASE)                  FLOPs: A1
    pretrain_dual  Step 1 with MINIJOINT's second head after layer N            A1 + second head
    build_mini     Step 1b: MINIPOST's 2 new layers over N frozen + frozen head A4
    adapt_full     Step 2 over the full model (BL_BASE): language group only    A3, l = all layers
    adapt_mini     Step 2 over the N-layer MINIJOINT mini-model                 A3, l = N
    finetune       Step 3: classification head, token embeddings frozen         3 x forward of the layers

Data. A synthetic corpus (Zipf-distributed pseudo-words, documents of sentences) is generated and prepared
with `mm_ds.data.corpus.prepare` into a temporary directory. It cannot support a 50k-piece SentencePiece
model, so its tokenizer is small; `MLMBatches` draws real packed, dynamically masked batches from it, and
a fixed injective map spreads the non-special ids over the model's full vocabulary (the mask pattern and
labels are the loader's). The loader share is the time `train_step` spends fetching a batch (loader plus
that map) over the step time. Finetuning uses synthetic padded sentence pairs (10% padding) and labels.

Peer. `transformers`' RobertaForMaskedLM (attn_implementation="sdpa") with the same shape, batches and
dropout, in a plain loop with torch.optim.AdamW (all parameters, its CPU defaults); Step 2 freezes all
but the word embeddings (tied to the decoder) and the LM-head bias. HF computes the LM head over every
position; mm-ds over the masked ones only: that difference is part of what the comparison measures.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from . import flops as F
from .config import DataConfig, ModelConfig, RunConfig, TrainConfig, read_preset
from .engine import measure_matmul_peak
from .tokens import IGNORE_INDEX, PAD

STAGES = ("pretrain", "pretrain_dual", "build_mini", "adapt_full", "adapt_mini", "finetune")
PEER_STAGES = ("pretrain", "adapt_full", "adapt_mini")  # the peer has no dual head, bridge or task loop here


@dataclass(frozen=True)
class Preset:
    model: str  # packaged model preset
    vocab: int  # used where the model preset leaves vocab_size to the tokenizer
    seq: int
    mini_layers: int  # N: MINIJOINT's second head, the mini-model, MINIPOST's frozen bottom
    new_layers: int  # MINIPOST's bridge
    micro_batch: int
    steps: int
    warmup: int
    corpus_mb: float  # synthetic text for the corpus and the encode-speed measurement


PRESETS = {
    "tiny": Preset("models/tiny", 4000, 128, 2, 2, micro_batch=8, steps=3, warmup=1, corpus_mb=2),
    "small": Preset("models/small", 50000, 512, 4, 2, micro_batch=2, steps=3, warmup=1, corpus_mb=12),
    "base": Preset("models/base", 50000, 512, 4, 2, micro_batch=2, steps=3, warmup=1, corpus_mb=12),
}

STAGE_TITLES = {
    "pretrain": "Step 1, single head",
    "pretrain_dual": "Step 1, dual head (MINIJOINT)",
    "build_mini": "Step 1b (MINIPOST bridge)",
    "adapt_full": "Step 2, full model",
    "adapt_mini": "Step 2, mini-model",
    "finetune": "Step 3, finetune (cls)",
}

# Speed targets at the base shape, as (key, description, threshold).
TARGETS = (
    ("a3_speedup", "Step 2 mini vs full: speedup >= 90% of analytic A3 ratio", 0.90),
    ("peer_pretrain", "pretrain tokens/s >= 1.25x transformers", 1.25),
    ("peer_adapt_mini", "Step 2 mini tokens/s >= 1.6x transformers", 1.6),
    ("mfu_pretrain", "pretrain achieved FLOP/s >= 50% of matmul peak", 0.50),
    ("prepare_encode", "prepare encode >= 80% of 1-proc SentencePiece x workers", 0.80),
    ("loader_share", "loader < 2% of step time (every MLM stage)", 0.02),
)


# ----------------------------------------------------------------------------------------------- measuring

def matmul_peak(n: int = 2048, reps: int = 5) -> dict:
    return measure_matmul_peak(n, reps)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class RssPeak:
    """Peak resident memory while the block runs, sampled every 10 ms from /proc (Linux); elsewhere only
    the process-wide high-water mark of getrusage is available."""

    def __init__(self, interval: float = 0.01):
        self.interval, self.peak, self.start = interval, 0, 0
        self._stop = threading.Event()
        self._ok = os.path.exists("/proc/self/statm")

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, _rss_bytes())

    def __enter__(self):
        if self._ok:
            self.start = self.peak = _rss_bytes()
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._ok:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, _rss_bytes())


def release_free_memory() -> None:
    """Between stages: hand the heap's free pages back (engine.keep_freed_memory keeps them during
    training), so each stage's peak RSS is its own and not its predecessors' high-water mark."""
    import ctypes
    import ctypes.util

    gc.collect()
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


# ----------------------------------------------------------------------------------------------- data

def synthetic_text(path: Path, megabytes: float, seed: int = 0) -> int:
    """English-like text in the CC-100 layout (a sentence per line, blank line between documents): words
    drawn Zipf-like from a generated lexicon, so SentencePiece sees a realistic piece distribution."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    freq = 1.0 / np.arange(1, len(letters) + 1)
    words = ["".join(rng.choice(letters, size=rng.integers(2, 10), p=freq / freq.sum())) for _ in range(20000)]
    zipf = 1.0 / np.arange(1, len(words) + 1) ** 1.1
    zipf /= zipf.sum()
    target = int(megabytes * 2 ** 20)
    written = 0
    with open(path, "w") as f:
        while written < target:
            n_sent = int(rng.integers(4, 16))
            lens = rng.integers(6, 30, size=n_sent)
            idx = rng.choice(len(words), size=int(lens.sum()), p=zipf)
            parts, at = [], 0
            for n in lens:
                parts.append(" ".join(words[i] for i in idx[at:at + n]).capitalize() + " .")
                at += n
            doc = "\n".join(parts) + "\n\n"
            f.write(doc)
            written += len(doc)
    return written


def prepare_corpus(work: Path, megabytes: float, workers: int, log) -> tuple[Path, dict]:
    """Prepare the synthetic corpus; then measure `mm-ds prepare`'s encoding against single-process
    SentencePiece on the same text (target 4), and with one worker (its own overhead, apart from scaling)."""
    import sentencepiece as spm

    from .data.corpus import prepare

    text = work / "corpus.txt"
    nbytes = synthetic_text(text, megabytes)
    vocab = 2000 if megabytes < 4 else 8000
    log(f"synthetic corpus: {nbytes / 2**20:.1f} MiB; training a {vocab}-piece SentencePiece model ...")
    t0 = time.perf_counter()
    meta = prepare("xx", [str(text)], str(work / "corpus"), vocab_size=vocab, sample_sentences=20000,
                   workers=workers, seed=0, progress=False)
    t_first = time.perf_counter() - t0
    model = work / "corpus" / meta["spm_model"]

    # Encoding only: reuse the trained model, so prepare's time is read + encode + write shards.
    t0 = time.perf_counter()
    prepare("xx", [str(text)], str(work / "reencoded"), spm_model=str(model), workers=workers, progress=False)
    t_prep = time.perf_counter() - t0
    t0 = time.perf_counter()
    prepare("xx", [str(text)], str(work / "reencoded1"), spm_model=str(model), workers=1, progress=False)
    t_prep1 = time.perf_counter() - t0
    sp = spm.SentencePieceProcessor(model_file=str(model))
    with open(text, encoding="utf-8") as f:
        lines = f.read().split("\n")
    sp.encode(lines[:2000], out_type=int, num_threads=1)
    t0 = time.perf_counter()
    sp.encode(lines, out_type=int, num_threads=1)
    t_single = time.perf_counter() - t0
    enc = {"text_bytes": nbytes, "corpus_tokens": meta["num_tokens"], "corpus_vocab": meta["vocab_size"],
           "first_prepare_s": t_first, "workers": workers, "prepare_encode_s": t_prep,
           "prepare_bytes_per_s": nbytes / t_prep, "prepare_1_worker_s": t_prep1,
           "prepare_1_worker_bytes_per_s": nbytes / t_prep1, "single_process_encode_s": t_single,
           "single_process_bytes_per_s": nbytes / t_single}
    enc["ratio"] = enc["prepare_bytes_per_s"] / (enc["single_process_bytes_per_s"] * workers)
    return work / "corpus", enc


class SpreadVocab:
    """Real `MLMBatches` batches with the corpus's non-special ids mapped injectively onto [5, vocab)."""

    def __init__(self, mlm, vocab: int, seed: int = 0):
        n_special = 5
        perm = np.random.default_rng(seed).permutation(vocab - n_special)[: mlm.corpus.vocab_size - n_special]
        self.lut = torch.from_numpy(np.concatenate([np.arange(n_special), perm + n_special]).astype(np.int64))
        self.mlm = mlm

    def __call__(self, step, micro, rank, geo) -> dict:
        b = self.mlm.batch(step, micro, rank, geo.world_size, geo.micro_batch, geo.grad_accum)
        labels = b["labels"]
        b["labels"] = torch.where(labels == IGNORE_INDEX, labels, self.lut[labels.clamp(min=0)])
        b["input_ids"] = self.lut[b["input_ids"]]
        return b


def pair_batches(vocab: int, seq: int, num_labels: int = 3):
    """Step 3 stand-in: padded sentence pairs (the last 10% of each row is padding) and class labels."""

    def batch(step, micro, rank, geo) -> dict:
        g = torch.Generator().manual_seed(step * 1000 + micro * 10 + rank)
        B = geo.micro_batch
        ids = torch.randint(5, vocab, (B, seq), generator=g)
        ids[:, 0] = 0
        keep = seq - seq // 10
        ids[:, keep:] = PAD
        mask = ids.ne(PAD)
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.randint(0, num_labels, (B,), generator=g)}

    return batch


# ----------------------------------------------------------------------------------------------- stages

@dataclass
class Built:
    name: str
    cfg: RunConfig
    model: torch.nn.Module
    trainable: object
    kind: str
    layers: int
    trainable_layers: int | None = None
    seq: int = 0
    extra: dict = field(default_factory=dict)


def base_model_cfg(preset: Preset) -> ModelConfig:
    from .config import from_dict

    mcfg = from_dict(ModelConfig, read_preset(preset.model)["model"], prefix="model.")
    if mcfg.vocab_size is None:
        mcfg.vocab_size = preset.vocab
    mcfg.check()
    return mcfg


def build_stage(name: str, mcfg: ModelConfig, preset: Preset, seq: int, corpus: Path) -> Built:
    """The stage's model, after the same surgery its stage module performs, and its trainable set."""
    from . import surgery
    from .data.tasks import PAIR_CLASSIFICATION
    from .heads import RobertaForTask
    from .model import LANGUAGE_PARAMS, RobertaMLM
    from .stages.finetune import FROZEN

    N = preset.mini_layers
    torch.manual_seed(0)
    cfg = RunConfig(stage="pretrain", model=replace(mcfg), data=DataConfig(corpus=str(corpus), seq_len=seq))
    if name == "pretrain":
        return Built(name, cfg, RobertaMLM(cfg.model), lambda n: True, "pretrain", mcfg.num_layers, seq=seq)
    if name == "pretrain_dual":
        cfg.model.aux_head_layer = N
        return Built(name, cfg, RobertaMLM(cfg.model), lambda n: True, "pretrain_dual", mcfg.num_layers, seq=seq)
    if name == "build_mini":  # surgery.build_minipost on a (random) primary model, as stages.build_mini
        sd = RobertaMLM(mcfg).state_dict()
        mini_cfg, mini_sd = surgery.build_minipost(mcfg, sd, n_layers=N, new_layers=preset.new_layers, seed=0)
        del sd
        model = RobertaMLM(mini_cfg)
        model.load_state_dict(mini_sd, strict=True)
        cfg.stage, cfg.model = "build_mini", mini_cfg
        return Built(name, cfg, model, surgery.minipost_trainable(mini_cfg, N), "build_mini", mini_cfg.num_layers,
                     preset.new_layers, seq=seq)
    if name == "adapt_full":
        cfg.stage = "adapt"
        return Built(name, cfg, RobertaMLM(cfg.model), lambda n: n in LANGUAGE_PARAMS, "adapt", mcfg.num_layers,
                     seq=seq)
    if name == "adapt_mini":  # MINIJOINT's mini-model: surgery.extract_minijoint of a dual-head model
        dual = replace(mcfg, aux_head_layer=N)
        sd = RobertaMLM(dual).state_dict()
        mini_cfg, mini_sd = surgery.extract_minijoint(dual, sd)
        del sd
        model = RobertaMLM(mini_cfg)
        model.load_state_dict(mini_sd, strict=True)
        cfg.stage, cfg.model = "adapt", mini_cfg
        return Built(name, cfg, model, lambda n: n in LANGUAGE_PARAMS, "adapt", mini_cfg.num_layers, seq=seq)
    if name == "finetune":
        cfg.stage = "finetune"
        model = RobertaForTask(cfg.model, PAIR_CLASSIFICATION, 3)
        return Built(name, cfg, model, lambda n: n not in FROZEN, "finetune", mcfg.num_layers, seq=seq)
    raise ValueError(f"unknown stage {name!r}; choose from {', '.join(STAGES)}")


def stage_flops(b: Built, micro_batch: int) -> float:
    m = b.cfg.model
    return F.stage_flops_per_step(b.kind, hidden=m.hidden_size, vocab=m.vocab_size, layers=b.layers,
                                  seq_len=b.seq, mask_prob=0.15 if b.kind != "finetune" else 0.0,
                                  global_batch=micro_batch, trainable_layers=b.trainable_layers)


def run_engine_stage(b: Built, batches, micro_batch: int, warmup: int, steps: int, ds_config: str,
                     rank: int, world: int) -> dict:
    """Build the engine as `engine.train` does and time `engine.train_step`."""
    import copy

    import deepspeed

    from . import ds_config as dsc
    from . import engine as eng
    from .model import param_groups, set_trainable

    cfg = b.cfg
    cfg.ds_config = ds_config
    cfg.train = TrainConfig(steps=warmup + steps, warmup_steps=1, global_batch=micro_batch * world,
                            micro_batch=micro_batch, lr=1e-4, log_every=10 ** 9)
    ds_cfg, geo = dsc.resolve(cfg, world)
    # As engine.train: freeze, then hand only the trainable groups to deepspeed.initialize.
    n_train, n_total = set_trainable(b.model, b.trainable)
    wd = ds_cfg["optimizer"].get("params", {}).get("weight_decay", 0.0)
    engine, _, _, _ = deepspeed.initialize(model=b.model, model_parameters=param_groups(b.model, wd),
                                           config=copy.deepcopy(ds_cfg))
    stage = eng.Stage(cfg=cfg, model=b.model, trainable=b.trainable, batches=batches,
                      flops_per_step=lambda gb: 0.0, tokens_per_sample=b.seq)
    engine.train()
    times, data, cpu, losses = [], [], [], []
    for step in range(warmup + steps):
        t0, c0 = time.perf_counter(), time.process_time()
        logs, dt = eng.train_step(engine, stage, step, rank, geo)
        elapsed, cpu_s = time.perf_counter() - t0, time.process_time() - c0
        losses.append(logs["loss"])
        if step >= warmup:
            times.append(elapsed)
            data.append(dt)
            cpu.append(cpu_s)
    del engine
    return {"step_times": times, "data_times": data, "cpu_times": cpu, "losses": losses, "trainable_params": n_train,
            "total_params": n_total, "zero_stage": dsc.zero_stage(ds_cfg), "grad_accum": geo.grad_accum,
            "optimizer": ds_cfg["optimizer"]}


# ----------------------------------------------------------------------------------------------- the peer

def hf_model(mcfg: ModelConfig, layers: int):
    from transformers import RobertaConfig, RobertaForMaskedLM

    hcfg = RobertaConfig(vocab_size=mcfg.vocab_size, hidden_size=mcfg.hidden_size, num_hidden_layers=layers,
                         num_attention_heads=mcfg.num_heads, intermediate_size=mcfg.ffn_size,
                         max_position_embeddings=mcfg.max_positions + PAD + 1, type_vocab_size=1,
                         pad_token_id=PAD, bos_token_id=0, eos_token_id=2, layer_norm_eps=mcfg.layer_norm_eps,
                         hidden_dropout_prob=mcfg.dropout, attention_probs_dropout_prob=mcfg.dropout,
                         initializer_range=mcfg.init_std)
    torch.manual_seed(0)
    return RobertaForMaskedLM._from_config(hcfg, attn_implementation="sdpa")


def run_peer_stage(name: str, mcfg: ModelConfig, layers: int, batches, micro_batch: int, warmup: int,
                   steps: int) -> dict:
    from .ds_config import Geometry

    model = hf_model(mcfg, layers)
    if name.startswith("adapt"):
        keep = {"roberta.embeddings.word_embeddings.weight", "lm_head.bias"}  # decoder weight/bias are tied
        for n, p in model.named_parameters():
            p.requires_grad_(n in keep)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
    model.train()
    geo = Geometry(micro_batch, micro_batch, 1, 1)
    times, data, cpu, losses = [], [], [], []
    for step in range(warmup + steps):
        t0, c0 = time.perf_counter(), time.process_time()
        b = batches(step, 0, 0, geo)
        dt = time.perf_counter() - t0
        out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"])
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(out.loss.detach()))
        elapsed, cpu_s = time.perf_counter() - t0, time.process_time() - c0
        if step >= warmup:
            times.append(elapsed)
            data.append(dt)
            cpu.append(cpu_s)
    return {"step_times": times, "data_times": data, "cpu_times": cpu, "losses": losses,
            "trainable_params": sum(p.numel() for p in params),
            "total_params": sum(p.numel() for p in model.parameters())}


# ----------------------------------------------------------------------------------------------- report

def summarise(raw: dict, tokens_per_step: int, flops_per_step: float, peak: float) -> dict:
    t = statistics.median(raw["step_times"])
    d = statistics.median(raw["data_times"])
    out = {"step_time_s": t, "step_time_min_s": min(raw["step_times"]), "step_time_max_s": max(raw["step_times"]),
           "tokens_per_step": tokens_per_step, "tokens_per_s": tokens_per_step / t,
           "flops_per_step": flops_per_step, "tflops": flops_per_step / t / 1e12,
           "mfu": flops_per_step / t / peak, "loader_s": d, "loader_share": d / t,
           # CPU seconds this process got per wall second per thread: ~1 on a quiet machine; lower means
           # other processes held the cores (the noise this number is reported for).
           "cpu_share": statistics.median(c / w for c, w in zip(raw["cpu_times"], raw["step_times"]))
           / torch.get_num_threads()}
    return out | {k: v for k, v in raw.items() if k not in out}


def _fmt_row(cells, widths):
    return "| " + " | ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths))) + " |"


def table(results: dict, peer: dict) -> str:
    head = ["stage", "layers", "train params", "step s (med)", "tokens/s", "GFLOP/step", "TFLOP/s", "MFU",
            "peak RSS GiB", "loader %", "CPU share", "HF tokens/s", "vs HF"]
    rows = []
    for name, r in results.items():
        p = peer.get(name)
        rows.append([STAGE_TITLES[name], r["layers"], f"{r['trainable_params'] / 1e6:.1f}M",
                     f"{r['step_time_s']:.3f}", f"{r['tokens_per_s']:.0f}", f"{r['flops_per_step'] / 1e9:.1f}",
                     f"{r['tflops']:.4f}", f"{100 * r['mfu']:.1f}%", f"{r['peak_rss_bytes'] / 2**30:.2f}",
                     f"{100 * r['loader_share']:.2f}", f"{r['cpu_share']:.2f}", f"{p['tokens_per_s']:.0f}" if p else "-",
                     f"{r['tokens_per_s'] / p['tokens_per_s']:.2f}x" if p else "-"])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    lines = [_fmt_row(head, widths), "|" + "|".join(("-" * (w + 1) + ":") if i else "-" * (w + 2)
                                                   for i, w in enumerate(widths)) + "|"]
    return "\n".join(lines + [_fmt_row(r, widths) for r in rows])


def evaluate_targets(results: dict, peer: dict, encode: dict | None) -> list[dict]:
    out = []

    def add(key, value, ok, detail):
        desc, thr = next((d, t) for k, d, t in TARGETS if k == key)
        out.append({"target": key, "description": desc, "threshold": thr, "value": value,
                    "pass": None if ok is None else bool(ok), "detail": detail})

    if "adapt_full" in results and "adapt_mini" in results:
        full, mini = results["adapt_full"], results["adapt_mini"]
        measured = mini["tokens_per_s"] / full["tokens_per_s"]
        analytic = full["flops_per_step"] / mini["flops_per_step"]
        add("a3_speedup", measured / analytic, measured / analytic >= 0.90,
            f"measured {measured:.2f}x vs analytic {analytic:.2f}x (need >= {0.9 * analytic:.2f}x)")
    for key, stage, thr in (("peer_pretrain", "pretrain", 1.25), ("peer_adapt_mini", "adapt_mini", 1.6)):
        if stage in results and stage in peer:
            ratio = results[stage]["tokens_per_s"] / peer[stage]["tokens_per_s"]
            add(key, ratio, ratio >= thr, f"{results[stage]['tokens_per_s']:.0f} vs "
                                          f"{peer[stage]['tokens_per_s']:.0f} tokens/s = {ratio:.2f}x")
    if "pretrain" in results:
        m = results["pretrain"]["mfu"]
        add("mfu_pretrain", m, m >= 0.5, f"{results['pretrain']['tflops'] * 1e3:.1f} GFLOP/s = {100 * m:.1f}% of peak")
    if encode:
        add("prepare_encode", encode["ratio"], encode["ratio"] >= 0.8,
            f"{encode['prepare_bytes_per_s'] / 2**20:.2f} MiB/s with {encode['workers']} workers vs "
            f"{encode['single_process_bytes_per_s'] / 2**20:.2f} MiB/s single-process = {encode['ratio']:.2f}")
    mlm = {k: v for k, v in results.items() if k != "finetune"}
    if mlm:
        worst = max(mlm, key=lambda k: mlm[k]["loader_share"])
        share = mlm[worst]["loader_share"]
        add("loader_share", share, share < 0.02, f"worst: {worst} {100 * share:.2f}% of step time")
    return out


# ----------------------------------------------------------------------------------------------- main

def run(args) -> dict:
    from . import dist
    from .data.mlm import MLMBatches
    from .data.shards import TokenCorpus

    preset = PRESETS[args.preset]
    micro = args.micro_batch or preset.micro_batch
    steps = args.steps or preset.steps
    warmup = preset.warmup if args.warmup is None else args.warmup
    stages = args.stages or list(STAGES)
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise ValueError(f"--stages {', '.join(unknown)}: choose from {', '.join(STAGES)}")
    mcfg = base_model_cfg(preset)
    seq = args.seq or min(preset.seq, mcfg.max_positions)
    if seq > mcfg.max_positions:
        raise ValueError(f"--seq {seq} exceeds the {args.preset} model's max_positions={mcfg.max_positions}")
    log = (lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True)) if not args.quiet else (lambda m: None)

    peer_ok = args.peer
    peer_note = None
    if peer_ok:
        try:
            import transformers  # noqa: F401
        except ImportError:
            peer_ok, peer_note = False, ("transformers is not installed: peer columns skipped "
                                         "(pip install 'mm-ds[bench]')")
            log(peer_note)

    import logging

    from deepspeed.utils import logger as ds_logger
    ds_logger.setLevel(logging.ERROR)  # e.g. "get_lr before the scheduler started", once per engine
    rank, _, world = dist.init()  # one in-process rank; sets this process's thread count
    if world != 1:
        raise ValueError("mm-ds bench runs as a single process; do not start it under a launcher")
    load_start = os.getloadavg()
    peak_start = matmul_peak()
    log(f"matmul peak (2048^3 fp32, {torch.get_num_threads()} threads): {peak_start['median_flops'] / 1e9:.1f} "
        f"GFLOP/s median; load average {load_start[0]:.2f}")

    with tempfile.TemporaryDirectory(prefix="mm-ds-bench-") as tmp:
        work = Path(tmp)
        corpus_dir, encode = prepare_corpus(work, args.corpus_mb or preset.corpus_mb, len(os.sched_getaffinity(0)), log)
        corpus = TokenCorpus(corpus_dir)
        mlm = MLMBatches(corpus, seq, seed=0, vocab_size=mcfg.vocab_size)
        mlm_batches = SpreadVocab(mlm, mcfg.vocab_size)
        results, peer, probes = {}, {}, [peak_start]
        for name in stages:
            release_free_memory()
            log(f"{name}: building ...")
            b = build_stage(name, mcfg, preset, seq, corpus_dir)
            batches = pair_batches(mcfg.vocab_size, seq) if name == "finetune" else mlm_batches
            probes.append(matmul_peak(reps=3))  # the machine is shared: probe the peak beside every stage
            with RssPeak() as mem:
                raw = run_engine_stage(b, batches, micro, warmup, steps, args.ds_config, rank, world)
            fl = stage_flops(b, micro)
            r = summarise(raw, micro * seq, fl, peak_start["median_flops"])
            r |= {"layers": b.layers, "kind": b.kind, "title": STAGE_TITLES[name], "peak_rss_bytes": mem.peak,
                  "rss_before_bytes": mem.start, "matmul_probe_flops": probes[-1]["median_flops"]}
            results[name] = r
            log(f"{name}: {r['step_time_s']:.3f} s/step, {r['tokens_per_s']:.0f} tokens/s, MFU {100 * r['mfu']:.1f}%")
            del b
            if peer_ok and name in PEER_STAGES:
                release_free_memory()
                layers = results[name]["layers"]
                with RssPeak() as mem:
                    raw = run_peer_stage(name, mcfg, layers, mlm_batches, micro, warmup, steps)
                p = summarise(raw, micro * seq, fl, peak_start["median_flops"])
                p |= {"layers": layers, "peak_rss_bytes": mem.peak}
                peer[name] = p
                log(f"{name} (transformers): {p['step_time_s']:.3f} s/step, {p['tokens_per_s']:.0f} tokens/s")
        # Real loader, without the vocabulary spread, for reference.
        t0 = time.perf_counter()
        for s in range(5):
            mlm.batch(s, 0, 0, 1, micro)
        loader_only = (time.perf_counter() - t0) / 5

    peak_end = matmul_peak()
    probes.append(peak_end)
    # MFU against the most the machine delivered in this run (contention only ever lowers a probe).
    peak = max(p["median_flops"] for p in probes)
    for r in list(results.values()) + list(peer.values()):
        r["mfu"] = r["flops_per_step"] / r["step_time_s"] / peak
    load_end = os.getloadavg()
    import deepspeed

    report = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "setup": {"preset": args.preset, "hidden": mcfg.hidden_size, "layers": mcfg.num_layers,
                  "heads": mcfg.num_heads, "ffn": mcfg.ffn_size, "vocab": mcfg.vocab_size, "seq": seq,
                  "micro_batch": micro, "global_batch": micro * world, "mini_layers": preset.mini_layers,
                  "new_layers": preset.new_layers, "steps": steps, "warmup": warmup, "dtype": "fp32",
                  "ds_config": args.ds_config, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                  "torch": torch.__version__, "deepspeed": deepspeed.__version__,
                  "transformers": _version("transformers"), "python": platform.python_version(),
                  "machine": platform.processor() or platform.machine(), "device": "cpu",
                  "load_avg_start": load_start, "load_avg_end": load_end},
        "peak": {"start": peak_start, "end": peak_end, "probes": probes, "used_flops": peak},
        "stages": results, "peer": peer, "peer_note": peer_note, "prepare": encode,
        "loader_only_s": loader_only, "max_rss_bytes": maxrss_bytes(),
    }
    report["targets"] = evaluate_targets(results, peer, encode)
    return report


def _version(mod: str) -> str | None:
    try:
        return __import__(mod).__version__
    except ImportError:
        return None


def print_report(rep: dict) -> None:
    s = rep["setup"]
    print(f"mm-ds bench  {rep['date']}  preset={s['preset']}  h={s['hidden']} layers={s['layers']} "
          f"heads={s['heads']} ffn={s['ffn']} V={s['vocab']} seq={s['seq']} micro_batch={s['micro_batch']} "
          f"N={s['mini_layers']} {s['dtype']}")
    print(f"cpu: {s['machine']}, {s['threads']} threads of {s['cpus']} cpus; torch {s['torch']}, deepspeed "
          f"{s['deepspeed']}, transformers {s['transformers']}; ds config {s['ds_config']}; median of "
          f"{s['steps']} steps after {s['warmup']} warm-up")
    pk = rep["peak"]
    probes = [p["median_flops"] / 1e9 for p in pk["probes"]]
    print(f"matmul peak (fp32 2048^3, medians): {pk['start']['median_flops'] / 1e9:.1f} GFLOP/s at start, "
          f"{pk['end']['median_flops'] / 1e9:.1f} at end, {min(probes):.1f}-{max(probes):.1f} over "
          f"{len(probes)} probes; MFU uses the highest, {pk['used_flops'] / 1e9:.1f}. "
          f"load average {s['load_avg_start'][0]:.2f} -> {s['load_avg_end'][0]:.2f}")
    print()
    print(table(rep["stages"], rep["peer"]))
    if rep["peer_note"]:
        print(f"peer: {rep['peer_note']}")
    spread = [f"{k} {100 * (r['step_time_max_s'] / r['step_time_min_s'] - 1):.0f}%" for k, r in rep["stages"].items()]
    print(f"step-time spread (max/min - 1): {', '.join(spread)}")
    e = rep["prepare"]
    print(f"prepare: {e['text_bytes'] / 2**20:.1f} MiB encoded in {e['prepare_encode_s']:.2f} s with "
          f"{e['workers']} workers, {e['prepare_1_worker_s']:.2f} s with 1; single-process SentencePiece "
          f"{e['single_process_encode_s']:.2f} s")
    print()
    for t in rep["targets"]:
        verdict = "PASS" if t["pass"] else "FAIL"
        print(f"[{verdict}] {t['description']}: {t['detail']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mm-ds bench", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="model shape (models/<preset>)")
    ap.add_argument("--micro-batch", type=int, help="sequences per step (default: the preset's)")
    ap.add_argument("--seq", type=int, help="sequence length (default: 512, or the model's max_positions)")
    ap.add_argument("--steps", type=int, help="timed steps per stage; the median is reported")
    ap.add_argument("--warmup", type=int, help="untimed steps per stage first")
    ap.add_argument("--stages", nargs="+", metavar="STAGE", help=f"subset of: {' '.join(STAGES)}")
    ap.add_argument("--ds-config", default=RunConfig.ds_config, help="DeepSpeed JSON (CPU: fp32)")
    ap.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True,
                    help="also time transformers' RobertaForMaskedLM (needs the [bench] extra)")
    ap.add_argument("--corpus-mb", type=float, help="synthetic text to prepare and encode (default: the preset's)")
    ap.add_argument("--json", help="write every number here")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = ap.parse_args(argv)
    for flag in ("micro_batch", "steps", "seq"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be positive")
    rep = run(args)
    print_report(rep)
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
