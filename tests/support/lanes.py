"""The fast lane: `make test-fast` runs every test but those marked `ranks` (they start ranks or a pipeline, seconds
to minutes each) or `engine` (they build a DeepSpeed engine or compile a model in the test's own process, seconds
each). The marks are kept honest here: an unmarked test that starts a launcher, a rank or a launching `mm-ds` command,
or calls `deepspeed.initialize`, fails at once, naming what it did, instead of slowing the fast lane down unnoticed.
(`torch.compile` is to be guarded the same way once tests/test_compile.py's in-process compiles carry `engine`.)
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from mm_ds.stages.resolve import STAGES

MARKS = ("ranks", "rehearsal", "gpu")
"""Tests with one of these marks may start ranks (the last two are kept out of `make test-fast` too)."""
IN_PROCESS_MARKS = ("engine", *MARKS)
"""Tests with one of these marks may build an engine or compile a model in their own process."""
LAUNCHERS = {"deepspeed", "mpirun", "mpiexec", "srun", "sbatch", "torchrun", "pdsh", "rank.py"}
"""Programs whose start is a rank's, or a launch of ranks."""
LAUNCHING = {"run", "run-job", "extend", "probe", "bench", *STAGES}
"""`mm-ds` commands that train or launch (a stage command trains in the process it starts, or launches ranks)."""
NOT_LAUNCHING = {"--check", "--dry-run", "--list-stage-runs", "-h", "--help"}
"""Options with which those commands stop before anything starts."""
RANK_ENV = {"RANK", "WORLD_SIZE"}
"""A process given both in its environment (as a launcher gives them to its ranks) is a rank, whatever it runs: tests
start ranks by hand (tests/compile_ranks.py, tests/support/host_reads.py, tests/support/comm_record.py, a `python -c`
rank), with no launcher to see. Only an environment given to the process counts: one inherited from a test that stands
in a rank's variables in its own process (tests/test_bringup.py) starts no rank."""


def starts_ranks(argv, env=None) -> str | None:
    """What `argv` (a process's command line) with `env` (the environment given to it; None: inherited) starts that
    makes a test a `ranks` one, or None."""
    if env is not None and RANK_ENV <= set(env):
        return "a rank (RANK and WORLD_SIZE in its environment)"
    args = shlex.split(argv) if isinstance(argv, str) else [str(a) for a in argv]
    for i, a in enumerate(args):
        name = Path(a).name
        if name in LAUNCHERS or Path(a).parent.name == "launchers":
            return name if name in LAUNCHERS else f"launchers/{name}"
        if (a == "mm_ds.cli" or name == "mm-ds") and i + 1 < len(args) and args[i + 1] in LAUNCHING \
                and not NOT_LAUNCHING & set(args):
            return f"mm-ds {args[i + 1]}"
    return None


_running: list = []
"""The test being set up, run or torn down (module fixtures start within the first test that uses them)."""
_popen_init = subprocess.Popen.__init__


def _guarded_init(self, args, *rest, **kwargs):
    item = _running[-1] if _running else None
    env = kwargs.get("env", rest[9] if len(rest) > 9 else None)  # Popen's 11th parameter
    if item is not None and not any(item.get_closest_marker(m) for m in MARKS) and (what := starts_ranks(args, env)):
        pytest.fail(f"{item.nodeid} starts {what} but is not marked: add @pytest.mark.ranks (make test-fast leaves "
                    f"such tests out)", pytrace=False)
    _popen_init(self, args, *rest, **kwargs)


def _in_process(what: str, original):
    """`original` (deepspeed.initialize; dynamo's compile-start callback), failing an unmarked test that calls it."""
    def guarded(*args, **kwargs):
        item = _running[-1] if _running else None
        if item is not None and not any(item.get_closest_marker(m) for m in IN_PROCESS_MARKS):
            pytest.fail(f"{item.nodeid} {what} in its own process but is not marked: add @pytest.mark.engine "
                        f"(make test-fast leaves such tests out)", pytrace=False)
        return original(*args, **kwargs)
    guarded.guarded = original
    return guarded


def _guard_in_process() -> None:
    """Looked up at call time (`deepspeed.initialize(...)` in runtime/training/engine.py), so replacing the module
    attribute sees every call. Done before the first test rather than at configure: the process that only hands tests
    to xdist's workers need not import DeepSpeed."""
    import deepspeed
    from torch._dynamo.callback import callback_handler

    if not hasattr(deepspeed.initialize, "guarded"):
        deepspeed.initialize = _in_process("builds a DeepSpeed engine (deepspeed.initialize)", deepspeed.initialize)
        # A compile is seen where dynamo starts one (torch.compile itself only wraps: compiling is lazy). Failed is a
        # BaseException: it leaves through dynamo's error handling to the test.
        callback_handler.register_start_callback(_in_process("compiles a model (torch.compile)", lambda *a: None))


def guard() -> None:
    """From conftest's pytest_configure: every process a test starts passes `starts_ranks`."""
    subprocess.Popen.__init__ = _guarded_init


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _guard_in_process()
    _running.append(item)
    try:
        yield
    finally:
        _running.pop()
