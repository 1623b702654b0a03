"""The fast lane's mark is kept honest (tests/support/lanes.py): what counts as starting ranks, and an unmarked test
that starts them fails before anything runs."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.lanes import starts_ranks


def test_what_starts_ranks():
    assert starts_ranks(["/venv/bin/deepspeed", "--num_gpus", "2", "mm_ds/rank.py", "RUN"]) == "deepspeed"
    assert starts_ranks([sys.executable, "-u", "/src/mm_ds/rank.py", "run-job", "job.json"]) == "rank.py"
    assert starts_ranks(["bash", "launchers/mpirun.sh", "pretrain"]) == "launchers/mpirun.sh"
    assert starts_ranks([sys.executable, "-m", "mm_ds.cli", "run", "tiny", "--out", "x"]) == "mm-ds run"
    assert starts_ranks("mm-ds adapt --preset tiny/adapt --out x") == "mm-ds adapt"
    assert starts_ranks([sys.executable, "-m", "mm_ds.cli", "run", "tiny", "--check"]) is None
    assert starts_ranks([sys.executable, "-m", "mm_ds.cli", "prepare", "--lang", "en"]) is None
    assert starts_ranks(["git", "status"]) is None


def test_an_unmarked_test_that_starts_ranks_fails_before_they_start():  # a test that cannot fail is a defect
    with pytest.raises(pytest.fail.Exception, match="starts deepspeed but is not marked"):
        subprocess.run(["deepspeed", "--num_gpus", "2", "no-such-script.py"])
    assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0


def port_helpers(source: str) -> list[str]:
    """Functions of a test file that pick a free port themselves (mm_ds.runtime.distributed.dist.free_port is the one helper)."""
    return re.findall(r"^\s*def (_?free_port)\(", source, flags=re.M)


def test_ports_come_from_one_helper():
    assert port_helpers("def _free_port() -> int:\n    ...\n") == ["_free_port"]  # the scan finds one
    tests = Path(__file__).parent
    assert {p.name: found for p in sorted(tests.rglob("*.py")) if p.name != "test_lanes.py"
            and (found := port_helpers(p.read_text()))} == {}


def fixed_ports(source: str) -> list[int]:
    """Master ports a test file's recipes fix (`"master_port": 29710`): two runs on one machine (another test file's
    worker, a helper's recipe run) then meet at one port, and the later one fails to listen."""
    return [v.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Dict)
            for k, v in zip(n.keys, n.values) if isinstance(k, ast.Constant) and k.value == "master_port"
            and isinstance(v, ast.Constant)]


def test_recipes_take_a_free_port():
    assert fixed_ports('RECIPE = {"launch": {"ranks": 2, "master_port": 29710}}') == [29710]  # the scan finds one
    assert fixed_ports('{"launch": {"master_port": free_port()}}') == []
    tests = Path(__file__).parent
    assert {p.name: found for p in sorted(tests.rglob("*.py")) if (found := fixed_ports(p.read_text()))} == {}
