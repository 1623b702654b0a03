"""Table 2 of the paper (§4.1): per task, each system's final score per target language beside its control, the
source-language score, and the Step-2 cost. The one renderer of `mm-ds run`'s results.md and of report/tables.md,
so the two show the same table, with its caption (mm_ds/report/captions.py)."""
from __future__ import annotations

from statistics import mean
from typing import TYPE_CHECKING

from ..model.flops import EXA
from . import captions
from .mdtable import cost, fmt, md

if TYPE_CHECKING:  # report.py imports this module
    from .report import Report


def table2(report: Report) -> dict[str, list[dict]]:
    """Per task: one row per system, final scores per language with their controls, their average, the
    source-language score, and the final Step-2 cost."""
    out = {}
    for t in report.tasks:
        rows = []
        for s in report.systems:
            finals = {l: report.final((t, l, s)) for l in report.langs[t]}
            got = {l: f for l, f in finals.items() if f is not None}
            if not got:
                continue
            missing = [l for l in report.langs[t] if l not in got]
            rows.append(dict(system=s, eflops=max(f.flops for f in got.values()) / EXA,
                             v100_days=max(f.v100_days for f in got.values()),
                             scores={l: (f.score if f else None) for l, f in finals.items()},
                             avg=mean(f.score for f in got.values()), avg_partial=bool(missing),
                             controls={l: report.control_score((t, l, s)) for l in report.langs[t]},
                             sources={l: v for (tt, l, ss), v in report.sources.items() if (tt, ss) == (t, s)}))
        out[t] = rows
    return out


def format_table2(report: Report, task: str, rows: list[dict] | None = None) -> str:
    """Table 2 of one task, captioned: the one renderer of `mm-ds run`'s results.md and report/tables.md."""
    rows = table2(report)[task] if rows is None else rows
    L, src = report.langs[task], sorted({l for r in rows for l in r["sources"]})
    ctrl = any(v is not None for r in rows for v in r["controls"].values())

    def cell(r, l):
        c = r["controls"][l]
        return fmt(r["scores"][l]) + ("" if c is None or r["scores"][l] is None else f" (ctrl {fmt(c)})")

    base = [[name, "-", "-"] + ["-"] * len(src) + [fmt(b.get((task, l))) for l in L]
            + [fmt(mean(b[(task, l)] for l in L)) if all((task, l) in b for l in L) else "-"]
            for name, b in report.baselines.items() if any(t == task for t, _ in b)]
    table = md(["system", "Step-2 EFLOPs", "V100-days"] + src + L + ["avg"], [
        [r["system"], cost(r["eflops"]), cost(r["v100_days"])] + [fmt(r["sources"].get(l)) for l in src]
        + [cell(r, l) for l in L] + [fmt(r["avg"]) + ("*" if r["avg_partial"] else "")] for r in rows] + base)
    source = f" {', '.join(src)}: the primary model finetuned and scored in {', '.join(src)} (no swap)." if src else ""
    source += (f" {', '.join(n for n, *_ in base)}: a baseline, no Step 2 (the target's training-shard piece "
               f"frequencies on the same tokens)." if base else "")
    about = (captions.scores(task, report.seeds.get(task, ()), report.world, ctrl, report.examples(task)) + source
             + f" avg: over {', '.join(L)}; * = fewer languages than the task has. Cost: Step 2 to its last "
             "checkpoint (the largest over languages).")
    return f"## {task}: performance at training completion (Table 2)\n\n{about}\n\n{table}"


def format_table2s(report: Report) -> str:
    """Every task's Table 2: results.md."""
    t2 = table2(report)
    return "\n\n".join(format_table2(report, t, t2[t]) for t in report.tasks)
