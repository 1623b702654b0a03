"""Many small independent runs packed onto a launch's devices: Step 3's finetunings (Step 4's units and the alignment
check's Step-2 runs share its queue loop: mm_ds/runtime/distributed/jobs.py `serve`).

Steps 1, 1b and 2 are a few long runs, each data-parallel over every device of the launch. Step 3 is many short
ones (every primary model x task x seed: 60 in the paper recipe), each of which needs one device for the paper's
batch of 32: they run as single-device runs, as many at once as the launch has devices.

    queue      the launch's ranks take the runs one at a time, longest first (`serve`): a rank that finishes early
               takes the next, and no rank waits in a collective while another trains (NCCL's would time out after
               30 minutes)
    a run      `mm-ds finetune ... launch.launcher=none`, a child process of its rank: a world of one, with the
               launcher's rank variables removed, on the rank's device: CUDA_VISIBLE_DEVICES names that one device
               (as clusters bind a device per task: under deepspeed the node's list has it at the rank's index,
               under `srun --gpus-per-task=1` it is the only one), on CPU the rank's share of the node's cores
    one failed its exit code and log are recorded, the rank takes the next run; the pack fails at the end, naming
               each failed run; the same `mm-ds run` again skips the finished ones and resumes each failed one
               alone from its newest checkpoint (its own --resume)
    a stop     a stop signal on a rank (mm_ds/runtime/distributed/stop.py) is passed to its run, which saves and exits 75; no
               rank takes another run, and the other ranks pass it to theirs (a key in the store they poll); each
               stopped run is recorded `stopped`, and the pack ends with exit code 75: the same `mm-ds run` resumes
    progress   OUT/logs/<pack>/<run>.json (running, done or failed: rank, device, exit code, log), which
               `mm-ds run` follows (`Watch`)

The pack is a work item (`Pack`, mm_ds/pipeline/jobs.py): `mm-ds run` launches it alone (`mm_ds/rank.py
OUT/logs/step3.json` under the recipe's launcher; `none`: one rank in a subprocess), or a one-job run's ranks reach
it in their job; either way every rank runs `run_pack`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..runtime.checkpointing import checkpoint
from ..runtime.distributed import dist, stop
from ..runtime.distributed.jobs import FAILED, serve
from ..runtime.exits import WorkFailed
from .progress import INTERVAL_S, StageFailed, clock, say

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE",
               "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS",
               "MPI_LOCALNRANKS")
LAUNCH_PREFIXES = ("OMPI_COMM_WORLD_", "MV2_COMM_WORLD_", "PMI_", "PMIX_RANK")
"""What makes a process a rank of the launch (mm_ds/runtime/distributed/launch.py under_launcher,
mm_ds/runtime/distributed/rendezvous.py adopt_env): a packed run is a world of one, so its environment has none of it."""


def complete(run: Path) -> bool:
    """A stage run whose final/ is published (sizes checked; the next stage's rank 0 hashes it)."""
    try:
        checkpoint.verify(run / checkpoint.FINAL, checksums=False)
        return True
    except checkpoint.CheckpointError:
        return False


# ---------------------------------------------------------------- one device per run

def child_env(env: dict[str, str], root_pid: int, gpu_index: int | None, cuda_count: int) -> tuple[dict, str]:
    """(environment, device) of a single-device run started by a rank whose device is `gpu_index` among those it
    sees (None on CPU): the launcher's rank variables removed, the rank as the run's launch root (it ends when its
    rank does: mm_ds/runtime/distributed/watchdog.py), and on GPUs that device as its only visible one."""
    child = {k: v for k, v in env.items() if k not in LAUNCH_VARS and not k.startswith(LAUNCH_PREFIXES)}
    child["MM_DS_LAUNCH_ROOT"] = str(root_pid)
    if gpu_index is None:
        return child, "cpu"
    listed = env.get("CUDA_VISIBLE_DEVICES", "")
    visible = listed.split(",") if listed else [str(i) for i in range(cuda_count)]
    child["CUDA_VISIBLE_DEVICES"] = visible[gpu_index % len(visible)]
    return child, f"GPU {child['CUDA_VISIBLE_DEVICES']}"


def cpu_share(cores: list[int], local_rank: int, local_world: int, bound: bool) -> list[int]:
    """The cores a rank's runs may use: its launcher's binding when it has one (`bound`: srun --cpus-per-task),
    else a contiguous slice of the node's cores that the rank's affinity shows (the node's ranks share them, as
    mm_ds/runtime/distributed/dist.py set_threads assumes), so that runs packed onto one node do not fight over cores."""
    n = len(cores)
    if bound or local_world <= 1 or n <= 1:
        return cores
    if n < local_world:
        return [cores[local_rank % n]]
    return cores[local_rank * n // local_world:(local_rank + 1) * n // local_world]


def _this_ranks_device(local_rank: int, local_world: int) -> tuple[dict[str, str], str]:
    """The environment and device of this rank's packed runs (after `dist.init` made its device current)."""
    import torch

    if torch.cuda.is_available():
        return child_env(dict(os.environ), os.getpid(), torch.cuda.current_device(), torch.cuda.device_count())
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    share = cpu_share(cores, local_rank, local_world, bool(os.environ.get("SLURM_CPUS_PER_TASK")))
    if share and share != cores:
        os.sched_setaffinity(0, share)  # this rank's children inherit it; their thread pools fit it
    env, _ = child_env(dict(os.environ), os.getpid(), None, 0)
    return env, ("CPU" if not share else f"CPU core {share[0]}" if len(share) == 1
                 else f"CPU cores {share[0]}-{share[-1]}")


# ---------------------------------------------------------------- Step 3: runs as child processes

@dataclass(frozen=True)
class Pack:
    """The work item of single-device runs packed onto a launch's devices (mm_ds/pipeline/jobs.py)."""
    name: str
    runs: tuple[dict, ...]
    """Each run: {name, out, argv (its stage command), log}, longest first."""
    status: str
    """OUT/logs/<name>/: each run's state, one file each (`Watch` follows them)."""


def _status_file(status: str | Path, name: str) -> Path:
    return Path(status) / f"{name.replace('/', '_')}.json"


def pack(status: Path, name: str, runs: list, logs: Path) -> Pack:
    """The pack of `runs` (`StageRun`s, longest first); status files of an earlier attempt are cleared: what they
    said is in the run directories and logs."""
    jobs = tuple({"name": r.name.partition("/")[2], "out": str(r.out), "argv": r.argv,
                  "log": str(logs / f"{r.name.replace('/', '_')}.log")} for r in runs)
    with checkpoint.writing(status, then="re-run the same command"):
        status.mkdir(parents=True, exist_ok=True)
        for old in status.glob("*.json"):
            old.unlink()
    return Pack(name, jobs, str(status))


def _run_one(job: dict, env: dict, device: str, rank: int, status_dir: str, halted=lambda: False) -> str:
    """One packed run on this rank's device, resumed from its newest checkpoint when it has one: done, failed or
    stopped (a stop signal here or `halted()`: passed on to the run, which saves). Its output goes to its own log;
    its state to its status file."""
    out, log, started = Path(job["out"]), Path(job["log"]), time.time()
    status = _status_file(status_dir, job["name"])
    if complete(out):
        return "done"
    resume = ["--resume"] if checkpoint.list_checkpoints(out) else []
    record = {"name": job["name"], "rank": rank, "device": device, "log": str(log), "resumed": bool(resume)}
    checkpoint.write_json_atomic(status, record | {"state": "running", "started": started})
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "mm_ds.cli", *job["argv"], "--no-progress", *resume]
    with open(log, "a") as f:
        f.write(f"[mm-ds run] {job['name']} on rank {rank}, {device}: mm-ds {' '.join(cmd[3:])}\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        try:
            rc, passed = _wait(proc, halted)
        except BaseException:  # the rank is stopped: its run stops with it, and resumes next time
            proc.terminate()
            proc.wait()
            raise
    state = "done" if rc == 0 and complete(out) else "stopped" if rc == stop.EXIT_CODE or passed else "failed"
    checkpoint.write_json_atomic(status, record | {"state": state, "exit_code": rc, "seconds": time.time() - started})
    return state


def _wait(proc: subprocess.Popen, halted, every_s: float = 0.5) -> tuple[int, bool]:
    """(exit code of a packed run, whether a stop was passed to it): a stop signal to this rank, or `halted()` (one
    to another rank; asked every 2 s), is passed on once; the grace and a margin later the run is killed."""
    passed, asked = False, time.monotonic()
    while proc.poll() is None:
        now = time.monotonic()
        if not passed:
            stopping = stop.requested() is not None
            if not stopping and now - asked > 2:
                asked, stopping = now, halted()
            if stopping:
                seen = stop.requested()
                proc.send_signal(getattr(signal, seen.name if seen else "SIGTERM"))
                passed, asked = True, now
        elif now - asked > stop.GRACE_S + stop.MARGIN_S:
            proc.kill()
        time.sleep(every_s)
    return proc.returncode, passed


def run_pack(item: Pack) -> int:
    """Every rank of a launch: take the pack's runs one at a time (mm_ds/runtime/distributed/jobs.py `serve`) and run
    each on this rank's device. Raises PackFailed when any failed, `Stopped` when a stop reached any."""
    rank, local_rank, world = dist.init()
    env, device = _this_ranks_device(local_rank, dist.local_world_size() or world)
    count = serve(item.name, len(item.runs),
                  lambda i, halted: _run_one(item.runs[i], env, device, rank, item.status, halted), what="run")
    if count[FAILED]:
        raise PackFailed(f"{count[FAILED]} of {len(item.runs)} runs of {item.name} failed; {item.status} says which, "
                         f"with their logs")
    return 0


class PackFailed(WorkFailed):
    """Some runs of a pack failed; the others finished. `failures` says which."""


# ---------------------------------------------------------------- what `mm-ds run` shows and reports

def statuses(status: str | Path) -> list[dict]:
    out, status = [], Path(status)
    for f in sorted(status.glob("*.json")) if status.is_dir() else []:
        try:
            out.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue  # being replaced: read next time
    return out


def _exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


def failures(item: Pack, tail: int = 8) -> str:
    """Each run of the pack that did not finish: how it ended, where, its log and the log's last lines."""
    seen = {s["name"]: s for s in statuses(item.status)}
    lines = []
    for job in item.runs:
        if complete(Path(job["out"])):
            continue
        s = seen.get(job["name"])
        how = (f"stopped on rank {s['rank']} ({s['device']}), resumes next time" if s and s["state"] == "stopped"
               else f"{_exit(s['exit_code'])} on rank {s['rank']} ({s['device']})" if s and "exit_code" in s
               else "did not finish (its rank stopped)" if s else "not started")
        lines.append(f"  {job['name']}: {how}; its log: {job['log']}")
        try:
            lines += [f"    | {line}" for line in Path(job["log"]).read_text(errors="replace").splitlines()[-tail:]]
        except OSError:
            pass
    return "\n".join(lines)


class Watch:
    """A pack as `mm-ds run` follows it (mm_ds/pipeline/progress.py Follow): a line when one of its runs starts,
    finishes or fails, and now and then how many are done, running and failed."""

    def __init__(self, item: Pack, title: str, interval_s: float = INTERVAL_S):
        self.item, self.title, self.interval_s = item, title, interval_s
        self.seen: dict[str, str] = {}
        self.shown = 0.0

    def poll(self, now: float) -> None:
        total, states = len(self.item.runs), statuses(self.item.status)
        for s in states:
            if self.seen.get(s["name"]) == s["state"]:
                continue
            self.seen[s["name"]] = s["state"]
            if s["state"] == "running":
                say(f"{s['name']}: started on rank {s['rank']}, {s['device']}{' (resumed)' if s['resumed'] else ''}")
            elif s["state"] == "done":
                say(f"{s['name']}: done in {clock(s['seconds'])}")
            elif s["state"] == "stopped":
                say(f"{s['name']}: stopped after a checkpoint (resumes next time); its log: {s['log']}")
            else:
                say(f"{s['name']}: FAILED ({_exit(s['exit_code'])}); its log: {s['log']}")
        count = {k: sum(s["state"] == k for s in states) for k in ("done", "running", "failed")}
        if now - self.shown >= self.interval_s and count["running"]:
            self.shown = now
            say(f"{self.title}: {count['done']} of {total} runs done this time, {count['running']} running, "
                f"{count['failed']} failed")


# ---------------------------------------------------------------- Step 3 in `mm-ds run`

STEP3 = "step3"
"""Step 3's pack: its runs' status in OUT/logs/step3/, its launch's log OUT/logs/step3.log."""


def step3_failed(item: Pack, e: StageFailed) -> StageFailed:
    """The failed launch `e` as what failed in Step 3's pack, when it says (else `e` itself)."""
    named = failures(item) if statuses(item.status) else ""  # else it failed before the pack began
    if not named:
        return e
    return StageFailed(f"Step 3 runs did not finish; the others finished and are kept:\n{named}\nFix the cause and "
                       f"re-run the same `mm-ds run` command: finished runs are skipped, and each of these resumes "
                       f"alone from its newest checkpoint")
