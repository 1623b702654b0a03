"""Real multi-process jobs through each launcher path on CPU (gloo), and resume on another world size.

- 2 "nodes" of 1 rank through the hostfile path on loopback: `deepspeed --hostfile --no_ssh --node_rank R`,
  started once per node, as `mm-ds ... launch.node_rank=R` and as launchers/deepspeed_hostfile.sh;
- 2 ranks through `mpirun` (mpi4py discovery);
- launchers/slurm.sbatch: on a private single-node SLURM when slurmctld/slurmd/munged are installed and we
  are root, otherwise with a fake `srun` that starts the tasks with SLURM_PROCID/SLURM_STEP_NUM_TASKS;
- DeepSpeed's slurm runner (`launch.ds_launcher=slurm`) with that fake `srun`;
- ZeRO-1 and ZeRO-2: trained on 2 ranks, resumed on 1 (universal checkpoint), then on 2 again.
(2 ranks through the plain `deepspeed` launcher, and bitwise same-world-size resume: test_train_distributed.
2 nodes in separate network namespaces, each seeing only what a remote node receives: test_nodes.)
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mm_ds.runtime.checkpointing import checkpoint as ckpt_io
from mm_ds.runtime.distributed.dist import free_port  # the one free-port helper (test_nodes takes it from here)

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.ffn_size=64",
        "model.secondary_head_layer=1", "data.seq_len=32", "model.max_positions=32", "train.global_batch=16",
        "train.micro_batch=4", "train.lr=3e-3", "train.warmup_steps=5", "train.log_every=5",
        "train.checkpoint_steps=[10]", "train.checkpoint_every=1000000"]


def stage_args(corpus: Path, out: Path, *extra: str) -> list[str]:
    return ["pretrain", "--preset", "tiny/minijoint", "--out", str(out), "--no-progress", f"data.corpus={corpus}",
            *TINY, *extra]


def env(**kw) -> dict:
    # The launcher scripts call `python`, `deepspeed`, `mpirun`: this interpreter's, wherever pytest was started.
    path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
            **kw}


def check(proc: subprocess.CompletedProcess | subprocess.Popen, out: str = "") -> str:
    if proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{out[-4000:]}")
    return out


def mm_ds(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mm_ds.cli", *args], capture_output=True, text=True,
                          env=env(**kw.pop("env", {})), cwd=ROOT, **kw)


def logged(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "logs" / "train.jsonl").read_text().splitlines()]


def assert_trained_and_resumed(run: Path, steps: int, world: int, output: str):
    assert "resumed from" in output and "at step 10" in output, output[-3000:]
    meta = ckpt_io.read_meta(run / "final")
    assert meta["step"] == steps and meta["world_size"] == world
    rows = logged(run)
    assert [r["step"] for r in rows] == [5, 10, 15][: len(rows)] and rows[-1]["step"] == steps
    assert all(r["loss"] == r["loss"] for r in rows) and rows[-1]["loss"] < rows[0]["loss"], rows
    assert all(0.05 < r["peak_mem_gib"] < 64 for r in rows), rows  # rank 0's resident set on a CPU, in GiB


# ---------------------------------------------------------------- two nodes through a hostfile, on loopback

def start_nodes(args_for_node, env_for_node) -> str:
    """Start node 0 and node 1 (each its own `deepspeed --no_ssh --node_rank R`), wait for both."""
    procs = [subprocess.Popen(args_for_node(r), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              cwd=ROOT, env=env_for_node(r)) for r in (0, 1)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    for p, o in zip(procs, outs):
        check(p, o)
    return "\n".join(outs)


@pytest.mark.ranks
def test_two_nodes_through_a_hostfile(corpus, tmp_path):
    hosts = tmp_path / "hosts"
    # Two 'nodes' of one rank, both this machine: loopback reaches rank 0 from each (refused otherwise).
    hosts.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    run, port = tmp_path / "run", free_port()
    launch = [f"launch.hostfile={hosts}", "launch.nodes=2", "launch.ranks=1", f"launch.master_port={port}"]
    start_nodes(lambda r: [sys.executable, "-m", "mm_ds.cli", *stage_args(corpus, run, "train.steps=10", *launch,
                                                                           f"launch.node_rank={r}")],
                lambda r: env())
    assert ckpt_io.read_meta(run / "checkpoints" / "step_00000010")["world_size"] == 2
    # Resume through the launcher script: the same hostfile path, one script call per node.
    port = free_port()
    out = start_nodes(lambda r: ["bash", "launchers/deepspeed_hostfile.sh", *stage_args(corpus, run, "train.steps=15",
                                                                                       "--resume")],
                      lambda r: env(HOSTFILE=str(hosts), NNODES="2", NPROC_PER_NODE="1", NODE_RANK=str(r),
                                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
    assert_trained_and_resumed(run, 15, 2, out)


@pytest.mark.ranks
def test_hostfile_script_node_ranks(corpus, tmp_path):
    """NODE_RANK must differ per node; the script passes it through (checked here without training)."""
    hosts = tmp_path / "hosts"
    hosts.write_text("node-a slots=1\n")
    bad = subprocess.run(["bash", "launchers/deepspeed_hostfile.sh", "pretrain"], capture_output=True, text=True,
                         cwd=ROOT, env=env(HOSTFILE=str(hosts), NNODES="2"))
    assert bad.returncode == 2 and "2 nodes requested" in bad.stderr and "lists only 1" in bad.stderr


@pytest.mark.ranks
@pytest.mark.parametrize("script", ["deepspeed_hostfile.sh", "mpirun.sh"])
def test_launcher_scripts_check_what_the_readme_says(script, tmp_path):
    """CHECK=1: the stage's own check at the script's launch (`mm-ds STAGE --check launch.*=...`), then the command
    it would run; a batch that the ranks cannot share, a misspelt preset, no nodes: exit 2 with the reason."""
    hosts, run = tmp_path / "hosts", tmp_path / "run"
    hosts.write_text("localhost slots=8\n")
    base = {"HOSTFILE": str(hosts), "CHECK": "1", "MASTER_PORT": str(free_port())}
    args = ["pretrain", "--preset", "paper/minijoint", "--out", str(run)]
    for extra, argv, words in (
            ({"NPROC_PER_NODE": "6"}, args, "global batch 2048 is not divisible by micro batch 32 x world size 6"),
            ({"NPROC_PER_NODE": "8"}, [*args[:2], "paper/minijont", *args[3:]], "did you mean 'paper/minijoint'?"),
            ({"NNODES": "0"}, args, "launch.nodes")):
        proc = subprocess.run(["bash", f"launchers/{script}", *argv], capture_output=True, text=True, cwd=ROOT,
                              env=env(**base, **extra))
        assert proc.returncode == 2 and words in proc.stderr and "would run" not in proc.stdout, (extra, proc.stderr)
    proc = subprocess.run(["bash", f"launchers/{script}", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env(**base, NPROC_PER_NODE="8"))
    assert proc.returncode == 0, proc.stderr
    assert "# launch: " in proc.stdout and "1 node(s) x 8 rank(s) = world size 8" in proc.stdout, proc.stdout
    assert "# geometry: 32 x 8 x 8 = 2048" in proc.stdout and "would run: " in proc.stdout and not run.exists()


# ---------------------------------------------------------------- mpirun

@pytest.mark.ranks
def test_two_ranks_through_mpirun(corpus, tmp_path):
    run = tmp_path / "run"
    first = mm_ds(*stage_args(corpus, run, "train.steps=10", "launch.launcher=mpirun", "launch.ranks=2",
                              f"launch.master_port={free_port()}"))
    check(first, first.stdout + first.stderr)
    assert "mpirun" in first.stdout and ckpt_io.read_meta(run / "final")["world_size"] == 2
    # Resume through launchers/mpirun.sh (mpirun runs `mm-ds` directly: ranks from mpi4py).
    proc = subprocess.run(["bash", "launchers/mpirun.sh", *stage_args(corpus, run, "train.steps=15", "--resume")],
                          capture_output=True, text=True, cwd=ROOT,
                          env=env(NP="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())))
    out = check(proc, proc.stdout + proc.stderr)
    assert_trained_and_resumed(run, 15, 2, out)


# ---------------------------------------------------------------- SLURM

def _slurm_available() -> bool:
    return (hasattr(os, "geteuid") and os.geteuid() == 0
            and all(shutil.which(x) for x in ("slurmctld", "slurmd", "munged", "sbatch", "sinfo", "scontrol")))


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A private single-node SLURM (own config, ports, state and munge socket) or None when not installed."""
    if not _slurm_available() or os.environ.get("MM_DS_FAKE_SLURM"):  # MM_DS_FAKE_SLURM=1: the dry run only
        yield None
        return
    d = tmp_path_factory.mktemp("slurm")
    host = socket.gethostname()
    for sub in ("state", "spool", "munge"):
        (d / sub).mkdir()
    conf = d / "slurm.conf"
    conf.write_text(f"""ClusterName=mmds
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={d}/munge/munge.socket
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")
    e = env(SLURM_CONF=str(conf))
    subprocess.run(["munged", "--force", "-S", f"{d}/munge/munge.socket", "--pid-file", f"{d}/munge/munged.pid",
                    "--log-file", f"{d}/munge/munged.log", "--seed-file", f"{d}/munge/seed"], check=True, env=e)
    subprocess.run(["slurmctld", "-i"], check=True, env=e)
    subprocess.run(["slurmd"], check=True, env=e)
    for _ in range(60):
        state = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=e).stdout.strip()
        if state == "idle":
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"private SLURM did not come up (sinfo: {state!r}); logs in {d}")
    yield e
    for pid_file in (d / "slurmd.pid", d / "slurmctld.pid", d / "munge" / "munged.pid"):
        try:
            os.kill(int(pid_file.read_text().strip()), 15)
        except (OSError, ValueError):
            pass


def fake_slurm_bin(tmp_path: Path) -> Path:
    """`srun` that records its arguments and runs the command once per task with SLURM's task variables,
    and `scontrol show hostnames` answering localhost."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("""#!/usr/bin/env bash
printf '%s\n' "$*" > "$FAKE_SRUN_LOG"
n=${SLURM_NTASKS:-1}
while [[ "$1" == -* ]]; do  # options; those DeepSpeed's slurm runner passes take their value apart
  case "$1" in -n|--ntasks) n=$2; shift 2 ;; --nodes|--gpus-per-node|--nodelist|--comment) shift 2 ;; *) shift ;; esac
done
pids=()
for ((i = 0; i < n; i++)); do
  SLURM_PROCID=$i SLURM_LOCALID=$i SLURM_STEP_NUM_TASKS=$n SLURM_STEP_TASKS_PER_NODE=$n \\
  SLURM_STEP_NODELIST=localhost SLURM_STEP_NUM_NODES=1 "$@" & pids+=($!)
done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done; exit $rc
""")
    (bin_dir / "scontrol").write_text("#!/usr/bin/env bash\necho localhost\n")
    (bin_dir / "sinfo").write_text("#!/usr/bin/env bash\n")  # DeepSpeed's slurm runner looks for it
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir


@pytest.mark.ranks
def test_slurm_sbatch_script(corpus, tmp_path, slurm):
    run = tmp_path / "run"
    if slurm is None:
        # Dry run of the batch script: what sbatch would run, with a recording fake srun.
        bin_dir = fake_slurm_bin(tmp_path)
        log = tmp_path / "srun.args"
        proc = subprocess.run(["bash", "launchers/slurm.sbatch", *stage_args(corpus, run, "train.steps=10")],
                              capture_output=True, text=True, cwd=ROOT,
                              env=env(PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_SRUN_LOG=str(log),
                                      SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="localhost", SLURM_NTASKS="2",
                                      SLURM_NNODES="1", SLURM_PROCID="0", MASTER_PORT=str(free_port())))
        check(proc, proc.stdout + proc.stderr)
        assert log.read_text().startswith("--kill-on-bad-exit=1 ") and "-m mm_ds.cli pretrain" in log.read_text()
        assert ckpt_io.read_meta(run / "final")["world_size"] == 2
        pytest.skip("no SLURM installed (apt-get install slurmd slurmctld slurm-client munge): checked "
                    "launchers/slurm.sbatch with a fake srun only")
    out = ""
    for steps, resume in (("train.steps=10", []), ("train.steps=15", ["--resume"])):
        log = tmp_path / f"job-{steps}.out"
        proc = subprocess.run(["sbatch", "--wait", "--nodes=1", "--ntasks-per-node=2", f"--output={log}",
                               "launchers/slurm.sbatch", *stage_args(corpus, run, steps, *resume)],
                              capture_output=True, text=True, cwd=ROOT, timeout=300,
                              env=slurm | {"MASTER_PORT": str(free_port())})
        out = log.read_text() if log.exists() else ""
        check(proc, proc.stdout + proc.stderr + out)
    assert_trained_and_resumed(run, 15, 2, out)


@pytest.mark.ranks
def test_deepspeed_slurm_runner(corpus, tmp_path):
    """`launch.ds_launcher=slurm`: DeepSpeed's SlurmRunner runs `srun ... python -u SCRIPT` (it drops --module),
    so the ranks start by a script path, given the run directory. The fake srun runs its tasks here, with SLURM's
    task variables."""
    bin_dir, log, run = fake_slurm_bin(tmp_path), tmp_path / "srun.args", tmp_path / "run"
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=1\n127.0.0.1 slots=1\n")  # both 'nodes' this machine
    proc = mm_ds(*stage_args(corpus, run, "train.steps=10", f"launch.hostfile={hosts}", "launch.nodes=2", "launch.ranks=1",
                             "launch.ds_launcher=slurm", f"launch.master_port={free_port()}"),
                 env={"PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
                      "FAKE_SRUN_LOG": str(log)})
    check(proc, proc.stdout + proc.stderr)
    # every rank starts from the run directory the mm-ds process resolved (mm_ds/runtime/training/resolved.py)
    assert log.read_text().startswith("-n 2 ") and log.read_text().endswith(f"/mm_ds/rank.py {run}\n"), log.read_text()
    assert ckpt_io.read_meta(run / "final")["world_size"] == 2


# ---------------------------------------------------------------- bad input fails before any rank starts

@pytest.mark.ranks
def test_bad_launch_input_fails_before_training(corpus, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("node-a slots=1\nnode-b\n")
    out = tmp_path / "run"
    cases = [
        ([f"launch.hostfile={hosts}", "launch.nodes=2", "launch.node_rank=0"], "line 2"),
        ([f"launch.hostfile={tmp_path / 'none'}", "launch.nodes=2"], "does not exist"),
        (["launch.ranks=3"], "not divisible by micro batch 4 x world size 3"),
        (["launch.master_addr=no-such-host.invalid"], "does not resolve"),
    ]
    for extra, words in cases:
        proc = mm_ds(*stage_args(corpus, out, "train.steps=10", *extra))
        assert proc.returncode == 2 and words in proc.stderr, (extra, proc.stderr[-2000:])
    hosts.write_text("node-a slots=1\nnode-b slots=1\n")
    proc = mm_ds(*stage_args(corpus, out, "train.steps=10", f"launch.hostfile={hosts}", "launch.nodes=2",
                             "launch.ranks=2", "launch.node_rank=0"))
    assert proc.returncode == 2 and "only slots=1" in proc.stderr, proc.stderr[-2000:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        proc = mm_ds(*stage_args(corpus, out, "train.steps=10", f"launch.master_port={s.getsockname()[1]}"))
    assert proc.returncode == 2 and "already in use" in proc.stderr, proc.stderr[-2000:]
    assert not out.exists()  # nothing started, nothing written


@pytest.mark.ranks
def test_loopback_master_refused_on_several_nodes(corpus, tmp_path):
    """Every other node's ranks would dial their own loopback until the 30-minute store timeout."""
    hosts, out = tmp_path / "hosts", tmp_path / "run"
    hosts.write_text("node-a slots=1\nnode-b slots=1\n")
    for launcher in (["launch.node_rank=0"], ["launch.launcher=mpirun"]):
        proc = mm_ds(*stage_args(corpus, out, "train.steps=10", f"launch.hostfile={hosts}", "launch.nodes=2", "launch.ranks=1",
                                 "launch.master_addr=127.0.0.1", *launcher))
        assert proc.returncode == 2 and "launch.master_addr=127.0.0.1 is loopback, but launch.nodes=2" in proc.stderr \
            and "launch.master_addr=node-a (the hostfile's first host)" in proc.stderr, proc.stderr[-2000:]
        assert "launching" not in proc.stdout and not out.exists()  # nothing started, nothing written
    # `mm-ds run RECIPE --check` (and `mm-ds run` before any work) says the same for every training stage.
    from mm_ds.pipeline.check import check as check_recipe
    from mm_ds.pipeline.recipe import load_recipe
    recipe = load_recipe("tiny", [f"launch.hostfile={hosts}", "launch.nodes=2", "launch.ranks=1",
                                  "launch.master_addr=127.0.0.1"])
    problems = check_recipe(recipe, out, strict=False).format()
    assert "launch.master_addr=127.0.0.1 is loopback" in problems and not out.exists(), problems


# ---------------------------------------------------------------- another world size on resume

@pytest.mark.ranks
@pytest.mark.parametrize("zero", [1, 2])
def test_resume_on_another_world_size(corpus, tmp_path, zero):
    run = tmp_path / "run"
    common = [f"ds_config=fp32_zero{zero}.json", "train.checkpoint_steps=[10,15]"]
    first = mm_ds(*stage_args(corpus, run, "train.steps=10", *common, f"launch.master_port={free_port()}"))
    check(first, first.stdout + first.stderr)
    before = logged(run)
    ckpt10 = run / "checkpoints" / "step_00000010"
    assert ckpt_io.read_meta(ckpt10)["world_size"] == 2

    # 2 -> 1 rank: converted to a universal checkpoint beside the original, loaded bit for bit.
    dump = tmp_path / "resumed.pt"
    one = mm_ds(*stage_args(corpus, run, "train.steps=15", *common, "launch.ranks=1",
                            f"launch.master_port={free_port()}", "--resume"), env={"MM_DS_DUMP_RESUMED": str(dump)})
    out = check(one, one.stdout + one.stderr)
    assert "world size 2 -> 1" in out and "universal checkpoint" in out and "at step 10" in out, out[-3000:]
    uni = run / "checkpoints" / "step_00000010.universal"
    ckpt_io.verify(uni)
    assert ckpt_io.read_meta(uni)["universal_of"] == ckpt10.name
    assert [p.name for p in ckpt_io.list_checkpoints(run)] == ["step_00000010", "step_00000015"]
    expected, loaded = ckpt_io.consolidate(ckpt10), torch.load(dump)
    assert expected.keys() <= loaded.keys()
    assert all(torch.equal(expected[k], loaded[k]) for k in expected), [k for k in expected
                                                                         if not torch.equal(expected[k], loaded[k])]
    after = logged(run)[len(before):]
    assert after[-1]["step"] == 15 and after[-1]["loss"] < before[0]["loss"]
    assert abs(after[-1]["loss"] - before[-1]["loss"]) < 0.5, (before, after)  # continues, does not restart
    assert ckpt_io.read_meta(run / "checkpoints" / "step_00000015")["world_size"] == 1

    # 1 -> 2 ranks, from the step-15 checkpoint written on one rank.
    two = mm_ds(*stage_args(corpus, run, "train.steps=20", *common, f"launch.master_port={free_port()}", "--resume"),
                env={"MM_DS_DUMP_RESUMED": str(dump)})
    out = check(two, two.stdout + two.stderr)
    assert "world size 1 -> 2" in out and "at step 15" in out, out[-3000:]
    expected, loaded = ckpt_io.consolidate(run / "checkpoints" / "step_00000015"), torch.load(dump)
    assert all(torch.equal(expected[k], loaded[k]) for k in expected)
    assert (run / "checkpoints" / "step_00000015.universal" / ckpt_io.MANIFEST).is_file()
    final = ckpt_io.read_meta(run / "final")
    assert final["step"] == 20 and final["world_size"] == 2
    last = logged(run)[-1]
    assert last["step"] == 20 and last["loss"] < before[0]["loss"]
