"""The stand-ins of tests/standins do what the real tools do with what the launcher tests give them, and refuse what
the real tools refuse: srun's layout, task variables and refusals; hydra's placement, MPMD blocks and PMI
variables; pdsh's %n and -S; pkill on a node touching that node's processes only; a broken node's missing Python
environment. Shell commands on two emulated nodes (tests/support/netns.py), a few seconds in all."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.netns import LOGIN_PATH, Nodes, cluster_env, login_env, nodes_or_skip

ECHO = 'echo "$(hostname) $SLURM_PROCID $SLURM_LOCALID $SLURM_NODEID $SLURM_STEP_TASKS_PER_NODE $PMI_RANK $PMI_SIZE"'


@pytest.fixture(scope="module")
def nodes():
    yield from nodes_or_skip(2)


def on_node0(nodes: Nodes, tmp_path: Path, command: str, hydra: bool = False, **settings) -> subprocess.CompletedProcess:
    """`command` in a shell on node 0, the stand-ins first on PATH, the map written with `settings`."""
    cluster_map = nodes.write_map(tmp_path / "cluster.json", login_env(), **settings)
    names = ",".join(n.name for n in nodes.nodes)
    env = cluster_env(cluster_map, hydra, SLURM_JOB_ID="7", SLURM_JOB_NODELIST=names)
    return subprocess.run(nodes.command(nodes[0], ["/bin/sh", "-c", command], env), capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)


def lines(proc: subprocess.CompletedProcess) -> list[list[str]]:
    return sorted(line.split() for line in proc.stdout.splitlines() if line.strip())


def test_srun_lays_out_tasks_as_slurm_does_and_refuses_what_slurm_refuses(nodes, tmp_path):
    n0, n1 = nodes[0].name, nodes[1].name
    out = on_node0(nodes, tmp_path, f"srun -n 3 -N 2 sh -c '{ECHO}'", pmi="pmi2")
    assert out.returncode == 0, out.stderr
    assert lines(out) == [[n0, "0", "0", "0", "2,1", "0", "3"], [n0, "1", "1", "0", "2,1", "1", "3"],
                          [n1, "2", "0", "1", "2,1", "2", "3"]], out.stdout
    crowded = on_node0(nodes, tmp_path, f"srun -n 4 -N 2 sh -c '{ECHO}'", cpus=[3, 1])  # a node of 3 free CPUs
    assert [row[:2] for row in lines(crowded)] == [[n0, "0"], [n0, "1"], [n0, "2"], [n1, "3"]], crowded.stdout
    assert "PMI" not in crowded.stdout and len(lines(crowded)[0]) == 5  # no pmi2: no PMI_RANK/PMI_SIZE
    for args, says in ((["-N", "3"], "Only allocated 2 nodes asked for 3"),
                       (["--gpus-per-node=4"], "Invalid generic resource (gres) specification"),
                       (["-n", "6", "-N", "2", "--ntasks-per-node=2"], "Requested node configuration is not available"),
                       (["-n", "2", "-c", "65"], "More processors requested than permitted"),
                       (["--no-such-option"], "unrecognized option")):
        bad = on_node0(nodes, tmp_path, f"srun {' '.join(args)} true")
        assert bad.returncode == 1 and says in bad.stderr, (args, bad.stderr)


def test_srun_ends_the_step_when_a_task_fails_under_kill_on_bad_exit(nodes, tmp_path):
    started = time.monotonic()
    out = on_node0(nodes, tmp_path, "srun -n 2 -N 2 --kill-on-bad-exit=1 sh -c "
                                    "'[ $SLURM_PROCID = 1 ] && exit 3; sleep 60'", kill_wait_s=1)
    assert out.returncode == 143, (out.returncode, out.stderr)  # the largest: task 0's, ended by SIGTERM
    assert f"{nodes[1].name}: task 1: Exited with exit code 3" in out.stderr and time.monotonic() - started < 30


def test_hydra_places_ranks_per_host_with_pmi_variables(nodes, tmp_path):
    n0, n1 = nodes[0].name, nodes[1].name
    show = 'echo "$(hostname) $PMI_RANK $MPI_LOCALRANKID $MPI_LOCALNRANKS $X ${MV2_COMM_WORLD_RANK:--}"'
    out = on_node0(nodes, tmp_path, f"mpirun -n 4 -ppn 2 -genv X=g -hosts {n0},{n1} sh -c '{show}'", hydra=True)
    assert lines(out) == [[n0, "0", "0", "2", "g", "-"], [n0, "1", "1", "2", "g", "-"],
                          [n1, "2", "0", "2", "g", "-"], [n1, "3", "1", "2", "g", "-"]], out.stdout + out.stderr
    mpmd = on_node0(nodes, tmp_path, f"mpirun -ppn 1 -genv X g -hosts {n0},{n1} -n 1 -env X a sh -c '{show}' : "
                                     f"-n 1 -env X b sh -c '{show}'", hydra=True, mpi="mvapich")
    assert lines(mpmd) == [[n0, "0", "0", "1", "a", "0"], [n1, "1", "0", "1", "b", "1"]], mpmd.stdout + mpmd.stderr


def test_pdsh_numbers_the_hosts_and_returns_the_largest_exit_code(nodes, tmp_path):
    n0, n1 = nodes[0].name, nodes[1].name
    out = on_node0(nodes, tmp_path, f"pdsh -S -f 4 -w {n0},{n1} 'echo %n $(hostname) $PATH; exit %n'")
    assert out.returncode == 1, out.stderr
    assert lines(out) == [[f"{n0}:", "0", n0, LOGIN_PATH], [f"{n1}:", "1", n1, LOGIN_PATH]], out.stdout  # a login's


def test_pkill_through_pdsh_touches_only_that_nodes_processes(nodes, tmp_path):
    """DeepSpeed's pdsh runner cleans up with `pkill -f PATTERN` on every node. Here all nodes share one process
    table, where a real pkill would also end this machine's other processes: the stand-in keeps to the node's."""
    marker = f"sleep 3{os.getpid() % 1000}.5"
    here = subprocess.Popen(marker.split())  # this machine's, outside every node
    there = subprocess.Popen(nodes.command(nodes[1], marker.split(), login_env()))
    nodes.procs.append(there)
    time.sleep(1)
    out = on_node0(nodes, tmp_path, f"pdsh -w {nodes[1].name} pkill -f '{marker}'")
    try:
        assert there.wait(timeout=20) is not None and here.poll() is None, out.stderr
    finally:
        here.kill()


def test_a_broken_node_has_no_python_environment(nodes, tmp_path):
    out = on_node0(nodes, tmp_path, f"ssh {nodes[1].name} {sys.executable} -c pass; echo $?; "
                                    f"ssh {nodes[0].name} {sys.executable} -c pass; echo $?",
                   broken={nodes[1].name: "no Python environment"})
    assert out.stdout.split() == ["127", "0"], out.stdout + out.stderr
    assert Path(sys.executable).exists()  # hidden there only
