"""Hostfile parsing and the launch preflight: bad input fails with the line or flag to fix, before any rank starts."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mm_ds.config import ConfigError, LaunchConfig
from mm_ds.runtime.distributed import hostfile, launch

ROOT = Path(__file__).resolve().parents[1]


def test_parse_hosts_comments_and_blank_lines():
    hosts = hostfile.parse("# the cluster\nworker-0 slots=8\n\n10.0.0.2 slots=4   # the small one\n")
    assert [(h.name, h.slots, h.line) for h in hosts] == [("worker-0", 8, 2), ("10.0.0.2", 4, 4)]
    assert hostfile.world_size(hosts, None) == 12 and hostfile.world_size(hosts, 2) == 4


@pytest.mark.parametrize("text, words", [
    ("node0 slots=2\nslots=2\n", ["line 2", "no host name"]),
    ("node0 slots=2\nnode1\n", ["line 2", "no slots", "node1 slots=N"]),
    ("node0 slots=two\n", ["line 1", "malformed", "slots=two"]),
    ("node0 slots=0\n", ["line 1", "positive integer"]),
    ("node0 max_slots=2 slots=2\n", ["line 1", "malformed", "max_slots=2"]),
    ("node0 slots=2\nnode1 slots=2\nnode0 slots=4\n", ["line 3", "already listed on line 1"]),
    ("# nothing here\n\n", ["no hosts"]),
])
def test_bad_lines_name_the_line(text, words):
    with pytest.raises(ConfigError) as e:
        hostfile.parse(text, "hosts")
    for w in words:
        assert w in str(e.value), str(e.value)


@pytest.mark.parametrize("text", [
    "node1 slots=8 max_slots=8\n",  # OpenMPI's cap on oversubscription
    "node1 slots=8\n  node2   slots=8   # two spaces, a comment\n",
    "user@node1 slots=2\nnode-2.cluster.local slots=2\n",
    "node1 slots=8 max_slots=8\nnode1 slots=8\n",
    "node1 slots=two\n",
    "node1 max_slots=8 slots=8\n",
    "node1\n",
    "slots=8\n",
    "# only a comment\n",
])
def test_accepts_exactly_what_deepspeeds_launcher_accepts(text):
    from deepspeed.launcher.runner import _parse_hostfile

    try:
        want = list(_parse_hostfile(text.splitlines()).items())
    except ValueError:
        want = None
    try:
        got = [(h.name, h.slots) for h in hostfile.parse(text)]
    except ConfigError:
        got = None
    assert got == want


def test_more_nodes_or_ranks_than_the_hostfile_offers():
    hosts = hostfile.parse("a slots=2\nb slots=1\n")
    assert [h.name for h in hostfile.select(hosts, 1, 2)] == ["a"]
    with pytest.raises(ConfigError, match="3 nodes requested .* lists only 2"):
        hostfile.select(hosts, 3, 1, "hosts")
    with pytest.raises(ConfigError, match=r"2 ranks per node requested .* line 2 gives host 'b' only slots=1"):
        hostfile.select(hosts, 2, 2, "hosts")


def test_launch_commands(tmp_path, monkeypatch):
    fake = tmp_path / "srun"  # the command line is what is tested: any machine, SLURM installed or not
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    one = LaunchConfig(ranks=2, master_port=29555)
    assert launch.command(one, ["pretrain"])[1:5] == ["--num_gpus", "2", "--master_addr", "127.0.0.1"]
    hosts = tmp_path / "hosts"
    hosts.write_text("node0 slots=8\nnode1 slots=8\n")
    multi = LaunchConfig(ranks=8, nodes=2, hostfile=str(hosts), node_rank=1, ds_launcher="openmpi")
    cmd = launch.command(multi, ["adapt"])
    assert cmd[1:11] == ["--hostfile", str(hosts), "--num_nodes", "2", "--num_gpus", "8", "--launcher", "openmpi",
                         "--no_ssh", "--node_rank"]
    assert cmd[cmd.index("--master_addr") + 1] == "node0"  # no address given: the first host, where rank 0 runs
    mpi = launch.command(LaunchConfig(ranks=8, hostfile=str(hosts), launcher="mpirun"), ["pretrain"])
    assert mpi[3:5] == ["-n", "16"] and mpi[mpi.index("-npernode") + 1] == "8"  # the hostfile's 2 nodes x 8
    srun = launch.command(LaunchConfig(ranks=4, nodes=2, launcher="srun"), ["pretrain"])
    assert srun[1:7] == ["--nodes", "2", "--ntasks-per-node", "4", "--ntasks", "8"]
    with pytest.raises(ConfigError, match="needs launch.hostfile"):
        launch.command(LaunchConfig(ranks=2, nodes=2), ["pretrain"])


def test_launch_config_checks(tmp_path):
    with pytest.raises(ConfigError, match="launch.node_rank=2 must lie in"):
        LaunchConfig(nodes=2, node_rank=2).check()
    hosts = tmp_path / "hosts"
    hosts.write_text("node0 slots=1\nnode1 slots=1\n")
    with pytest.raises(ConfigError, match=r"launch.node_rank=2 must lie in \[0, launch.nodes=2\)"):
        launch.resolve(LaunchConfig(hostfile=str(hosts), node_rank=2))  # the hostfile's 2 nodes
    with pytest.raises(ConfigError, match="use deepspeed, mpirun, srun or none"):
        LaunchConfig(launcher="torchrun").check()
    assert LaunchConfig(ranks=8, nodes=4).world_size == 32


def test_preflight_hostfile_and_port(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("node0 slots=1\nnode1 slots=1\n")
    with pytest.raises(ConfigError, match="2 ranks per node requested"):
        launch.preflight(LaunchConfig(ranks=2, nodes=2, hostfile=str(hosts), node_rank=0))
    with pytest.raises(ConfigError, match="does not exist"):
        launch.preflight(LaunchConfig(ranks=1, nodes=2, hostfile=str(tmp_path / "missing"), node_rank=0))
    with pytest.raises(ConfigError, match="does not resolve"):
        launch.preflight(LaunchConfig(ranks=2, master_addr="no-such-host.invalid"))
    with pytest.raises(ConfigError, match="not an address of this machine"):
        launch.preflight(LaunchConfig(ranks=2, master_addr="192.0.2.1"))  # TEST-NET-1: never local
    launch.preflight(LaunchConfig(ranks=1, nodes=2, hostfile=str(hosts), node_rank=1, master_addr="192.0.2.1"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match=f"master port {port} .* already in use"):
            launch.preflight(LaunchConfig(ranks=2, master_port=port))
        # Node 1 of a --no_ssh start does not bind: node 0 (every node is this machine here) is listening there.
        here = tmp_path / "here"
        here.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
        launch.preflight(LaunchConfig(ranks=1, nodes=2, hostfile=str(here), node_rank=1, master_port=port))
    # Loopback on several nodes: each other node would dial itself. Refused, naming the fix.
    for cfg in (LaunchConfig(nodes=2, hostfile=str(hosts), node_rank=0, master_addr="127.0.0.1"),
                LaunchConfig(nodes=2, hostfile=str(hosts), launcher="mpirun", master_addr="localhost"),
                LaunchConfig(nodes=2, launcher="srun", master_addr="127.0.1.1")):
        with pytest.raises(ConfigError, match=r"is loopback, but launch.nodes=2: .* reach, (e.g. launch.master_addr="
                                              r"node0 \(the hostfile's first host\)|launch.master_addr=NODE0)"):
            launch.preflight(cfg)


def test_hostfile_cli(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("node0 slots=4\nnode1 slots=4\n")
    ok = subprocess.run([sys.executable, "-m", "mm_ds.runtime.distributed.hostfile", str(hosts), "--nodes", "2"], capture_output=True,
                        text=True, cwd=ROOT)
    assert ok.returncode == 0 and "world size 8" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "mm_ds.runtime.distributed.hostfile", str(hosts), "--nproc-per-node", "8"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "slots=4" in bad.stderr
