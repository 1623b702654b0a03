"""Two nodes on one machine (tests/netns.py: a network namespace, a host name and an /etc/hosts per node, the
Debian-style "127.0.1.1 <own name>" line included), each node's processes started with only what a remote node
receives. A stage completes and resumes

- under `deepspeed --no_ssh --node_rank K`: one `mm-ds ... launch.node_rank=K` per node, no master address given;
- under `mpirun` started on node 0, its daemon on node 1 started through an rsh agent (an ssh stand-in that
  enters node 1's namespace with a login environment), so node 1's ranks get only what `-x` names.

A rank that dials 127.0.0.1 for another node, listens or advertises on loopback, or decides a collective from
a variable that does not reach every node hangs here as on a cluster: each launch is bounded (TIMEOUT_S).
"""

from pathlib import Path

import pytest

from netns import VENV_BIN, Nodes, Unavailable, login_env, remote_env, wait_all
from test_launchers import assert_trained_and_resumed, stage_args

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 150  # a launch of the tiny stage takes ~30 s on 2 quiet cores; a hang would wait 30 minutes


@pytest.fixture
def nodes():
    n = Nodes(2)
    try:
        n.up()
    except Unavailable as e:
        pytest.skip(str(e))
    try:
        yield n
    finally:
        n.down()


def run_on_nodes(nodes: Nodes, commands: dict[int, tuple[list[str], dict]], logs: Path) -> str:
    """Start each node's command, wait for all (bounded), return their output; fail on a hang or an error."""
    logs.mkdir(parents=True, exist_ok=True)
    procs = {k: nodes.start(nodes[k], argv, env, logs / f"node{k}.log", ROOT) for k, (argv, env) in commands.items()}
    codes = wait_all(list(procs.values()), TIMEOUT_S)
    outs = {k: (logs / f"node{k}.log").read_text() for k in procs}
    text = "\n".join(f"----- node {k} (exit {c}):\n{outs[k][-3000:]}" for k, c in zip(procs, codes))
    if any(c is None for c in codes):
        nodes.down()
        pytest.fail(f"hung: still running after {TIMEOUT_S} s\n{text}")
    assert all(c == 0 for c in codes), text
    return "\n".join(outs.values())


def test_deepspeed_no_ssh_on_two_nodes(nodes, corpus, tmp_path):
    """`deepspeed --no_ssh --node_rank K` per node; the master address is left to mm-ds (the hostfile's first host,
    which node 0 resolves to 127.0.1.1 and node 1 to node 0's address)."""
    hosts, run = nodes.hostfile(tmp_path / "hosts"), tmp_path / "run"

    def on_node(k: int, *extra: str) -> tuple[list[str], dict]:
        return ([str(VENV_BIN / "mm-ds"), *stage_args(corpus, run, *extra), f"launch.hostfile={hosts}",
                 "launch.nodes=2", "launch.ranks=1", f"launch.node_rank={k}"], remote_env())

    run_on_nodes(nodes, {k: on_node(k, "train.steps=10") for k in (0, 1)}, tmp_path / "first")
    out = run_on_nodes(nodes, {k: on_node(k, "train.steps=15", "--resume") for k in (0, 1)}, tmp_path / "resumed")
    assert_trained_and_resumed(run, 15, 2, out)


def test_mpirun_on_two_nodes_through_an_rsh_agent(nodes, corpus, tmp_path):
    """mpirun on node 0 with a hostfile of both nodes; node 1's daemon and rank start through the rsh agent."""
    hosts, run = nodes.hostfile(tmp_path / "hosts"), tmp_path / "run"
    root_ok = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}  # tests run as root
    agent = nodes.rsh_agent(tmp_path / "rsh", login_env())  # node 1's daemon starts as an ssh login would
    env = remote_env(**root_ok, PRTE_MCA_plm_ssh_agent=str(agent))  # OpenMPI 5 (PRRTE): plm_ssh_agent

    def on_node0(*extra: str) -> dict[int, tuple[list[str], dict]]:
        return {0: ([str(VENV_BIN / "mm-ds"), *stage_args(corpus, run, *extra), "launch.launcher=mpirun",
                     f"launch.hostfile={hosts}", "launch.nodes=2", "launch.ranks=1"], env)}

    run_on_nodes(nodes, on_node0("train.steps=10"), tmp_path / "first")
    out = run_on_nodes(nodes, on_node0("train.steps=15", "--resume"), tmp_path / "resumed")
    assert_trained_and_resumed(run, 15, 2, out)
