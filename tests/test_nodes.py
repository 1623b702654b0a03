"""Two nodes on one machine (tests/support/netns.py: a network namespace, a host name and an /etc/hosts per node, the
Debian-style "127.0.1.1 <own name>" line included), each node's processes started with only what a remote node
receives, two ranks on each. A stage completes and resumes

- under `deepspeed --no_ssh --node_rank K`: one `mm-ds ... launch.node_rank=K` per node, no master address given;
- under `mpirun` started on node 0, its daemon on node 1 started through the ssh stand-in (tests/standins/ssh:
  it enters node 1's namespace with a login's environment), so node 1's ranks get only what `-x` names.

A rank that dials 127.0.0.1 for another node, listens or advertises on loopback, or decides a collective from
a variable that does not reach every node hangs here as on a cluster: each launch is bounded (TIMEOUT_S).
Every other launcher, and the SLURM site's quirks: tests/test_runners_on_nodes.py.
"""

from pathlib import Path

import pytest

from support.netns import MM_DS, STANDINS, Nodes, cluster_env, launch, login_env, nodes_or_skip, remote_env
from test_launchers import assert_trained_and_resumed, free_port, stage_args

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 240  # a launch of the tiny stage on 4 ranks takes ~40 s on 2 quiet cores; a hang would wait 30 minutes


@pytest.fixture
def nodes():
    yield from nodes_or_skip(2)


def run_on_nodes(nodes: Nodes, commands: dict[int, tuple[list[str], dict]], logs: Path) -> str:
    """Start each node's command, wait for all (bounded), return their output; fail on a hang or an error."""
    ran = launch(nodes, commands, logs, TIMEOUT_S, ROOT)
    print(f"{logs.name}: {ran.wall_s:.1f} s")
    if ran.hung:
        pytest.fail(f"hung: still running after {TIMEOUT_S} s\n{ran.output[-6000:]}")
    assert all(c == 0 for c in ran.codes), ran.output[-6000:]
    return ran.output


@pytest.mark.ranks
def test_deepspeed_no_ssh_on_two_nodes(nodes, corpus, tmp_path):
    """`deepspeed --no_ssh --node_rank K` per node; the master address is left to mm-ds (the hostfile's first host,
    which node 0 resolves to 127.0.1.1 and node 1 to node 0's address)."""
    hosts, run, port = nodes.hostfile(tmp_path / "hosts"), tmp_path / "run", free_port()

    def on_node(k: int, *extra: str) -> tuple[list[str], dict]:
        return ([*MM_DS, *stage_args(corpus, run, *extra), f"launch.hostfile={hosts}",
                 "launch.nodes=2", "launch.ranks=2", f"launch.node_rank={k}", f"launch.master_port={port}"],
                remote_env())

    run_on_nodes(nodes, {k: on_node(k, "train.steps=10") for k in (0, 1)}, tmp_path / "first")
    out = run_on_nodes(nodes, {k: on_node(k, "train.steps=15", "--resume") for k in (0, 1)}, tmp_path / "resumed")
    assert_trained_and_resumed(run, 15, 4, out)


@pytest.mark.ranks
def test_mpirun_on_two_nodes_through_ssh(nodes, corpus, tmp_path):
    """mpirun on node 0 with a hostfile of both nodes; node 1's daemon and ranks start through the ssh stand-in."""
    hosts, run = nodes.hostfile(tmp_path / "hosts"), tmp_path / "run"
    cluster_map = nodes.write_map(tmp_path / "cluster.json", login_env())
    env = cluster_env(cluster_map, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",  # tests run as root
                      PRTE_MCA_plm_ssh_agent=str(STANDINS / "ssh"))  # OpenMPI 5 (PRRTE): its daemons' ssh

    def on_node0(*extra: str) -> dict[int, tuple[list[str], dict]]:
        return {0: ([*MM_DS, *stage_args(corpus, run, *extra), "launch.launcher=mpirun",
                     f"launch.hostfile={hosts}", "launch.nodes=2", "launch.ranks=2"], env)}

    run_on_nodes(nodes, on_node0("train.steps=10"), tmp_path / "first")
    out = run_on_nodes(nodes, on_node0("train.steps=15", "--resume"), tmp_path / "resumed")
    assert_trained_and_resumed(run, 15, 4, out)
