"""Ranks die with their launcher: no orphan keeps training, writing the run directory, or holding the port.

DeepSpeed's launcher (`deepspeed` runner -> `deepspeed.launcher.launch` -> ranks) forwards SIGINT/SIGTERM
to the ranks, but a SIGKILLed runner (a killed job, a lost login, `kill -9`) cannot: the per-node
`launch` process and the ranks it started keep running, keep the rendezvous port, and would race a
resumed run over the same checkpoints. Each rank therefore watches the processes that launched it
(parent, grandparent, ... up to `MM_DS_LAUNCH_ROOT`, the `mm-ds` process that started the launcher, or
`mm-ds run`; without it, the ancestors that are DeepSpeed launcher processes) and exits as soon as one of
them is gone. Linux only (/proc); elsewhere it does nothing.
"""

from __future__ import annotations

import os
import time

ROOT_ENV = "MM_DS_LAUNCH_ROOT"


def _stat(pid: int) -> tuple[int, str, str] | None:
    """(parent pid, state, start time) of a live process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    if fields[0] in ("Z", "X"):  # killed, not yet reaped by its parent
        return None
    return int(fields[1]), fields[0], fields[19]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def launcher_chain(pid: int | None = None) -> list[tuple[int, str, str]]:
    """(pid, start time, command line) of the processes that launched `pid`, nearest first."""
    pid = pid or os.getpid()
    root = os.environ.get(ROOT_ENV, "")
    ancestors, cur = [], pid
    while True:
        st = _stat(cur)
        if st is None or st[0] <= 1:
            break
        cur = st[0]
        pst = _stat(cur)
        if pst is None:
            break
        ancestors.append((cur, pst[2], _cmdline(cur)))
    if root.isdigit() and any(a[0] == int(root) for a in ancestors):
        return ancestors[:[a[0] for a in ancestors].index(int(root)) + 1]
    chain = []
    for a in ancestors:  # no root named (or it is on another node): the DeepSpeed launcher processes
        if "deepspeed" not in a[2]:
            break
        chain.append(a)
    return chain


_WATCHED: dict[int, list[tuple[int, str, str]]] = {}
"""pid -> the chain its watcher watches: one watcher per process, however often `dist.init()` runs (once per
stage in `mm-ds run`'s one job)."""


def start(rank: int, poll_s: float = 1.0) -> list[tuple[int, str, str]]:
    """Kill this rank (SIGKILL: no cleanup that could block on dead peers) as soon as a launcher dies.

    The watching is done by a small separate process, not a thread: a rank spends most of its time in
    collectives and kernels that may hold the GIL, which starved a watcher thread for seconds (observed
    with DeepSpeed's CPU shared-memory all-reduce). The watcher exits by itself when the rank does."""
    if not os.path.isdir("/proc"):
        return []
    if os.getpid() in _WATCHED:
        return _WATCHED[os.getpid()]
    chain = _WATCHED[os.getpid()] = launcher_chain()
    if not chain:
        return []
    import subprocess
    import sys

    args = [str(os.getpid()), str(rank), str(poll_s)] + [f"{pid}:{started}" for pid, started, _ in chain]
    subprocess.Popen([sys.executable, "-I", "-S", __file__, *args], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, start_new_session=True)
    return chain


def _watch(argv: list[str]) -> None:
    import signal

    me, rank, poll_s = int(argv[0]), argv[1], float(argv[2])
    me_started = (_stat(me) or (0, "", ""))[2]
    chain = [(int(a.split(":")[0]), a.split(":")[1]) for a in argv[3:]]
    while True:
        time.sleep(poll_s)
        st = _stat(me)
        if st is None or st[2] != me_started:
            return  # the rank is gone: nothing to watch
        for pid, started in chain:
            pst = _stat(pid)
            if pst is None or pst[2] != started:
                print(f"[mm-ds] rank {rank}: its launcher (pid {pid}) is gone; killing the rank (pid {me}) so that "
                      f"no orphan keeps the port or the run directory", file=sys.stderr, flush=True)
                os.kill(me, signal.SIGKILL)
                return


if __name__ == "__main__":
    import sys

    _watch(sys.argv[1:])
