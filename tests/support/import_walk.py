"""The walk from `mm-ds run` to a rank, over the import graph: which files a reader enters, in which folders, and
where a rank climbs back up above the stage it trains.

    python tests/support/import_walk.py               # this checkout
    python tests/support/import_walk.py --root DIR    # another checkout (e.g. an older commit's), its own layer table

The graph is tests/test_layout.py's (imports anywhere in a module, function-level ones included, and dispatch strings),
but the CLI's command tables are followed only for the command a process runs. Three processes:
    mm-ds run     `python -m mm_ds.cli run RECIPE`: the launching side
    stage rank    what the launcher starts for one stage run (the CLI's stage command, or mm_ds/rank.py RUN)
    job rank      what the launcher starts for a one-job run (the CLI's run-job, or mm_ds/rank.py JOB)
For each: the files entered, their folders, and the modules entered most often (import edges into them). A climb
back up is an import edge, on a rank, into a module above the layer where the rank's work lies (a stage rank's:
stages; a job rank's: pipeline, its executor), or into the CLI, the recipe, the report or tools: the rank re-enters
orchestration its launching side already did (mm_ds/rank.py itself is where every rank starts).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOT_ON_A_RANK = ("entry", "recipe", "report", "tools")
"""Layers no rank needs for its work: the CLI (its argv is the launching side's), the recipe (a layer of its own in
older checkouts), the report (written after the ranks), tools."""
RECIPE = {"mm_ds.recipe", "mm_ds.pipeline.recipe"}
"""The recipe, wherever a checkout keeps it: the launching side read it; no rank needs it."""


def layout(root: Path):
    """The checkout's own tests/test_layout.py (its layer table and import scan), loaded under a private name."""
    spec = importlib.util.spec_from_file_location("_walk_layout", root / "tests" / "test_layout.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(root / "tests"))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(root / "tests"))
    return mod


def cli_commands(layout_mod) -> dict[str, str]:
    """command -> module of the CLI's tables (STAGE_COMMANDS through the stage runner, TOOL_COMMANDS, internal)."""
    found = {}
    for p in (layout_mod.PACKAGE / "cli.py", *sorted((layout_mod.PACKAGE / "stages").glob("*.py"))):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values):
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Tuple) and isinstance(v.elts[0], ast.Constant) \
                            and isinstance(v.elts[0].value, str) and v.elts[0].value.startswith("mm_ds."):
                        found.setdefault(k.value, v.elts[0].value.partition(":")[0])
    return found


def graph(layout_mod) -> dict[str, set[str]]:
    """test_layout's graph, with the CLI's dispatch strings dropped (`walk` follows the command a process runs)."""
    g = layout_mod.graph()
    commands = set(cli_commands(layout_mod).values())
    for m in ("mm_ds.cli", *(m for m in g if m.startswith("mm_ds.stages."))):
        cli_only = {d for d in g.get(m, set()) if d in commands and not _imported(layout_mod, m, d)}
        g[m] = g.get(m, set()) - cli_only
    return g


def _imported(layout_mod, module: str, target: str) -> bool:
    """`module` has an import statement of `target` (not only a dispatch string naming it)."""
    path = layout_mod.PACKAGE.parent / (module.replace(".", "/") + ".py")
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == target for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.rpartition(".")[0].split(".")
                base = ".".join(pkg[:len(pkg) - node.level + 1] + ([base] if base else []))
            if base == target or any(f"{base}.{a.name}" == target for a in node.names):
                return True
    return False


def walk(g: dict[str, set[str]], starts: list[str]) -> tuple[set[str], list[tuple[str, str]]]:
    """(modules entered, import edges followed) from `starts`."""
    seen, edges, todo = set(), [], list(starts)
    while todo:
        m = todo.pop()
        if m in seen or m not in g:
            continue
        seen.add(m)
        for d in sorted(g[m]):
            edges.append((m, d))
            todo.append(d)
    return seen, edges


def rank_starts(layout_mod, g, kind: str) -> list[str]:
    """What a rank of `kind` (stage | job) enters first. When mm_ds/rank.py is the CLI run as a script, the CLI and
    the command the launcher gives it (a stage command; run-job); else rank.py's own function for it
    (`stage_rank`: a run directory; `job_rank`: a job) and its module-level imports."""
    tree = ast.parse((layout_mod.PACKAGE / "rank.py").read_text())
    if not any(isinstance(n, ast.FunctionDef) and n.name == f"{kind}_rank" for n in tree.body):
        commands = cli_commands(layout_mod)
        return ["mm_ds.cli", commands["pretrain"] if kind == "stage" else commands["run-job"]]
    modules = set(g)
    starts = []
    for node in tree.body:
        is_import = isinstance(node, (ast.Import, ast.ImportFrom))
        if is_import or isinstance(node, ast.FunctionDef) and node.name == f"{kind}_rank":
            for n in ast.walk(node):
                if isinstance(n, ast.ImportFrom) and n.module:
                    base = n.module if not n.level else f"mm_ds.{n.module}"
                    starts += [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in n.names]
                elif isinstance(n, ast.Import):
                    starts += [a.name for a in n.names]
    return [m for m in starts if m in modules]


def report(root: Path) -> dict:
    L = layout(root)
    g = graph(L)
    g["mm_ds.rank"] = set()  # its imports differ by what it is given: rank_starts
    out = {}
    for name, starts, work in (("mm-ds run", ["mm_ds.cli", cli_commands(L)["run"]], None),
                               ("stage rank", rank_starts(L, graph(L), "stage"), "stages"),
                               ("job rank", rank_starts(L, graph(L), "job"), "pipeline")):
        seen, edges = walk(g, starts)
        if work is not None:
            seen.add("mm_ds.rank")
            edges = [("mm_ds.rank", s) for s in starts] + edges
        into: dict[str, int] = {}
        for _, d in edges:
            into[d] = into.get(d, 0) + 1
        climbs = [] if work is None else [(a, d) for a, d in edges if L.folder(d) in NOT_ON_A_RANK or d in RECIPE or (
            L.folder(d) != "entry" and L.LAYER[L.folder(d)] > L.LAYER[work])]
        out[name] = {"files": len(seen), "folders": sorted({L.folder(m) for m in seen}), "edges": len(edges),
                     "climbs": climbs, "most": sorted(into.items(), key=lambda kv: (-kv[1], kv[0]))[:4]}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=HERE.parents[1], help="the checkout to walk (default: this one)")
    p.add_argument("--climbs", action="store_true", help="list every climb back up")
    a = p.parse_args(argv)
    for name, r in report(a.root.resolve()).items():
        most = ", ".join(f"{m.removeprefix('mm_ds.')} {n}" for m, n in r["most"])
        print(f"{name:<11} {r['files']:>3} files in {len(r['folders'])} folders ({' '.join(r['folders'])}), "
              f"{r['edges']} import edges, {len(r['climbs'])} climbs back up; entered most: {most}")
        if a.climbs:
            print("\n".join(f"    {x} -> {y}" for x, y in r["climbs"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
