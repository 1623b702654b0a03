"""DeepSpeed's runner (deepspeed/launcher/runner.py `main`, 0.19.8) run on a command line mm-ds produces, up to the
process it would start, which is recorded instead: the command and environment of pdsh, mpirun or srun (or of
DeepSpeed's per-node launcher, for a one-node or `--no_ssh` start), exactly as DeepSpeed builds them. For tests that
assert on those commands, and for those that run them (with stand-ins for pdsh, ssh, mpirun and srun).

    started = runner_command(launch.command(cfg, argv), launch.launch_env(cfg))
    started.cmd, started.env   # what `deepspeed` would run, in which environment

Nothing runs: DeepSpeed's ssh check (`ssh HOST hostname`) is recorded in `ssh_checks`; asking a host for
`hostname -I` (what it does without --master_addr) fails the call; each runner's `backend_exists` says yes (whether
the executables are here is mm-ds's check, mm_ds/runtime/distributed/runners.py check_tools); its signal handlers are
not set. The runner reads the environment file named by `env`'s DS_ENV_FILE, as a runner started in `env` would.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
from dataclasses import dataclass, field
from unittest import mock

from deepspeed.launcher import runner as ds  # at import: its logger keeps the stdout it finds (not a test's capture)


@dataclass
class Started:
    cmd: list[str]
    env: dict[str, str]
    ssh_checks: list[list[str]] = field(default_factory=list)

    def world_info(self) -> dict[str, list[int]]:
        """The hosts and slots DeepSpeed's per-node launcher is given (pdsh, one-node and --no_ssh starts)."""
        arg = next(a for a in self.cmd if a.startswith("--world_info="))
        return json.loads(base64.urlsafe_b64decode(arg.split("=", 1)[1]))


def runner_command(cmd: list[str], env: dict[str, str]) -> Started:
    """What DeepSpeed's runner would start for `cmd` (mm-ds's `deepspeed ...` command) in environment `env`."""
    assert os.path.basename(cmd[0]) == "deepspeed", cmd
    started: list[Started] = []
    ssh_checks: list[list[str]] = []

    class Process:  # subprocess.Popen as runner.main uses it
        returncode = 0

        def __init__(self, argv, env=None, **_):
            started.append(Started(list(argv), dict(env or {}), ssh_checks))

        def wait(self):
            return 0

        def send_signal(self, _):
            pass

    def hostname_i(argv, **_):
        raise AssertionError(f"DeepSpeed asks a host for its address over ssh ({' '.join(argv)}): no --master_addr")

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.dict(os.environ, env, clear=True))
        stack.enter_context(mock.patch.object(ds.subprocess, "Popen", Process))
        stack.enter_context(mock.patch.object(ds.subprocess, "check_call", lambda argv, **_: ssh_checks.append(argv)))
        stack.enter_context(mock.patch.object(ds.subprocess, "check_output", hostname_i))
        stack.enter_context(mock.patch.object(ds.signal, "signal", lambda *_: None))
        # read when deepspeed starts, from its environment
        stack.enter_context(mock.patch.object(ds, "DEEPSPEED_ENVIRONMENT_NAME", env.get("DS_ENV_FILE", ".deepspeed_env")))
        for cls in ds.LAUNCHER_CLASSES.values():
            stack.enter_context(mock.patch.object(cls, "backend_exists", lambda self: True))
        ds.main(cmd[1:])
    assert len(started) == 1, started
    return started[0]
