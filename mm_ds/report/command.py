"""`mm-ds report`: its command line over mm_ds.report.report (records -> the paper's tables, speedups and curves)
and, beside them, the alignment check's rows (align.md, and the MLM level in OUT/mlm/)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..systems import REFERENCE, SYSTEMS
from .align_report import write_align
from .records import load_results, read_records, recorded, source_scores
from .report import build_report, format_tables, mlm_report, write_report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mm-ds report", description="Tables 2/3, speedups (Figure 1) and training "
                                 "curves (Figure 3) from evaluated Step-2 checkpoints, and at the MLM level from the "
                                 "alignment check's rows (align.jsonl), task data or not.")
    ap.add_argument("results", nargs="*", help="CSV/JSON/JSONL with system,task,lang,step,flops,v100_days,score "
                    "(none: --align only)")
    ap.add_argument("--out", required=True, help="directory for tables.md, *.csv, report.json, *.png")
    ap.add_argument("--reference", default=SYSTEMS[REFERENCE].label, help="system whose final score sets the target")
    ap.add_argument("--fraction", type=float, default=0.95, help="target = fraction × reference final score")
    ap.add_argument("--xmax-days", type=float, help="clip curve plots at this many V100-days (paper: 7)")
    ap.add_argument("--bounds", action="store_true", help="print Table A4's (lower-upper) days in Table 3")
    ap.add_argument("--headline-tasks", metavar="T1,T2", help="the tasks Figure 1's headline speedup averages "
                    "(paper: xnli,mlqa,pawsx; default: every task in the results)")
    ap.add_argument("--no-plots", action="store_true", help="skip the PNGs")
    ap.add_argument("--world", action="store_true", help="scored on the generated world's task files: captions and "
                    "curves give their chance levels (default: when a world/world.json is beside a results file, as "
                    "`mm-ds run` leaves it)")
    ap.add_argument("--align", help="align.jsonl of `mm-ds align` or `mm-ds run` (default: one beside a results "
                    "file): align.md, align_<lang>.png and the MLM level's tables and curves in OUT/mlm/ too")
    args = ap.parse_args(argv)

    align = args.align or next((str(p) for p in (Path(r).with_name("align.jsonl") for r in args.results)
                                if p.is_file()), None)
    if not args.results and not align:
        print("mm-ds report: give results files (results.jsonl of `mm-ds run`, or your CSV/JSON), --align FILE "
              "(align.jsonl of `mm-ds run` or `mm-ds align`), or both", file=sys.stderr)
        return 2
    written = []
    if args.results:
        controls, rows = {}, []
        results, warnings = load_results(args.results, controls, rows)
        if not results:
            for w in warnings:
                print(f"warning: {w}", file=sys.stderr)
            print(f"mm-ds report: no usable records in {', '.join(args.results)}", file=sys.stderr)
            return 2
        world = args.world or any((Path(r).parent / "world" / "world.json").is_file() for r in args.results)
        report = build_report(results, args.reference, args.fraction, warnings, controls, source_scores(rows),
                              recorded(rows, "seeds"), world,
                              headline_tasks=args.headline_tasks and args.headline_tasks.split(","))
        written += write_report(report, args.out, plots=not args.no_plots, xmax_days=args.xmax_days)
        print(format_tables(report, bounds=args.bounds))
        for w in report.warnings:
            print(f"warning: {w}", file=sys.stderr)
    if align:  # the alignment check (mm_ds/eval/align.py) and the MLM level, beside the tables
        rows, problems = read_records(align)
        if problems:
            print(f"mm-ds report: {'; '.join(problems)}", file=sys.stderr)
            return 2
        written += write_align(rows, Path(args.out), plots=not args.no_plots)
        mlm, files = mlm_report(rows, Path(args.out), plots=not args.no_plots)
        written += files
        if mlm is not None:
            print(f"\n# MLM level ({align})\n\n{format_tables(mlm, bounds=args.bounds)}")
    print(f"wrote {len(written)} files to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
