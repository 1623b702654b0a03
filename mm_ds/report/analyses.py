"""The paper's analyses (§5.2, §5.3), from a `report.Report` and `mm-ds run`'s result rows.

- Depth sweeps (§5.2): for every mini-model system whose variants are in the results (`minijoint@2`,
  `minijoint@4`, ...; systems.system_of), Table 4 (V100-days to near-maximal performance per depth, language
  and task, with Table A4's checkpoint bounds; ∞ when never reached), Table A3 (final scores) and Figure 4
  (score vs Step-2 V100-days, averaged over languages, one line per depth). The reference system's row is
  shown with them: its final score sets every target.
- English performance (§5.3, Table 5): the source-language score of every primary model and of every mini-model
  finetuned on its own (recipe key `english_minis`): does pretraining with a secondary head hurt either?
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

from ..systems import SystemNameError, system_of
from . import captions
from .mdtable import cost, days_cell, fmt, md
from .plots import chance_line, mean_curve, target_line
from .records import condition

if TYPE_CHECKING:  # report.py calls this module when it writes its files
    from .report import Report


def sweeps(report: Report) -> dict[str, list[str]]:
    """Base system label -> its rows in the report (the base row, then its variants by depth), for every base
    with at least one variant among the results."""
    groups: dict[str, list[str]] = defaultdict(list)
    for label in report.systems:  # already in table order: base row first, then variants by depth
        try:
            row = system_of(label.lower())
        except SystemNameError:
            continue
        if row.mini:
            groups[system_of(row.base).label].append(label)
    return {base: labels for base, labels in groups.items() if any("@" in label for label in labels)}


def sweep_tables(report: Report, t2: dict, t3: dict) -> str:
    """Tables 4 and A3 of every depth sweep in the report ("" when there is none), from its Table 2 and 3 rows
    (report.table2, report.table3)."""
    parts = []
    for base, labels in sweeps(report).items():
        shown = [report.reference, *labels]
        for t in report.tasks:
            L = report.langs[t]
            days = [r for r in t3[t] if r["system"] in shown]
            if days:
                parts.append(f"## {base} depth sweep, {t}: V100-days to {report.target_phrase} (Table 4; checkpoint "
                             f"bounds in brackets)")
                parts.append(captions.days(t, report.seeds.get(t, ()), report.world, report.target_phrase,
                                           report.examples(t), report.over_control))
                parts.append(md(["system"] + L + ["avg"], [
                    [r["system"]] + [days_cell(r["days"][l], r["bounds"].get(l)) for l in L]
                    + ["∞" if r["avg"] is None else cost(r["avg"]) + ("*" if r["avg_partial"] else "")]
                    for r in days]))
            finals = [r for r in t2[t] if r["system"] in shown]
            if finals:
                parts.append(f"## {base} depth sweep, {t}: final scores (Table A3)")
                parts.append(captions.scores(t, report.seeds.get(t, ()), report.world, n=report.examples(t)))
                parts.append(md(["system", "Step-2 days"] + L + ["avg"], [
                    [r["system"], cost(r["v100_days"])] + [fmt(r["scores"][l]) for l in L]
                    + [fmt(r["avg"]) + ("*" if r["avg_partial"] else "")] for r in finals]))
    if parts:
        parts.append("∞ = never reached; * = averaged over fewer languages than the task has; n/a = no target (the "
                     "reference did not beat its control significantly there, see tables.md).")
    return "\n\n".join(parts)


def write_sweep_plots(report: Report, out: Path) -> list[Path]:
    """Figure 4: per depth sweep, score vs Step-2 V100-days averaged over languages, one panel per task."""
    from matplotlib.figure import Figure

    written = []
    for base, labels in sweeps(report).items():
        n = len(report.tasks)
        fig = Figure(figsize=(5 * n, 4))
        for ax, t in zip(fig.subplots(1, n, squeeze=False)[0], report.tasks):
            for i, s in enumerate([report.reference, *labels]):
                pts = mean_curve(report, t, s)
                if pts:
                    ax.plot(*zip(*pts), marker=".", label=s, c=f"C{i}")
            target_line(ax, report, t)
            chance_line(ax, report, t)
            ax.set(title=f"{base} depths, {t} (mean over languages)", xlabel="V100-days (Step 2)",
                   ylabel=captions.metric(t))
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / f"sweep_{base.lower()}.png"
        fig.savefig(path, dpi=120)
        written.append(path)
    return written


def write_sweeps(report: Report, out: Path, t2: dict, t3: dict, plots: bool = True) -> list[Path]:
    """sweep.md (Tables 4 and A3) and Figure 4's PNGs, for report.write_report; [] without sweeps."""
    text = sweep_tables(report, t2, t3)
    if not text:
        return []
    (out / "sweep.md").write_text(text + "\n")
    written = [out / "sweep.md"]
    if plots:
        try:
            written += write_sweep_plots(report, out)
        except Exception as e:  # a plot failure must not cost the numbers
            report.warnings.append(f"sweep plots not written: {type(e).__name__}: {e}")
    return written


def english_table(recipe, rows: list[dict], primaries: list[str], minis: list[str], tasks: list[str]) -> str:
    """Table 5: English scores (mean over finetuning seeds) of each primary model and each mini-model on `tasks`,
    as the recipe names them (mm_ds/pipeline/recipe.py: primaries, minis_in_english, english_tasks)."""
    def score(cond: str, systems: set[str], task: str):
        got = [r for r in rows if condition(r) == cond and r["system"] in systems and r["task"] == task
               and r["lang"] == recipe.source_lang]
        return got[0] if got else None

    models = [(f"{system_of(p).label}", "source", {s for s in recipe.systems if system_of(s).primary == p})
              for p in primaries]
    models += [(f"{system_of(s).label} mini-model", "mini", {s}) for s in minis]
    body = []
    for name, cond, systems in models:
        cells = [score(cond, systems, t) for t in tasks]
        layers = next((c["layers"] for c in cells if c and "layers" in c), None)
        body.append([name, str(layers or "-")] + [f"{c['score']:.1f}" if c else "-" for c in cells])
    about = " ".join(captions.scores(t, [len(recipe.seeds)], recipe.world is not None) for t in tasks)
    return (f"Scores in {recipe.source_lang}. {about}\n\n"
            + md(["model", "layers"] + [f"{t} {recipe.source_lang}" for t in tasks], body))
