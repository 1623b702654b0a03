"""Many small independent runs packed onto a launch's devices: Step 3's finetunings (Step 4's units and the alignment
check's checkpoints share its queue: mm_ds/runtime/jobs.py).

Steps 1, 1b and 2 are a few long runs, each data-parallel over every device of the launch. Step 3 is many short
ones (every primary model x task x seed: 60 in the paper recipe), each of which needs one device for the paper's
batch of 32: they run as single-device runs, as many at once as the launch has devices.

    queue      the launch's ranks take the runs one at a time, longest first, from a counter in rank 0's
               rendezvous store (`dist.shared_add`): a rank that finishes early takes the next, and no rank waits
               in a collective while another trains (NCCL's would time out after 30 minutes)
    a run      `mm-ds finetune ... launch.launcher=none`, a child process of its rank: a world of one, with the
               launcher's rank variables removed, on the rank's device: CUDA_VISIBLE_DEVICES names that one device
               (as clusters bind a device per task: under deepspeed the node's list has it at the rank's index,
               under `srun --gpus-per-task=1` it is the only one), on CPU the rank's share of the node's cores
    one failed its exit code and log are recorded, the rank takes the next run; the pack fails at the end, naming
               each failed run; the same `mm-ds run` again skips the finished ones and resumes each failed one
               alone from its newest checkpoint (its own --resume)
    a stop     a stop signal on a rank (mm_ds/runtime/stop.py) is passed to its run, which saves and exits 75; no
               rank takes another run, and the other ranks pass it to theirs (a key in the store they poll); each
               stopped run is recorded `stopped`, and the pack ends with exit code 75: the same `mm-ds run` resumes
    progress   OUT/logs/<pack>/<run>.json (running, done or failed: rank, device, exit code, log), which
               `mm-ds run` follows (`Watch`)

Every launcher runs it the same way: `mm-ds run` starts `mm-ds run-pack OUT/logs/<pack>.json` under the recipe's
launcher (deepspeed, mpirun, srun; `none`: one rank in a subprocess), and a one-job run's ranks run the same
function in their process when they reach the pack.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..runtime import checkpoint, stop
from ..runtime.jobs import Queue
from .progress import INTERVAL_S, Follow, StageFailed, clock, run_logged, say

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE",
               "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS",
               "MPI_LOCALNRANKS", "MM_DS_VALIDATED")
LAUNCH_PREFIXES = ("OMPI_COMM_WORLD_", "MV2_COMM_WORLD_", "PMI_", "PMIX_RANK")
"""What makes a process a rank of the launch (mm_ds/runtime/launch.py under_launcher, mm_ds/runtime/dist.py adopt_env): a packed
run is a world of one, so its environment has none of it."""


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
    rank does: mm_ds/runtime/watchdog.py), and on GPUs that device as its only visible one."""
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
    mm_ds/runtime/dist.py set_threads assumes), so that runs packed onto one node do not fight over cores."""
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


# ---------------------------------------------------------------- the queue

# ---------------------------------------------------------------- Step 3: runs as child processes

def status_dir(spec_path: Path) -> Path:
    return spec_path.with_suffix("")


def _status_file(spec_path: Path, name: str) -> Path:
    return status_dir(spec_path) / f"{name.replace('/', '_')}.json"


def write_spec(path: Path, name: str, runs: list, logs: Path) -> Path:
    """OUT/logs/<name>.json: the pack's runs (`recipe.StageRun`s, longest first) for `mm-ds run-pack`. Status files
    of an earlier attempt are cleared: what they said is in the run directories and logs."""
    jobs = [{"name": r.name.partition("/")[2], "out": str(r.out), "argv": r.argv,
             "log": str(logs / f"{r.name.replace('/', '_')}.log")} for r in runs]
    with checkpoint.writing(path, then="re-run the same command"):
        path.parent.mkdir(parents=True, exist_ok=True)
        checkpoint.write_json_atomic(path, {"name": name, "jobs": jobs})
        status_dir(path).mkdir(exist_ok=True)
        for old in status_dir(path).glob("*.json"):
            old.unlink()
    return path


def _run_one(job: dict, env: dict, device: str, rank: int, spec_path: Path, halted=lambda: False) -> str:
    """One packed run on this rank's device, resumed from its newest checkpoint when it has one: done, failed or
    stopped (a stop signal here or `halted()`: passed on to the run, which saves). Its output goes to its own log;
    its state to its status file."""
    out, log, started = Path(job["out"]), Path(job["log"]), time.time()
    status = _status_file(spec_path, job["name"])
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


def run_pack(spec_path: Path) -> int:
    """Every rank of a launch: take the pack's runs one at a time and run each on this rank's device; then, with
    every rank, how many failed (collective at the start and the end only). Raises PackFailed when any did."""
    from ..runtime import dist

    rank, local_rank, world = dist.init()
    spec = dist.on_rank0(lambda: json.loads(Path(spec_path).read_text()), f"reading {spec_path}")
    queue, count, error = Queue(spec["name"], len(spec["jobs"])), {"failed": 0, "stopped": 0}, None
    halt = f"{queue.key}/stop-signal"  # a stop on some rank: every rank passes it to its run

    def halted() -> bool:
        return dist.is_initialized() and dist.shared_add(halt, 0) > 0

    try:
        env, device = _this_ranks_device(local_rank, dist.local_world_size() or world)
        with stop.handling():  # a world of one started by `mm-ds run` (launcher none) has no handler of its own
            while stop.requested() is None and not halted() and (i := queue.claim()) is not None:
                state = _run_one(spec["jobs"][i], env, device, rank, Path(spec_path), halted)
                count[state] = count.get(state, 0) + 1
                if state == "stopped" and dist.is_initialized():
                    dist.shared_add(halt)
    except Exception as e:  # noqa: BLE001  this rank cannot go on (its runs' own failures are counted above)
        queue.stop()
        error = f"rank {rank}: {type(e).__name__}: {e}"
        print(f"[mm-ds] {error}", file=sys.stderr, flush=True)
    queue.drain()
    failed, broken, stopped, signalled = (int(x) for x in dist.all_reduce(
        [count["failed"], error is not None, count["stopped"], stop.requested() is not None]))
    if stopped or signalled:  # the runs saved where they were; the same `mm-ds run` resumes them (and failed ones)
        seen = stop.requested()
        raise stop.Stopped(seen.name if seen else None, f"{spec['name']} stopped: {stopped} run(s) stopped, {failed} "
                                                        f"failed; {status_dir(Path(spec_path))} says which")
    if failed or broken:
        raise PackFailed(f"{failed} of {len(spec['jobs'])} runs of {spec['name']} failed"
                         f"{f', {broken} rank(s) stopped (their output says why)' if broken else ''}; "
                         f"{status_dir(Path(spec_path))} says which, with their logs")
    return 0


class PackFailed(RuntimeError):
    """Some runs of a pack failed; the others finished. `failures` says which."""


def main(argv: list[str]) -> int:
    """`mm-ds run-pack SPEC.json` (internal): every rank of `mm-ds run`'s Step-3 launch."""
    try:
        return run_pack(Path(argv[0]))
    except PackFailed as e:
        print(f"mm-ds run-pack: {e}", file=sys.stderr, flush=True)
        return 3


# ---------------------------------------------------------------- what `mm-ds run` shows and reports

def statuses(spec_path: Path) -> list[dict]:
    out = []
    for f in sorted(status_dir(spec_path).glob("*.json")) if status_dir(spec_path).is_dir() else []:
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


def failures(spec_path: Path, tail: int = 8) -> str:
    """Each run of the pack that did not finish: how it ended, where, its log and the log's last lines."""
    spec = json.loads(spec_path.read_text())
    seen = {s["name"]: s for s in statuses(spec_path)}
    lines = []
    for job in spec["jobs"]:
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
    """A pack as `mm-ds run` follows it (mm_ds/pipeline/progress.py Follow): a line when one of its runs starts, finishes or
    fails, and now and then how many are done, running and failed."""

    def __init__(self, spec_path: Path, title: str, interval_s: float = INTERVAL_S):
        self.spec_path, self.title, self.interval_s = spec_path, title, interval_s
        self.seen: dict[str, str] = {}
        self.shown = 0.0

    def poll(self, now: float) -> None:
        try:
            total = len(json.loads(self.spec_path.read_text())["jobs"])
        except (OSError, ValueError, KeyError):
            return  # not written yet
        states = statuses(self.spec_path)
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
"""OUT/logs/step3.json: Step 3's runs; their status in OUT/logs/step3/."""


def step3_spec(runs: list, recipe, out: Path) -> Path:
    """The pack file of Step 3's runs, longest first (their costs as `mm-ds plan` counts them): the last to start
    are the shortest, so the devices finish close together."""
    from .stage_runs import stage_configs
    from .costs import finetune_costs

    costs = finetune_costs(recipe, stage_configs(recipe, out), out)
    order = sorted(runs, key=lambda r: -costs[r.name.split("/", 1)[1]].flops)
    return write_spec(out / "logs" / f"{STEP3}.json", STEP3, order, out / "logs")


def run_step3(runs: list, recipe, out: Path) -> None:
    """Step 3: its runs on the recipe's launch, one per device, several at once (mm_ds/pipeline/pack.py); a run that
    fails is named with its log once the others are done."""
    from ..config import LaunchConfig, from_dict
    from ..runtime.launch import command, launch_env, preflight

    if not runs:
        return
    cfg = from_dict(LaunchConfig, recipe.launch)
    spec = step3_spec(runs, recipe, out)
    say(f"Step 3: {len(runs)} single-device runs, {min(cfg.world_size, len(runs))} at once on {cfg.world_size} "
        f"device(s); each run's log: {out / 'logs'}/finetune_*.log, the launch's: {out / 'logs' / 'step3.log'}")
    preflight(cfg)
    argv = ["run-pack", str(spec)]
    try:
        run_logged(command(cfg, argv) if cfg.launcher != "none" else [sys.executable, "-m", "mm_ds.cli", *argv],
                   out / "logs" / f"{STEP3}.log", Follow([], others=[Watch(spec, "Step 3")]), launch_env(cfg))
    except StageFailed as e:
        raise step3_failed(spec, e) from None


def step3_failed(spec: Path, e: StageFailed) -> StageFailed:
    """The failed launch `e` as what failed in Step 3's pack, when it says (else `e` itself)."""
    named = failures(spec) if spec.is_file() and statuses(spec) else ""  # else it failed before the pack began
    if not named:
        return e
    return StageFailed(f"Step 3 runs did not finish; the others finished and are kept:\n{named}\nFix the cause and "
                       f"re-run the same `mm-ds run` command: finished runs are skipped, and each of these resumes "
                       f"alone from its newest checkpoint")
