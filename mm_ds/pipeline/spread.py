"""Side by side (`launch.spread=G`): a step's independent stage runs on separate groups of nodes at once.

The runs of one step share no parent-child edge (Step 2's every system and language; Step 1's pretrainings). Without
spread `mm-ds run` runs each on every node, one after another. With `launch.spread=G` it splits the hostfile's nodes
(the first `launch.nodes`) into G groups of equal size, in hostfile order, and each group runs one of a step's runs
at a time, taking the next as it frees up; the step ends with its last run, and the next step starts on every
group. A step with fewer runs than groups runs one after another on every node, as without spread. Step 3's
single-device runs, Step 4 and the alignment check take the whole launch, as always.

Why: a run on one node communicates over NVLink, not the network, and runs several at once: `mm-ds plan --spread G`
prices both ways. What changes for a run is its world size: each group is its own launch, with its own hostfile
(its lines of `launch.hostfile`, under OUT/logs/spread/), `launch.nodes`, and master port `launch.master_port + K`
for group K; rank 0's address is found at start, as without a `launch.master_addr`. The global batch is kept: a
smaller world runs more micro-steps per update (ds_config.split), and a group size that cannot divide a stage's
global batch is refused by `--check`, naming the values of launch.spread that keep it. A run interrupted on one
group resumes on whichever group takes it next (every group has the same world size).

A failed run stops the scheduling: no further run starts, the runs in flight finish (their work is kept), then
`mm-ds run` fails naming the run and its log; the same command again skips what finished and resumes the rest.

Launchers: `deepspeed` through an ssh-style runner (pdsh, openmpi, mvapich, mpich, impi) and `mpirun`, each with a
hostfile. DeepSpeed's runner runs a one-host hostfile on the machine it is started on; a group of one node that is
not this machine is started through the runner, as several nodes are (`launch.force_multi`). Not `srun` nor
`launch.ds_launcher=slurm` (srun chooses a job step's nodes itself: give the allocation's nodes as a hostfile,
`scontrol show hostnames`, and use pdsh, openmpi or mpirun), nor `launch.node_rank` (one command per node).
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import time
from collections import deque
from pathlib import Path

from ..config import ConfigError, LaunchConfig, from_dict
from ..runtime.checkpointing import checkpoint
from ..runtime.checkpointing.rundir import LOGS, logs_dir
from ..runtime.distributed import hostfile, stop
from ..runtime.distributed.launch import is_loopback, launch_env, rank_command
from ..runtime.training.ds_config import geometry
from ..stages.command import published_as_built
from ..stages.resolve import StageRun, resolve
from .progress import Follow, StageFailed, Watched, failure_of, say

STEPS = ("pretrain", "build_mini", "adapt")
"""The data-parallel steps whose runs may go side by side (Step 3's runs are single-device: mm_ds/pipeline/pack.py)."""
GROUP_DIR = Path(LOGS) / "spread"


def launch_of(recipe) -> LaunchConfig:
    return from_dict(LaunchConfig, recipe.launch, prefix="launch.")


def groups(launch: LaunchConfig) -> list[list]:
    """The hostfile's hosts (`hostfile.Host`) in `launch.spread` groups; [] without spread. ConfigError when the
    launcher cannot start a subset of nodes or the nodes do not split evenly."""
    g = launch.spread
    if g == 1:
        return []
    where = f"launch.spread={g}"
    if launch.launcher not in ("deepspeed", "mpirun") or not launch.hostfile:
        raise ConfigError(f"{where} splits a hostfile's nodes into groups: use launch.launcher=deepspeed or mpirun "
                          f"with launch.hostfile (under SLURM: a hostfile of `scontrol show hostnames` lines)")
    if launch.launcher == "deepspeed" and launch.ds_launcher == "slurm":
        raise ConfigError(f"{where}: DeepSpeed's slurm runner lets srun choose each launch's nodes, so groups could "
                          f"share nodes; use launch.ds_launcher=pdsh or openmpi, or launch.launcher=mpirun")
    if launch.node_rank is not None:
        raise ConfigError(f"{where} starts every group from this command; launch.node_rank (one command per node) "
                          f"cannot: unset it and reach the nodes through pdsh, openmpi or mpirun")
    hosts = hostfile.select(hostfile.read(launch.hostfile), launch.nodes, launch.ranks, launch.hostfile)
    if len(hosts) % g:
        fits = [d for d in range(1, len(hosts) + 1) if len(hosts) % d == 0]
        raise ConfigError(f"{where}: {len(hosts)} nodes do not split into {g} groups of equal size; choose "
                          f"launch.spread from {', '.join(map(str, fits))}")
    size = len(hosts) // g
    return [hosts[i:i + size] for i in range(0, len(hosts), size)]


def spread_steps(runs: list[StageRun], spread: int) -> dict[str, list[StageRun]]:
    """The steps whose runs go side by side: data-parallel ones with at least as many runs as groups."""
    by_step: dict[str, list[StageRun]] = {}
    for run in runs:
        if run.stage in STEPS and not run.packed:
            by_step.setdefault(run.stage, []).append(run)
    return {s: rs for s, rs in by_step.items() if spread > 1 and len(rs) >= spread}


# ---------------------------------------------------------------- `mm-ds run --check`

def check_spread(recipe, runs: list[StageRun], configs: dict, report) -> None:
    """`--check`'s part: the groups, and each side-by-side run's batch geometry at a group's world size; a note
    says how the steps run. `configs`: by resolved run directory (check.check_stages)."""
    launch = launch_of(recipe)
    if launch.spread == 1:
        return
    if recipe.mode == "one_job":
        report.add("launch.spread", "mode: one_job runs every stage in one launch of every node; side by side needs "
                   "mode: per_stage")
        return
    try:
        hosts = groups(launch)
    except ConfigError as e:
        report.add("launch.spread", str(e))
        return
    steps = spread_steps(runs, launch.spread)
    world, nodes = len(hosts[0]) * launch.ranks, len(hosts) * len(hosts[0])
    bad = geometry_problems([r for rs in steps.values() for r in rs], configs, world)
    for where, msg in bad:
        ok = spreads_that_fit(runs, configs, nodes, launch.ranks)
        report.add(where, f"launch.spread={launch.spread} runs it on {len(hosts[0])} node(s) x {launch.ranks} = "
                   f"{world} ranks: {msg}; launch.spread values with which every data-parallel run keeps its global "
                   f"batch on these {nodes} nodes: {', '.join(map(str, ok)) or 'none'}")
    if steps and not bad:
        report.notes.append(describe(launch, hosts, steps, configs))


def geometry_problems(runs: list[StageRun], configs: dict, world: int) -> list[tuple[str, str]]:
    """(run directory under OUT, why) of each run whose global batch `world` ranks cannot divide."""
    found = []
    for run in runs:
        cfg = configs.get(run.out.resolve())
        if cfg is None:
            continue  # its config is refused: --check names that already
        try:
            geometry(cfg, world)
        except ConfigError as e:
            found.append((run.name.split("/", 1)[1], str(e)))
    return found


def spreads_that_fit(runs: list[StageRun], configs: dict, nodes: int, ranks: int) -> list[int]:
    """The values of launch.spread with which every data-parallel run keeps its global batch: side-by-side runs at
    a group's world size, the others at every node's."""
    fits = []
    for g in (d for d in range(1, nodes + 1) if nodes % d == 0):
        spread = [r for rs in spread_steps(runs, g).values() for r in rs]
        rest = [r for r in runs if r.stage in STEPS and not r.packed and r not in spread]
        if not geometry_problems(spread, configs, nodes // g * ranks) + geometry_problems(rest, configs, nodes * ranks):
            fits.append(g)
    return fits


def describe(launch: LaunchConfig, hosts: list[list], steps: dict[str, list[StageRun]], configs: dict) -> str:
    world = len(hosts[0]) * launch.ranks
    first = next(iter(steps.values()))[0]
    cfg = configs.get(first.out.resolve())
    geo = geometry(cfg, world) if cfg is not None else None
    geo = (f" ({first.name.split('/', 1)[1]}: {geo.micro_batch} per rank x {geo.grad_accum} micro-steps x {world} "
           f"ranks = {geo.global_batch})" if geo else "")
    return (f"launch.spread={launch.spread}: " + ", ".join(f"{len(rs)} {s} runs" for s, rs in steps.items()) +
            f" side by side on {len(hosts)} groups of {len(hosts[0])} node(s) x {launch.ranks} ranks ("
            + " | ".join(",".join(h.name for h in g) for g in hosts) + f"), master ports {launch.master_port}-"
            f"{launch.master_port + len(hosts) - 1}; global batch kept{geo}")


# ---------------------------------------------------------------- `mm-ds run`

@dataclasses.dataclass
class Group:
    index: int
    hosts: list
    hostfile: Path
    overrides: tuple[str, ...]
    """What makes a stage run this group's launch (after the run's own launch.* overrides)."""


def write_groups(launch: LaunchConfig, out: Path) -> list[Group]:
    """Each group's hostfile (its lines of launch.hostfile, comments dropped) under OUT/logs/spread/."""
    lines = Path(launch.hostfile).read_text().splitlines()
    found = []
    for k, hosts in enumerate(groups(launch)):
        path = (out / GROUP_DIR / f"group{k}.hosts").resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(lines[h.line - 1].split("#", 1)[0].strip() + "\n" for h in hosts))
        # deepspeed runs a one-node launch's ranks where it starts: a group of one other machine goes through the
        # runner (pdsh, ...) as several nodes do; one of this machine (loopback) runs here
        remote = launch.launcher == "deepspeed" and len(hosts) == 1 and not is_loopback(hosts[0].name)
        found.append(Group(k, hosts, path, (f"launch.hostfile={path}", f"launch.nodes={len(hosts)}",
                                            f"launch.master_port={launch.master_port + k}", "launch.master_addr=",
                                            *(["launch.force_multi=true"] if remote else []))))
    return found


def run_spread(todo: list[StageRun], recipe, out: Path, sequential, start_run=None) -> None:
    """Run `todo` (dependency order, the complete ones left out) step by step: a step with at least as many runs
    as groups side by side (`start_run`, default `start`), the others by `sequential(runs)` on every node
    (run.run_stages)."""
    launch = launch_of(recipe)
    groups_ = write_groups(launch, out)
    for stage in dict.fromkeys(r.stage for r in todo):
        mine = [r for r in todo if r.stage == stage]
        if stage in STEPS and len(mine) >= len(groups_):
            say(f"{stage}: {len(mine)} runs side by side on {len(groups_)} groups of {len(groups_[0].hosts)} node(s)")
            side_by_side(mine, groups_, logs_dir(out), start_run or start)
        else:
            if stage in STEPS:
                say(f"{stage}: {len(mine)} run(s) left, fewer than the {len(groups_)} groups: one after another on "
                    f"every node")
            sequential(mine)


def side_by_side(runs: list[StageRun], groups_: list[Group], logs: Path, start_run, poll_s: float = 1.0) -> None:
    """Each group takes the next run as it frees up. `start_run(run, group, log) -> (Popen, log offset) | None`
    (None: nothing to launch). A failed run stops new starts; the others finish; then the first failure is raised.
    Interrupted (Ctrl-C, a signal's exception), every run in flight is terminated: each resumes on the next run."""
    queue, running, failed = deque(runs), {}, []
    try:
        while running or queue and not failed:
            for g in groups_:
                while g.index not in running and queue and not failed:
                    run = queue.popleft()
                    log = logs / f"{run.name.replace('/', '_')}.log"
                    say(f"{run.name.partition('/')[2]}: on group {g.index} ({', '.join(h.name for h in g.hosts)})")
                    try:
                        started = start_run(run, g, log)
                    except ConfigError as e:  # refused before it started: the runs in flight go on
                        failed.append(e)
                        say(f"{e}; no further run starts, {len(running)} in flight finish first")
                        break
                    if started is not None:
                        follow = Follow([Watched(run.name.partition("/")[2], run.out, log, runs.index(run), len(runs))])
                        running[g.index] = (run, log, *started, follow)
            for k, (run, log, proc, offset, follow) in list(running.items()):
                follow.poll()
                if proc.poll() is None:
                    continue
                del running[k]
                if proc.returncode != 0:
                    failed.append(failure(run, proc, log, offset))
                    say(f"{run.name.partition('/')[2]} failed (log: {log}); no further run starts, "
                        f"{len(running)} in flight finish first")
            time.sleep(poll_s if running else 0)
    except BaseException:
        for _, _, proc, _, _ in running.values():
            proc.terminate()
        for _, _, proc, _, _ in running.values():
            proc.wait()
        raise
    if failed:
        raise failed[0]


def start(run: StageRun, group: Group, log: Path) -> tuple[subprocess.Popen, int] | None:
    """`run` on `group`'s nodes: resolved here as run._launch_stage resolves a stage, its ranks started by the
    launcher in the background on its run directory, output to `log`."""
    resume = bool(checkpoint.list_checkpoints(run.out))
    run = dataclasses.replace(run, overrides=(*run.overrides, *group.overrides))
    argv = run.argv + ["--no-progress"] + (["--resume"] if resume else [])
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f, contextlib.redirect_stdout(f):
        try:
            got = resolve(run, resume, resume_with=stop.resume_command(argv))
        except (ConfigError, checkpoint.CheckpointError, FileNotFoundError, ValueError) as e:
            raise ConfigError(f"stage {run.name}: {e}") from e
        if published_as_built(got):
            return None
    if resume:
        found = got.resume_from
        say(f"resume {run.name} from {found.name if found else 'step 0 (no checkpoint verifies)'}")
    cmd = rank_command(got.cfg.launch, got.run_dir)
    say(f"$ {' '.join(cmd)}")
    f = open(log, "a")  # noqa: SIM115 (the child holds it; closed below once started)
    offset = f.tell()
    try:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=launch_env(got.cfg.launch)), offset
    finally:
        f.close()


def failure(run: StageRun, proc: subprocess.Popen, log: Path, offset: int) -> StageFailed:
    """As progress.run_logged says it: the exit code, the log, its last lines of this attempt, what to do."""
    return failure_of(run.name, proc.returncode, log, offset)
