"""Bring-up as a rank sees it (mm_ds/runtime/distributed/bringup.py, mm_ds/runtime/distributed/dist.py init), on one
machine: which launcher's variables name a rank (a rank may carry several launchers' sets), where an srun step's ranks
meet (a stale or loopback MASTER_ADDR that sbatch exported), where rank 0 listens (a name with several addresses), how
long ranks wait for one another (a rank that never comes), two ranks on one GPU (CUDA stood in), and a stage's build
that fails on one rank. Across emulated nodes, with every launcher: tests/test_runners_on_nodes.py."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mm_ds.config import ConfigError, LaunchConfig
from mm_ds.runtime.distributed import bringup, dist, launch, rendezvous, srun, watchdog

ROOT = Path(__file__).resolve().parents[1]

SRUN_PMI2 = {"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
             "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NODELIST": "n[0-1]", "SLURM_STEP_NUM_NODES": "2",
             "SLURM_JOB_NODELIST": "n[0-1]", "PMI_RANK": "3", "PMI_SIZE": "4"}
"""Task 3 of `srun -N 2 -n 4` under MpiDefault=pmi2: PMI's variables beside SLURM's, with the same values."""


@pytest.fixture
def rank_env(monkeypatch):
    """A clean environment, without SLURM installed (the host list is expanded here)."""
    env = {"PATH": "/usr/bin:/bin"}
    monkeypatch.setattr(os, "environ", env)
    return env


# ---------------------------------------------------------------- whose variables name the rank

@pytest.mark.parametrize("given,launcher,place", [
    (SRUN_PMI2, "srun", (3, 4, 1, 2, "n0")),
    # hydra's mpiexec inside an allocation: its proxies are srun tasks (one a node), its ranks carry their SLURM
    # variables and their own PMI ones
    ({**SRUN_PMI2, "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
      "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "MASTER_ADDR": "n0"}, "MPICH/Intel MPI", (3, 4, 1, 2, "n0")),
    # OpenMPI's mpirun inside an allocation: its daemons are srun tasks likewise
    ({"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "0", "OMPI_COMM_WORLD_RANK": "3",
      "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
     "OpenMPI", (3, 4, 1, 2, None)),
    ({"MV2_COMM_WORLD_RANK": "2", "MV2_COMM_WORLD_SIZE": "4", "MV2_COMM_WORLD_LOCAL_RANK": "0",
      "MV2_COMM_WORLD_LOCAL_SIZE": "2", "PMI_RANK": "2", "PMI_SIZE": "4"}, "MVAPICH", (2, 4, 0, 2, None)),
    # DeepSpeed's launcher (and the mpich/impi runners' -env RANK): its own, whatever else is there
    ({**SRUN_PMI2, "RANK": "0", "WORLD_SIZE": "8", "LOCAL_RANK": "0", "LOCAL_SIZE": "4", "MASTER_ADDR": "n9"},
     "deepspeed/torchrun", (0, 8, 0, 4, "n9")),
    # a node of 3 tasks and one of 1: this node's entry
    ({**SRUN_PMI2, "SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURM_LOCALID": "0"}, "srun", (3, 4, 0, 1, "n0")),
])
def test_a_ranks_place_is_its_own_launchers(given, launcher, place):
    """Rank, world and local rank come from the variables of the launcher that started the process, never from
    MPI; an address only where the launcher gives one (None: to be told through MPI)."""
    here = bringup.place(given)
    assert here.launcher == launcher
    assert (here.rank, here.world, here.local_rank, here.local_world, here.master_addr) == place


def test_launch_and_bring_up_agree_on_what_makes_a_rank(rank_env):
    """launch.under_launcher (re-run under a launcher or not) reads the same table: an srun task is a rank, the
    batch script around it (SLURM_PROCID, no step) is not, an MVAPICH rank is."""
    rank_env.update(SLURM_PROCID="0", SLURM_JOB_NODELIST="n[0-1]")
    assert not launch.under_launcher()
    rank_env.update(SRUN_PMI2)
    assert launch.under_launcher()
    for k in SRUN_PMI2:
        rank_env.pop(k)
    rank_env.update(MV2_COMM_WORLD_RANK="1", MV2_COMM_WORLD_SIZE="2")
    assert launch.under_launcher() and bringup.RANK_VARS == launch.RANK_VARS
    rank_env.pop("MV2_COMM_WORLD_SIZE")  # a rank variable alone: a rank, whose launcher's set is incomplete
    with pytest.raises(ConfigError, match="MV2_COMM_WORLD_RANK is set but MV2_COMM_WORLD_SIZE is not"):
        rendezvous.adopt_env()
    assert {v for row in bringup.LAUNCHERS for v in (row.rank, row.world, row.local_rank, *row.local_world,
                                                     *((row.node,) if row.node else ()))} <= set(bringup.LAUNCHER_VARS)


def test_a_packed_run_started_by_any_launchers_rank_is_no_rank(rank_env):
    """Step 3's single-device runs drop their rank's launcher variables (mm_ds/pipeline/pack.py child_env): of every
    launcher in the table, or the child would join its parent's rendezvous."""
    from mm_ds.pipeline import pack

    for row in bringup.LAUNCHERS:
        rank_env.clear()
        rank_env.update(pack.child_env({row.rank: "1", row.world: "2", row.local_rank: "1", "PATH": "/bin",
                                        **dict.fromkeys(row.local_world, "2"), **SRUN_PMI2}, 1, None, 0)[0])
        assert not launch.under_launcher(), (row.name, rank_env)


ADOPT = """
import json, os, sys
from mm_ds.runtime.distributed import rendezvous
rendezvous.adopt_env()
print(json.dumps({k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
                 | {"mpi": "mpi4py" in sys.modules}))
"""


def test_an_srun_task_under_pmi2_takes_slurms_variables_not_mpi(tmp_path):
    """Under MpiDefault=pmi2 every srun task also has PMI_RANK/PMI_SIZE. Taken as an MPI launch, the task went to
    mpi4py, which saw a world of one: every task became rank 0 of 1, then rank 0 could not listen ("Address
    already in use"). It is task 3 of 4, on node n1, meeting at the step's first node, and MPI is not asked."""
    env = {k: v for k, v in os.environ.items() if k not in bringup.LAUNCHER_VARS} | SRUN_PMI2
    proc = subprocess.run([sys.executable, "-c", ADOPT], env=env, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = __import__("json").loads(proc.stdout.strip().splitlines()[-1])
    assert seen == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "n0", "mpi": False}, seen


# ---------------------------------------------------------------- where an srun step's ranks meet

def adopted(env: dict, **given: str) -> dict:
    """rendezvous.adopt_env() in a fresh task's environment: SRUN_PMI2 with `given` over it."""
    env.clear()
    env.update({"PATH": "/usr/bin:/bin", **SRUN_PMI2, **given})
    rendezvous.adopt_env()
    return env


def test_an_srun_step_meets_at_its_first_node_whatever_sbatch_exported(rank_env, capsys):
    """sbatch exports the submitting shell's environment: a MASTER_ADDR there (a past job's node, loopback from a
    one-node test) made nodes 1..N dial the wrong machine until the 30-minute timeout. The step's first node is
    taken, rank 0 says so once; what mm-ds itself chose (marked MM_DS_MASTER_ADDR) is kept."""
    env = adopted(rank_env, MASTER_ADDR="old-node7", MASTER_PORT="29511")
    assert env["MASTER_ADDR"] == "n0" and env["RANK"] == "3" and env["MASTER_PORT"] == "29511"
    assert capsys.readouterr().out == ""  # rank 3 says nothing
    task0 = {"SLURM_PROCID": "0", "PMI_RANK": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    assert adopted(rank_env, **task0, MASTER_ADDR="127.0.0.1")["MASTER_ADDR"] == "n0"
    said = capsys.readouterr().out
    assert said.count("MASTER_ADDR=127.0.0.1 came with the environment") == 1 and "meet at n0" in said, said
    # launch.master_addr, another name of n0 (mm-ds marks what it chose); the first node by its full name
    assert adopted(rank_env, **task0, MASTER_ADDR="n0-ib", MM_DS_MASTER_ADDR="n0-ib")["MASTER_ADDR"] == "n0-ib"
    assert adopted(rank_env, **task0, MASTER_ADDR="n0.cluster.local")["MASTER_ADDR"] == "n0.cluster.local"
    assert capsys.readouterr().out == ""


def test_a_loopback_rendezvous_on_a_step_of_several_nodes_stops_every_rank_at_once(rank_env):
    """Chosen loopback (marked as mm-ds's own) on a step of two nodes: each node's ranks would dial themselves.
    Every rank decides so from the same strings and stops, naming the address and the step's first node."""
    for task in ("0", "3"):
        with pytest.raises(ConfigError, match="MASTER_ADDR=localhost is loopback, but this srun step spans 2 nodes"):
            adopted(rank_env, SLURM_PROCID=task, PMI_RANK=task, MASTER_ADDR="localhost", MM_DS_MASTER_ADDR="localhost")
    one_node = adopted(rank_env, SLURM_STEP_NUM_NODES="1", SLURM_STEP_NODELIST="n0", SLURM_STEP_TASKS_PER_NODE="4",
                       MASTER_ADDR="localhost", MM_DS_MASTER_ADDR="localhost")
    assert one_node["MASTER_ADDR"] == "localhost"  # one node: loopback is right


def test_the_launcher_side_marks_the_address_it_chose(monkeypatch):
    monkeypatch.setenv(srun.MARKED, "stale-from-an-outer-launch")
    assert launch.launch_env(LaunchConfig(launcher="srun", nodes=2, ranks=4)).get(srun.MARKED) is None
    env = launch.launch_env(LaunchConfig(launcher="srun", nodes=2, ranks=4, master_addr="n0-ib"))
    assert env["MASTER_ADDR"] == env[srun.MARKED] == "n0-ib"


# ---------------------------------------------------------------- where rank 0 listens

class _Store:
    """TCPStore stand-in for one rank 0 whose peer has joined: the join's keys answer as if it had."""

    def __init__(self, *args, **kw):
        self.kw, self.data = kw, {}

    def set(self, k, v):
        self.data[k] = v.encode() if isinstance(v, str) else v

    def add(self, k, n):
        return 2 if k.endswith("count") else 0

    def multi_get(self, keys):
        return [self.data.get(keys[0]) or b'{"host": "a"}', b'{"host": "b", "local_world": 1}']

    def get(self, k):
        return self.data[k]

    def check(self, keys):
        return True

    def set_timeout(self, t):
        self.timeout = t


def test_rank0_listens_on_every_interface_when_its_name_has_several_addresses(monkeypatch):
    """A multi-homed rank 0: its name resolves to two addresses and another node may reach it at either. Rank 0
    bound the first only (here one this machine does not hold, so the bind itself failed; on a cluster the
    other node's connection was refused until the 30-minute timeout). It listens on every interface."""
    real = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **kw: [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.7", a[0] if a else 0)),
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", a[0] if a else 0))]
        if host == "rank0.multi" else real(host, *a, **kw))
    monkeypatch.setattr(os, "environ", {"PATH": "/usr/bin", "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                                        "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "rank0.multi",
                                        "MASTER_PORT": str(dist.free_port())})
    monkeypatch.setattr(torch.distributed, "TCPStore", _Store)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **kw: None)
    monkeypatch.setattr(rendezvous, "_gloo_interface", lambda *a, **kw: None)
    monkeypatch.setattr("deepspeed.init_distributed", lambda **kw: None)
    monkeypatch.setattr(dist, "keep_freed_memory", lambda: None)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(watchdog, "start", lambda rank: [])
    dist.init()
    assert rendezvous._RENDEZVOUS_SOCKET.getsockname()[0] in ("0.0.0.0", "::")
    rendezvous._RENDEZVOUS_SOCKET.close()


def test_where_rank0_listens():
    """An IP literal binds that address, a world on one node MASTER_ADDR's first address; across nodes a name
    that resolves to loopback here (Debian's 127.0.1.1) or to several addresses listens on every interface."""
    def res(*ips):
        return [(socket.AF_INET6 if ":" in ip else socket.AF_INET, 1, 6, "", (ip, 1)) for ip in ips]

    assert bringup.listen_on("10.0.0.5", res("10.0.0.5"), True)[1:] == ("10.0.0.5", "")
    assert bringup.listen_on("n0", res("10.0.0.5", "10.1.0.5"), False)[1:] == ("10.0.0.5", "")
    assert bringup.listen_on("n0", res("10.0.0.5"), True)[1:] == ("10.0.0.5", "")
    assert bringup.listen_on("n0", res("127.0.1.1"), True)[1] == "0.0.0.0"
    family, where, why = bringup.listen_on("n0", res("10.0.0.5", "fd00::5"), True)
    assert (family, where) == (socket.AF_INET6, "::") and "10.0.0.5, fd00::5" in why
    assert bringup.listen_on("localhost", res("127.0.0.1", "::1"), True)[1] == "127.0.0.1"


# ---------------------------------------------------------------- how long ranks wait for one another

@pytest.mark.parametrize("alone,says", [
    (0, "rank 0 stopped: 1 of 2 ranks never joined the rendezvous in 4 s: node 1: rank 1 (placing 1 rank a node)"),
    (1, "rank 1: rank 0's rendezvous at 127.0.0.1:"),
])
@pytest.mark.ranks
def test_a_rank_whose_peer_never_starts_stops_within_the_rendezvous_timeout(tmp_path, alone, says):
    """One rank of two started (the other's node never ran its command): it waited for the 30-minute collective
    timeout. With launch.rendezvous_timeout_s it stops then, saying which rank never came (rank 0), or that rank
    0 never answered (rank 1)."""
    env = os.environ | {"RANK": str(alone), "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(dist.free_port())}
    proc = subprocess.run([sys.executable, "-m", "mm_ds.cli", "pretrain", "--preset", "tiny/minijoint", "--out",
                           str(tmp_path / "run"), "data.corpus=/nowhere", "launch.rendezvous_timeout_s=4"],
                          env=env, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def test_the_launch_timeouts_reach_the_store_and_the_process_group(monkeypatch):
    seen = {}
    monkeypatch.setattr(os, "environ", {"PATH": "/usr/bin"})
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **kw: seen.update(kw))
    monkeypatch.setattr("deepspeed.init_distributed", lambda **kw: None)
    monkeypatch.setattr(dist, "keep_freed_memory", lambda: None)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(watchdog, "start", lambda rank: [])
    dist.init(LaunchConfig(rendezvous_timeout_s=7, collective_timeout_s=77))
    assert seen["timeout"].total_seconds() == 77 and rendezvous.store().timeout.total_seconds() == 77
    rendezvous._RENDEZVOUS_SOCKET.close()


# ---------------------------------------------------------------- two ranks of a node on one GPU

FAKE_GPUS = """
import sys, types
import deepspeed, torch  # DeepSpeed has found no GPU: its accelerator stays the CPU's, the process group gloo
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: {count}
torch.cuda.set_device = lambda i: None
torch.cuda.get_device_properties = lambda i: types.SimpleNamespace(uuid="GPU-" + ({uuids})[i])
from mm_ds.runtime.distributed import dist
dist.init()
print("formed", dist.rank(), flush=True)
dist.finish(0)
"""


def fake_gpu_ranks(world: int, count: int, uuids: str) -> list[subprocess.CompletedProcess]:
    """`world` ranks of one node, each seeing `count` GPUs (torch.cuda stood in) named by `uuids` (Python)."""
    port, procs = dist.free_port(), []
    for r in range(world):
        env = {k: v for k, v in os.environ.items() if k not in bringup.LAUNCHER_VARS} | {
            "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, "-c", FAKE_GPUS.format(count=count, uuids=uuids)], env=env,
                                      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    out = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
        out.append(subprocess.CompletedProcess(p.args, p.returncode, o, e))
    return out


@pytest.mark.ranks
def test_more_ranks_on_a_node_than_its_gpus_stop_at_bring_up_on_every_rank():
    """Three ranks on a node whose every rank sees the same two GPUs: `local_rank % 2` put ranks 0 and 2 on GPU 0
    and NCCL stopped at the first collective ("duplicate GPU"), with nothing saying why (DeepSpeed's slurm runner
    gave srun no --ntasks-per-node). Every rank stops at bring-up saying which ranks share a GPU and the fix."""
    ranks = fake_gpu_ranks(3, 2, '"a", "b"')
    for r in ranks:
        assert r.returncode != 0 and "ranks 0, 2 take the same GPU" in r.stderr and "--gpus-per-task=1" in r.stderr, \
            r.stderr[-3000:]


def test_one_gpu_per_task_stays_allowed():
    """`srun --gpus-per-task=1`: each task sees one GPU of its own (its index 0), however many tasks a node runs."""
    for r, (count, uuid) in enumerate([(1, "a"), (1, "b")]):
        records = [{"host": "n0", "device": {"count": 1, "index": 0, "uuid": u}} for u in ("a", "b")]
    assert bringup.device_problem(records) == ""
    shared = [{"host": "n0", "device": {"count": 1, "index": 0, "uuid": "a"}}] * 2  # one GPU, two tasks
    assert "ranks 0-1 take the same GPU" in bringup.device_problem(shared)
    unnamed = [{"host": "n0", "device": {"count": 2, "index": i % 2, "uuid": ""}} for i in range(3)]
    assert "3 ranks share the 2 GPUs" in bringup.device_problem(unnamed)
    assert bringup.device_problem([{"host": f"n{i}", "device": {"count": 1, "index": 0, "uuid": "a"}}
                                   for i in range(2)]) == ""  # the same model on two nodes is two GPUs


# ---------------------------------------------------------------- a stage's build that fails on one rank

def test_a_build_that_fails_on_another_rank_stops_this_one_before_training(monkeypatch, tmp_path):
    """One node cannot read a file the stage's build needs: its ranks fail there, the others went on into the
    engine's collectives and relied on the process group to notice. They stop, saying another rank failed."""
    from mm_ds import config
    from mm_ds.runtime.training.resolved import Resolved
    from mm_ds.stages import runner

    trained, failed = [], iter([False, True])  # reading the run directory went well; rank 1's build failed
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(dist, "init", lambda *a, **kw: (0, 0, 2))
    monkeypatch.setattr(dist, "any_rank", lambda flag: next(failed))
    monkeypatch.setattr("mm_ds.runtime.training.engine.train", lambda *a, **kw: trained.append(1))
    monkeypatch.setattr("mm_ds.stages.pretrain.build", lambda cfg: object())
    got = Resolved(tmp_path / "run", config.load("tiny/minijoint"), None, None, 2)
    with pytest.raises(dist.OtherRankFailed, match="another rank failed building the stage"):
        runner.train_run(tmp_path / "run", got)
    assert not trained
