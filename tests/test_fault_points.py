"""Fault injection stays out of the product: mm_ds/runtime/faults.py is the one module that names the MM_DS_* test
variables, it imports nothing from the package at load (no cycle), and its points parse and fire as documented."""

import ast
from pathlib import Path

import pytest
import torch

from mm_ds.runtime import faults

PACKAGE = Path(faults.__file__).resolve().parents[1]  # mm_ds/
PRODUCT_SETTINGS = {"MM_DS_LAUNCH_ROOT", "MM_DS_MALLOC", "MM_DS_MASTER_ADDR"}
"""MM_DS_* variables that configure the product itself (mm_ds/runtime/distributed/watchdog.py,
mm_ds/runtime/distributed/dist.py; mm_ds/runtime/distributed/bringup.py: the master address mm-ds chose, which srun's
ranks prefer to an inherited MASTER_ADDR), not a test."""


def env_names(path: Path) -> list[str]:
    """Every MM_DS_* name a module spells out but the product settings: reading it (os.environ, os.getenv,
    `in os.environ`) or keeping it in a constant needs the string."""
    return sorted({node.value for node in ast.walk(ast.parse(path.read_text(), str(path)))
                   if isinstance(node, ast.Constant) and isinstance(node.value, str)
                   and node.value.startswith("MM_DS_") and node.value.isidentifier()
                   and node.value not in PRODUCT_SETTINGS})


def test_only_the_fault_module_names_test_variables():
    bad = [f"{p.relative_to(PACKAGE.parent)}: {n}" for p in sorted(PACKAGE.rglob("*.py"))
           if p != PACKAGE / "runtime" / "faults.py" for n in env_names(p)]
    assert not bad, ("test variables read outside mm_ds/runtime/faults.py (add a named fault point there and call it; a "
                     "variable that configures the product belongs in PRODUCT_SETTINGS above): " + "; ".join(bad))


def test_the_scan_finds_what_it_forbids(tmp_path):
    f = tmp_path / "m.py"
    for src in ('import os\nos.environ.get("MM_DS_NAN_AT")\n',
                'import os\nos.getenv("MM_DS_KILL_AT", "")\n',
                'import os\nx = os.environ["MM_DS_DUMP_RESUMED"]\n',
                'import os\nif "MM_DS_KILL_STAGE" in os.environ: pass\n',
                'VAR = "MM_DS_KILL_IN_SAVE"\n'):
        f.write_text(src)
        assert env_names(f), src
    f.write_text('"""Set MM_DS_MALLOC=system to opt out."""\nimport os\nos.environ.get("MM_DS_MALLOC")\n')
    assert not env_names(f)


def test_the_fault_module_imports_nothing_from_the_package_at_load():
    tree = ast.parse((PACKAGE / "runtime" / "faults.py").read_text())
    package = [ast.unparse(n) for n in tree.body if isinstance(n, ast.ImportFrom) and (n.level or n.module == "mm_ds")
               or isinstance(n, ast.Import) and any(a.name.startswith("mm_ds") for a in n.names)]
    assert not package, f"mm_ds/runtime/faults.py imports the package at load (an import cycle waits): {package}"


def test_points_parse_once_and_name_a_bad_value():
    assert not faults.read({}) and not faults.read({"MM_DS_KILL_STAGE": "adapt"})  # a filter arms nothing
    assert faults.read({"MM_DS_KILL_AT": "6"}).kill_at == (6, 0)
    assert faults.read({"MM_DS_KILL_AT": "3:launcher"}).kill_at == (3, "launcher")
    assert faults.read({"MM_DS_KILL_IN_SAVE": "4"}).kill_in_save == (4, 0, faults.SAVE_PHASES[0])
    assert faults.read({"MM_DS_KILL_IN_SAVE": "8:1:before-latest"}).kill_in_save == (8, 1, "before-latest")
    assert faults.read({"MM_DS_NAN_AT": "3,4::loss_main"}).nan_at == (frozenset({3, 4}), None, "loss_main")
    with pytest.raises(ValueError, match="MM_DS_KILL_IN_SAVE='4:0:halfway': phase 'halfway' is not one of"):
        faults.read({"MM_DS_KILL_IN_SAVE": "4:0:halfway"})
    with pytest.raises(ValueError, match="MM_DS_KILL_AT='six': 'six' is not a number"):
        faults.read({"MM_DS_KILL_AT": "six"})


def test_poison_touches_only_the_armed_step_rank_and_head(monkeypatch):
    out = {"loss": torch.tensor(1.0), "loss_secondary": torch.tensor(2.0), "loss_main": torch.tensor(3.0)}
    monkeypatch.setattr(faults, "POINTS", faults.read({}))
    assert faults.poison(out, 4, 0) is out  # inert: the outputs themselves, untouched
    monkeypatch.setattr(faults, "POINTS", faults.read({"MM_DS_NAN_AT": "4:1:loss_secondary"}))
    assert faults.poison(out, 3, 1) is out and faults.poison(out, 4, 0) is out
    hit = faults.poison(out, 4, 1)
    assert hit["loss"].isnan() and hit["loss_secondary"].isnan() and hit["loss_main"] == 3.0 and out["loss"] == 1.0
