"""Every one of DeepSpeed's runners, built by DeepSpeed itself (tests/support/ds_runner.py: its `runner.main` on the
exact command mm-ds produces, up to the process it would start) for 3 of a hostfile's 4 nodes x 2 ranks: the nodes, the
ranks per node, the script, rank 0's address and what reaches the other nodes' ranks are asserted on the command
each runner would start. Where a runner cannot work with mm-ds's settings, mm-ds says so before the launch."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mm_ds.config import ConfigError, LaunchConfig
from mm_ds.runtime.distributed import launch, runners
from mm_ds.runtime.distributed.environment import LAUNCHER, VARIABLES, forwarded
from support.ds_runner import runner_command

FABRIC = {"LD_LIBRARY_PATH": "/opt/aws-ofi-nccl/lib:/usr/local/cuda/lib64", "FI_PROVIDER": "efa",
          "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_SOCKET_IFNAME": "ens5", "OMP_NUM_THREADS": "12",
          "CUDA_DEVICE_MAX_CONNECTIONS": "1", "PYTHONPATH": "/work/mm-ds"}
"""The launching shell's fabric settings: each must reach every rank, as it is here."""
QUOTED = {"NCCL_IB_HCA": "^mlx5_2", "FI_EFA_IFACE": "rdmap 0"}
"""Values DeepSpeed's runners put in quotes: a shell (pdsh) takes them off, mpirun and srun would pass them on."""
NEVER = {"CUDA_VISIBLE_DEVICES": "0,1", "LOCAL_RANK": "3", "SLURM_PROCID": "1"}
"""A launcher's per-rank or per-node variables in the launching shell (a job's own): never forwarded."""


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A hostfile of 4 nodes x 8 slots, the fabric's variables in the shell, a user's ~/.deepspeed_env."""
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(f"node{i} slots=8\n" for i in range(4)))
    for k, v in {**FABRIC, **NEVER, **QUOTED}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("DS_ENV_FILE", raising=False)
    (tmp_path / ".deepspeed_env").write_text("SITE_VAR=from-deepspeed-env\n")
    # The hostfile's names as this machine would resolve them (the openmpi runner is told each node's address).
    monkeypatch.setattr(runners, "ipv4", lambda name: {f"node{i}": f"10.1.0.{i + 1}" for i in range(4)}.get(name))
    return hosts


def exports(cmd: list[str]) -> str:
    return " ".join(cmd)


def hostfile_lines(path: str) -> list[str]:
    return Path(path).read_text().split("\n")[:-1]


# What each runner's command must say: nodes, ranks per node (and world size 6), rank 0's address.
EXPECT = {
    "pdsh": lambda cmd, s: (cmd[:6] == ["pdsh", "-S", "-f", "1024", "-w", "node0,node1,node2"]
                            and s.world_info() == {f"node{i}": [0, 1] for i in range(3)}
                            and "--master_addr=node0" in cmd),
    "openmpi": lambda cmd, s: (cmd[:3] == ["mpirun", "-n", "6"]
                               and hostfile_lines(cmd[cmd.index("-hostfile") + 1]) == [f"node{i} slots=2" for i in range(3)]
                               and "btl_tcp_if_include 10.1.0.1/32,10.1.0.2/32,10.1.0.3/32" in " ".join(cmd)
                               and "eth0" not in cmd and "--bind-to none" in " ".join(cmd)
                               and cmd[cmd.index("--prefix") + 1] == runners.mpirun_prefix(runners.bin_path("mpirun"))
                               and "MASTER_ADDR=node0" in cmd),
    "mpich": lambda cmd, s: (cmd[:5] == ["mpirun", "-n", "6", "-ppn", "2"]
                             and cmd[cmd.index("-hosts") + 1] == "node0,node1,node2"
                             and "MASTER_ADDR node0" in " ".join(cmd)),
    "impi": lambda cmd, s: (cmd[:3] == ["mpirun", "-ppn", "2"] and cmd[cmd.index("-hosts") + 1] == "node0,node1,node2"
                            and cmd.count(launch.ENTRY) == 6 and "MASTER_ADDR node0" in " ".join(cmd)),
    "mvapich": lambda cmd, s: (cmd[:5] == ["mpirun", "-np", "6", "-ppn", "2"]
                               and hostfile_lines(cmd[cmd.index("--hostfile") + 1]) == [f"node{i}" for i in range(3)]
                               and "MASTER_ADDR=node0" in cmd),
    "slurm": lambda cmd, s: (cmd[:3] == ["srun", "-n", "6"] and "--ntasks-per-node=2" in cmd
                             and cmd[cmd.index("--nodes") + 1] == "3" and s.env["MASTER_ADDR"] == "node0"),
}


@pytest.mark.parametrize("name", EXPECT)
def test_each_runner_starts_the_chosen_nodes_with_the_fabrics_environment(site, name, capsys):
    cfg = LaunchConfig(ranks=2, nodes=3, hostfile=str(site), ds_launcher=name, master_port=29511)
    started = runner_command(launch.rank_command(cfg, "/shared/runs/x"), launch.launch_env(cfg))
    cmd = started.cmd
    assert EXPECT[name](cmd, started), cmd
    assert cmd[-2:] == [launch.ENTRY, "/shared/runs/x"], cmd  # every rank starts from the resolved run directory
    if name == "slurm":  # srun hands its tasks the runner's whole environment (--export=ALL)
        got = {k: started.env.get(k) for k in {**FABRIC, **QUOTED}}
        assert got == {**FABRIC, **QUOTED, "PYTHONPATH": f"{os.getcwd()}:{FABRIC['PYTHONPATH']}"}  # DeepSpeed's cwd first
        assert started.env["MASTER_PORT"] == "29511" and "--export=ALL" in " ".join(cmd)
        return
    line, warned = " ".join(cmd), capsys.readouterr().err
    for k, v in {**FABRIC, "SITE_VAR": "from-deepspeed-env", "MASTER_PORT": "29511"}.items():
        assert f"{k}={v}" in line or f"{k} {v}" in line, (k, line)
    assert not any(f"{k}={v}" in line or f"{k} {v}" in line for k, v in NEVER.items()), line
    if name == "pdsh":  # in `export K="V";`, which the remote shell unquotes
        assert all(f'{k}="{v}"' in line for k, v in QUOTED.items()) and "warning" not in warned, line
    else:  # named, not passed on with quotes (DeepSpeed's own NCCL prefix would still pass it, on CUDA)
        assert "cannot pass these to the other nodes as they are" in warned and all(k in warned for k in QUOTED)
        assert "FI_EFA_IFACE" not in line, line


def test_the_runner_table_is_deepspeeds():
    """Which runners take --num_nodes/--num_gpus, as DeepSpeed's own validate_args decides."""
    from deepspeed.launcher.runner import LAUNCHER_CLASSES, parse_args

    assert set(runners.RUNNERS) == set(LAUNCHER_CLASSES)
    for name, cls in LAUNCHER_CLASSES.items():
        args = parse_args(["--num_nodes", "2", "--num_gpus", "2", "--launcher", name, "x.py"])
        try:
            cls(args, "", {}) if name != "pdsh" else cls(args, "")
            takes = True
        except ValueError:
            takes = False
        assert takes == runners.RUNNERS[name].counts, name


def test_the_hostfile_decides_the_world(tmp_path):
    """4 hosts, no node count: 4 nodes x 8 = 32, in the command DeepSpeed's runner is given and in what it starts."""
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(f"gpu0{i} slots=8\n" for i in range(1, 5)))
    cfg = launch.resolve(LaunchConfig(ranks=8, hostfile=str(hosts)))
    assert (cfg.nodes, cfg.world_size) == (4, 32)
    started = runner_command(launch.command(cfg, ["pretrain"]), launch.launch_env(cfg))
    assert started.world_info() == {f"gpu0{i}": list(range(8)) for i in range(1, 5)}
    assert "--master_addr=gpu01" in started.cmd  # by name: every node resolves rank 0's host itself
    with pytest.raises(ValueError, match="unresolved"):  # a caller that reads the world before resolving it
        LaunchConfig(ranks=8, hostfile=str(hosts)).world_size


def test_a_one_node_start_runs_here(tmp_path):
    """DeepSpeed runs a one-node launch's ranks on this machine: so it must be the hostfile's host (or run_here)."""
    here = tmp_path / "here"
    here.write_text("localhost slots=8\nnode1 slots=8\n")
    one = LaunchConfig(ranks=2, nodes=1, hostfile=str(here))
    started = runner_command(launch.command(one, ["pretrain"]), launch.launch_env(one))
    assert started.cmd[:4] == [sys.executable, "-u", "-m", "deepspeed.launcher.launch"] and not started.ssh_checks
    assert started.world_info() == {"localhost": [0, 1]}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("node-a slots=8\n")
    with pytest.raises(ConfigError, match=r"gives the one node \(launch.nodes=1\) as 'node-a', but deepspeed runs a "
                                          r"one-node launch's ranks on the machine it starts on, .* launch.run_here=true"):
        launch.check_hosts(LaunchConfig(ranks=8, hostfile=str(elsewhere)))
    launch.check_hosts(LaunchConfig(ranks=8, hostfile=str(elsewhere), run_here=True))


@pytest.mark.ranks
def test_a_runner_that_cannot_work_is_refused_before_launch(tmp_path, monkeypatch):
    hosts = tmp_path / "hosts"
    hosts.write_text("no-such-node-a.invalid slots=2\nno-such-node-b.invalid slots=2\n")
    with pytest.raises(ConfigError, match="ds_launcher='pdssh' is not one of DeepSpeed's runners \\(did you mean 'pdsh'"):
        launch.resolve(LaunchConfig(hostfile=str(hosts), ds_launcher="pdssh"))
    with pytest.raises(ConfigError, match="no-such-node-a.invalid, no-such-node-b.invalid does not resolve .* list "
                                          "addresses in the hostfile"):
        launch.command(LaunchConfig(ranks=2, hostfile=str(hosts), ds_launcher="openmpi"), ["pretrain"])
    # The venv's mpirun is Open MPI's: the MPICH-speaking runners would pass it flags it does not take.
    for name in ("mpich", "impi"):
        with pytest.raises(ConfigError, match=f"launch.ds_launcher={name}: the mpirun found .* is Open MPI"):
            runners.check_tools(LaunchConfig(ranks=2, hostfile=str(hosts), ds_launcher=name))
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    monkeypatch.setattr(runners, "find_bin", lambda name: None)
    with pytest.raises(ConfigError, match="launch.ds_launcher=pdsh needs pdsh, ssh on this machine"):
        runners.check_tools(LaunchConfig(ranks=2, hostfile=str(hosts)))


@pytest.mark.ranks
def test_mpirun_forwards_the_fabric_by_its_absolute_path_and_prefix(site):
    cmd = launch.command(LaunchConfig(ranks=2, nodes=3, hostfile=str(site), launcher="mpirun"), ["pretrain"])
    assert os.path.isabs(cmd[0]) and cmd[1:3] == ["--prefix", str(Path(os.path.realpath(cmd[0])).parents[1])]
    forwarded_names = {cmd[i + 1] for i, a in enumerate(cmd) if a == "-x"}
    assert set(FABRIC) <= forwarded_names and not forwarded_names & set(NEVER), forwarded_names
    # launchers/mpirun.sh runs the same mpirun line (its own rank program after it)
    script = subprocess.run(["bash", "launchers/mpirun.sh", "pretrain", "--preset", "tiny/pretrain", "--out", "x"],
                            capture_output=True, text=True, cwd=Path(__file__).parents[1],
                            env={**os.environ, "CHECK": "1", "HOSTFILE": str(site), "NNODES": "2",
                                 "NPROC_PER_NODE": "2", "PYTHON": sys.executable, "MASTER_ADDR": "node0"})
    assert script.returncode == 0, script.stderr
    assert "'--prefix' " in script.stdout and "'-x' 'LD_LIBRARY_PATH'" in script.stdout, script.stdout


def test_no_launcher_variable_is_ever_forwarded():
    """The rule behind FORWARDED: a variable a launcher sets per rank or per node stays where it was set, even where a
    forwarded prefix matches it (CUDA_VISIBLE_DEVICES)."""
    assert forwarded("CUDA_DEVICE_MAX_CONNECTIONS") and forwarded("FI_PROVIDER") and forwarded("LD_LIBRARY_PATH")
    assert not forwarded("CUDA_VISIBLE_DEVICES") and VARIABLES["CUDA_VISIBLE_DEVICES"].set_by == LAUNCHER
    assert not [n for n, row in VARIABLES.items() if row.set_by == LAUNCHER and forwarded(n)]
