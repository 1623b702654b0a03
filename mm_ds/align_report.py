"""The alignment check in the report (mm_ds/align.py computes the rows): align.md (per system and language, the
MLM loss and accuracy of the mini-model and of the primary model with its embeddings, per Step-2 checkpoint, and
the step where the primary's loss is lowest: an early-stopping signal), align.csv, and align_<lang>.png (MLM loss
and accuracy vs Step-2 updates, one column per system: mini-model solid, primary model with the swap dashed)."""
from __future__ import annotations

import csv
from pathlib import Path

from .mdtable import md
from .systems import sort_key, system_of

COLUMNS = ("system", "lang", "step", "flops", "v100_days", "sequences", "targets", "mini_loss", "mini_acc",
           "primary_loss", "primary_acc", "mini_layers", "primary_layers")


def curves(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """(system, lang) -> rows by step, systems in the paper's table order."""
    out: dict[tuple[str, str], list[dict]] = {}
    for r in sorted(rows, key=lambda r: (sort_key(r["system"]), r["lang"], r["step"])):
        out.setdefault((r["system"], r["lang"]), []).append(r)
    return out


def align_table(rows: list[dict]) -> str:
    """Markdown: a summary (first vs last checkpoint, best primary step) and every checkpoint's row."""
    groups = curves(rows)
    summary = []
    for (s, lang), c in groups.items():
        best = min(c, key=lambda r: (r["primary_loss"], r["step"]))
        first, last = c[0], c[-1]
        summary.append([system_of(s).label, lang, f"{first['mini_loss']:.3f} → {last['mini_loss']:.3f}",
                        f"{first['primary_loss']:.3f} → {last['primary_loss']:.3f}",
                        f"{100 * last['primary_acc']:.1f}", f"{best['step']}" + (" (last)" if best is last else "")])
    parts = ["## Alignment check: target MLM on held-out text, mini-model vs primary model with its embeddings",
             md(["system", "lang", "mini loss (step 0 → last)", "primary loss (step 0 → last)", "primary acc % (last)",
                 "lowest primary loss at step"], summary)]
    body = [[system_of(s).label, lang, str(r["step"]), f"{r['v100_days']:.3g}", f"{r['mini_loss']:.3f}",
             f"{100 * r['mini_acc']:.1f}", f"{r['primary_loss']:.3f}", f"{100 * r['primary_acc']:.1f}"]
            for (s, lang), c in groups.items() for r in c]
    parts += ["## Every checkpoint", md(["system", "lang", "step", "V100-days", "mini loss", "mini acc %",
                                         "primary loss", "primary acc %"], body)]
    n = {r["lang"]: (r["sequences"], r["targets"]) for r in rows}
    parts.append(f"Step 0: the initial embeddings (overlapping pieces copied, the rest random). Every checkpoint is "
                 f"scored on the same held-out sequences and masks: "
                 + "; ".join(f"{lang} {a} sequences, {b} masked tokens" for lang, (a, b) in sorted(n.items())) + ".")
    return "\n\n".join(parts)


def _layers(*ns: int) -> str:
    """"4 layers"; a multi-depth mini-model's curve runs through its depths: "1→4 layers"."""
    lo, hi = min(ns), max(ns)
    return (f"{lo}→{hi}" if lo != hi else f"{hi}") + " layer" + ("s" if hi != 1 else "")


def write_plots(rows: list[dict], out: Path) -> list[Path]:
    """align_<lang>.png: MLM loss (top) and accuracy (bottom) vs Step-2 updates, one column per system."""
    from matplotlib.figure import Figure

    groups = curves(rows)
    written = []
    for lang in sorted({lang for _, lang in groups}):
        systems = [s for s, lg in groups if lg == lang]
        fig = Figure(figsize=(4 * len(systems), 5.5))
        axes = fig.subplots(2, len(systems), squeeze=False, sharex="col")
        for col, s in enumerate(systems):
            c = groups[(s, lang)]
            steps = [r["step"] for r in c]
            for ax, metric, scale, name in ((axes[0, col], "loss", 1, "held-out MLM loss"),
                                             (axes[1, col], "acc", 100, "held-out MLM accuracy %")):
                ax.plot(steps, [scale * r[f"mini_{metric}"] for r in c], marker=".", c="C0",
                        label=f"mini-model ({_layers(*(r['mini_layers'] for r in c))})")
                ax.plot(steps, [scale * r[f"primary_{metric}"] for r in c], marker=".", ls="--", c="C1",
                        label=f"primary + its embeddings ({_layers(c[0]['primary_layers'])})")
                ax.set(ylabel=name)
            axes[0, col].set(title=f"{system_of(s).label} {lang}")
            axes[1, col].set(xlabel="Step-2 updates")
            axes[0, col].legend(fontsize=7)
        fig.tight_layout()
        path = out / f"align_{lang}.png"
        fig.savefig(path, dpi=120)
        written.append(path)
    return written


def write_align(rows: list[dict], out: Path, plots: bool = True) -> list[Path]:
    """align.md, align.csv and (with matplotlib) align_<lang>.png in `out`; [] without rows."""
    if not rows:
        return []
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "align.md").write_text(align_table(rows) + "\n")
    with open(out / "align.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS), extrasaction="ignore")
        w.writeheader()
        w.writerows(r for c in curves(rows).values() for r in c)
    written = [out / "align.md", out / "align.csv"]
    if plots:
        try:
            written += write_plots(rows, out)
        except ImportError as e:  # matplotlib is optional: the numbers are in align.md
            print(f"[mm-ds] alignment plots not written: {e}")
    return written
