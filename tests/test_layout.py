"""The package's shape: no import cycles (function-level imports and dispatch strings included: a cycle there is
still two modules that cannot be read apart), arrows that never climb back up the folders, nothing that imports
the CLI, no module longer than a reader can hold (400 lines) and no function longer than a screen (60 lines), but
for the named exceptions below, each with its reason."""

import ast
import builtins
import itertools
import re
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mm_ds"
TESTS = PACKAGE.parent / "tests"
MAX_LINES = 400
MAX_FUNCTION_LINES = 60
LONG_MODULES = {
    # module: why it is still longer (each is one subject; the split it awaits is named)
}
"""Modules over MAX_LINES; an entry that fits again is removed (test_the_allow_lists_are_current)."""
LONG_FUNCTIONS = {
    "mm_ds/runtime/training/engine.py:_train": "the one training loop, read top to bottom as nanoGPT's: its pieces "
                                               "are helpers",
}
"""Functions over MAX_FUNCTION_LINES (path:name), with why they read better whole."""

DISPATCH = re.compile(r"mm_ds(\.\w+)+(:\w+)?")
"""A string that is a module's name, or module:function: `importlib.import_module` and the CLI's tables call it."""

# The layers, bottom-up, as the README's code map lists them: a module imports its own layer and those below, never
# one above. "base" is the top-level modules every folder reads (config, coerce, systems, tokens); "entry" the entry
# points (the package's __init__, cli, rank). The last column names arrows that must stay forbidden (the order
# already forbids them; test_the_table_forbids_the_named_arrows keeps it so when the table changes).
LAYERS = (
    # layer              owns                                                     never imports, e.g.
    (("base", "data"),   "configs, the systems table, corpora, the task table",   ()),
    (("model",),         "the MLM, heads, surgery, FLOPs formulas",               ()),
    (("runtime",),       "one stage on many ranks: ROOMS below",                  ("stages", "eval", "report", "pipeline")),
    (("interop",),       "foreign checkpoints in, Hugging Face out",              ()),
    (("stages",),        "one module per training stage",                         ("pipeline",)),
    (("eval",),          "scoring only: Step 4, metrics, the alignment check",    ("report", "pipeline")),
    (("report",),        "records -> tables, curves, figures",                    ("pipeline",)),
    (("pipeline",),      "`mm-ds run`: the recipe, stage runs, check, packing, costs, extend", ("tools",)),
    (("tools",),         "plan, bench, discover, verify: around the pipeline",    ()),
    (("entry",),         "cli, rank: nothing imports them",                       ()),
)
FOLDERS = ("data", "model", "runtime", "interop", "stages", "eval", "report", "pipeline", "tools")
ENTRY = {"mm_ds", "mm_ds.cli", "mm_ds.rank"}
LAYER = {name: i for i, (names, _, _) in enumerate(LAYERS) for name in names}
FORBIDDEN = {(name, above) for names, _, never in LAYERS for name in names for above in never}


ROOMS = ("distributed", "checkpointing", "training")
"""runtime/'s rooms, bottom-up as the layers are: distributed/ (collectives, bring-up, launch, the watchdog, stop, the
shared queue) knows nothing of checkpoints or training; checkpointing/ (DeepSpeed's layout, run directories, sums,
resharding) nothing of training; training/ (the loop, its engine and engine config) reads both."""
BESIDE_THE_ROOMS = {"mm_ds.runtime", "mm_ds.runtime.faults", "mm_ds.runtime.exits"}
"""runtime/'s modules in no room: the test fault points every room calls, and the exit codes every room's errors
end in."""


def folder(module: str) -> str:
    if module in ENTRY:
        return "entry"
    part = module.split(".")[1]
    return part if part in FOLDERS else "base"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """Package modules `path` imports, wherever the import statement is, except under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for n in ast.walk(node)}
    # `[python, "-m", "mm_ds.cli", ...]` starts another process: a command line, not an import
    started = {id(b) for node in ast.walk(tree) if isinstance(node, (ast.List, ast.Tuple))
               for a, b in zip(node.elts, node.elts[1:]) if isinstance(a, ast.Constant) and a.value == "-m"}
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and DISPATCH.fullmatch(node.value) \
                and id(node) not in started:
            found.add(node.value.partition(":")[0])
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    return {m for m in found if m in modules and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {m: imports(p, set(files)) for m, p in files.items()}


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_cycles():  # a test that cannot fail is a defect
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_dispatch_strings_are_imports():
    g = graph()
    assert "mm_ds.eval.transfer" in g["mm_ds.cli"] and "mm_ds.stages.pretrain" in g["mm_ds.stages.resolve"]


def test_nothing_imports_the_cli():
    """The CLI is an entry point: the library never imports it back (mm_ds/rank.py is the CLI run as a script)."""
    assert [m for m, deps in graph().items() if "mm_ds.cli" in deps and m != "mm_ds.rank"] == []


def climbs(module: str, imported: str) -> bool:
    return LAYER[folder(imported)] > LAYER[folder(module)]


def test_arrows_do_not_climb_back_up():
    """runtime never imports stages, eval, report or the pipeline; stages and eval never import the recipe (it is
    the pipeline's); ... (LAYERS)."""
    bad = sorted(f"{m} -> {d}" for m, deps in graph().items() for d in deps if climbs(m, d))
    assert bad == [], "these imports climb back up; move the shared piece down instead:\n" + "\n".join(bad)


def test_the_table_forbids_the_named_arrows():
    assert [(a, b) for a, b in sorted(FORBIDDEN) if not LAYER[b] > LAYER[a]] == []


def test_the_folder_rule_finds_a_climbing_arrow():  # a test that cannot fail is a defect
    assert climbs("mm_ds.stages.adapt", "mm_ds.pipeline.recipe")
    assert climbs("mm_ds.eval.transfer", "mm_ds.pipeline.stage_runs")
    assert climbs("mm_ds.report.analyses", "mm_ds.pipeline.run")
    assert climbs("mm_ds.pipeline.pack", "mm_ds.tools.plan.plan")
    assert climbs("mm_ds.runtime.training.engine", "mm_ds.pipeline.run")
    assert climbs("mm_ds.runtime.training.engine", "mm_ds.stages.adapt")
    assert climbs("mm_ds.pipeline.run", "mm_ds.cli")
    assert not climbs("mm_ds.stages.adapt", "mm_ds.runtime.training.engine")
    assert climbs("mm_ds.eval.transfer", "mm_ds.pipeline.recipe") and climbs("mm_ds.eval.align", "mm_ds.report.report")
    assert not climbs("mm_ds.config", "mm_ds.data.tasks")


def room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if folder(module) == "runtime" and len(parts) > 2 and parts[2] in ROOMS else None


def climbs_a_room(module: str, imported: str) -> bool:
    a, b = room(module), room(imported)
    return a is not None and b is not None and ROOMS.index(b) > ROOMS.index(a)


def test_runtimes_rooms_do_not_climb():
    """distributed/ never imports checkpointing/ or training/; checkpointing/ never imports training/ (ROOMS)."""
    bad = sorted(f"{m} -> {d}" for m, deps in graph().items() for d in deps if climbs_a_room(m, d))
    assert bad == [], "these imports climb to a room above; move the shared piece down instead:\n" + "\n".join(bad)


def test_every_runtime_module_has_a_room():
    homeless = sorted(m for m in graph() if folder(m) == "runtime" and room(m) is None and m not in BESIDE_THE_ROOMS)
    assert homeless == [], f"put these in one of runtime/'s rooms {ROOMS} (or name one in BESIDE_THE_ROOMS): {homeless}"


def test_the_room_rule_finds_a_climbing_arrow():  # a test that cannot fail is a defect
    assert climbs_a_room("mm_ds.runtime.checkpointing.rundir", "mm_ds.runtime.training.engine")
    assert climbs_a_room("mm_ds.runtime.distributed.dist", "mm_ds.runtime.checkpointing.checkpoint")
    assert climbs_a_room("mm_ds.runtime.distributed", "mm_ds.runtime.training.engine")
    assert not climbs_a_room("mm_ds.runtime.training.engine", "mm_ds.runtime.distributed.dist")
    assert not climbs_a_room("mm_ds.runtime.faults", "mm_ds.runtime.distributed.stop")
    assert room("mm_ds.runtime.training") == "training" and room("mm_ds.stages.adapt") is None


def test_relative_imports_resolve_to_package_modules():
    g = graph()
    assert "mm_ds.model.flops" in g["mm_ds.pipeline.costs"] and "mm_ds.pipeline.stage_runs" in g["mm_ds.pipeline.costs"]
    assert "mm_ds.runtime.checkpointing.checkpoint" in g["mm_ds.pipeline.run"]


def long_functions() -> dict[str, int]:
    return {f"{p.relative_to(PACKAGE.parent)}:{n.name}": length for p in PACKAGE.rglob("*.py")
            for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and (length := n.end_lineno - n.lineno + 1) > MAX_FUNCTION_LINES}


def long_modules() -> dict[str, int]:
    return {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}


def test_no_function_is_longer_than_a_screen():
    long = {f: n for f, n in long_functions().items() if f not in LONG_FUNCTIONS}
    assert long == {}, f"split these where a step of their work ends (or name one in LONG_FUNCTIONS, and why): {long}"


def test_no_module_is_longer_than_a_reader_can_hold():
    long = {m: n for m, n in long_modules().items() if m not in LONG_MODULES}
    assert long == {}, f"split these along a seam the reader would recognise (or name one in LONG_MODULES): {long}"


def test_the_allow_lists_are_current():
    """An exception that fits the cap again leaves the list, so the list stays the few that do not."""
    assert sorted(set(LONG_MODULES) - set(long_modules())) == []
    assert sorted(set(LONG_FUNCTIONS) - set(long_functions())) == []


ONE_NAME = ("Report", "fingerprint", "stage_runs", "StageRun")
"""Names that once meant two or three things (a check's findings and the paper's report; a command's, a unit's and
an alignment row's cache key; a recipe's and extend's stage runs): each is defined once in the package, at most."""


def test_one_definition_per_name():
    where: dict[str, list[str]] = {}
    for p in PACKAGE.rglob("*.py"):
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in ONE_NAME:
                where.setdefault(node.name, []).append(module_name(p))
    assert {n: ms for n, ms in where.items() if len(ms) > 1} == {}


DEEPSPEED_FILES = re.compile(r"mp_rank_|zero_pp_rank|optim_states|model_states|latest_universal|global_step"
                             r"|[\"']latest[\"']")
"""The names of DeepSpeed's checkpoint files and pointers (`mp_rank_00_model_states.pt`, `*_optim_states.pt`, the
`latest` and `latest_universal` pointers, `global_step*` tags)."""
LAYOUT_OWNER = PACKAGE / "runtime" / "checkpointing" / "checkpoint.py"


def names_deepspeed_files(text: str) -> list[str]:
    return sorted({m.group(0) for m in DEEPSPEED_FILES.finditer(text)})


def test_only_the_checkpoint_module_knows_deepspeeds_layout():
    """A module that needs something from an engine checkpoint asks mm_ds/runtime/checkpointing/checkpoint.py for it:
    one module changes when DeepSpeed's layout does."""
    bad = {str(p.relative_to(PACKAGE.parent)): found for p in sorted(PACKAGE.rglob("*.py"))
           if p != LAYOUT_OWNER and (found := names_deepspeed_files(p.read_text()))}
    assert bad == {}, f"these name DeepSpeed's checkpoint files; add a function to {LAYOUT_OWNER.name} instead: {bad}"


def test_the_layout_scan_finds_deepspeeds_file_names():  # a test that cannot fail is a defect
    assert names_deepspeed_files('torch.load(d / "mp_rank_00_model_states.pt")') == ["model_states", "mp_rank_"]
    assert names_deepspeed_files("(ckpt / 'latest').read_text()") == ["'latest'"]
    assert names_deepspeed_files("glob('bf16_zero_pp_rank_*_optim_states.pt')") == ["optim_states", "zero_pp_rank"]
    assert names_deepspeed_files("latest_tag(run_dir); checkpoint.LATEST") == []
    assert names_deepspeed_files(LAYOUT_OWNER.read_text())


RUN_TREE_NAMES = ("checkpoints", "final", "frozen", "logs", "train.jsonl", "run_config.yaml", "ds_config.json",
                  "resolved.json")
"""The names of a run directory's parts (and of `mm-ds run`'s OUT/logs/), spelt out in
mm_ds/runtime/checkpointing/rundir.py only: everyone else asks it (`logs_dir`, `train_log`, `checkpoints_dir`, FINAL, ...)."""
RUN_TREE_OWNER = PACKAGE / "runtime" / "checkpointing" / "rundir.py"
META_KEYS = {"frozen"}
"""Names that are also checkpoint meta keys (mm_ds.json's "frozen": the frozen weights' path), as dict keys."""


def run_tree_literals(path: Path) -> list[str]:
    """`path`'s string constants that name a part of a run directory (a meta key used as one, `meta["frozen"]`, is
    not a path)."""
    tree = ast.parse(path.read_text())
    keys = {id(n.slice) for n in ast.walk(tree) if isinstance(n, ast.Subscript)} | {
        id(k) for n in ast.walk(tree) if isinstance(n, ast.Dict) for k in n.keys if k is not None} | {
        id(n.args[0]) for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
        and n.func.attr == "get" and n.args}
    return sorted(f"{n.lineno}: {n.value!r}" for n in ast.walk(tree) if isinstance(n, ast.Constant)
                  and n.value in RUN_TREE_NAMES and not (n.value in META_KEYS and id(n) in keys))


def test_only_the_run_directory_module_names_a_run_directorys_parts():
    bad = {str(p.relative_to(PACKAGE.parent)): found for p in sorted(PACKAGE.rglob("*.py"))
           if p != RUN_TREE_OWNER and (found := run_tree_literals(p))}
    assert bad == {}, f"these spell out a run directory's parts; ask {RUN_TREE_OWNER.name} instead: {bad}"


def test_the_run_tree_scan_finds_a_spelt_out_part(tmp_path):  # a test that cannot fail is a defect
    (tmp_path / "m.py").write_text('log = run / "logs" / "train.jsonl"\nmeta.get("frozen")\nx = f"{out / \'final\'}"\n')
    assert run_tree_literals(tmp_path / "m.py") == ["1: 'logs'", "1: 'train.jsonl'", "3: 'final'"]
    assert run_tree_literals(RUN_TREE_OWNER)


def hidden_imports(path: Path) -> list[str]:
    """`path`'s imports of the package made inside a function with no comment on their lines: an import there hides
    an arrow from a reader of the module's head, so it says why it is there (a cost deferred, a path set first)."""
    source = path.read_text()
    lines, tree = source.splitlines(), ast.parse(source)
    found = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for n in ast.walk(fn):
                ours = isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("mm_ds")) or \
                    isinstance(n, ast.Import) and any(a.name.startswith("mm_ds") for a in n.names)
                if ours and "#" not in " ".join(lines[n.lineno - 1:n.end_lineno]):
                    found.append(f"{n.lineno}: {lines[n.lineno - 1].strip()}")
    return found


def test_package_imports_sit_at_the_top_or_say_why_not():
    bad = {str(p.relative_to(PACKAGE.parent)): found for p in sorted(PACKAGE.rglob("*.py"))
           if (found := hidden_imports(p))}
    assert bad == {}, f"move these to the module's head, or give the reason in a comment on the line: {bad}"


def test_the_import_scan_finds_a_hidden_import(tmp_path):  # a test that cannot fail is a defect
    (tmp_path / "m.py").write_text("import json\n\ndef f():\n    from .x import y\n    from mm_ds import z  # why\n"
                                   "    import torch\n    return y\n")
    assert hidden_imports(tmp_path / "m.py") == ["4: from .x import y"]


def unbound_names(source: str) -> list[str]:
    """Names `source` reads that nothing in it binds (an import, a definition, an assignment, a parameter) and that
    are not builtins: a NameError waiting for its line to run. Scopes are not told apart, so it finds the name that
    is bound nowhere, e.g. an import moved away from the one function that used it, or a rename that missed an
    f-string."""
    tree = ast.parse(source)
    bound = set(dir(builtins)) | {"__file__", "__name__", "__doc__", "__spec__"}
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            bound.add(n.id)
        elif isinstance(n, ast.arg):
            bound.add(n.arg)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            bound.add(n.name)
    return sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - bound)


def test_every_name_a_module_reads_is_bound_in_it():
    bad = {str(p.relative_to(PACKAGE.parent)): found for p in sorted(PACKAGE.rglob("*.py"))
           if (found := unbound_names(p.read_text()))}
    assert bad == {}, f"these names are read but never imported or defined: {bad}"


def test_the_name_scan_finds_an_unbound_name():  # a test that cannot fail is a defect
    source = "import json\n\ndef f(x):\n    y = json.dumps(x)\n    return f'{report.format()}' + torch.tensor(y)\n"
    assert unbound_names(source) == ["report", "torch"]


SORTED_SECTIONS = ("__future__", "standard library", "third party", "mm-ds", "relative")
"""The order of a module's leading imports, as isort and ruff's I001 sort them (this package and the tests' own
modules first-party): by section, `import x` before `from x import ...`, then by name."""


def import_key(node: ast.stmt, first_party: set[str]) -> tuple:
    if isinstance(node, ast.ImportFrom) and node.level:
        return 4, -node.level, (node.module or "").lower()
    name = node.names[0].name if isinstance(node, ast.Import) else node.module
    top = name.partition(".")[0]
    section = 0 if top == "__future__" else 1 if top in sys.stdlib_module_names else 3 if top in first_party else 2
    return section, isinstance(node, ast.ImportFrom), name.lower()


def unsorted_imports(source: str, first_party: set[str]) -> list[str]:
    """The leading imports (the block after the docstring) out of SORTED_SECTIONS' order, as `a, then b`."""
    body = ast.parse(source).body
    body = body[1:] if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else body
    block = list(itertools.takewhile(lambda n: isinstance(n, (ast.Import, ast.ImportFrom)), body))
    keys = [import_key(n, first_party) for n in block]
    return [f"{ast.unparse(a)!r}, then {ast.unparse(b)!r}" for (ka, a), (kb, b) in
            itertools.pairwise(zip(keys, block)) if kb < ka]


def test_imports_are_sorted():
    """Imports at the top, sorted: `ruff check --select I --fix --line-length 120` with mm_ds and the tests' own
    modules as known first-party sorts a file that fails here (then rejoin its import lists as the code writes them)."""
    first_party = {"mm_ds", *(p.stem for p in TESTS.rglob("*.py")), *(p.name for p in TESTS.iterdir() if p.is_dir())}
    found = {str(p.relative_to(PACKAGE.parent)): bad for p in sorted([*PACKAGE.rglob("*.py"), *TESTS.rglob("*.py")])
             if (bad := unsorted_imports(p.read_text(), first_party))}
    assert found == {}


def test_the_import_order_scan_finds_an_unsorted_block():  # a test that cannot fail is a defect
    source = '"""doc"""\nfrom __future__ import annotations\n\nimport os\nimport sys\nfrom pathlib import Path\n\n' \
             'import torch\n\nfrom mm_ds.config import A\n\nfrom ..x import y\nfrom . import z\n'
    assert unsorted_imports(source, {"mm_ds"}) == []
    assert unsorted_imports(source.replace("import os\nimport sys", "import sys\nimport os"), {"mm_ds"}) == \
        ["'import sys', then 'import os'"]
    assert len(unsorted_imports("from mm_ds import a\nimport torch\n", {"mm_ds"})) == 1
    assert len(unsorted_imports("from . import a\nfrom .. import b\n", {"mm_ds"})) == 1
