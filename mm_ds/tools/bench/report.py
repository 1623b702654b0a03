"""`mm-ds bench`'s printed report: the setup, the stage table against the peer, the host side, the targets."""

from __future__ import annotations

from . import compile_pairs as bench_compile
from . import host as bench_host
from . import pairs as bench_pairs
from . import profile as bench_profile


def _fmt_row(cells, widths):
    return "| " + " | ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths))) + " |"


def table(results: dict, peer: dict) -> str:
    head = ["stage", "layers", "train params", "step s (med)", "tokens/s", "GFLOP/step", "TFLOP/s", "MFU",
            "peak RSS GiB", "loader %", "CPU share", "HF tokens/s", "vs HF, apart"]
    rows = []
    for name, r in results.items():
        p = peer.get(name)
        rows.append([r["title"], r["layers"], f"{r['trainable_params'] / 1e6:.1f}M",
                     f"{r['step_time_s']:.3f}", f"{r['tokens_per_s']:.0f}", f"{r['flops_per_step'] / 1e9:.1f}",
                     f"{r['tflops']:.4f}", f"{100 * r['mfu']:.1f}%", f"{r['peak_rss_bytes'] / 2**30:.2f}",
                     f"{100 * r['loader_share']:.2f}", f"{r['cpu_share']:.2f}", f"{p['tokens_per_s']:.0f}" if p else "-",
                     f"{r['tokens_per_s'] / p['tokens_per_s']:.2f}x" if p else "-"])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    lines = [_fmt_row(head, widths), "|" + "|".join(("-" * (w + 1) + ":") if i else "-" * (w + 2)
                                                   for i, w in enumerate(widths)) + "|"]
    return "\n".join(lines + [_fmt_row(r, widths) for r in rows])


def print_report(rep: dict) -> None:
    s = rep["setup"]
    print(f"mm-ds bench  {rep['date']}  preset={s['preset']}  h={s['hidden']} layers={s['layers']} "
          f"heads={s['heads']} ffn={s['ffn']} V={s['vocab']} seq={s['seq']} micro_batch={s['micro_batch']} "
          f"N={s['mini_layers']} {s['dtype']}")
    print(f"cpu: {s['machine']}, {s['threads']} threads of {s['cpus']} cpus; torch {s['torch']}, deepspeed "
          f"{s['deepspeed']}, transformers {s['transformers']}; ds config {s['ds_config']}; median of "
          f"{s['steps']} steps after {s['warmup']} warm-up")
    pk = rep["peak"]
    if "probes" in pk:
        probes = [p["median_flops"] / 1e9 for p in pk["probes"]]
        print(f"matmul peak (fp32 2048^3, medians): {pk['start']['median_flops'] / 1e9:.1f} GFLOP/s at start, "
              f"{pk['end']['median_flops'] / 1e9:.1f} at end, {min(probes):.1f}-{max(probes):.1f} over "
              f"{len(probes)} probes; MFU uses the highest, {pk['used_flops'] / 1e9:.1f}. "
              f"load average {s['load_avg_start'][0]:.2f} -> {s['load_avg_end'][0]:.2f}")
    else:
        print(f"gpu: {pk['gpu']}, CUDA {s['cuda']}; MFU against {pk['used_flops'] / 1e12:g} TFLOP/s ({pk['source']})")
    print()
    print(table(rep["stages"], rep["peer"]))
    gpu = {k: r["peak_gpu_bytes"] for k, r in rep["stages"].items() if r.get("peak_gpu_bytes") is not None}
    if gpu:
        print("GPU memory, peak allocated: " + ", ".join(f"{k} {b / 2**30:.2f} GiB" for k, b in gpu.items()))
    if rep["peer_note"]:
        print(f"peer: {rep['peer_note']}")
    spread = [f"{k} {100 * (r['step_time_max_s'] / r['step_time_min_s'] - 1):.0f}%" for k, r in rep["stages"].items()]
    print(f"step-time spread (max/min - 1): {', '.join(spread)}")
    e = rep["prepare"]
    if e:
        print(f"prepare: {e['text_bytes'] / 2**20:.1f} MiB (the corpus text x {e['text_repeats']}, {e['chunks']} "
              f"chunks) encoded in {e['prepare_encode_s']:.2f} s with {e['workers']} workers, "
              f"{e['prepare_1_worker_s']:.2f} s with 1; SentencePiece alone, the same calls on one thread, "
              f"{e['single_process_encode_s']:.2f} s (medians of three, in turn)")
    if rep["pairs"]:
        print()
        print(bench_pairs.table(rep["pairs"]))
    if rep.get("compiled"):
        print()
        print(bench_compile.table(rep["compiled"]))
    if rep.get("profile"):
        print()
        print(bench_profile.table(rep["profile"], rep["peak"]["used_flops"]))
    if rep["host"]:
        print()
        print(bench_host.table(rep["host"]))
    print()
    for t in rep["targets"]:
        verdict = {True: "PASS", False: "FAIL", None: "----"}[t["pass"]]
        print(f"[{verdict}] {t['description']}: {t['detail']}")
