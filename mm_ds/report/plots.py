"""The report's figures: Figure 3 (score vs V100-days, mean over languages and per language, each curve from its
control at 0 days, with the task's chance level) and Figure 1 (speedups, each bar labelled with the languages and
seeds behind it), from a `report.Report`. matplotlib's object API only: no pyplot global state, no display."""
from __future__ import annotations

import math
from pathlib import Path
from statistics import mean
from typing import TYPE_CHECKING

from ..data.tasks import chance_level
from . import captions

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


def chance_line(ax, report: Report, task: str) -> None:
    """The task's chance level (mm_ds/data/tasks.py): what a model that learned nothing scores."""
    level = chance_level(task, report.world)
    if level is not None:
        ax.axhline(level, ls="-.", c="black", lw=0.8, label=f"chance ({level:.1f})")


def control_point(ax, report: Report, task: str, system: str, langs: list[str], first: tuple[float, float],
                  color: str) -> bool:
    """The control (the untrained target embeddings Step 2 starts from) as the curve's point at 0 days, dotted to
    its first checkpoint; averaged over `langs`, drawn only when every one has a control. True when drawn."""
    cs = [report.control_score((task, l, system)) for l in langs]
    if not cs or None in cs:
        return False
    ax.plot([0, first[0]], [mean(cs), first[1]], ls=":", c=color, marker="o", mfc="none", markevery=[0])
    return True


def _reference_marks(ax, report: Report, task: str, drew_control: bool) -> None:
    chance_line(ax, report, task)
    if drew_control:  # one legend entry for every system's open circle
        ax.plot([], [], ls=":", c="grey", marker="o", mfc="none", label="ctrl (untrained embeddings), at 0 days")


def curves_figure(report: Report, xmax_days: float | None = None):
    """Figure 3, averaged over languages: one panel per task, a line per system from its control."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no display backend needed

    color = {s: f"C{i}" for i, s in enumerate(report.systems)}  # one colour per system in every figure
    fig = Figure(figsize=(5 * max(len(report.tasks), 1), 4))
    for ax, t in zip(fig.subplots(1, len(report.tasks), squeeze=False)[0], report.tasks):
        ctrl = False
        for s in report.systems:
            pts = mean_curve(report, t, s)
            if pts:
                ax.plot(*zip(*pts), marker=".", label=s, c=color[s])
                langs = [l for l in report.langs[t] if (t, l, s) in report.curves]
                ctrl |= control_point(ax, report, t, s, langs, pts[0], color[s])
        target_line(ax, report, t)
        _reference_marks(ax, report, t, ctrl)
        ax.set(title=f"{t} (mean over languages)", xlabel="V100-days (Step 2)", ylabel=captions.metric(t))
        if xmax_days:
            ax.set_xlim(0, xmax_days)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def language_curves_figure(report: Report, task: str, xmax_days: float | None = None):
    """Figure 3 per language of `task`: a panel per language, a line per system from its control."""
    from matplotlib.figure import Figure

    color = {s: f"C{i}" for i, s in enumerate(report.systems)}
    L = report.langs[task]
    cols = min(4, len(L))
    fig = Figure(figsize=(4 * cols, 3 * math.ceil(len(L) / cols)))
    axes = fig.subplots(math.ceil(len(L) / cols), cols, squeeze=False).ravel()
    for ax, l in zip(axes, L):
        ctrl = False
        for s in report.systems:
            c = report.curves.get((task, l, s))
            if c:
                ax.plot([r.v100_days for r in c], [r.score for r in c], marker=".", label=s, c=color[s])
                ctrl |= control_point(ax, report, task, s, [l], (c[0].v100_days, c[0].score), color[s])
        if (task, l) in report.targets:
            ax.axhline(report.targets[(task, l)], ls="--", c="grey", lw=1, label="target")
        _reference_marks(ax, report, task, ctrl)
        ax.set(title=f"{task} {l}", xlabel="V100-days", ylabel=captions.metric(task))
        if xmax_days:
            ax.set_xlim(0, xmax_days)
    for ax in axes[len(L):]:
        ax.set_visible(False)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def speedup_figure(report: Report):
    """Figure 1: a bar per task and system, labelled with the languages (of those the task has) and seeds behind
    it; a bar resting on fewer languages than its task has (or an average over fewer tasks) is hatched. None
    without speedups."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    summ = [r for r in report.speedup_summary if r["mean_speedup"] is not None]
    if not summ:
        return None
    color = {s: f"C{i}" for i, s in enumerate(report.systems)}
    groups = list(dict.fromkeys(r["task"] for r in summ))
    systems = list(dict.fromkeys(r["system"] for r in summ))
    partial_tasks = {(r["task"], r["system"]) for r in summ
                     if r["n_tasks"] is None and r["n_langs"] < len(report.langs[r["task"]])}
    fig = Figure(figsize=(2.5 + 1.6 * len(groups) * max(len(systems), 1) / 2, 4.5))
    ax = fig.subplots()
    width, any_short = 0.8 / len(systems), False
    for j, s in enumerate(systems):
        xs, ys, labels, partial = [], [], [], []
        for i, g in enumerate(groups):
            r = next((r for r in summ if r["task"] == g and r["system"] == s), None)
            if r is None:
                continue
            if r["n_tasks"] is None:
                used = f"{r['n_langs']}/{len(report.langs[g])} langs"
                seeds = captions.runs_label([g], report.seeds)
                short = (g, s) in partial_tasks
            else:
                used = f"{r['n_tasks']}/{len(report.tasks)} tasks"
                seeds = captions.runs_label(report.tasks, report.seeds)
                short = r["n_tasks"] < len(report.tasks) or any(p[1] == s for p in partial_tasks)
            xs.append(i + j * width)
            ys.append(r["mean_speedup"])
            labels.append(f"{r['mean_speedup']:.1f}x{'*' if short else ''}\n{used}\n{seeds}")
            partial.append(short)
            any_short |= short
        bars = ax.bar(xs, ys, width, label=s, color=color[s], edgecolor="black", lw=0.5)
        for bar, short in zip(bars, partial):
            bar.set_hatch("//" if short else "")
        ax.bar_label(bars, labels=labels, fontsize=6)
    ax.axhline(1, c="grey", lw=1)
    ax.set_xticks([i + width * (len(systems) - 1) / 2 for i in range(len(groups))], groups)
    ax.set(ylabel=f"speedup over {report.reference}", title="Speedup to near-maximal performance")
    ax.margins(y=0.2)  # room for the labels
    handles, _ = ax.get_legend_handles_labels()
    if any_short:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//",
                             label="* fewer languages (or tasks) than the task has"))
    ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=min(len(handles), 3))
    fig.tight_layout()  # below the axes, the legend hides no bar label
    return fig


def write_plots(report: Report, out: Path, xmax_days: float | None = None) -> list[Path]:
    """Figure 3 (score vs V100-days, averaged over languages and per language) and Figure 1 (speedups)."""
    figures = {"curves_avg.png": curves_figure(report, xmax_days)}
    figures |= {f"curves_{t}.png": language_curves_figure(report, t, xmax_days) for t in report.tasks}
    figures["speedup.png"] = speedup_figure(report)
    written = []
    for name, fig in figures.items():
        if fig is not None:
            fig.savefig(out / name, dpi=120)
            written.append(out / name)
    return written
