"""Starting ranks: `mm-ds <stage>` re-executes itself under a launcher when it is not already under one.

Under `deepspeed`, `mpirun`, or `srun` the environment already names the rank, and the stage runs
directly. Otherwise `launch.ranks` local processes are started with `launch.launcher`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from .config import ConfigError, LaunchConfig

RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def under_launcher() -> bool:
    return any(v in os.environ for v in RANK_VARS)


def _bin(name: str) -> str:
    here = os.path.join(os.path.dirname(sys.executable), name)
    found = here if os.path.exists(here) else shutil.which(name)
    if not found:
        raise ConfigError(f"launcher executable {name!r} not found next to {sys.executable} or on PATH; "
                          f"install it or set launch.launcher=none with launch.ranks=1")
    return found


def command(launch: LaunchConfig, argv: list[str]) -> list[str]:
    """The command line that runs `python -m mm_ds.cli ARGV` on `launch.ranks` local ranks."""
    if launch.launcher == "deepspeed":
        return [_bin("deepspeed"), "--num_gpus", str(launch.ranks), "--master_addr", launch.master_addr,
                "--master_port", str(launch.master_port), "--module", "mm_ds.cli", *argv]
    if launch.launcher == "mpirun":
        env = ["-x", f"MASTER_ADDR={launch.master_addr}", "-x", f"MASTER_PORT={launch.master_port}"]
        return [_bin("mpirun"), "-n", str(launch.ranks), *env, sys.executable, "-m", "mm_ds.cli", *argv]
    raise ConfigError(f"launch.launcher={launch.launcher!r} cannot start {launch.ranks} ranks; "
                      f"use deepspeed or mpirun")


def relaunch(launch: LaunchConfig, argv: list[str]) -> int:
    cmd = command(launch, argv)
    env = dict(os.environ)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env["PYTHONUNBUFFERED"] = "1"
    print("[mm-ds] launching:", " ".join(cmd), flush=True)
    return subprocess.call(cmd, env=env)
