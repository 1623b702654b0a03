"""Evaluated Step-2 checkpoints -> the paper's tables, speedups and curves (§4.1, §4.2, §5.1, A.4).

Input: one record per evaluated checkpoint, {system, task, lang, step, flops, v100_days, score}, the score
already averaged over finetuning seeds, from CSV, JSON (a list, or {"results": [...]}) or JSONL.

- Near-maximal performance (§4.2, fn. 5): 95% of the reference system's (BL_BASE) score at its LAST checkpoint
  for that task and language; the same target for every system. At the MLM level (`over_control`, `mlm_report`):
  the control + 95% of the reference's final improvement over it (an MLM accuracy has no zero to scale from).
- No target from noise (significance.py): with a control, a language gets a target only when the reference's
  final score beats it by a margin significant for the test set's size and the seeds; tables show the margin.
- Time to target (§3, Table A4): curves.time_to_target, linear interpolation between the bracketing checkpoints.
- Speedup (fn. 6): reference days / system days, per language; the headline is the MEAN OF THESE RATIOS over
  languages (not the ratio of mean days), then the mean over the headline tasks (Figure 1: XNLI, MLQA and PAWS-X
  in the paper, `headline_tasks`; default every task). Languages where either side never reaches the target are
  left out and listed.

Bad input never stops the report: what is wrong is collected in `Report.warnings` and the rest is produced.
The command, `mm-ds report`: mm_ds.report.command.
"""
from __future__ import annotations

import csv
import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import mean
from typing import Iterable, Sequence

from ..model.flops import EXA
from ..systems import REFERENCE, SYSTEMS, SystemNameError, sort_key
from . import captions
from .analyses import write_sweeps
from .curves import Crossing, Key, group_curves, time_to_target
from .mdtable import cost, days_cell, fmt, md
from .records import Result, mlm_baselines, mlm_results
from .significance import TEST, Margin, margin_of, margin_table
from .table2 import format_table2, table2

# --- The report ------------------------------------------------------------------------------------------------

@dataclass
class Report:
    reference: str
    fraction: float
    tasks: list[str]
    langs: dict[str, list[str]]  # task -> languages
    systems: list[str]
    curves: dict[Key, list[Result]]
    targets: dict[tuple[str, str], float]  # (task, lang) -> target score
    crossings: dict[Key, Crossing]
    speedup_rows: list[dict]  # per task, system, language
    speedup_summary: list[dict]  # per task (and task "avg"), system
    warnings: list[str] = field(default_factory=list)
    controls: dict[Key, Result] = field(default_factory=dict)  # the untrained-embedding control's result
    sources: dict[Key, float] = field(default_factory=dict)  # (task, source language, system) -> its score
    seeds: dict[str, list[int]] = field(default_factory=dict)  # task -> how many finetuning seeds a score averages
    world: bool = False  # scored on the generated world's files (their chance levels)
    margins: dict[tuple[str, str], Margin] = field(default_factory=dict)  # (task, lang) -> reference vs control
    over_control: bool = False  # targets are a fraction of the improvement over the control (MLM level)
    headline: list[str] = field(default_factory=list)  # the tasks Figure 1's headline (task "avg") averages
    baselines: dict[str, dict[tuple[str, str], float]] = field(default_factory=dict)  # row -> (task, lang) -> score

    @property
    def target_phrase(self) -> str:
        return (f"{self.fraction:.0%} of {self.reference}'s final improvement over its control" if self.over_control
                else f"{self.fraction:.0%} of {self.reference}'s final score")

    def control_score(self, key: Key) -> float | None:
        c = self.controls.get(key)
        return None if c is None else c.score

    def final(self, key: Key) -> Result | None:
        c = self.curves.get(key)
        return c[-1] if c else None

    def examples(self, task: str) -> dict[str, set[int]]:
        """lang -> the test-example counts (masked tokens at the MLM level) its records carry: for the captions."""
        return {l: {r.n for s in self.systems for r in self.curves.get((task, l, s), ()) if r.n is not None}
                for l in self.langs[task]}


def _system_order(systems: Iterable[str], reference: str) -> list[str]:
    """The reference first, then the paper's rows, each followed by its variants by depth, then any other."""
    def key(label: str):
        try:
            return (label != reference, 0, sort_key(label.lower()), label)
        except SystemNameError:
            return (label != reference, 1, (), label)
    return sorted(set(systems), key=key)


def build_report(results: Iterable[Result], reference: str = SYSTEMS[REFERENCE].label, fraction: float = 0.95,
                 warnings: Sequence[str] = (), controls: dict[tuple[str, str, str], Result] | None = None,
                 sources: dict[Key, float] | None = None, seeds: dict[str, list[int]] | None = None,
                 world: bool = False, over_control: bool = False,
                 headline_tasks: Sequence[str] | None = None) -> Report:
    """`controls`: (task, lang, SYSTEM) -> control result (records.control_scores, records.mlm_results). Where the
    reference's final score does not beat its control significantly (significance.py) it learned nothing to be
    near to: that language gets no target. `over_control`: the target is `fraction` of the reference's final
    improvement over its control (needs the control), not of its score. `sources` (records.source_scores),
    `seeds` (records.recorded) and `world` are for Table 2 and the captions.
    `headline_tasks`: the tasks the headline speedup averages (default: every task in the results)."""
    warnings, controls, margins = list(warnings), controls or {}, {}
    curves = group_curves(results, warnings)
    tasks = sorted({t for t, _, _ in curves})
    langs = {t: sorted({l for tt, l, _ in curves if tt == t}) for t in tasks}
    systems = _system_order((s for _, _, s in curves), reference)
    if curves and reference not in systems:
        warnings.append(f"no results for the reference system {reference!r} (systems found: {', '.join(systems)}); "
                        "no targets, times to target or speedups")

    targets, crossings = {}, {}
    for t in tasks:
        for l in langs[t]:
            ref = curves.get((t, l, reference))
            if not ref:
                if reference in systems:
                    warnings.append(f"{t}/{l}: no {reference} results, so no target; its times to target and "
                                    "speedups are left out")
                continue
            control = controls.get((t, l, reference))
            if control is None and over_control:
                warnings.append(f"{t}/{l}: no control for {reference}, so no improvement over it to take "
                                f"{fraction:.0%} of; no target")
                continue
            if control is not None:
                m = margins[(t, l)] = margin_of(ref[-1], control)
                warnings += m.warnings(f"{t}/{l}", reference)
                if not m.significant:
                    continue
            floor = control.score if over_control else 0.0
            targets[(t, l)] = floor + fraction * (ref[-1].score - floor)
            for s in systems:
                if (t, l, s) in curves:
                    crossings[(t, l, s)] = time_to_target(curves[(t, l, s)], targets[(t, l)])

    warnings += _coverage_warnings(tasks, langs, systems, curves)
    headline = [t for t in tasks if t in headline_tasks] if headline_tasks else list(tasks)
    if headline_tasks and set(headline_tasks) - set(tasks):
        warnings.append(f"headline tasks without results: {', '.join(sorted(set(headline_tasks) - set(tasks)))}; "
                        f"the headline speedup averages {', '.join(headline) or 'nothing'}")
    rows, summary = _speedups(tasks, langs, systems, reference, targets, crossings, curves, warnings, headline)
    return Report(reference, fraction, tasks, langs, systems, curves, targets, crossings, rows, summary, warnings,
                  controls, sources or {}, seeds or {}, world, margins, over_control, headline)


def _coverage_warnings(tasks, langs, systems, curves) -> list[str]:
    out = []
    for t in tasks:
        for s in systems:
            finals = [curves[(t, l, s)][-1] for l in langs[t] if (t, l, s) in curves]
            if not finals:
                continue
            missing = [l for l in langs[t] if (t, l, s) not in curves]
            if missing:
                out.append(f"{t}/{s}: no results for {', '.join(missing)}; its averages cover "
                           f"{len(finals)} of {len(langs[t])} languages (marked *)")
            steps = {f.step for f in finals}
            if len(steps) > 1:
                out.append(f"{t}/{s}: last checkpoints differ across languages (steps {min(steps)}..{max(steps)}); "
                           "Table 2's cost columns show the largest")
    return out


def _speedups(tasks, langs, systems, reference, targets, crossings, curves, warnings, headline):
    rows, summary = [], []
    if reference not in systems:  # already warned once; per-language "no reference" lines would only repeat it
        return rows, summary
    per_system_task_means: dict[str, list[float]] = defaultdict(list)
    for t in tasks:
        for s in systems:
            if s == reference:
                continue
            used, excluded = [], {}
            for l in langs[t]:
                if (t, l, s) not in curves:
                    continue
                if (t, l) not in targets:
                    excluded[l] = (f"no target: {reference} did not beat its control significantly"
                                   if (t, l, reference) in curves else f"no {reference} results")
                    continue
                ref, sys_ = crossings[(t, l, reference)], crossings[(t, l, s)]
                if not sys_.reached:
                    excluded[l] = f"{s} never reaches the target"
                elif not ref.reached:
                    excluded[l] = f"{reference} never reaches the target"
                elif sys_.estimate.v100_days <= 0:
                    excluded[l] = f"{s} reaches the target at 0 days (speedup undefined)"
                else:
                    ratio = ref.estimate.v100_days / sys_.estimate.v100_days
                    used.append((l, ref.estimate.v100_days, sys_.estimate.v100_days))
                    rows.append(dict(task=t, system=s, lang=l, reference_days=ref.estimate.v100_days,
                                     system_days=sys_.estimate.v100_days, speedup=ratio))
            if not used and not excluded:
                continue
            mean_ratio = mean(r / d for _, r, d in used) if used else None
            if mean_ratio is not None and t in headline:
                per_system_task_means[s].append(mean_ratio)
            if excluded:
                warnings.append(f"{t}/{s}: speedup leaves out {len(excluded)} language(s): "
                                + "; ".join(f"{l} ({why})" for l, why in excluded.items()))
            summary.append(dict(
                task=t, system=s, mean_speedup=mean_ratio, n_langs=len(used), n_tasks=None, excluded=excluded,
                # Footnote 6's contrast, kept for the reader: NOT the headline.
                ratio_of_mean_days=(mean(r for _, r, _ in used) / mean(d for _, _, d in used)) if used else None))
    for s, means in per_system_task_means.items():
        summary.append(dict(task="avg", system=s, mean_speedup=mean(means), n_langs=None, n_tasks=len(means),
                            excluded={}, ratio_of_mean_days=None, tasks=" ".join(headline)))
    return rows, summary


# --- Tables ----------------------------------------------------------------------------------------------------

def table3(report: Report) -> dict[str, list[dict]]:
    """Per task: V100-days to near-maximal performance per system and language (None: never; absent: n/a)."""
    out = {}
    for t in report.tasks:
        rows = []
        for s in report.systems:
            cells, bounds, reached = {}, {}, []
            for l in report.langs[t]:
                c = report.crossings.get((t, l, s))
                if c is None:
                    cells[l] = "n/a"
                elif c.reached:
                    cells[l] = c.estimate.v100_days
                    bounds[l] = (c.lower.v100_days, c.upper.v100_days)
                    reached.append(c.estimate.v100_days)
                else:
                    cells[l] = None
            if all(v == "n/a" for v in cells.values()):
                continue
            rows.append(dict(system=s, days=cells, bounds=bounds, avg=mean(reached) if reached else None,
                             avg_partial=len(reached) < len(cells)))
        out[t] = rows
    return out


def format_tables(report: Report, bounds: bool = False, table2s: bool = True) -> str:
    """Markdown tables; with bounds, Table 3 cells carry Table A4's (lower-upper) checkpoint bracket; without
    table2s, Tables 3 and the speedups only (`mm-ds run` prints Table 2 before them, from results.md)."""
    parts = []
    t2, t3 = table2(report), table3(report)
    for t in report.tasks:
        L = report.langs[t]
        if table2s:
            parts.append(format_table2(report, t, t2[t]))
        margins = {l: m for (tt, l), m in report.margins.items() if tt == t}
        if margins:
            parts.append(f"## {t}: does {report.reference} beat its control? ({TEST}; a target only where it does)")
            parts.append(captions.margins(t, report.seeds.get(t, ()), report.world, report.reference,
                                          report.target_phrase, report.examples(t)))
            parts.append(margin_table(L, margins, {l: v for (tt, l), v in report.targets.items() if tt == t}))
        if t3[t]:
            parts.append(f"## {t}: V100-days to {report.target_phrase} (Table 3)")
            parts.append(captions.days(t, report.seeds.get(t, ()), report.world, report.target_phrase,
                                       report.examples(t), report.over_control)
                         + (" In brackets: those checkpoints (Table A4)." if bounds else ""))
            parts.append(md(["system"] + L + ["avg"], [
                [r["system"]] + [days_cell(r["days"][l], bounds and r["bounds"].get(l)) for l in L]
                + ["∞" if r["avg"] is None else cost(r["avg"]) + ("*" if r["avg_partial"] else "")]
                for r in t3[t]]))
    if report.speedup_summary:
        parts.append(f"## Speedup over {report.reference} (Figure 1: mean of per-language ratios of V100-days; "
                     f"the headline, avg, averages {', '.join(report.headline)})")
        parts.append(f"Per task: the mean over its languages of {report.reference}'s V100-days to {report.target_phrase} divided "
                     f"by the system's; used: the languages of the task behind it (of those the task has), and the "
                     f"{captions.runs_nouns(report.tasks)} behind each score; avg: the mean over tasks.")
        body = []
        for r in report.speedup_summary:
            n = (f"{r['n_langs']}/{len(report.langs[r['task']])} langs, "
                 f"{captions.runs_label([r['task']], report.seeds)}" if r["n_tasks"] is None
                 else f"{r['n_tasks']}/{len(report.tasks)} tasks, {captions.runs_label(report.tasks, report.seeds)}")
            sp = "—" if r["mean_speedup"] is None else f"{r['mean_speedup']:.2f}x"
            body.append([r["task"], r["system"], sp, n, ", ".join(r.get("excluded", {})),
                         fmt(r.get("ratio_of_mean_days"), 2)])
        parts.append(md(["task", "system", "speedup", "used", "left out", "ratio of mean days"], body))
    parts.append("* = averaged over fewer languages than the task has (missing results, or never reached); "
                 "∞ = never reached; n/a = no results, or no target (no reference results, or the reference did not "
                 "beat its control significantly).")
    return "\n\n".join(parts)


# --- Files -----------------------------------------------------------------------------------------------------

def _write_csv(path: Path, rows: list[dict]):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        if rows:
            w.writeheader()
            w.writerows(rows)


def _crossing_rows(report: Report) -> list[dict]:
    rows = []
    for (t, l, s), c in sorted(report.crossings.items()):
        e, lo, up = c.estimate, c.lower, c.upper
        rows.append(dict(task=t, lang=l, system=s, target=c.target, reached=c.reached,
                         step=e and e.step, eflops=e and e.flops / EXA, v100_days=e and e.v100_days,
                         lower_step=lo and lo.step, lower_v100_days=lo and lo.v100_days,
                         upper_step=up and up.step, upper_v100_days=up and up.v100_days))
    return rows


def write_report(report: Report, out_dir: str | Path, plots: bool = True, xmax_days: float | None = None
                 ) -> list[Path]:
    """Writes tables.md, *.csv, report.json and (with matplotlib) PNGs; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t2, t3 = table2(report), table3(report)

    curve_rows = [dict(task=r.task, lang=r.lang, system=r.system, step=r.step, eflops=r.flops / EXA,
                       v100_days=r.v100_days, score=r.score) for k in sorted(report.curves) for r in report.curves[k]]
    final_rows = [dict(task=t, system=r["system"], lang=l, score=v, eflops=r["eflops"], v100_days=r["v100_days"])
                  for t, rows in t2.items() for r in rows for l, v in r["scores"].items()]
    summary_rows = [dict(r, excluded="; ".join(f"{k}: {v}" for k, v in r.get("excluded", {}).items()))
                    for r in report.speedup_summary]
    files = {"curves.csv": curve_rows, "final_scores.csv": final_rows, "time_to_target.csv": _crossing_rows(report),
             "speedups.csv": report.speedup_rows, "speedup_summary.csv": summary_rows}
    written = []
    for name, rows in files.items():
        _write_csv(out / name, rows)
        written.append(out / name)

    (out / "tables.md").write_text(format_tables(report, bounds=True) + "\n")
    doc = dict(reference=report.reference, fraction=report.fraction, seeds=report.seeds, world=report.world,
               over_control=report.over_control,
               headline_tasks=report.headline,
               margins=[dict(task=t, lang=l, **asdict(m), difference=m.difference, significant=m.significant)
                        for (t, l), m in sorted(report.margins.items())],
               targets=[dict(task=t, lang=l, target=v) for (t, l), v in sorted(report.targets.items())],
               table2=t2, table3=t3, time_to_target=_crossing_rows(report), speedups=report.speedup_rows,
               speedup_summary=report.speedup_summary, curves=curve_rows)
    if plots:
        try:
            from .plots import write_plots  # matplotlib only for plots, and failing to import it costs no numbers
            written += write_plots(report, out, xmax_days)
        except Exception as e:  # a plot failure must not cost the numbers
            report.warnings.append(f"plots not written: {type(e).__name__}: {e}")
    written += write_sweeps(report, out, t2, t3, plots)  # depth sweeps (§5.2): Tables 4, A3 and Figure 4
    doc["warnings"] = report.warnings
    (out / "report.json").write_text(json.dumps(doc, indent=2, default=asdict) + "\n")
    (out / "warnings.txt").write_text("".join(w + "\n" for w in report.warnings))
    return written + [out / "tables.md", out / "report.json", out / "warnings.txt"]


MLM_DIR = "mlm"


def mlm_report(align_rows: list[dict], out: Path, plots: bool = True) -> tuple[Report | None, list[Path]]:
    """The MLM level (the alignment check's rows, records.mlm_results) in out/mlm/: Tables 2 and 3, Figure 3,
    speedups, margins, targets at 95% of BL_BASE's final improvement over its control; (None, []) without rows."""
    results, controls = mlm_results(align_rows)
    if not results:
        return None, []
    report = build_report(results, controls=controls, over_control=True)
    if baseline := mlm_baselines(align_rows):
        report.baselines["unigram"] = baseline
    return report, write_report(report, Path(out) / MLM_DIR, plots=plots)
