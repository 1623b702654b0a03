"""The report's figures: Figure 3 (score vs V100-days, mean over languages and per language) and Figure 1
(speedups), from a `report.Report`. matplotlib's object API only: no pyplot global state, no display."""
from __future__ import annotations

import math
from pathlib import Path
from statistics import mean
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # report.py imports this module when it writes figures
    from .report import Report


def mean_curve(report: Report, task: str, system: str) -> list[tuple[float, float]]:
    """(days, score) averaged over the system's languages, at the steps every one of them was evaluated."""
    cs = [report.curves[(task, l, system)] for l in report.langs[task] if (task, l, system) in report.curves]
    if not cs:
        return []
    common = set.intersection(*({r.step for r in c} for c in cs))
    return [(mean(r.v100_days for c in cs for r in c if r.step == st), mean(r.score for c in cs for r in c
                                                                            if r.step == st)) for st in sorted(common)]


def target_line(ax, report: Report, task: str) -> None:
    """The mean target over the task's languages, for curves averaged over them; only when every language has
    one (a mean over some languages would sit above or below curves that average over all of them)."""
    tg = [report.targets.get((task, l)) for l in report.langs[task]]
    if tg and None not in tg:
        ax.axhline(mean(tg), ls="--", c="grey", lw=1, label="target (mean over langs)")
    elif any(v is not None for v in tg):
        missing = ", ".join(l for l, v in zip(report.langs[task], tg) if v is None)
        ax.plot([], [], ls="--", c="grey", lw=1, label=f"no mean target: none for {missing}")


def write_plots(report: Report, out: Path, xmax_days: float | None = None) -> list[Path]:
    """Figure 3 (score vs V100-days, averaged over languages and per language) and Figure 1 (speedups)."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no display backend needed

    color = {s: f"C{i}" for i, s in enumerate(report.systems)}  # one colour per system in every figure
    written = []
    n = len(report.tasks)
    fig = Figure(figsize=(5 * max(n, 1), 4))
    for ax, t in zip(fig.subplots(1, n, squeeze=False)[0], report.tasks):
        for s in report.systems:
            pts = mean_curve(report, t, s)
            if pts:
                ax.plot(*zip(*pts), marker=".", label=s, c=color[s])
        target_line(ax, report, t)
        ax.set(title=f"{t} (mean over languages)", xlabel="V100-days (Step 2)", ylabel="score")
        if xmax_days:
            ax.set_xlim(0, xmax_days)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "curves_avg.png", dpi=120)
    written.append(out / "curves_avg.png")

    for t in report.tasks:
        L = report.langs[t]
        cols = min(4, len(L))
        rows = math.ceil(len(L) / cols)
        fig = Figure(figsize=(4 * cols, 3 * rows))
        axes = fig.subplots(rows, cols, squeeze=False).ravel()
        for ax, l in zip(axes, L):
            for s in report.systems:
                c = report.curves.get((t, l, s))
                if c:
                    ax.plot([r.v100_days for r in c], [r.score for r in c], marker=".", label=s, c=color[s])
            if (t, l) in report.targets:
                ax.axhline(report.targets[(t, l)], ls="--", c="grey", lw=1)
            ax.set(title=f"{t} {l}", xlabel="V100-days", ylabel="score")
            if xmax_days:
                ax.set_xlim(0, xmax_days)
        for ax in axes[len(L):]:
            ax.set_visible(False)
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        path = out / f"curves_{t}.png"
        fig.savefig(path, dpi=120)
        written.append(path)

    summ = [r for r in report.speedup_summary if r["mean_speedup"] is not None]
    if summ:
        groups = list(dict.fromkeys(r["task"] for r in summ))
        systems = list(dict.fromkeys(r["system"] for r in summ))
        fig = Figure(figsize=(1.5 + 1.2 * len(groups) * max(len(systems), 1) / 2, 4))
        ax = fig.subplots()
        width = 0.8 / len(systems)
        for j, s in enumerate(systems):
            xs, ys = [], []
            for i, g in enumerate(groups):
                v = next((r["mean_speedup"] for r in summ if r["task"] == g and r["system"] == s), None)
                if v is not None:
                    xs.append(i + j * width)
                    ys.append(v)
            bars = ax.bar(xs, ys, width, label=s, color=color[s])
            ax.bar_label(bars, fmt="%.1fx", fontsize=7)
        ax.axhline(1, c="grey", lw=1)
        ax.set_xticks([i + width * (len(systems) - 1) / 2 for i in range(len(groups))], groups)
        ax.set(ylabel=f"speedup over {report.reference}", title="Speedup to near-maximal performance")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "speedup.png", dpi=120)
        written.append(out / "speedup.png")
    return written
