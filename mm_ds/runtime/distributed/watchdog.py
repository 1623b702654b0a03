"""Ranks die with their launcher: no orphan keeps training, writing the run directory, or holding the port.

DeepSpeed's launcher (`deepspeed` runner -> `deepspeed.launcher.launch` -> ranks) forwards SIGINT/SIGTERM
to the ranks, but a SIGKILLed runner (a killed job, a lost login, `kill -9`) cannot: the per-node
`launch` process and the ranks it started keep running, keep the rendezvous port, and would race a
resumed run over the same checkpoints. Each rank therefore watches the processes that launched it
(parent, grandparent, ... up to `MM_DS_LAUNCH_ROOT`, the `mm-ds` process that started the launcher, or
`mm-ds run`; without it, the ancestors that are DeepSpeed launcher processes). When one of them is gone the
rank is stopped as a stop signal would (mm_ds/runtime/distributed/stop.py): SIGTERM first, so that it saves and leaves
with its peers (whose launcher is gone too: a single-node `deepspeed` runner dies at once on SIGTERM, and would
otherwise take its ranks' save with it), then SIGKILL once the grace is over (train.stop_grace_s: a rank whose peer is
lost waits in a collective forever). Linux only (/proc); elsewhere it does nothing.
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


_WATCHED: dict[int, tuple[list[tuple[int, str, str]], object]] = {}
"""pid -> the chain its watcher watches, and the watcher: one per process, however often `dist.init()` runs (once
per stage in `mm-ds run`'s one job)."""
GRACE_S = 20.0
"""Until `set_grace`: mm_ds/runtime/distributed/stop.py's GRACE_S (this module is a leaf, run as a script by the watcher)."""


def start(rank: int, poll_s: float = 1.0, grace_s: float = GRACE_S) -> list[tuple[int, str, str]]:
    """Stop this rank when a launcher dies: SIGTERM, then SIGKILL (no cleanup that could block on dead peers) after
    `grace_s` unless it has left.

    The watching is done by a small separate process, not a thread: a rank spends most of its time in
    collectives and kernels that may hold the GIL, which starved a watcher thread for seconds (observed
    with DeepSpeed's CPU shared-memory all-reduce). The watcher exits by itself when the rank does."""
    if not os.path.isdir("/proc"):
        return []
    if os.getpid() in _WATCHED:
        return _WATCHED[os.getpid()][0]
    chain = launcher_chain()
    _WATCHED[os.getpid()] = (chain, None)
    if not chain:
        return []
    import subprocess
    import sys

    args = [str(os.getpid()), str(rank), str(poll_s), str(grace_s)] + [f"{pid}:{started}" for pid, started, _ in chain]
    watcher = subprocess.Popen([sys.executable, "-I", "-S", __file__, *args], stdin=subprocess.PIPE,
                               stdout=subprocess.DEVNULL, start_new_session=True, text=True)
    _WATCHED[os.getpid()] = (chain, watcher)
    return chain


def set_grace(grace_s: float) -> None:
    """The stage's train.stop_grace_s, for this rank's watcher (a line on its stdin; it started with GRACE_S)."""
    watcher = _WATCHED.get(os.getpid(), (None, None))[1]
    if watcher is not None and watcher.poll() is None:
        try:
            watcher.stdin.write(f"{grace_s}\n")
            watcher.stdin.flush()
        except OSError:
            pass  # it has gone: nothing to tell


def _watch(argv: list[str]) -> None:
    import select
    import signal

    # The launcher's stop passes SIGTERM/SIGINT to the rank's whole process tree, this watcher included: it must
    # outlive the rank's save, and exits when the rank does.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    me, rank, poll_s, grace_s = int(argv[0]), argv[1], float(argv[2]), float(argv[3])
    me_started = (_stat(me) or (0, "", ""))[2]
    chain = [(int(a.split(":")[0]), a.split(":")[1]) for a in argv[4:]]
    gone_at = None
    while True:
        ready = select.select([sys.stdin], [], [], poll_s)[0] if not sys.stdin.closed else time.sleep(poll_s)
        if ready:
            line = sys.stdin.readline()
            if not line:
                sys.stdin.close()  # the rank closed its end (it exited, or exec'd)
            elif line.strip():
                grace_s = float(line)
        st = _stat(me)
        if st is None or st[2] != me_started:
            return  # the rank is gone: nothing to watch
        if gone_at is None:
            for pid, started in chain:
                pst = _stat(pid)
                if pst is None or pst[2] != started:
                    print(f"[mm-ds] rank {rank}: its launcher (pid {pid}) is gone; stopping the rank (pid {me}): "
                          f"SIGTERM, SIGKILL in {grace_s:.0f} s unless it has left (no orphan keeps the port or the "
                          f"run directory)", file=sys.stderr, flush=True)
                    os.kill(me, signal.SIGTERM)
                    gone_at = time.monotonic()
                    break
        elif time.monotonic() - gone_at > grace_s:
            os.kill(me, signal.SIGKILL)
            return


if __name__ == "__main__":
    import sys

    _watch(sys.argv[1:])
