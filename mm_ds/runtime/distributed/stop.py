"""A stopped job loses nothing but the update in flight: the stop signals, the flag they set, and the exit code that
says "stopped, resumable".

On a cluster most runs are stopped, not crashed: SLURM's time limit or a preemption (SIGTERM, or the signal
`sbatch --signal=B:USR1@120` names, then SIGKILL after KillWait, 30 s by default), `scancel`, Ctrl-C. A stop signal
on any rank (or on the process that started the launcher) ends the run after a checkpoint:

    ranks      SIGTERM, SIGINT, SIGUSR1 (train.stop_signals) only record the first signal: its name, when, and the
               update whose boundary will carry it (`in_flight`); the loop's update boundary makes the ranks agree
               (mm_ds/runtime/training/boundary.py), every rank saves a `resume` checkpoint through the verified save,
               rank 0 prints one line ("stopped by SIGTERM at update N; resume with: ..."), and every rank raises
               `Stopped`: the process exits EXIT_CODE. A later signal is counted and ignored: the save goes on, and
               `latest` moves only once a checkpoint verified, so the previous one stays published either way.
    parents    the `mm-ds STAGE` process that starts the launcher and `mm-ds run` (`run_child`): the launcher runs in
               a session of its own, each stop signal this process gets is forwarded to its process group (a
               single-node `deepspeed` runner dies on SIGTERM; its per-node launchers pass SIGTERM to the ranks),
               and the parent waits for it, at most the grace and MARGIN_S, then exits EXIT_CODE.

Exit code 75 (EX_TEMPFAIL in sysexits.h): stopped, resumable. The same command with --resume (a stage), or the same
`mm-ds run` command, continues from the saved update; launchers/slurm.sbatch requeues the job on it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass

EXIT_CODE = 75
"""EX_TEMPFAIL: stopped by a signal after saving (or with nothing to save); re-run to resume."""
SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1")
"""train.stop_signals' default: SLURM's and DeepSpeed's launch.py's stop, Ctrl-C, and `sbatch --signal=B:USR1@...`."""
GRACE_S = 20.0
"""train.stop_grace_s' default: from the signal to the ranks' exit. Below the 30 s that DeepSpeed's launch.py waits
after passing SIGTERM on before it SIGKILLs its ranks, and SLURM's default KillWait (30 s), with room for the update
in flight and the processes' teardown."""
MARGIN_S = 30.0
"""How long a parent waits beyond the grace for its launcher before it SIGKILLs the launcher's process group."""


@dataclass(frozen=True)
class Seen:
    """The first stop signal this process received."""
    name: str
    at: float
    """time.monotonic() when it arrived."""
    update: int
    """The update whose boundary carries it (`in_flight` when it arrived): the run stops after it or the next."""


_first: Seen | None = None
_ignored = 0
in_flight = 0
"""The update whose boundary will carry a signal that arrives now; the loop sets it (mm_ds/runtime/training/boundary.py)."""


class Stopped(Exception):
    """A stop signal ended the run after a checkpoint (or with nothing to save): exit with EXIT_CODE."""

    def __init__(self, signame: str | None, message: str = ""):
        super().__init__(message or f"stopped by {signame or 'a stop signal'}")
        self.signame = signame


def check_names(names) -> list[str]:
    """Signal names as train.stop_signals takes them (SIGTERM or TERM); ValueError naming a bad one."""
    out = []
    for n in names:
        full = n if str(n).startswith("SIG") else f"SIG{n}"
        if not isinstance(getattr(signal, full, None), signal.Signals) or full in ("SIGKILL", "SIGSTOP"):
            raise ValueError(f"{n!r} is not a signal a process can handle (e.g. SIGTERM, SIGINT, SIGUSR1, SIGUSR2)")
        out.append(full)
    return out


def _record(signum, frame) -> None:
    """The ranks' handler: record the first signal and return. Nothing else: no print (a handler may run inside a
    print), no collective, no exception."""
    global _first, _ignored
    if _first is None:
        _first = Seen(signal.Signals(signum).name, time.monotonic(), in_flight)
    else:
        _ignored += 1


def requested() -> Seen | None:
    """The first stop signal this process received, if any."""
    return _first


def ignored() -> int:
    """Stop signals received after the first (ignored)."""
    return _ignored


def reset() -> None:
    """Forget a recorded signal (tests; a driver process that handled it)."""
    global _first, _ignored
    _first, _ignored = None, 0


def install(names=SIGNALS, handler=_record) -> dict:
    """`handler` for each named signal in this (main) thread, system calls restarted rather than interrupted (C++
    code in collectives need not handle EINTR). Returns what was there before, for `restore`; {} off the main
    thread (where Python cannot install handlers)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    before = {}
    for name in check_names(names):
        sig = getattr(signal, name)
        before[sig] = signal.signal(sig, handler)
        signal.siginterrupt(sig, False)
    return before


def restore(before: dict) -> None:
    for sig, handler in before.items():
        signal.signal(sig, handler)


@contextlib.contextmanager
def handling(names=SIGNALS):
    """Within it, the named signals only set the flag (`install`); the handlers before are restored after."""
    before = install(names)
    try:
        yield
    finally:
        restore(before)


_resume_with: str | None = None


def resume_with(command: str | None) -> None:
    """The command that resumes this process's run, as its launching side named it (mm_ds/runtime/training/resolved.py):
    a rank started from a run directory has no stage command line of its own."""
    global _resume_with
    _resume_with = command


def resume_line() -> str:
    """What resumes this process's run, for a stop's line: the command its launching side named (`resume_with`)."""
    return _resume_with or "the same command with --resume"


def resume_command(argv: list[str]) -> str:
    """The command that resumes `mm-ds ARGV`: the same stage command with --resume; `mm-ds run`'s, itself."""
    argv = [a for a in argv if not a.startswith("--local_rank")]
    if not argv or argv[0].startswith("run"):
        return "the same `mm-ds run` command"
    return shlex.join(["mm-ds", *argv, *([] if "--resume" in argv else ["--resume"])])


# ---------------------------------------------------------------- the process that starts the launcher

FORWARD_AS = {
    # the launcher a parent starts -> the signal that reaches its ranks with no kill close behind it
    "deepspeed": "SIGTERM",  # its per-node launch.py passes SIGTERM on, then waits 30 s (USR1 would kill it)
    "deepspeed --launcher openmpi": "SIGUSR1",  # the runner starts mpirun or srun: as below
    "deepspeed --launcher mvapich": "SIGUSR1",
    "deepspeed --launcher mpich": "SIGUSR1",
    "deepspeed --launcher impi": "SIGUSR1",
    "deepspeed --launcher slurm": "SIGUSR1",
    "mpirun": "SIGUSR1",  # OpenMPI passes SIGUSR1/2 on; on SIGTERM it kills the job (SIGKILL a second later)
    "srun": "SIGUSR1",  # srun passes SIGUSR1 to its tasks; on SIGTERM it ends the step (SIGKILL after KillWait)
}
"""A stop signal forwarded to a launcher of the left column becomes the right one; other children (a rank itself:
`launch.launcher=none`) get it as received."""


def forward_as(cmd: list[str], signame: str) -> str:
    """The signal a parent sends `cmd`'s process group for a stop signal `signame` it received (FORWARD_AS)."""
    name = os.path.basename(cmd[0]) if cmd else ""
    ds = cmd[cmd.index("--launcher") + 1] if name == "deepspeed" and "--launcher" in cmd[:-1] else None
    key = f"deepspeed --launcher {ds}" if ds in ("openmpi", "mvapich", "mpich", "impi", "slurm") else name
    return FORWARD_AS.get(key, signame)


_children: dict[int, list[str]] = {}
"""Process groups (their leaders' pids) a stop signal received here is forwarded to, with their commands."""
_starting = False
_raise_when_idle = False


def _send(pgid: int, cmd: list[str], signame: str) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, getattr(signal, forward_as(cmd, signame)))


def _forward(signum, frame) -> None:
    """A parent's handler: record, forward to the launchers running now, and where none runs and the caller asked for
    it (`mm-ds run`: its own in-process work publishes atomically), stop here at once."""
    first, name = _first is None, signal.Signals(signum).name
    _record(signum, frame)
    for pgid, cmd in list(_children.items()):
        _send(pgid, cmd, name)
    if first and _children:
        os.write(2, f"[mm-ds] {name}: passed on to the launcher; its ranks stop after their next update and "
                    f"save\n".encode())
    if not _children and not _starting and _raise_when_idle:
        raise Stopped(name)


@contextlib.contextmanager
def forwarding(names=SIGNALS, raise_when_idle: bool = False):
    """Within it, the stop signals this process receives are forwarded to the launchers `start_child` started."""
    global _raise_when_idle
    before, was = install(names, _forward), _raise_when_idle
    _raise_when_idle = raise_when_idle
    try:
        yield
    finally:
        _raise_when_idle = was
        restore(before)


def start_child(cmd: list[str], **popen) -> subprocess.Popen:
    """Start a launcher in a session of its own (a terminal's Ctrl-C reaches it once, through `_forward`), registered
    for forwarding; a stop that arrived before is passed on at once."""
    global _starting
    _starting = True
    try:
        proc = subprocess.Popen(cmd, start_new_session=True, **popen)
        _children[proc.pid] = list(cmd)
    finally:
        _starting = False
    if _first is not None:
        _send(proc.pid, cmd, _first.name)
    return proc


def overdue(grace_s: float) -> bool:
    """A stop was received more than the grace and MARGIN_S ago: the launcher did not end (a rank stuck in a
    collective whose peer is gone); the caller kills its process group."""
    return _first is not None and time.monotonic() - _first.at > grace_s + MARGIN_S


def _group_alive(pgid: int) -> bool:
    """A process of group `pgid` still runs (a zombie does not count: without a reaping init it stays forever)."""
    if not os.path.isdir("/proc"):
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()  # state, ppid, pgrp, ...
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def wait_child(proc: subprocess.Popen, grace_s: float = GRACE_S, poll=None, every_s: float = 0.5) -> int:
    """Wait for a launcher `start_child` started, calling `poll()` meanwhile. After a stop: until its whole process
    group is gone (a runner that dies on the signal leaves its mpirun or ranks saving), at most the grace and
    MARGIN_S, then SIGKILL to the group. Its exit code, or EXIT_CODE when a stop was passed on and it did not end
    cleanly (DeepSpeed's launchers exit 1, or by the signal, whatever their ranks said)."""
    try:
        while proc.poll() is None or _first is not None and _group_alive(proc.pid):
            if poll is not None:
                poll()
            if overdue(grace_s):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
            time.sleep(every_s)
    finally:
        _children.pop(proc.pid, None)
    if poll is not None:
        poll()
    return EXIT_CODE if _first is not None and proc.returncode != 0 else proc.returncode


def run_child(cmd: list[str], grace_s: float = GRACE_S, **popen) -> int:
    """`cmd` (a launcher) as `start_child` starts it and `wait_child` waits for it, stop signals forwarded."""
    with forwarding():
        return wait_child(start_child(cmd, **popen), grace_s)
