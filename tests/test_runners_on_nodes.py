"""Every launcher's real command, executed across two emulated nodes of two ranks each (tests/support/netns.py).

`mm-ds probe` runs on node 0 as a user would type it: it builds the launcher's command with
`mm_ds.runtime.distributed.launch.command` and runs it for real. For `launch.launcher=deepspeed` that is DeepSpeed's own
`runner.main`, which builds its pdsh, openmpi, mpich, impi, mvapich or slurm runner from mm-ds's arguments and
runs the command that runner produces; the tools it calls are tests/standins (ssh, pdsh, srun, sinfo,
scontrol, hydra's mpirun, mpiname; each says what it emulates and what not) or real (OpenMPI's mpirun, its
daemons started through the ssh stand-in). Each rank comes up as a stage's does (mm_ds/rank.py, `dist.init`),
and rank 0 lists every rank's host and local rank; then all run one all-reduce. Each launcher must form the
world, 2 nodes x 2 ranks with local ranks 0, 1 on each, or mm-ds must refuse it before anything starts, saying
why. Then the SLURM site's quirks (tests/standins/srun): PMI_RANK beside SLURM's variables, a stale and a
loopback MASTER_ADDR in the environment sbatch exports, a node whose Python environment is missing.

Each launch is bounded (TIMEOUT_S); the wall time of each is printed (`pytest -s`).
"""

import re
import time
from pathlib import Path

import pytest

from standins import cluster
from support.netns import MM_DS, STANDINS, Nodes, cluster_env, launch, login_env, nodes_or_skip, python_without_openmpi
from test_launchers import free_port

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 240  # a probe launch takes ~15 s on 2 quiet cores; a hang would wait for the rendezvous timeout
OPENMPI = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",  # tests run as root
           "PRTE_MCA_plm_ssh_agent": str(STANDINS / "ssh")}  # OpenMPI 5 (PRRTE) starts its daemons with ssh


@pytest.fixture
def nodes():
    yield from nodes_or_skip(2)


def in_allocation(nodes: Nodes) -> dict[str, str]:
    """What a batch script on the allocation's first node sees (sbatch -N 2): srun's allocation."""
    names = cluster.compress([n.name for n in nodes.nodes])
    return {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": names, "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2",
            "SLURM_CPUS_ON_NODE": "2"}


# launcher -> (launch overrides, cluster map settings, hydra's mpirun on PATH, the launching shell's extra variables)
RUNNERS = {
    "deepspeed pdsh": (["launch.ds_launcher=pdsh"], {}, False, {}),
    "deepspeed openmpi": (["launch.ds_launcher=openmpi"], {}, False, OPENMPI),
    "deepspeed mpich": (["launch.ds_launcher=mpich"], {"mpi": "mpich"}, True, {}),
    "deepspeed impi": (["launch.ds_launcher=impi"], {"mpi": "impi"}, True, {}),
    "deepspeed mvapich": (["launch.ds_launcher=mvapich"], {"mpi": "mvapich"}, True, {}),
    "deepspeed slurm": (["launch.ds_launcher=slurm"], {}, False, "allocation"),
    "mpirun": (["launch.launcher=mpirun"], {}, False, OPENMPI),
    # srun under MpiDefault=pmi2 (PMI_RANK/PMI_SIZE beside SLURM's), with a stale MASTER_ADDR exported by sbatch
    "srun": (["launch.launcher=srun"], {"pmi": "pmi2"}, False, "allocation, stale MASTER_ADDR"),
}


def probe(nodes: Nodes, tmp_path: Path, overrides: list[str], settings: dict, hydra: bool, shell: dict | str,
          timeout_s: float = TIMEOUT_S, node_by_node: bool = False):
    """`mm-ds probe` on node 0 (on each node with its launch.node_rank: `node_by_node`): exit codes, output, wall."""
    hosts = nodes.hostfile(tmp_path / "hosts")
    cluster_map = nodes.write_map(tmp_path / "cluster.json", login_env(), **settings)
    extra = OPENMPI if shell == OPENMPI else {}
    if isinstance(shell, str):
        extra = in_allocation(nodes) | ({"MASTER_ADDR": nodes[1].name} if "stale" in shell else {}) | \
            ({"MASTER_ADDR": "127.0.0.1"} if "loopback" in shell else {})
    srun = "launch.launcher=srun" in overrides
    mm_ds = [python_without_openmpi(tmp_path / "mpich-site"), *MM_DS[1:]] if hydra else MM_DS
    argv = [*mm_ds, "probe", "launch.nodes=2", "launch.ranks=2", f"launch.master_port={free_port()}",
            *([] if srun else [f"launch.hostfile={hosts}"]), *overrides]
    env = cluster_env(cluster_map, hydra, **extra)
    commands = {k: ([*argv, f"launch.node_rank={k}"], env) for k in (0, 1)} if node_by_node else {0: (argv, env)}
    return launch(nodes, commands, tmp_path / "logs", timeout_s, ROOT)


ROW = re.compile(r"rank +(\d+) +node (\d+) (\S+) +local (\d+)/(\S+)")


def assert_world(output: str, world: int = 4, per_node: int = 2) -> list[tuple]:
    """Rank 0's table: every rank on its node (ranks 0-1 on node 0, 2-3 on node 1), local ranks 0..per_node-1 on
    each, and the all-reduce right."""
    rows = [(int(r), int(n), h, int(lr), lw) for r, n, h, lr, lw in ROW.findall(output)]
    assert [r[0] for r in rows] == list(range(world)), output[-6000:]
    assert [(r[1], r[3]) for r in rows] == [(k // per_node, k % per_node) for k in range(world)], rows
    assert all(lw == str(per_node) for *_, lw in rows), rows
    assert f"all_reduce over {world} rank(s): {world * (world + 1) // 2} (ok)" in output, output[-3000:]
    return rows


def refused_before_launch(ran) -> bool:
    """mm-ds stopped before starting anything, saying why: exit 2 with an error, no launcher command run."""
    return ran.codes == [2] and "error:" in ran.output and "[mm-ds] launching:" not in ran.output


@pytest.mark.ranks
@pytest.mark.parametrize("name", RUNNERS)
def test_each_launcher_forms_the_world_across_nodes(nodes, tmp_path, name):
    overrides, settings, hydra, shell = RUNNERS[name]
    ran = probe(nodes, tmp_path, overrides, settings, hydra, shell)
    print(f"{name}: {ran.wall_s:.1f} s, exit {ran.codes}")
    assert not ran.hung, f"{name} hung: still running after {TIMEOUT_S} s\n{ran.output[-8000:]}"
    if refused_before_launch(ran):  # mm-ds names why this runner cannot start here
        print(f"{name}: refused before launch: {ran.output.strip().splitlines()[-1]}")
        return
    assert ran.codes == [0], f"{name}: exit {ran.codes}\n{ran.output[-8000:]}"
    rows = assert_world(ran.output)
    assert [r[2] for r in rows] == [nodes[0].name] * 2 + [nodes[1].name] * 2, rows
    if "stale" in str(shell):  # said once, by rank 0, and not used
        assert ran.output.count(f"MASTER_ADDR={nodes[1].name} came with the environment") == 1, ran.output[-6000:]


@pytest.mark.ranks
def test_deepspeed_no_ssh_node_by_node(nodes, tmp_path):
    """`deepspeed --no_ssh --node_rank K`: the same `mm-ds probe` typed on each node."""
    ran = probe(nodes, tmp_path, [], {}, False, {}, node_by_node=True)
    print(f"deepspeed --no_ssh: {ran.wall_s:.1f} s, exit {ran.codes}")
    assert ran.codes == [0, 0], ran.output[-8000:]
    assert_world(ran.output)


# ---------------------------------------------------------------- the SLURM site

@pytest.mark.ranks
def test_a_loopback_master_addr_from_the_environment_is_not_used_under_srun(nodes, tmp_path):
    """sbatch exported the submitting shell's MASTER_ADDR=127.0.0.1 (a single-node test there): under a step of two
    nodes each node would dial itself. The ranks meet at the step's first node instead, and rank 0 says so."""
    ran = probe(nodes, tmp_path, ["launch.launcher=srun"], {}, False, "allocation, loopback MASTER_ADDR")
    print(f"srun, loopback MASTER_ADDR: {ran.wall_s:.1f} s, exit {ran.codes}")
    assert ran.codes == [0], ran.output[-8000:]
    assert_world(ran.output)
    assert ran.output.count("MASTER_ADDR=127.0.0.1 came with the environment") == 1, ran.output[-6000:]


@pytest.mark.ranks
def test_a_node_whose_ranks_never_start_stops_the_others_in_seconds(nodes, tmp_path):
    """DeepSpeed's slurm runner (srun without --kill-on-bad-exit) on two nodes, node 1 without the Python
    environment: its tasks never start, srun waits for node 0's. Those stop after launch.rendezvous_timeout_s,
    naming node 1 and its ranks, instead of waiting 30 minutes in the first collective."""
    wait_s = 20
    started = time.monotonic()
    ran = probe(nodes, tmp_path, ["launch.ds_launcher=slurm", f"launch.rendezvous_timeout_s={wait_s}"],
                {"broken": {nodes[1].name: "no Python environment"}}, False, "allocation", timeout_s=wait_s + 120)
    print(f"a node that never starts: {ran.wall_s:.1f} s, exit {ran.codes}")
    assert not ran.hung and ran.codes != [0], ran.output[-8000:]
    named = f"2 of 4 ranks never joined the rendezvous in {wait_s} s: node 1 ({nodes[1].name}): ranks 2-3"
    assert ran.output.count(named) == 2, ran.output[-8000:]  # each of node 0's ranks says it
    assert time.monotonic() - started < wait_s + 90
