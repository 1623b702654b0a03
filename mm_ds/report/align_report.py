"""The alignment check and the MLM-level measure in the report (mm_ds/eval/align.py computes the rows).

- align.md: per system and language, held-out target MLM of the primary model with each Step-2 checkpoint's
  embeddings (read through its main head with the output bias refit on the target's training text: the measure,
  the same for every system), of the same primary with the bias Step 2 left (step bias), and of the mini-model,
  first vs last checkpoint and every checkpoint; the gain against frequencies (unigram → control → last); the
  source-language MLM of every primary model and mini-model beside a unigram predictor's (for a MINIJOINT primary,
  its main head read with the secondary head's bias too, and the cosine between the two heads' mean outputs).
  align.csv: the rows.
- align_<lang>.png: MLM loss and accuracy vs Step-2 updates, one column per system: primary model with the swap
  solid (refit bias), with its step bias dotted, mini-model dashed, the unigram predictor a grey line.
The MLM level's Tables 2 and 3, Figure 3 and speedups (mlm/) are the report's own (report.mlm_report).
"""
from __future__ import annotations

import csv
from pathlib import Path

from ..systems import sort_key, system_of
from .mdtable import md

COLUMNS = ("system", "lang", "step", "flops", "v100_days", "sequences", "targets", "mini_loss", "mini_acc",
           "primary_loss", "primary_acc", "step_bias_loss", "step_bias_acc", "unigram_loss", "unigram_acc",
           "fit_sequences", "fit_steps", "fit_l1", "mini_layers", "primary_layers")
SOURCE_COLUMNS = ("system", "model", "lang", "layers", "sequences", "targets", "loss", "acc", "unigram_loss",
                  "unigram_acc", "secondary_bias_loss", "secondary_bias_acc", "head_cosine")


def _targets(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("kind", "target") == "target"]


def curves(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """(system, lang) -> target-language rows by step, systems in the paper's table order."""
    out: dict[tuple[str, str], list[dict]] = {}
    for r in sorted(_targets(rows), key=lambda r: (sort_key(r["system"]), r["lang"], r["step"])):
        out.setdefault((r["system"], r["lang"]), []).append(r)
    return out


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _loss(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def align_table(rows: list[dict]) -> str:
    """Markdown: a summary per system and language, the gain against frequencies, every checkpoint's row, and the
    source-language rows."""
    groups = curves(rows)
    summary, gain = [], []
    for (s, lang), c in groups.items():
        best = min(c, key=lambda r: (r["primary_loss"], r["step"]))
        first, last = c[0], c[-1]
        summary.append([system_of(s).label, lang, f"{_loss(first['mini_loss'])} → {_loss(last['mini_loss'])}",
                        f"{first['primary_loss']:.3f} → {last['primary_loss']:.3f}", _pct(last["primary_acc"]),
                        f"{best['step']}" + (" (last)" if best is last else "")])
        gain.append([system_of(s).label, lang, _pct(last.get("unigram_acc")), _pct(first["primary_acc"]),
                     _pct(last["primary_acc"]), _points(last["primary_acc"] - first["primary_acc"]),
                     _pct(first.get("step_bias_acc")), _pct(last.get("step_bias_acc"))])
    parts = ["## Alignment check: target MLM on held-out text, primary model with the Step-2 embeddings vs the "
             "mini-model Step 2 trained over",
             md(["system", "lang", "mini loss (step 0 → last)", "primary loss (step 0 → last)", "primary acc % (last)",
                 "lowest primary loss at step"], summary),
             "## Against frequencies: held-out target MLM accuracy % of the primary model",
             md(["system", "lang", "unigram", "control (step 0)", "last", "last - control",
                 "step bias: control", "step bias: last"], gain),
             "Primary: read through its main head with the output bias refit on the target's training text "
             "(embeddings, body and head frozen; the maximum-likelihood bias, matched to the training shards' piece "
             "frequencies), the same for every system and for the control, whichever head Step 2 trained through. "
             "Control: the untrained target embeddings (overlapping pieces copied from English, the rest random). "
             "Unigram: the training shards' piece frequencies at every masked position (what frequencies alone "
             "give). Step bias: the main head read with the output bias Step 2 left (MINIJOINT's: its secondary "
             "head's), as this check scored before 2026-11-27."]
    body_rows = [[system_of(s).label, lang, str(r["step"]), f"{r['v100_days']:.3g}", _loss(r["mini_loss"]),
                  _pct(r["mini_acc"]), f"{r['primary_loss']:.3f}", _pct(r["primary_acc"]), _pct(r.get("step_bias_acc"))]
                 for (s, lang), c in groups.items() for r in c]
    parts += ["## Every checkpoint", md(["system", "lang", "step", "V100-days", "mini loss", "mini acc %",
                                         "primary loss", "primary acc %", "step bias acc %"], body_rows)]
    n = {r["lang"]: (r["sequences"], r["targets"], r.get("fit_sequences")) for r in _targets(rows)}
    parts.append("Step 0: the initial embeddings. Mini: - where Step 2 trains the primary model itself (BL_BASE, "
                 "BL_SMALL). Every checkpoint is scored on the same held-out sequences and masks, every masked token "
                 "<mask>; the refit reads training sequences masked the same way: "
                 + "; ".join(f"{lang} {a} sequences, {b} masked tokens, {f} training sequences"
                             for lang, (a, b, f) in sorted(n.items())) + ".")
    source = source_table(rows)
    return "\n\n".join(parts + ([source] if source else []))


def _points(x) -> str:
    return f"{100 * x:+.1f}"


def source_table(rows: list[dict]) -> str:
    """The source-language rows: each model's held-out MLM beside a unigram predictor's ("" without them); for a
    MINIJOINT primary, its main head with the secondary head's bias and the two heads' mean-output cosine."""
    src = sorted((r for r in rows if r.get("kind") == "source"),
                 key=lambda r: (r["model"] != "primary", sort_key(r["system"])))
    if not src:
        return ""
    body = [[system_of(r["system"]).label, r["model"], str(r["layers"]), _loss(r["loss"]), _pct(r["acc"]),
             _loss(r["unigram_loss"]), _pct(r["unigram_acc"]),
             "-" if r["unigram_acc"] is None else _points(r["acc"] - r["unigram_acc"])] for r in src]
    parts = [f"## Source language ({src[0]['lang']}): held-out MLM of every model beside a unigram predictor",
             md(["system", "model", "layers", "loss", "acc %", "unigram loss", "unigram acc %", "above unigram"], body),
             f"Unigram: the training shards' piece frequencies at every masked position (it always predicts the most "
             f"frequent piece); {src[0]['sequences']} held-out sequences, {src[0]['targets']} masked tokens. A model "
             f"above it has learnt more than word frequencies."]
    two = [r for r in src if r.get("head_cosine") is not None]
    if two:
        parts += [md(["system", "main head, own bias: loss / acc %", "main head, secondary head's bias: loss / acc %",
                      "cosine of the heads' mean outputs"],
                     [[system_of(r["system"]).label, f"{r['loss']:.3f} / {_pct(r['acc'])}",
                       f"{r['secondary_bias_loss']:.3f} / {_pct(r['secondary_bias_acc'])}", f"{r['head_cosine']:.2f}"]
                      for r in two]),
                  "A model with two heads: each carries the piece frequencies partly in its bias and partly along its "
                  "mean output (the mean of its transform over masked positions). Where the two means point apart, "
                  "a prior learnt through one head (MINIJOINT's Step 2 trains through the secondary head) reads "
                  "scrambled through the other; the target rows above therefore refit the main head's bias."]
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
                ax.plot(steps, [scale * r[f"primary_{metric}"] for r in c], marker=".", c="C1",
                        label=f"primary + its embeddings, refit bias ({_layers(c[0]['primary_layers'])})")
                if c[0]["mini_layers"] is not None:
                    ax.plot(steps, [scale * r[f"mini_{metric}"] for r in c], marker=".", ls="--", c="C0",
                            label=f"mini-model ({_layers(*(r['mini_layers'] for r in c))})")
                if all(r.get(f"step_bias_{metric}") is not None for r in c):
                    ax.plot(steps, [scale * r[f"step_bias_{metric}"] for r in c], ls=":", c="C1",
                            label="primary with its step bias")
                if c[-1].get(f"unigram_{metric}") is not None:
                    ax.axhline(scale * c[-1][f"unigram_{metric}"], c="grey", lw=0.8, label="unigram")
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
    """align.md, align.csv, align_source.csv and (with matplotlib) align_<lang>.png in `out`; [] without rows."""
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
    src = [r for r in rows if r.get("kind") == "source"]
    if src:
        with open(out / "align_source.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(SOURCE_COLUMNS), extrasaction="ignore")
            w.writeheader()
            w.writerows(src)
        written.append(out / "align_source.csv")
    if plots:
        try:
            written += write_plots(rows, out)
        except ImportError as e:  # matplotlib is optional: the numbers are in align.md
            print(f"[mm-ds] alignment plots not written: {e}")
    return written


def diagnosis_table(rows: list[dict]) -> str:
    """Markdown: (a), (b), (c), mini-model and unigram, control and last checkpoint per system and language."""
    def cell(loss, acc) -> str:
        return "-" if acc is None else f"{loss:.3f} / {100 * acc:.1f}"

    rows = sorted(rows, key=lambda r: (r["lang"], sort_key(r["system"]), r["step"]))
    body = [[system_of(r["system"]).label, r["lang"], "E0 (control)" if r["step"] == 0 else f"E' (step {r['step']})",
             cell(r["step_bias_loss"], r["step_bias_acc"]), cell(r["refit_loss"], r["refit_acc"]),
             f"{100 * r['readout_acc']:.1f}", cell(r["mini_loss"], r["mini_acc"]),
             cell(r["unigram_loss"], r["unigram_acc"])] for r in rows]
    r0 = rows[0]
    return "\n\n".join([
        "## Defect or scale: the primary's held-out target MLM (loss / accuracy %) read four ways",
        md(["system", "lang", "embeddings", "(a) main head, step bias", "(b) main head, refit bias",
            "(c) fresh read-out acc %", "mini-model", "unigram"], body),
        f"(a) the main head with the output bias Step 2 left (MINIJOINT's: its secondary head's); (b) the same head "
        f"with its bias refit to convergence on {r0['fit_sequences']} training sequences ({r0['fit_targets']} masked "
        f"tokens; embeddings, body and head frozen); (c) a fresh linear read-out of the top layer fitted on the same "
        f"tokens, over the most frequent pieces (it can be right on {100 * r0['coverage']:.0f}% of the held-out "
        f"targets); {r0['targets']} held-out masked tokens."])
