"""`mm-ds bench`: time every stage kind through the real training step, against a same-run matmul peak
and a Hugging Face `transformers` peer, and check the CPU speed targets; on a GPU, in the paper presets' bf16
against its datasheet peak (device.py), the throughput to compare with `mm-ds plan --bench`.

    mm-ds bench --preset base --micro-batch 2 --json bench.json
    mm-ds bench --preset tiny --steps 2 --no-peer
    mm-ds bench --preset base --device cuda --json bench-gpu.json      # on the target GPU

What runs. Each stage kind is a real `RunConfig` handed to its stage module's `build()` (the model after
the stage's own surgery, its trainable set, batches and FLOPs formula), then to `engine.build_engine`, the
builder `engine.train` uses (same DeepSpeed config resolution, freezing before `deepspeed.initialize`;
fp32 on CPU, bf16 on a GPU; one in-process rank), stepped by `engine.train_step`, the function `engine.train`
loops over.
The parents the later stages start from are written into the temporary work directory by the product's
own zero-update path (`engine.train` with train.steps=0: the model as built, untrained).

    pretrain       Step 1, one MLM head, all layers (BL_BASE)                  FLOPs: A1
    pretrain_secondary  Step 1 with MINIJOINT's secondary head after layer N            A1 + secondary head
    build_mini     Step 1b: MINIPOST's 2 new layers over N frozen + frozen head A4
    adapt_full     Step 2 over the full model (BL_BASE): language group only    A3, l = all layers
    adapt_mini     Step 2 over the N-layer MINIJOINT mini-model                 A3, l = N
    finetune       Step 3: classification head, token embeddings frozen         3 x forward of the layers

Data. A synthetic corpus (Zipf-distributed pseudo-words, documents of sentences) is generated and prepared
with `mm_ds.data.corpus.prepare` into a temporary directory. It cannot support a 50k-piece SentencePiece
model, so its trained tokenizer is small and grown to the model's vocabulary with its pieces spread over
all ids (`data.spread_tokenizer`); the stages' own `MLMBatches` draw real packed, dynamically masked
batches from it. The loader share is the time `train_step` spends fetching a batch over the step time.
Finetuning is built from a small generated English NLI file and timed on synthetic padded sentence pairs
(10% padding) of the benchmark's length. The peer: peer.py. The ratio targets (Step 2 mini vs full, mm-ds
vs the peer) build both sides at once and step them in turn, so that the machine's drift hits both: pairs.py;
prepare's encoding and single-process SentencePiece (the same encode calls on one thread) are timed in turn too,
over the corpus text repeated to 48 MiB (`data.prepare_corpus`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from ...config import RunConfig
from ...data.mlm import MLMBatches
from ...data.shards import TokenCorpus
from ...runtime.distributed import dist
from ...runtime.training import ds_config as dsc
from . import compile_pairs as bench_compile
from . import device as bench_device
from . import host as bench_host
from . import pairs as bench_pairs
from . import profile as bench_profile
from .data import host_corpus, prepare_corpus, spread_corpus
from .pairs import alternate
from .peer import PeerSteps, RssPeak, maxrss_bytes, release_free_memory
from .report import print_report
from .stages import (PEER_STAGES, PRESETS, STAGE_RUNS, STAGE_TITLES, STAGES, Stages, base_model_cfg, matmul_peak,
                     run_engine_stage)
from .targets import TARGETS, evaluate_targets  # noqa: F401 (TARGETS: bench's own list)

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


# ----------------------------------------------------------------------------------------------- main

def _peer_available(wanted: bool, device: bench_device.Device, log) -> tuple[bool, str | None]:
    """(run the transformers peer, why not)."""
    if not wanted:
        return False, None
    if not device.peer:
        note = f"the transformers peer is a CPU comparison: not run on {device.kind} (run `mm-ds bench --device cpu`)"
        log(note)
        return False, note
    try:
        import transformers  # noqa: F401
    except ImportError:
        note = "transformers is not installed: peer columns skipped (pip install 'mm-ds[bench]')"
        log(note)
        return False, note
    return True, None


def _bench_stage(name, builder, o, rank, world, peer_ok, results, peer, probes, log):
    """One stage kind timed through the engine (into `results`), then its transformers peer (into `peer`). `o`:
    the run's settings (`_settings`); `probes`: the CPU's matmul peaks so far (the first is MFU's until the end)."""
    mcfg, seq, micro, warmup, steps = o.mcfg, o.seq, o.micro, o.warmup, o.steps
    release_free_memory()
    log(f"{name}: building ...")
    stage = builder.timed(name, warmup + steps)
    cuda, before = o.device.kind == "cuda", None
    if cuda:
        bench_device.memory_peak_reset()
        before = bench_device.memory_now()  # what earlier stages left allocated (none, if their engines were freed)
    else:
        probes.append(matmul_peak(reps=3))  # the machine is shared: probe the peak beside every stage
    with RssPeak() as mem:
        raw = run_engine_stage(stage, warmup, steps, rank, world)
    fl = stage.flops_per_step(micro)
    r = summarise(raw, micro * seq, fl, probes[0]["median_flops"] if probes else o.peak["used_flops"])
    r |= {"layers": stage.cfg.model.num_layers, "kind": STAGE_RUNS[name][3], "title": STAGE_TITLES[name],
          "peak_rss_bytes": mem.peak, "rss_before_bytes": mem.start,
          "peak_gpu_bytes": bench_device.memory_peak() if cuda else None, "gpu_bytes_before": before,
          "matmul_probe_flops": probes[-1]["median_flops"] if probes else None}
    results[name] = r
    log(f"{name}: {r['step_time_s']:.3f} s/step, {r['tokens_per_s']:.0f} tokens/s, MFU {100 * r['mfu']:.1f}%")
    batches = stage.batches
    del stage
    if peer_ok and name in PEER_STAGES:
        release_free_memory()
        layers = results[name]["layers"]
        with RssPeak() as mem:
            steps_of = PeerSteps(name, mcfg, layers, batches, micro)
            raw = alternate({"peer": steps_of}, warmup, steps)["peer"]
            raw |= {"trainable_params": steps_of.trainable_params, "total_params": steps_of.total_params}
            steps_of.close()
        p = summarise(raw, micro * seq, fl, probes[0]["median_flops"])
        p |= {"layers": layers, "peak_rss_bytes": mem.peak}
        peer[name] = p
        log(f"{name} (transformers): {p['step_time_s']:.3f} s/step, {p['tokens_per_s']:.0f} tokens/s")


def _settings(args) -> argparse.Namespace:
    """The run's shape, device and engine JSON from the arguments, the bench preset and the device's defaults."""
    device = bench_device.choose(args.device)
    preset = PRESETS[args.preset]
    stages = args.stages or list(STAGES)
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise ValueError(f"--stages {', '.join(unknown)}: choose from {', '.join(STAGES)}")
    compile_stages = args.compile_stages or stages
    if unknown := [s for s in compile_stages if s not in stages]:
        raise ValueError(f"--compile-stages {', '.join(unknown)}: choose from the timed stages, {', '.join(stages)}")
    mcfg = base_model_cfg(preset)
    seq = args.seq or min(preset.seq, mcfg.max_positions)
    if seq > mcfg.max_positions:
        raise ValueError(f"--seq {seq} exceeds the {args.preset} model's max_positions={mcfg.max_positions}")
    ds_config = args.ds_config or (bench_device.paper_ds_config() if device.paper_config else RunConfig.ds_config)
    o = argparse.Namespace(
        device=device, preset=preset, stages=stages, compile_stages=compile_stages, mcfg=mcfg, seq=seq, ds_config=ds_config,
        precision=dsc.precision(json.loads(dsc.find(ds_config).read_text())),
        micro=args.micro_batch or device.micro_batch or preset.micro_batch,
        steps=args.steps or device.steps or preset.steps,
        warmup=next(w for w in (args.warmup, device.warmup, preset.warmup) if w is not None),
        log=(lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True)) if not args.quiet else (lambda m: None))
    o.peak = bench_device.gpu_peak(o.precision, args.peak_tflops) if device.kind == "cuda" else None
    return o


def _measure(args, o, rank: int, world: int, peer_ok: bool, probes: list) -> dict:
    """Every stage, the ratio pairs, and on CPU prepare's encoding and the host side, over a synthetic corpus."""
    log, preset, mcfg = o.log, o.preset, o.mcfg
    with tempfile.TemporaryDirectory(prefix="mm-ds-bench-") as tmp:
        work = Path(tmp)
        mb, workers = args.corpus_mb or preset.corpus_mb, len(os.sched_getaffinity(0))
        if o.device.encode:
            corpus_dir, text, encode = prepare_corpus(work, mb, preset.encode_mb, mcfg.vocab_size, workers, log)
        else:
            (corpus_dir, text, _, _), encode = spread_corpus(work, mb, mcfg.vocab_size, workers, log), None
        builder = Stages(work, corpus_dir, text, mcfg, preset, o.seq, o.micro, o.ds_config, log)
        results, peer = {}, {}
        for name in o.stages:
            _bench_stage(name, builder, o, rank, world, peer_ok, results, peer, probes, log)
        pairs = bench_pairs.measure(builder, mcfg, o.stages, o.warmup, o.steps, rank, world, peer_ok, log)
        backend = None if args.compile == "off" else args.compile
        comp = bench_compile.measure(builder, o.compile_stages, o.warmup, o.steps, rank, world, backend, log) if backend else {}
        prof = bench_profile.measure(builder, backend, rank, world, log) if args.profile else None
        host = None
        if o.device.host:
            host = bench_host.measure(lambda m, c, sq, mb, ds: Stages(work / "host", c, text, m, PRESETS["base"], sq,
                                                                      mb, ds, log),
                                      corpus_dir, host_corpus(work, text, bench_host.HOST_VOCAB),
                                      base_model_cfg(PRESETS["base"]), PRESETS["base"].mini_layers, rank, log,
                                      backend=backend)
        # The loader alone, for reference.
        mlm = MLMBatches(TokenCorpus(corpus_dir), o.seq, seed=0, vocab_size=mcfg.vocab_size)
        t0 = time.perf_counter()
        for s in range(5):
            mlm.batch(s, 0, 0, 1, o.micro)
        loader_only = (time.perf_counter() - t0) / 5
    return {"stages": results, "peer": peer, "pairs": pairs, "compiled": comp, "profile": prof, "prepare": encode,
            "loader_only_s": loader_only, "host": host}


def run(args) -> dict:
    o = _settings(args)
    log = o.log
    peer_ok, peer_note = _peer_available(args.peer, o.device, log)
    from deepspeed.utils import logger as ds_logger  # deepspeed only once a bench runs: `--help` stays quick
    ds_logger.setLevel(logging.ERROR)  # e.g. "get_lr before the scheduler started", once per engine
    rank, _, world = dist.init()  # one in-process rank; sets this process's thread count
    if world != 1:
        raise ValueError("mm-ds bench runs as a single process; do not start it under a launcher")
    load_start = os.getloadavg()
    probes = []
    if o.device.kind == "cpu":
        probes.append(matmul_peak())
        log(f"matmul peak (2048^3 fp32, {torch.get_num_threads()} threads): "
            f"{probes[0]['median_flops'] / 1e9:.1f} GFLOP/s median; load average {load_start[0]:.2f}")
    else:
        log(f"{o.peak['gpu']}: peak {o.peak['used_flops'] / 1e12:g} TFLOP/s ({o.peak['source']}); {o.ds_config}")
    measured = _measure(args, o, rank, world, peer_ok, probes)
    if o.device.kind == "cpu":
        probes.append(matmul_peak())
        # MFU against the most the machine delivered in this run (contention only ever lowers a probe).
        peak = {"start": probes[0], "end": probes[-1], "probes": probes,
                "used_flops": max(p["median_flops"] for p in probes), "source": "measured: fp32 2048^3 matmul"}
    else:
        peak = o.peak
    for r in list(measured["stages"].values()) + list(measured["peer"].values()):
        r["mfu"] = r["flops_per_step"] / r["step_time_s"] / peak["used_flops"]
    report = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "setup": _setup(args, o, world, load_start),
              "peak": peak, "peer_note": peer_note, "max_rss_bytes": maxrss_bytes(), **measured}
    report["targets"] = evaluate_targets(measured["stages"], measured["pairs"], measured["prepare"],
                                         measured["host"], o.device.kind, measured["compiled"])
    return report


def _setup(args, o, world: int, load_start) -> dict:
    import deepspeed

    mcfg, preset = o.mcfg, o.preset
    cuda = o.device.kind == "cuda"
    return {"preset": args.preset, "hidden": mcfg.hidden_size, "layers": mcfg.num_layers,
            "heads": mcfg.num_heads, "ffn": mcfg.ffn_size, "vocab": mcfg.vocab_size, "seq": o.seq,
            "micro_batch": o.micro, "global_batch": o.micro * world, "mini_layers": preset.mini_layers,
            "new_layers": preset.new_layers, "steps": o.steps, "warmup": o.warmup, "dtype": o.precision,
            "precision": o.precision, "ds_config": o.ds_config, "threads": torch.get_num_threads(),
            "cpus": os.cpu_count(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "deepspeed": deepspeed.__version__, "transformers": _version("transformers"),
            "python": platform.python_version(), "machine": platform.processor() or platform.machine(),
            "device": o.device.kind, "gpu": torch.cuda.get_device_name() if cuda else None,
            "load_avg_start": load_start, "load_avg_end": os.getloadavg()}


def _version(mod: str) -> str | None:
    try:
        return __import__(mod).__version__
    except ImportError:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mm-ds bench", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="model shape (models/<preset>)")
    ap.add_argument("--micro-batch", type=int, help="sequences per step (default: the preset's)")
    ap.add_argument("--seq", type=int, help="sequence length (default: 512, or the model's max_positions)")
    ap.add_argument("--steps", type=int, help="timed steps per stage; the median is reported")
    ap.add_argument("--warmup", type=int, help="untimed steps per stage first")
    ap.add_argument("--stages", nargs="+", metavar="STAGE", help=f"subset of: {' '.join(STAGES)}")
    ap.add_argument("--device", default="auto", choices=["auto", *bench_device.DEVICES],
                    help="cpu, or cuda (the first visible GPU, bf16: see mm_ds/tools/bench/device.py); auto: cuda "
                         "where torch sees a GPU")
    ap.add_argument("--ds-config", help=f"DeepSpeed JSON (default: {RunConfig.ds_config} on cpu, the paper presets' "
                                        f"on cuda)")
    ap.add_argument("--peak-tflops", type=float, help="cuda: the GPU's peak for MFU, if not in mm_ds/runtime/training/peaks.py")
    ap.add_argument("--compile", default="inductor", choices=["inductor", "aot_eager", "off"],
                    help="also time each stage with train.compile on this backend against eager, in turn, and the "
                         "compiled host loop (off: not)")
    ap.add_argument("--compile-stages", nargs="+", metavar="STAGE",
                    help="the stages timed compiled against eager (default: every timed stage; each compiles for "
                         "seconds to minutes)")
    ap.add_argument("--profile", action="store_true",
                    help="also profile one update of Step 1 by part (matmuls, attention, vocabulary, optimizer), "
                         "eager and compiled: where its MFU goes (bench_profile.py)")
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
