"""The environment guard (mm_ds/runtime/distributed/environment.py). A launcher hands a remote node's ranks only part of
the launching shell's environment, so a rank that decides a collective from a variable that did not reach every rank
calls other collectives than its peers and the run hangs (MM_DS_VALIDATED under mpirun did, before the ranks read a
resolved run directory instead). These tests scan the
package: every variable it reads is in the table (mm_ds/runtime/faults.py's test fault points are the user's, as a
whole), and none that may differ between ranks is read in a function that calls a collective, except as rank
0's value handed to `dist.broadcast_object`. The check looks at the function that reads a variable: a helper
that returns one to a caller that decides collectively must be called as broadcast_object's argument there."""

import ast
from pathlib import Path

from mm_ds.runtime.distributed import dist
from mm_ds.runtime.distributed.environment import FAULT_POINTS, VARIABLES

PACKAGE = Path(dist.__file__).resolve().parents[2]  # mm_ds/
ENV_MAPS = {"os.environ", "environ", "env"}  # `env` is os.environ (or a copy of it) wherever the package uses it
# Calls that are (or contain) collectives: a rank that skips one of them while its peers call it hangs them.
COLLECTIVES = {"barrier", "all_reduce", "any_rank", "broadcast_object", "run_stage", "build_engine", "load_into_engine",
               "dist.init", "dist.finish", "init_process_group", "deepspeed.init_distributed", "deepspeed.initialize",
               "engine.train", "ckpt_io.save", "checkpoint.save", "universal.prepare"}


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _strings(node: ast.AST | None) -> list[str] | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List)):
        out = [_strings(e) for e in node.elts]
        return None if any(o is None for o in out) else [s for o in out for s in o]
    return None


def constants() -> dict[str, list[str]]:
    """Module-level NAME = "X" / ("X", "Y") of the whole package (VALIDATED, SRUN_STEP_VARS, ...)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                if (values := _strings(node.value)) is not None:
                    found[node.targets[0].id] = values
    return found


def reads(path: Path, consts: dict[str, list[str]]) -> list[dict]:
    """Every read of a named environment variable in `path`: names, line, enclosing function, whether it is
    inside a `broadcast_object(...)` call, whether it is a bare `setdefault` statement (a default handed to a
    library, no decision of ours)."""
    tree = ast.parse(path.read_text(), str(path))
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def ancestors(node):
        while node in parent:
            node = parent[node]
            yield node

    def resolve(arg: ast.AST, at: ast.AST) -> list[str] | None:
        if (values := _strings(arg)) is not None:
            return values
        if isinstance(arg, ast.Name):
            if arg.id in consts:
                return consts[arg.id]
            for a in ancestors(at):  # a loop or comprehension variable over a tuple of names
                gens = a.generators if isinstance(a, (ast.GeneratorExp, ast.ListComp, ast.SetComp)) else \
                    [a] if isinstance(a, ast.For) else []
                for g in gens:
                    if isinstance(g.target, ast.Name) and g.target.id == arg.id:
                        return _strings(g.iter) or (consts.get(g.iter.id) if isinstance(g.iter, ast.Name) else None)
                params = [x.arg for x in a.args.args] if isinstance(a, ast.FunctionDef) else []
                if arg.id in params:  # a function's parameter: the names its callers in this module pass
                    i, values = params.index(arg.id), []
                    for call in ast.walk(tree):
                        if isinstance(call, ast.Call) and _dotted(call.func) == a.name:
                            v = _strings(call.args[i]) if len(call.args) > i else None
                            if v is None:
                                return None
                            values += v
                    return values or None
        return None

    found = []
    for node in ast.walk(tree):
        arg = None
        bare_default = False
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if _dotted(node.func.value) in ENV_MAPS and node.func.attr in ("get", "setdefault", "pop"):
                arg = node.args[0]
                bare_default = node.func.attr == "setdefault" and isinstance(parent.get(node), ast.Expr)
            elif _dotted(node.func) == "os.getenv":
                arg = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _dotted(node.value) in ENV_MAPS:
            arg = node.slice
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)) \
                and _dotted(node.comparators[0]) in ENV_MAPS:
            arg = node.left
        if arg is None:
            continue
        func = next((a for a in ancestors(node) if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
        broadcast = any(isinstance(a, ast.Call) and _dotted(a.func).split(".")[-1] == "broadcast_object"
                        for a in ancestors(node))
        found.append({"names": resolve(arg, node), "line": node.lineno, "func": func, "broadcast": broadcast,
                      "bare_default": bare_default, "text": ast.unparse(node)})
    return found


def calls_collective(func: ast.AST) -> list[str]:
    return sorted({_dotted(n.func) for n in ast.walk(func) if isinstance(n, ast.Call)
                   and (_dotted(n.func) in COLLECTIVES or _dotted(n.func).split(".")[-1] in COLLECTIVES
                        and _dotted(n.func).startswith(("dist.", "torch.distributed.")))})


def scan() -> tuple[dict[str, list[str]], list[str], list[str]]:
    """(variable -> where it is read, unresolved reads, reads that may decide a collective)."""
    consts, read, unresolved, deciding = constants(), {}, [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE.parent)
        for r in reads(path, consts):
            if r["names"] is None:
                unresolved.append(f"{where}:{r['line']}: {r['text']}")
                continue
            for name in r["names"]:
                row = FAULT_POINTS if path.name == "faults.py" and name not in VARIABLES else VARIABLES.get(name)
                if row is not FAULT_POINTS:
                    read.setdefault(name, []).append(f"{where}:{r['line']}")
                if row is None or row.reaches_every_rank or r["broadcast"] or r["bare_default"] or r["func"] is None:
                    continue
                if collectives := calls_collective(r["func"]):
                    deciding.append(f"{where}:{r['line']}: {name} ({row.set_by}) read in {r['func'].name}(), "
                                    f"which calls {', '.join(collectives)}")
    return read, unresolved, deciding


def test_every_variable_the_package_reads_is_in_the_table():
    read, unresolved, _ = scan()
    assert not unresolved, ("environment reads whose variable the scan cannot name (use a literal or a module "
                            "constant): " + "; ".join(unresolved))
    missing = {n: w for n, w in read.items() if n not in VARIABLES}
    assert not missing, f"read but not in mm_ds/runtime/distributed/environment.py VARIABLES (who sets it? does it reach every rank?): {missing}"
    stale = sorted(set(VARIABLES) - set(read))
    assert not stale, f"in mm_ds/runtime/distributed/environment.py but read nowhere: {stale}"


def test_no_variable_that_may_differ_between_ranks_decides_a_collective():
    _, _, deciding = scan()
    assert not deciding, ("a variable that may not reach every rank is read where collectives are called: decide "
                          "on rank 0 and broadcast it (dist.broadcast_object): " + "; ".join(deciding))


def test_the_scan_finds_what_it_forbids(tmp_path, monkeypatch):
    """The guard itself: main once read MM_DS_VALIDATED (a fingerprint set by the launching side, since replaced by
    the resolved run directory) in run_stage, then entered a barrier or not; here the same shape with another
    variable the mm-ds process sets."""
    pkg = tmp_path / "mm_ds"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        'import os\nVALIDATED = "MM_DS_LAUNCH_ROOT"\n\n'
        'def run_stage(dist):\n    if os.environ.get(VALIDATED) != "x":\n        dist.barrier()\n\n'
        'def fixed(dist):\n    if not dist.broadcast_object(os.environ.get(VALIDATED) if dist.rank() == 0 else None):\n'
        '        dist.barrier()\n\n'
        'def threads(env):\n    return env.get("OMP_NUM_THREADS")\n\n'
        'def loop():\n    return [os.environ[v] for v in ("RANK", "WORLD_SIZE")]\n\n'
        'def unnamed(k):\n    return os.environ.get(k)\n\n'
        'def passed():\n    def number(var):\n        return os.environ[var]\n    return number("MM_DS_NAN_AT")\n')
    monkeypatch.setattr(__import__(__name__), "PACKAGE", pkg)
    read, unresolved, deciding = scan()
    assert set(read) == {"MM_DS_LAUNCH_ROOT", "OMP_NUM_THREADS", "RANK", "WORLD_SIZE", "MM_DS_NAN_AT"}
    assert len(read["MM_DS_LAUNCH_ROOT"]) == 2 and len(unresolved) == 1 and "os.environ.get(k)" in unresolved[0]
    assert len(deciding) == 1 and "run_stage()" in deciding[0] and "dist.barrier" in deciding[0], deciding
