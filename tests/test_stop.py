"""A stopped job loses nothing but the update in flight (issue 38; docs/reliability.md): stop signals only set a flag,
the ranks agree one update late, save a verified `resume` checkpoint and exit 75, through every launcher path; resume
checkpoints rotate while the curve ones stay; a save hashes each file once and needs every optimizer shard.

The 2-rank cases share their launches: one Step-1 run (multi-depth MINIJOINT) stopped three times (SIGTERM to the
`mm-ds` launcher process at a seeded random time; a signal during a curve checkpoint to a rank that waits in a
collective, with a second signal during the stop's save; a signal before the first update) and finished; one
multi-depth Step-2 run under launchers/slurm.sbatch with a fake SLURM (SIGUSR1 to the batch shell at a random time,
requeued, resumed); a Step-3 pack stopped through its rank; two network-namespace nodes with SIGTERM to one rank. Each
finished run is compared bitwise with an uninterrupted one (fp32, CPU). MM_DS_STOP_SEED picks other random times.
`mm-ds run`'s parent stopped: tests/test_pipeline_resume.py. Ten seeded stops: `python tests/fault_harness.py --stops 10`.
"""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mm_ds.runtime import faults
from mm_ds.runtime.checkpointing import checkpoint, sums
from mm_ds.runtime.distributed import stop
from mm_ds.runtime.distributed.dist import free_port
from mm_ds.runtime.training.boundary import LaggedMax

ROOT = Path(__file__).resolve().parents[1]
SEED = int(os.environ.get("MM_DS_STOP_SEED", 0))
GRACE_S = stop.GRACE_S
STEPS = 14
CURVE = 8
MODEL = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.ffn_size=64", "data.seq_len=32",
         "model.max_positions=32"]
TRAIN = ["train.global_batch=16", "train.micro_batch=4", "train.lr=3e-3", "train.warmup_steps=2", "train.log_every=1",
         f"train.checkpoint_steps=[{CURVE}]", "train.checkpoint_every=1000000", f"train.steps={STEPS}",
         "train.resume_every=3", "train.keep_resume=1", "peak_tflops=1"]
ENV = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
       "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
"""One thread per rank everywhere (here 2 ranks share 2 cores; a namespace node has one rank): the same sums."""


# ---------------------------------------------------------------- the flag, the lag, the forwarding (no launch)

def test_a_signal_only_sets_the_flag_and_a_second_is_counted_and_ignored():
    stop.reset()
    # a known handler before (an earlier test in this process may have left the flag's own installed)
    outer = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with stop.handling():
            stop.in_flight = 7
            os.kill(os.getpid(), signal.SIGUSR1)
            os.kill(os.getpid(), signal.SIGTERM)
            seen = stop.requested()
            assert (seen.name, seen.update, stop.ignored()) == ("SIGUSR1", 7, 1)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers before are back
    finally:
        signal.signal(signal.SIGTERM, outer)
        stop.reset()
    with pytest.raises(ValueError, match="SIGKILL"):
        stop.check_names(["SIGKILL"])


def test_the_lagged_agreement_answers_one_boundary_late():
    lag = LaggedMax(2)
    assert lag.exchange([0, 1]) is None
    assert lag.exchange([15, 0]) == [0.0, 1.0]
    assert lag.exchange([0, 0]) == [15.0, 0.0]
    lag.close()
    assert lag.pending is None


def test_the_launcher_gets_the_signal_that_reaches_its_ranks_without_a_kill_behind_it():
    assert stop.forward_as(["/x/deepspeed", "--num_gpus", "2", "rank.py"], "SIGUSR1") == "SIGTERM"
    assert stop.forward_as(["/x/deepspeed", "--hostfile", "h", "--launcher", "openmpi", "r.py"], "SIGTERM") == "SIGUSR1"
    assert stop.forward_as(["/usr/bin/mpirun", "-n", "2"], "SIGINT") == "SIGUSR1"
    assert stop.forward_as(["srun", "--nodes", "2"], "SIGTERM") == "SIGUSR1"
    assert stop.forward_as([sys.executable, "-m", "mm_ds.cli", "pretrain"], "SIGINT") == "SIGINT"


LAUNCHER = r'''
import os, signal, subprocess, sys, time
# A stand-in launcher: it dies at once on the signal (as a single-node deepspeed runner does) and leaves its "rank",
# which saves for a while after the signal, then exits 75.
rank = subprocess.Popen([sys.executable, "-c", """
import signal, sys, time
got = []
signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
open(sys.argv[1] + ".ready", "w").close()
while not got:
    time.sleep(0.05)
time.sleep(1.5)
open(sys.argv[1], "w").write(str(time.time()))
sys.exit(75)
""", sys.argv[1]])
rank.wait()
'''
PARENT = ("import sys; from mm_ds.runtime.distributed import stop; "
          "sys.exit(stop.run_child([sys.executable, '-c', sys.argv[1], sys.argv[2]]))")


def test_the_parent_passes_a_stop_to_the_launchers_group_and_waits_for_its_ranks(tmp_path):
    """`mm-ds STAGE`'s side (stop.run_child): the launcher in its own session, the signal passed to its process group,
    the parent waiting for the "rank" that outlives the launcher, then exit 75."""
    saved = tmp_path / "saved"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, LAUNCHER, str(saved)], env=os.environ | ENV)
    deadline = time.monotonic() + 60
    while not Path(str(saved) + ".ready").exists():
        assert time.monotonic() < deadline and parent.poll() is None, "the stand-in rank never started"
        time.sleep(0.1)
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=30) == stop.EXIT_CODE
    assert saved.is_file() and float(saved.read_text()) <= time.time()  # it waited for the save


WATCHED = r'''
import os, signal, sys, time
from mm_ds.runtime.distributed import watchdog
# A "rank" whose launcher is its parent: it records SIGTERM and goes on (as a rank whose save takes a while).
signal.signal(signal.SIGTERM, lambda s, f: open(sys.argv[1], "a").write(f"SIGTERM {time.monotonic()}\n"))
watchdog.start(0, poll_s=0.2)
getattr(watchdog, "set_grace", lambda s: None)(2.0)  # (main's watchdog has no grace: it SIGKILLs at once)
open(sys.argv[1] + ".ready", "w").close()
time.sleep(60)
'''


def test_a_lost_launcher_makes_the_watchdog_stop_the_rank_then_kill_it_after_the_grace(tmp_path):
    """The rank gets SIGTERM first (it would stop with its peers, after a save) and SIGKILL only once
    train.stop_grace_s (here 2 s, told over the watcher's stdin) is over; main SIGKILLed it at once."""
    seen = tmp_path / "seen"
    launcher = subprocess.Popen([sys.executable, "-c", "import os, subprocess, sys, time; os.environ['MM_DS_LAUNCH_"
                                 "ROOT'] = str(os.getpid()); subprocess.Popen(sys.argv[1:]); time.sleep(60)",
                                 sys.executable, "-c", WATCHED, str(seen)], env=os.environ | ENV)
    deadline = time.monotonic() + 60
    while not Path(str(seen) + ".ready").exists():
        assert time.monotonic() < deadline, "the stand-in rank never started"
        time.sleep(0.1)
    import psutil
    rank = psutil.Process(launcher.pid).children()[0]
    launcher.kill()
    gone = time.monotonic()
    launcher.wait()
    rank.wait(timeout=30)
    lines = seen.read_text().splitlines() if seen.exists() else []
    assert len(lines) == 1 and lines[0].startswith("SIGTERM"), lines  # warned first
    assert 1.5 < time.monotonic() - gone < 15  # killed after the grace, not at once


# ---------------------------------------------------------------- checkpoints: kinds, rotation, one hash, shards

def _checkpoint(run: Path, step: int, kind: str) -> Path:
    ckpt = checkpoint.checkpoints_dir(run) / checkpoint.tag_for(step)
    ckpt.mkdir(parents=True)
    (ckpt / checkpoint.MODEL_STATES).write_bytes(os.urandom(64))
    checkpoint.write_meta(ckpt, {"stage": "adapt", "step": step, "kind": kind})
    checkpoint.write_manifest(ckpt)
    checkpoint.write_text_atomic(checkpoint.checkpoints_dir(run) / checkpoint.LATEST, ckpt.name)
    return ckpt


def test_resume_checkpoints_rotate_curves_stay_and_resume_takes_the_newest_of_either(tmp_path):
    from mm_ds.eval.transfer import adapted_checkpoints

    run = tmp_path / "run"
    for step, kind in [(2, "resume"), (4, "curve"), (5, "resume"), (6, "resume"), (8, "curve"), (9, "resume")]:
        _checkpoint(run, step, kind)
        (checkpoint.checkpoints_dir(run) / f"{checkpoint.tag_for(step)}{checkpoint.UNIVERSAL}").mkdir()
        checkpoint.rotate_resume(run, keep=2)
    names = [c.name for c in checkpoint.list_checkpoints(run)]
    assert names == ["step_00000004", "step_00000006", "step_00000008", "step_00000009"]
    assert sorted(p.name for p in checkpoint.checkpoints_dir(run).glob("*.universal")) == [
        "step_00000004.universal", "step_00000006.universal", "step_00000008.universal", "step_00000009.universal"]
    assert [c.name for c in adapted_checkpoints(run, curve=True)] == ["step_00000004", "step_00000008"]
    assert checkpoint.find_resume_point(run).name == "step_00000009"  # a resume checkpoint, the newest
    (checkpoint.find_resume_point(run) / checkpoint.MODEL_STATES).write_bytes(b"corrupt")
    assert checkpoint.find_resume_point(run).name == "step_00000008"  # the newest that verifies, a curve one


def test_a_checkpoint_is_hashed_once_when_it_is_written(tmp_path, monkeypatch):
    """write_manifest then verify (checkpoint.save's publish) read each file once; main read them twice."""
    read = []
    real = sums.sha256
    monkeypatch.setattr(sums, "sha256", lambda p, rank=0: read.append(Path(p).name) or real(p, rank))
    ckpt = _checkpoint(tmp_path / "run", 1, "curve")
    checkpoint.verify(ckpt)
    assert sorted(read) == sorted([checkpoint.MODEL_STATES, checkpoint.META])


def test_the_manifest_needs_every_optimizer_shard(tmp_path, monkeypatch):
    ckpt = tmp_path / "step"
    ckpt.mkdir()
    shards = checkpoint.optimizer_shards(2, bf16=True)
    assert shards == ["bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    (ckpt / shards[0]).write_bytes(b"rank 0")
    with pytest.raises(checkpoint.CheckpointError, match=r"1 optimizer shard\(s\) missing \(bf16_zero_pp_rank_1_"):
        checkpoint.await_files(ckpt, shards, wait_s=0.5)
    (ckpt / shards[1]).write_bytes(b"rank 1")
    listing = Path.rglob  # a stale shared-filesystem listing: rank 1's shard is there, but not listed
    monkeypatch.setattr(Path, "rglob", lambda self, pat: (p for p in listing(self, pat) if p.name != shards[1]))
    checkpoint.write_manifest(ckpt, required=checkpoint.await_files(ckpt, shards))
    assert set(json.loads((ckpt / checkpoint.MANIFEST).read_text())["files"]) == set(shards)


def test_stop_fault_points_parse_and_name_a_bad_value():
    a = faults.read({"MM_DS_SIGNAL_AT": "3:1:SIGTERM,0:0:SIGUSR1:0.5", "MM_DS_SLOW": "0.2::1",
                     "MM_DS_SIGNAL_IN_SAVE": "stop:1:after-engine-save:SIGINT"})
    assert a.signal_at == ((3, 1, "SIGTERM", 0.0), (0, 0, "SIGUSR1", 0.5)) and a.slow == (0.2, None, 1, None)
    assert a.signal_in_save == (("stop", 1, "after-engine-save", "SIGINT", 0.0),) and a
    with pytest.raises(ValueError, match="'SIGFOO' is not a signal name"):
        faults.read({"MM_DS_SIGNAL_AT": "3:1:SIGFOO"})
    with pytest.raises(ValueError, match="phase 'halfway'"):
        faults.read({"MM_DS_SIGNAL_IN_SAVE": "*:0:halfway:SIGTERM"})


def test_plan_prints_the_resume_interval_and_its_cost(capsys):
    from mm_ds.config import ConfigError, load
    from mm_ds.tools.plan import plan

    assert plan.main(["paper", "--nodes", "1", "--mfu", "0.2"]) == 0
    out = capsys.readouterr().out.split("resume checkpoints (train.resume_every_minutes")[1]
    row = next(line for line in out.splitlines() if line.startswith("| BL_BASE | step1 |"))
    curve_min, every, writes = row.split("|")[3:6]
    assert float(curve_min) > 5 and float(every) == 5 and int(writes.replace(",", "")) > 0, row
    with pytest.raises(ConfigError, match="train.stop_signals"):
        load("tiny/bl_base", None, ["train.stop_signals=[SIGKILL]"])


# ---------------------------------------------------------------- launched runs: helpers

def stage1(corpus: Path, out: Path, *extra: str) -> list[str]:
    """Step 1 of multi-depth MINIJOINT (secondary heads after layers 1 and 2), tiny, on 2 ranks."""
    return ["pretrain", "--preset", "tiny/minijoint", "--out", str(out), "--no-progress", f"data.corpus={corpus}",
            *MODEL, "model.secondary_head_layer=[1,2]", *TRAIN, *extra]


def start(argv: list[str], log: Path, env: dict | None = None, script: bool = False, **kw) -> subprocess.Popen:
    """`mm-ds ARGV` (`script`: `python ARGV`, e.g. mm_ds/rank.py and its argument), output to `log`."""
    with open(log, "a") as f:
        return subprocess.Popen([sys.executable, *([] if script else ["-m", "mm_ds.cli"]), *argv], stdout=f,
                                stderr=subprocess.STDOUT, env=os.environ | ENV | (env or {}), cwd=ROOT, **kw)


def finish(proc: subprocess.Popen, log: Path, want: int, timeout: float = 300) -> str:
    rc = proc.wait(timeout=timeout)
    out = log.read_text()
    assert rc == want, f"exit {rc}, expected {want}:\n{out[-4000:]}"
    return out


def rows(run: Path) -> list[dict]:
    path = run / "logs" / "train.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def wait_for_update(run: Path, step: int, proc: subprocess.Popen, timeout: float = 240) -> int:
    """Block until the run's log has a row at `step` or later (log_every=1: every update); its newest step."""
    deadline = time.monotonic() + timeout
    while True:
        done = max((r["step"] for r in rows(run) if "step" in r), default=0)
        if done >= step:
            return done
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before update {step}"
        assert time.monotonic() < deadline, f"no update {step} after {timeout} s"
        time.sleep(0.05)


STOP_LINE = re.compile(r"\[mm-ds\] stopped by (SIG\w+) at update (\d+)(?: \(seen in update (\d+)\))?; (.*); resume "
                       r"with: (.*)")


def stopped(out: str) -> dict:
    """Rank 0's one stop line, parsed."""
    lines = [m for m in map(STOP_LINE.search, out.splitlines()) if m]
    assert len(lines) == 1, f"expected one stop line:\n{out[-4000:]}"
    m = lines[0]
    return {"signal": m[1], "at": int(m[2]), "seen": int(m[3]) if m[3] else None, "what": m[4], "resume": m[5]}


def signal_at_random(rng: random.Random, run: Path, proc: subprocess.Popen, pid: int, sig: int, first: int,
                     last: int, slow: float) -> tuple[int, float]:
    """Once the run has done a random update in [first, last], wait a random part of an update and send `sig` to
    `pid`: (the newest update logged just before, the time it was sent)."""
    wait_for_update(run, rng.randint(first, last), proc)
    time.sleep(rng.uniform(0, slow))
    newest = max(r["step"] for r in rows(run) if "step" in r)
    os.kill(pid, sig)
    return newest, time.monotonic()


def check_stop(out: str, run: Path, newest: int | None = None) -> dict:
    """The stop line's promises: the run stopped after the update the signal was seen in or the next, saved there
    (the resume point), and nothing ran after it (lost: no update)."""
    s = stopped(out)
    assert s["at"] - s["seen"] in (0, 1), s
    if newest is not None:  # the signal went out after update `newest` was logged
        assert newest + 1 <= s["seen"] <= newest + 3, (newest, s)
    assert s["what"].startswith(f"saved {checkpoint.tag_for(s['at'])}"), s
    assert checkpoint.find_resume_point(run).name == checkpoint.tag_for(s["at"])
    assert checkpoint.read_meta(checkpoint.find_resume_point(run))["kind"] in ("resume", "curve")
    assert max(r["step"] for r in rows(run) if "step" in r) == s["at"]  # the stop's row, and none after it
    return s


def same_weights(a: Path, b: Path) -> list[str]:
    x, y = load_file(str(a / "final" / "model.safetensors")), load_file(str(b / "final" / "model.safetensors"))
    return sorted(set(x) ^ set(y)) or [k for k in x if not torch.equal(x[k], y[k])]


# ---------------------------------------------------------------- Step 1: the launcher, a curve checkpoint, the start

@pytest.fixture(scope="module")
def step1(corpus, tmp_path_factory):
    """An uninterrupted reference, and one run stopped three times and finished (see the module docstring)."""
    root, rng = tmp_path_factory.mktemp("step1"), random.Random(SEED)
    ref, run, log = root / "reference", root / "run", root / "run.log"
    finish(start(stage1(corpus, ref, "launch.ranks=2", f"launch.master_port={free_port()}"), root / "ref.log"),
           root / "ref.log", 0)
    found = {}
    port = ["launch.ranks=2", f"launch.master_port={free_port()}"]
    # SIGTERM to the `mm-ds` process that started the launcher, at a random time of updates 2-4 (each held 0.3 s)
    proc = start(stage1(corpus, run, *port), log, {"MM_DS_SLOW": "0.3"})
    newest, sent = signal_at_random(rng, run, proc, proc.pid, signal.SIGTERM, 1, 3, 0.3)
    out = finish(proc, log, stop.EXIT_CODE)
    found["launcher"] = (check_stop(out, run, newest), time.monotonic() - sent, out)
    # Rank 1 gets SIGUSR1 0.5 s into the save of curve checkpoint 8, while rank 0 is held 1.5 s publishing it: rank 1
    # waits in a collective. During the stop's save rank 1 gets SIGINT too (ignored).
    log.write_text("")
    proc = start(stage1(corpus, run, *port, "--resume"), log, {
        "MM_DS_SIGNAL_IN_SAVE": f"{CURVE}:1:after-engine-save:SIGUSR1:0.5,stop:1:after-engine-save:SIGINT",
        "MM_DS_SLOW": f"1.5:{CURVE}:0:after-meta"})
    out = finish(proc, log, stop.EXIT_CODE)
    found["curve"] = (check_stop(out, run), out)
    # SIGTERM to rank 1 before the first update of the next resume: nothing to save
    log.write_text("")
    before = sorted(p.name for p in checkpoint.checkpoints_dir(run).iterdir())
    at = found["curve"][0]["at"]
    out = finish(start(stage1(corpus, run, *port, "--resume"), log, {"MM_DS_SIGNAL_AT": f"{at}:1:SIGTERM"}), log,
                 stop.EXIT_CODE)
    found["start"] = (stopped(out), before, sorted(p.name for p in checkpoint.checkpoints_dir(run).iterdir()), out)
    log.write_text("")
    found["end"] = finish(start(stage1(corpus, run, *port, "--resume"), log), log, 0)
    return ref, run, found


@pytest.mark.ranks
def test_sigterm_to_the_launcher_stops_every_rank_within_the_grace_after_a_save(step1):
    _, run, found = step1
    s, seconds, out = found["launcher"]
    assert s["signal"] == "SIGTERM" and seconds < GRACE_S, (s, seconds)
    assert "SIGTERM: passed on to the launcher" in out
    assert s["resume"].startswith("mm-ds pretrain --preset tiny/minijoint") and s["resume"].endswith("--resume")


@pytest.mark.ranks
def test_a_signal_during_a_curve_checkpoint_to_a_rank_in_a_collective_and_a_second_during_the_stop(step1):
    _, run, found = step1
    s, out = found["curve"]
    assert (s["signal"], s["seen"], s["at"]) == ("SIGUSR1", CURVE + 1, CURVE + 2), s
    sent = re.findall(r"\[mm-ds fault\] pid \d+ sends itself (SIG\w+)", out)
    assert sent[:1] == ["SIGUSR1"] and "SIGINT" in sent, sent  # SIGINT during the stop's save: ignored, saved
    assert "KeyboardInterrupt" not in out and "Traceback" not in out
    for c in checkpoint.list_checkpoints(run):  # the curve checkpoint and the stop's are published and intact
        checkpoint.verify(c)
    assert checkpoint.kind(checkpoint.checkpoints_dir(run) / checkpoint.tag_for(CURVE)) == "curve"


@pytest.mark.ranks
def test_a_signal_before_the_first_update_stops_with_nothing_to_save(step1):
    _, _, found = step1
    s, before, after, out = found["start"]
    assert s["signal"] == "SIGTERM" and "before any update of this run: nothing to save" in s["what"], s
    assert before == after  # no new checkpoint


@pytest.mark.ranks
def test_the_stopped_run_resumes_bitwise_and_rotates_its_resume_checkpoints(step1):
    ref, run, found = step1
    assert same_weights(ref, run) == []
    kinds = {c.name: checkpoint.kind(c) for c in checkpoint.list_checkpoints(run)}
    # curve checkpoints at 8 and the last step stay; of the resume ones (every 3 updates, and the stops') the newest
    assert kinds == {checkpoint.tag_for(CURVE): "curve", checkpoint.tag_for(12): "resume",
                     checkpoint.tag_for(STEPS): "curve"}, kinds
    saves = [r for r in rows(run) if "save_s" in r]
    assert {r["step"] for r in saves} >= {CURVE, STEPS} and all(r["save_s"] > 0 for r in saves)


# ---------------------------------------------------------------- multi-depth Step 2 under sbatch, a fake SLURM

FAKE_SBATCH = r'''#!/usr/bin/env bash
# sbatch stand-in: runs the batch script here with a job's variables (its pid in $FAKE_SLURM/batch.pid: the test,
# as slurmctld would at --signal=B:USR1@..., signals it), and runs it again after `scontrol requeue`.
script=$1; shift
export SLURM_JOB_ID=4242 SLURM_JOB_NODELIST=localhost SLURM_NNODES=1 SLURM_JOB_NUM_NODES=1 SLURM_NTASKS=2 \
       SLURM_NTASKS_PER_NODE=2
restarts=0
while :; do
    SLURM_RESTART_COUNT=$restarts bash "$script" "$@" &
    echo $! > "$FAKE_SLURM/batch.pid"
    rc=0; wait $! || rc=$?
    echo "[fake sbatch] batch script exited $rc"
    [[ -f $FAKE_SLURM/requeued ]] || exit $rc
    rm "$FAKE_SLURM/requeued"; restarts=$((restarts + 1))
done
'''
FAKE_SRUN = r'''#!/usr/bin/env bash
# srun stand-in: each task with SLURM's task variables; SIGUSR1/SIGTERM/SIGINT passed on to every task, as srun does.
n=${SLURM_NTASKS:-1}
while [[ "$1" == -* ]]; do case "$1" in -n|--ntasks) n=$2; shift 2 ;; *) shift ;; esac; done
pids=()
for ((i = 0; i < n; i++)); do
    SLURM_PROCID=$i SLURM_LOCALID=$i SLURM_STEP_NUM_TASKS=$n SLURM_STEP_TASKS_PER_NODE=$n \
    SLURM_STEP_NODELIST=localhost SLURM_STEP_NUM_NODES=1 "$@" & pids+=($!)
done
pass_on() { echo "[fake srun] passing $1 to the tasks"; kill -s "$1" "${pids[@]}" 2>/dev/null || true; }
trap 'pass_on USR1' USR1; trap 'pass_on TERM' TERM; trap 'pass_on INT' INT
rc=0
for p in "${pids[@]}"; do
    while :; do r=0; wait "$p" || r=$?; kill -0 "$p" 2>/dev/null || break; done
    (( r > rc )) && rc=$r
done
exit $rc
'''
FAKE_SCONTROL = r'''#!/usr/bin/env bash
case "$1" in
    requeue) echo "$2" > "$FAKE_SLURM/requeued"; echo "requeue $2" >> "$FAKE_SLURM/scontrol.log" ;;
    show) echo localhost ;;
esac
'''


def fake_slurm(root: Path) -> Path:
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in (("sbatch", FAKE_SBATCH), ("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def stage2(parent: Path, corpus: Path, out: Path, *extra: str) -> list[str]:
    """Multi-depth Step 2 of MINIJOINT@1+2 (depth 1, then 2 from update 6), tiny."""
    return ["adapt", "--preset", "tiny/adapt", "--out", str(out), "--no-progress", "system=minijoint@1+2", "lang=t1",
            f"parent={parent}", f"data.corpus={corpus}", "data.seq_len=32", *TRAIN, "train.checkpoint_steps=[6]",
            "mini.depth_shares=[1,1]", *extra]


@pytest.fixture(scope="module")
def step2(corpus, tmp_path_factory):
    """Its parent (Step 1 on one process, Step 1b's extraction), an uninterrupted 2-rank reference, and a run under
    launchers/slurm.sbatch that SLURM signals (B:USR1) at a random update, requeues, and resumes."""
    root, rng = tmp_path_factory.mktemp("step2"), random.Random(SEED + 1)
    one = ["launch.launcher=none", "launch.ranks=1"]
    log = root / "setup.log"
    finish(start(stage1(corpus, root / "p", *one, "train.steps=4", "train.checkpoint_steps=[]"), log), log, 0)
    finish(start(["build-mini", "--preset", "tiny/build_mini", "--out", str(root / "b"), "--no-progress",
                  "system=minijoint@1+2", f"parent={root / 'p'}", f"data.corpus={corpus}", "data.seq_len=32", *one],
                 log), log, 0)
    finish(start(stage2(root / "b", corpus, root / "reference", "launch.ranks=2", f"launch.master_port={free_port()}"),
                 log), log, 0)
    script = (ROOT / "launchers" / "slurm.sbatch").read_text()
    assert "#SBATCH --signal=B:USR1@" in script and "#SBATCH --requeue" in script
    fake, run, job = root / "slurm", root / "run", root / "job.out"
    bin_dir = fake_slurm(fake)
    env = {"PATH": f"{bin_dir}:{ENV['PATH']}", "FAKE_SLURM": str(fake), "MASTER_PORT": str(free_port()),
           "PYTHON": sys.executable, "MM_DS_SLOW": "0.3"}
    with open(job, "w") as f:
        proc = subprocess.Popen([str(bin_dir / "sbatch"), "launchers/slurm.sbatch", *stage2(root / "b", corpus, run)],
                                stdout=f, stderr=subprocess.STDOUT, env=os.environ | ENV | env, cwd=ROOT)
    batch = None
    while batch is None:
        try:
            batch = int((fake / "batch.pid").read_text())
        except (OSError, ValueError):
            time.sleep(0.1)
    newest, sent = signal_at_random(rng, run, proc, batch, signal.SIGUSR1, 1, 7, 0.3)  # both depths' updates
    assert proc.wait(timeout=600) == 0, job.read_text()[-4000:]
    return root / "reference", run, job.read_text(), newest, (fake / "scontrol.log").read_text()


@pytest.mark.ranks
def test_sbatch_usr1_stops_the_srun_tasks_requeues_and_the_requeued_job_resumes_bitwise(step2):
    ref, run, out, newest, scontrol = step2
    first, second = out.split("[fake sbatch] batch script exited", 1)
    s = stopped(first)
    assert s["signal"] == "SIGUSR1" and newest + 1 <= s["seen"] <= newest + 3 and s["at"] - s["seen"] in (0, 1), s
    assert "[fake srun] passing USR1 to the tasks" in first and second.startswith(f" {stop.EXIT_CODE}\n")
    assert "requeueing job 4242" in first and scontrol == "requeue 4242\n"
    assert f"resumed from {run / 'checkpoints' / checkpoint.tag_for(s['at'])} at step {s['at']}" in second
    assert same_weights(ref, run) == []
    meta = checkpoint.read_meta(run / "final")
    assert meta["depth_phases"] == [[1, 0, 7], [2, 7, 14]] and meta["world_size"] == 2, meta


# ---------------------------------------------------------------- a Step-3 pack

@pytest.mark.ranks
def test_a_stop_to_a_pack_is_passed_to_its_run_which_saves_and_no_other_run_starts(corpus, tmp_path):
    """A job of one pack (Step 3's runs on a launch's ranks; here a world of one with two tiny runs, `mm_ds/rank.py
    JOB.json`): SIGTERM to the rank while its first run trains reaches the run, which saves and exits 75; the second
    run never starts; the pack ends with 75; the same job again resumes the stopped run and runs the other."""
    from mm_ds.pipeline import jobs
    from mm_ds.pipeline.pack import Pack, statuses
    from mm_ds.runtime.distributed.launch import ENTRY

    runs = tuple({"name": f"run{i}", "out": str(tmp_path / f"run{i}"), "log": str(tmp_path / f"run{i}.log"),
                  "argv": stage1(corpus, tmp_path / f"run{i}", "launch.launcher=none", "launch.ranks=1",
                                 "train.steps=6", "train.checkpoint_steps=[]")} for i in (1, 2))
    item = Pack("pack", runs, str(tmp_path / "pack"))
    (tmp_path / "pack").mkdir()
    job, log = jobs.write(tmp_path / "pack.json", [item]), tmp_path / "pack.log"
    proc = start([ENTRY, str(job)], log, {"MM_DS_SLOW": "0.3"}, script=True)
    wait_for_update(tmp_path / "run1", 2, proc)
    proc.send_signal(signal.SIGTERM)
    out = finish(proc, log, stop.EXIT_CODE)
    assert "pack stopped: 1 run(s) stopped, 0 failed" in out, out[-3000:]
    state = {s["name"]: s for s in statuses(item.status)}
    assert set(state) == {"run1"} and (state["run1"]["state"], state["run1"]["exit_code"]) == ("stopped", 75)
    s = check_stop((tmp_path / "run1.log").read_text(), tmp_path / "run1")
    finish(start([ENTRY, str(job)], log, script=True), log, 0)
    assert f"resumed from {tmp_path / 'run1' / 'checkpoints' / checkpoint.tag_for(s['at'])}" in \
        (tmp_path / "run1.log").read_text()
    assert {s["name"]: s["state"] for s in statuses(item.status)} == {"run1": "done", "run2": "done"}


# ---------------------------------------------------------------- two network-namespace nodes

@pytest.mark.ranks
def test_sigterm_to_one_rank_of_two_namespace_nodes_stops_both_and_resumes_bitwise(corpus, step1, tmp_path):
    """`deepspeed --no_ssh --node_rank K` on two emulated nodes (tests/support/netns.py), a rank each: SIGTERM to node
    1's rank alone, at a random update; both nodes' ranks save and exit 75 (their peer's flag reaches them through the
    lagged all-reduce over the nodes' link), and resuming on both finishes bitwise as the 2-rank reference."""
    import psutil

    from support.netns import VENV_BIN, Nodes, Unavailable, remote_env, wait_all

    ref, _, _ = step1
    nodes = Nodes(2)
    try:
        nodes.up()
    except Unavailable as e:
        pytest.skip(str(e))
    try:
        hosts, run, rng = nodes.hostfile(tmp_path / "hosts"), tmp_path / "run", random.Random(SEED + 2)
        env = remote_env(OMP_NUM_THREADS="1", MM_DS_SLOW="0.3")

        def on_nodes(*extra: str) -> list[subprocess.Popen]:
            return [nodes.start(nodes[k], [str(VENV_BIN / "python"), "-m", "mm_ds.cli", *stage1(corpus, run, *extra),
                                           f"launch.hostfile={hosts}", "launch.nodes=2", "launch.ranks=1",
                                           f"launch.node_rank={k}"], env, tmp_path / f"node{k}.log", ROOT)
                    for k in (0, 1)]

        procs = on_nodes()
        wait_for_update(run, 1, procs[0], timeout=150)
        rank = next(p for p in psutil.Process(procs[1].pid).children(recursive=True)
                    if "--local_rank=0" in " ".join(p.cmdline()) and "rank.py" in " ".join(p.cmdline()))
        newest, sent = signal_at_random(rng, run, procs[0], rank.pid, signal.SIGTERM, 2, 4, 0.3)
        codes = wait_all(procs, 150)
        outs = [(tmp_path / f"node{k}.log").read_text() for k in (0, 1)]
        assert codes == [stop.EXIT_CODE] * 2 and time.monotonic() - sent < GRACE_S + 10, (codes, outs)
        check_stop(outs[0], run, newest)  # rank 0 (node 0) says it: the signal came to node 1
        assert wait_all(on_nodes("--resume"), 150) == [0, 0]
        assert same_weights(ref, run) == []
    finally:
        nodes.down()
