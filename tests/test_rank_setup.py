"""A rank's own set-up in `dist.init()` / `dist.finish()`, with what this CPU machine lacks stood in: CUDA (a task
that sees one GPU), a 16-CPU node, W&B. The process group itself is not started (its bring-up is covered by
the multi-rank tests): `dist.init` runs with the rendezvous and DeepSpeed's init replaced."""

import os
import subprocess
import sys
import types

import pytest
import torch

from mm_ds.runtime.distributed import dist, rendezvous, watchdog

SRUN_TASK_5_OF_8 = {"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "5",
                    "SLURM_STEP_TASKS_PER_NODE": "8", "SLURM_STEP_NODELIST": "gpu1", "SLURM_STEP_NUM_NODES": "1",
                    "MASTER_ADDR": "gpu1", "MASTER_PORT": "29500"}


@pytest.fixture
def rank_env(monkeypatch):
    """A clean environment of a rank, a 16-CPU affinity, and dist.init's process-group steps recorded."""
    seen = {"set_device": [], "threads": [], "popen": []}
    env = {"PATH": os.environ["PATH"]}
    monkeypatch.setattr(os, "environ", env)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setattr(torch, "set_num_threads", seen["threads"].append)
    monkeypatch.setattr(rendezvous, "meet", lambda here, launch: None)
    monkeypatch.setattr(rendezvous, "start_group", lambda store, here, launch: None)
    monkeypatch.setattr("deepspeed.init_distributed", lambda **kw: None)
    monkeypatch.setattr(dist, "keep_freed_memory", lambda: None)
    # The launcher chain of a rank under DeepSpeed's launcher; the watcher process is recorded, not started.
    monkeypatch.setattr(watchdog, "launcher_chain", lambda pid=None: [(1234, "99", "python -m deepspeed.launcher")])
    monkeypatch.setattr("subprocess.Popen", lambda args, **kw: seen["popen"].append(args))
    monkeypatch.setattr(watchdog, "_WATCHED", {}, raising=False)  # a fresh process
    return env, seen


def one_visible_gpu(monkeypatch, seen):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", seen["set_device"].append)


def test_srun_task_that_sees_one_gpu_takes_it(rank_env, monkeypatch):
    """`srun --gpus-per-task=1`: SLURM_LOCALID=5, one visible device. set_device(5) would be an invalid ordinal;
    DeepSpeed's engine takes LOCAL_RANK as its device, so that is made 0 too."""
    env, seen = rank_env
    env.update(SRUN_TASK_5_OF_8)
    one_visible_gpu(monkeypatch, seen)
    dist.init()
    assert seen["set_device"] == [0] and env["LOCAL_RANK"] == "0" and env["RANK"] == "5"


def test_gpu_ranks_share_the_node_cpus(rank_env, monkeypatch):
    """8 GPU ranks of a 16-CPU node: 2 threads each (each started all-core pools). CPU ranks likewise; a task's
    `--cpus-per-task` and a user's OMP_NUM_THREADS win."""
    env, seen = rank_env
    env.update(RANK="3", LOCAL_RANK="3", WORLD_SIZE="16", LOCAL_SIZE="8", MASTER_ADDR="node0", MASTER_PORT="29500")
    one_visible_gpu(monkeypatch, seen)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    dist.init()
    assert seen["set_device"] == [3] and seen["threads"] == [2]
    assert dist.set_threads(local_world=8) and seen["threads"][-1] == 2
    env.update(SLURM_CPUS_PER_TASK="6", SLURM_PROCID="3", SLURM_STEP_NUM_TASKS="16")  # an srun task's own
    dist.set_threads(local_world=8)
    assert seen["threads"][-1] == 6
    env["OMP_NUM_THREADS"] = "3"
    dist.set_threads(local_world=8)
    assert len(seen["threads"]) == 3  # not set again: torch took OMP_NUM_THREADS at start


def test_one_watchdog_however_often_init_runs(rank_env):
    """`mm-ds run`'s one job calls dist.init() once per stage: one watcher process per rank all the same."""
    env, seen = rank_env
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", LOCAL_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    for _ in range(3):
        dist.init()
    watchers = [a for a in seen["popen"] if any(str(x).endswith("watchdog.py") for x in a)]
    assert len(watchers) == 1 and watchers[0][-1] == "1234:99", seen["popen"]


def test_finish_ends_the_wandb_run_before_leaving(monkeypatch):
    """dist.finish leaves through os._exit, which skips W&B's exit hook: the live run is finished first."""
    order = []

    class Run:
        def finish(self):
            order.append("wandb")
            wandb.run = None

    wandb = types.SimpleNamespace(run=Run())
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "barrier", lambda: order.append("barrier"))
    monkeypatch.setattr(torch.distributed, "destroy_process_group", lambda: order.append("destroy"))

    def leave(rc):
        order.append(f"exit {rc}")
        raise SystemExit(rc)

    monkeypatch.setattr(os, "_exit", leave)
    with pytest.raises(SystemExit):
        dist.finish(0)
    assert order == ["wandb", "barrier", "destroy", "exit 0"], order


LEAVE_WITH_WANDB = """
import sys, types
from mm_ds.runtime.distributed import dist
class Run:
    def finish(self):
        print("wandb finished", flush=True)
sys.modules["wandb"] = types.SimpleNamespace(run=Run())  # the run DeepSpeed's monitor started
dist.is_initialized = lambda: True  # a launched rank (RANK is set), without its process group
dist.barrier = lambda: print("barrier", flush=True)
dist.leave(3)
print("not reached")
"""


@pytest.mark.ranks
def test_a_failed_rank_ends_the_wandb_run_before_it_leaves():
    """dist.leave (the command failed) exits through os._exit as well, in a process of its own here: the live W&B
    run is finished first, and no barrier is entered (the other ranks may be gone)."""
    proc = subprocess.run([sys.executable, "-c", LEAVE_WITH_WANDB], env=os.environ | {"RANK": "0"},
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (3, "wandb finished\n"), (proc.returncode, proc.stdout, proc.stderr)


@pytest.mark.parametrize("argv", [["pretrain", "--preset", "tiny/no-such-system"],
                                  ["pretrain", "--preset", "tiny/bl_base", "data.corpus=/nowhere"]])
def test_a_failed_rank_leaves_at_once_with_its_error_code(monkeypatch, tmp_path, capsys, argv):
    """A launched rank whose command failed exits through `dist.leave`: no barrier (its peers may be gone) and no
    interpreter finalization, where gloo's threads abort it (SIGABRT, not the error's code)."""
    from mm_ds import cli

    order = []
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "barrier", lambda: order.append("barrier"))

    def leave(code):
        order.append(f"exit {code}")
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", leave)
    with pytest.raises(SystemExit):
        cli.main([*argv, "--out", str(tmp_path / "run")])
    assert order == ["exit 2"], order
    assert "error:" in capsys.readouterr().err


# ---------------------------------------------------------------- each rank's CPUs, launcher by launcher

DS_RANK = {"RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "16", "LOCAL_SIZE": "8", "MASTER_ADDR": "n1",
           "MASTER_PORT": "29500"}  # DeepSpeed's launcher on each node
MPI_RANK = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_LOCAL_RANK": "3",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "8", "MASTER_ADDR": "n1", "MASTER_PORT": "29500"}  # mpirun, with -x MASTER_*
SRUN_TASK = {"SLURM_PROCID": "3", "SLURM_LOCALID": "3", "SLURM_STEP_NUM_TASKS": "16",
             "SLURM_STEP_TASKS_PER_NODE": "8(x2)", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NODELIST": "n[1-2]",
             "SLURM_NODEID": "0"}
IN_A_JOB = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_CPUS_PER_TASK": "16", "SLURM_CPUS_ON_NODE": "16"}
"""The batch step of `sbatch -N 2 -c 16 --wrap "mm-ds ..."`: its one task has the node's 16 CPUs."""

# 16 ranks on 2 nodes of 16 CPUs: each rank's share is 2 CPUs and 2 threads. Per launcher: the launching shell's
# SLURM variables, what the command must ask its launcher for, what a rank it starts sees (the launcher's
# variables, over the shell's, which it inherits) and how many CPUs it may run on; its threads.
LAUNCHES = {
    "deepspeed (pdsh)": ({}, {}, None, DS_RANK, 16, 2),  # DeepSpeed's launcher on each node binds nothing
    "deepspeed (pdsh) in a batch job": ({}, IN_A_JOB, None, DS_RANK, 16, 2),  # the job's -c 16 is not a rank's
    "deepspeed's openmpi runner": ({"ds_launcher": "openmpi"}, {}, "--bind-to none", MPI_RANK, 16, 2),
    "deepspeed's slurm runner": ({"ds_launcher": "slurm"}, {"SLURM_CPUS_ON_NODE": "16"},
                                 "--cpus-per-task=2", SRUN_TASK | {"SLURM_CPUS_PER_TASK": "2"}, 2, 2),
    "mpirun": ({"launcher": "mpirun"}, {}, "--bind-to none", MPI_RANK, 16, 2),
    "mpirun in a batch job": ({"launcher": "mpirun"}, IN_A_JOB, "--bind-to none", MPI_RANK, 16, 2),
    "srun, -c 2 given to sbatch": ({"launcher": "srun"}, {"SLURM_CPUS_PER_TASK": "2", "SLURM_CPUS_ON_NODE": "16"},
                                   "--cpus-per-task=2", SRUN_TASK | {"SLURM_CPUS_PER_TASK": "2"}, 2, 2),
    "srun, whole nodes": ({"launcher": "srun"}, {"SLURM_CPUS_ON_NODE": "16"}, "--cpus-per-task=2",
                          SRUN_TASK | {"SLURM_CPUS_PER_TASK": "2"}, 2, 2),
    "srun, nothing known": ({"launcher": "srun"}, {}, None, SRUN_TASK, 1, 1),  # srun's default: a CPU a task
}


@pytest.mark.parametrize("name", LAUNCHES)
def test_each_launcher_gives_its_ranks_their_share_of_the_cpus(rank_env, monkeypatch, tmp_path, name):
    """8 ranks a node each starting all-core thread pools fought over the cores: each launcher's command gives a
    rank its CPUs (or leaves every rank all of them), and the rank's thread pools take its share."""
    from mm_ds.config import LaunchConfig
    from mm_ds.runtime.distributed import launch

    launch_cfg, shell, asks, rank_vars, cpus, threads = LAUNCHES[name]
    env, seen = rank_env
    (tmp_path / "srun").write_text("#!/bin/sh\n")  # the command line is what is tested, SLURM installed or not
    (tmp_path / "srun").chmod(0o755)
    (tmp_path / "hosts").write_text("10.0.0.1 slots=8\n10.0.0.2 slots=8\n")  # addresses: the openmpi runner resolves them
    env.update(shell, PATH=f"{tmp_path}{os.pathsep}{env['PATH']}")
    hosts = "" if launch_cfg.get("launcher") == "srun" else str(tmp_path / "hosts")  # srun: the allocation's
    cfg = LaunchConfig(ranks=8, nodes=2, hostfile=hosts, master_addr="n1", **launch_cfg)
    cmd = launch.command(cfg, ["pretrain"])
    line = " ".join(cmd)
    if cmd[0].endswith("deepspeed"):  # what its runner passes its mpirun or srun, as it parses the command
        from deepspeed.launcher.runner import parse_args
        ds = parse_args(cmd[1:])
        line = ds.launcher_args + (" --bind_cores_to_rank" if ds.bind_cores_to_rank else "")
    assert (asks in line) if asks else ("cpus-per-task" not in line and "bind" not in line), line
    env.update(rank_vars)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    dist.init()
    assert seen["threads"] == [threads]


@pytest.mark.ranks
def test_the_batch_script_gives_each_task_its_cpus(tmp_path):
    """launchers/slurm.sbatch asks srun for what `launch.launcher=srun` asks (srun inherits no --cpus-per-task)."""
    from test_launchers import ROOT, fake_slurm_bin

    bin_dir, log = fake_slurm_bin(tmp_path), tmp_path / "srun.args"
    job = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_SRUN_LOG": str(log), "PYTHON": "true",
           "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS_PER_NODE": "8"}
    for batch, asks in (({"SLURM_CPUS_PER_TASK": "6", "SLURM_CPUS_ON_NODE": "16"}, "--cpus-per-task=6"),
                        ({"SLURM_CPUS_ON_NODE": "16"}, "--cpus-per-task=2"), ({}, None)):
        subprocess.run(["bash", "launchers/slurm.sbatch", "pretrain"], cwd=ROOT, env=job | batch, check=True)
        args = log.read_text()
        assert (asks in args.split()) if asks else "cpus-per-task" not in args, (batch, args)


@pytest.mark.ranks
def test_the_hostfile_script_gives_each_rank_its_cpus(tmp_path):
    """launchers/deepspeed_hostfile.sh passes DeepSpeed's openmpi and slurm runners what `mm-ds` passes them (its
    CHECK=1 prints the command it would run)."""
    import shlex

    from test_launchers import ROOT, fake_slurm_bin, free_port

    hosts, tools = tmp_path / "hosts", fake_slurm_bin(tmp_path)  # srun and sinfo: looked for, not run
    hosts.write_text("127.0.0.1 slots=2\n127.0.0.2 slots=2\n")  # two "nodes", both this machine
    (tools / "pdsh").write_text("#!/bin/sh\n")
    (tools / "pdsh").chmod(0o755)
    for launcher, asks in (("openmpi", "--launcher_args=--bind-to none"),
                           ("slurm", "--launcher_args=--ntasks-per-node=2 --cpus-per-task=2"), ("pdsh", None)):
        proc = subprocess.run(["bash", "launchers/deepspeed_hostfile.sh", "pretrain", "--preset", "tiny/pretrain",
                               "--out", str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True,
                              env=os.environ | {"HOSTFILE": str(hosts), "LAUNCHER": launcher, "CHECK": "1",
                                                "PYTHON": sys.executable, "PATH": f"{tools}:{os.environ['PATH']}",
                                                "MASTER_PORT": str(free_port()), "SLURM_CPUS_ON_NODE": "4"})
        assert proc.returncode == 0, proc.stderr
        args = shlex.split(proc.stdout.split("would run: ")[1])
        assert any(a.startswith(asks) for a in args) if asks else not [a for a in args if "launcher_args" in a], args
        assert ("--no_ssh_check" in args) == (launcher == "slurm"), (launcher, args)  # as `mm-ds` launches it
        assert "" not in args, (launcher, args)  # no empty argument where there is nothing to pass
