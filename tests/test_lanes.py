"""The fast lane's marks are kept honest (tests/support/lanes.py): what counts as starting ranks, and an unmarked test
that starts them, builds a DeepSpeed engine or compiles a model fails before it does."""

import ast
import os
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
    rank = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    started = "a rank (RANK and WORLD_SIZE in its environment)"
    assert starts_ranks([sys.executable, "tests/compile_ranks.py", "CORPUS", "WORK", "plan.json"], rank) == started
    assert starts_ranks([sys.executable, "-c", "import mm_ds.runtime.distributed.dist"], rank) == started  # whatever it runs
    assert starts_ranks([sys.executable, "tests/compile_ranks.py"], {"PATH": "/usr/bin", "WORLD_SIZE": "2"}) is None
    assert starts_ranks([sys.executable, "-c", "pass"]) is None  # inherited: a test standing in a rank's variables


def test_an_unmarked_test_that_starts_ranks_fails_before_they_start():  # a test that cannot fail is a defect
    with pytest.raises(pytest.fail.Exception, match="starts deepspeed but is not marked"):
        subprocess.run(["deepspeed", "--num_gpus", "2", "no-such-script.py"])
    with pytest.raises(pytest.fail.Exception, match="starts a rank .RANK and WORLD_SIZE in its environment. but is not"):
        subprocess.run([sys.executable, "-c", "pass"], env=os.environ | {"RANK": "0", "WORLD_SIZE": "1"})
    assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0


def test_an_unmarked_test_that_builds_an_engine_fails_before_it_does():
    import deepspeed
    import torch

    with pytest.raises(pytest.fail.Exception, match="builds a DeepSpeed engine .deepspeed.initialize. in its own "
                                                    "process but is not marked: add @pytest.mark.engine"):
        deepspeed.initialize(model=torch.nn.Linear(2, 2), config={"train_batch_size": 1})


def test_an_unmarked_test_that_compiles_fails_when_dynamo_starts():
    import torch

    double = torch.compile(lambda x: 2 * x, backend="eager")  # compiling is lazy: nothing yet
    with pytest.raises(pytest.fail.Exception, match=r"compiles a model .torch.compile. in its own process but is not "
                                                    r"marked: add @pytest.mark.engine"):
        double(torch.ones(2))


def port_helpers(source: str) -> list[str]:
    """Functions of a test file that pick a free port themselves (runtime/distributed/dist.py's free_port is the one
    helper): one named so, or one that returns a socket's port (`return s.getsockname()[1]`). A test that holds a port
    busy (a socket bound for the test's length) returns none."""
    named = re.findall(r"^\s*def (_?free_port)\(", source, flags=re.M)
    return named + [f.name for f in ast.walk(ast.parse(source)) if isinstance(f, ast.FunctionDef)
                    and f.name not in named and any(isinstance(r, ast.Return) and "getsockname()[1]" in ast.unparse(r)
                                                    for r in ast.walk(f))]


def test_ports_come_from_one_helper():
    assert port_helpers("def _free_port() -> int:\n    ...\n") == ["_free_port"]  # the scan finds one
    assert port_helpers("def port():\n    with socket.socket() as s:\n        s.bind(('', 0))\n"
                        "        return s.getsockname()[1]\n") == ["port"]  # and one named otherwise
    assert port_helpers("def test_busy():\n    with socket.socket() as s:\n        port = s.getsockname()[1]\n") == []
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
