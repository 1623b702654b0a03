"""A failure in rank 0's own work (the run files, the frozen and final weights, the checkpoint to resume from, a
checkpoint's directory, the training log, a universal conversion, the evaluation's unit list, one job's stage
list and stage state) ends every rank promptly with the reason, said once: the other ranks learn of it from a
collective (`dist.on_rank0`), not from a barrier or a broadcast that under NCCL waits 30 minutes for a rank that
left."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fault_harness as harness
from mm_ds.config import LaunchConfig
from mm_ds.pipeline import jobs
from mm_ds.pipeline import run as pipeline
from mm_ds.runtime.checkpointing import checkpoint
from mm_ds.runtime.distributed.dist import free_port
from mm_ds.runtime.distributed.launch import rank_command
from mm_ds.stages.resolve import StageRun

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.ranks
def test_every_rank_raises_when_rank_0_fails_alone(corpus, tmp_path):
    """Two ranks started as a launcher on two nodes would start them (no launcher kills the survivor when one
    exits): at each point rank 0 raises a message that names the obstacle, and rank 1 learns that rank 0
    failed, within seconds, instead of waiting for it."""
    port, procs = free_port(), []
    for rank in (0, 1):
        env = os.environ | {"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1",
                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, str(ROOT / "tests" / "fault_harness.py"), "--out",
                                       str(tmp_path), "--rank0-failures", str(corpus)], env=env, cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + 120
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:
            p.kill()
        logs = [p.communicate()[0] for p in procs]
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) if (tmp_path / f"rank{r}.json").is_file() else {}
            for r in (0, 1)]
    points = list(harness._rank0_points(tmp_path, corpus))
    report = json.dumps(seen, indent=1) + "\n" + "\n".join(log[-3000:] for log in logs)
    assert list(seen[1]) == points, "rank 1 did not get past every point:\n" + report
    reads = {"resume point": "OSError", "one job's stage list": "ConfigError"}  # rank 0's own error, as is
    for point in points:
        (kind0, msg0, t0), (kind1, msg1, t1) = seen[0][point], seen[1][point]
        assert kind0 == reads.get(point, "CheckpointError") and kind1 == "OtherRankFailed", (point, report)
        assert "rank 1 stopped: rank 0 failed" in msg1 and t1 < 30, (point, msg1, t1)
        if point not in ("one job's stage state", *reads):
            assert "nothing was published" in msg0 and "what is in the way" in msg0, (point, msg0)
    assert [p.returncode for p in procs] == [0, 0], report
    assert not (tmp_path / "final weights" / "final").exists()  # nothing half-published
    assert checkpoint.list_checkpoints(tmp_path / "final weights")  # its checkpoint is intact


def failed_job(tmp_path: Path, items: list) -> tuple[str, str]:
    """`mm-ds run`'s one job of `items` as it runs it: 2 CPU ranks under the deepspeed launcher, their output in a
    log, a failure shown from the log's end. Returns the log and the failure's message (the job must fail)."""
    job = jobs.write(tmp_path / "job.json", items)
    log = tmp_path / "job.log"
    with pytest.raises(pipeline.StageFailed) as failed:
        pipeline._run_logged(rank_command(LaunchConfig(ranks=2, master_port=free_port()), job), log)
    return log.read_text(), str(failed.value)


@pytest.mark.ranks
def test_the_log_of_a_failed_job_names_the_error_once(corpus, tmp_path):
    """The measured case (a `final.tmp` in the way of the final weights, 2 CPU ranks) end to end. Every rank exits
    non-zero within 60 s; the output has rank 0's message once and no traceback."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "final.tmp").touch()
    stage = StageRun("pretrain", run, "tiny/bl_base", (
        f"data.corpus={corpus}", *harness.TINY_MODEL, "train.global_batch=8", "train.micro_batch=4",
        "train.warmup_steps=0", "train.steps=1", "train.checkpoint_steps=[]", "peak_tflops=1"))
    out, failed = failed_job(tmp_path, [jobs.Training(stage)])
    took = time.time() - (run / "checkpoints" / checkpoint.LATEST).stat().st_mtime  # since just before the failure
    reason = f"writing {run / 'final'} failed: FileExistsError"
    assert out.count(reason) == 1 and "Traceback" not in out, out[-4000:]
    assert failed.count(reason) == 1 and "failed with exit code 2;" in failed, failed
    assert "Move or remove what is in the way" in out and took < 60, took
    assert not (run / "final").exists() and checkpoint.list_checkpoints(run)


@pytest.mark.ranks
def test_the_log_of_a_failed_evaluation_names_the_error_once(tmp_path):
    """The same at a point of another kind: one job's Step 4, where rank 0 lists the evaluation's units into a run
    tree whose `logs` is a file. From the launch, every rank has exited non-zero within 60 s."""
    from mm_ds.pipeline.items import evaluation
    from mm_ds.pipeline.recipe import load_recipe

    run = tmp_path / "run"
    run.mkdir()
    (run / "logs").touch()
    t0 = time.monotonic()
    out, failed = failed_job(tmp_path, [evaluation(load_recipe("tiny", ["curve=false"]), run)])
    took = time.monotonic() - t0
    reason = f"writing {run / 'logs' / 'eval-units.json'} failed"
    assert out.count(reason) == 1 and "Traceback" not in out, out[-4000:]
    assert failed.count(reason) == 1 and "failed with exit code 2;" in failed, failed
    assert "what is in the way" in out and took < 60, took


def test_a_failed_stage_shows_its_error_line_when_launcher_lines_follow(tmp_path):
    """On many ranks the launchers' lines after a rank's error can fill the log's last lines: the error is
    still shown, once, and an earlier attempt's error in the same log is not."""
    log = tmp_path / "stage.log"
    log.write_text("mm-ds adapt: error: an earlier attempt's error\n")
    script = ("print('mm-ds adapt: error: writing RUN/' + 'final failed')\n"  # (not as such in the command line)
              "for i in range(40): print(f'Killing subprocess {i}')\nraise SystemExit(2)")
    with pytest.raises(pipeline.StageFailed) as failed:
        pipeline._run_logged([sys.executable, "-c", script], log)
    msg = str(failed.value)
    assert msg.count("writing RUN/final failed") == 1 and "earlier attempt" not in msg
    assert "Killing subprocess 25\n" in msg and "Killing subprocess 24\n" not in msg  # and the last 15 lines


@pytest.mark.ranks
def test_a_check_that_fails_on_one_rank_stops_every_rank(corpus, tmp_path):
    """Ranks started by hand, as a launcher starts them on two nodes: rank 1 does not see what rank 0 sees (the
    corpus, a path relative to its working directory, is not there on its node) and fails to build the stage that
    rank 0 resolved; rank 0, which saw nothing wrong, stops too (`dist.on_every_rank`) instead of waiting for rank 1
    in the next collective."""
    from test_launchers import TINY

    port, procs = free_port(), []
    for rank in (0, 1):
        env = os.environ | {"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1",
                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PYTHONPATH": str(ROOT)}
        node = corpus.parent if rank == 0 else tmp_path / "not-on-this-node"
        node.mkdir(exist_ok=True)
        procs.append(subprocess.Popen([sys.executable, "-m", "mm_ds.cli", "pretrain", "--preset", "tiny/minijoint",
                                       "--out", str(tmp_path / "run"), "--no-progress", f"data.corpus={corpus.name}",
                                       *TINY, "train.steps=6"], env=env, cwd=node, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    t0 = time.monotonic()
    try:
        logs = [p.communicate(timeout=max(1.0, 90 - (time.monotonic() - t0)))[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [2, 2], logs
    assert "is not a prepared corpus" in logs[1] and "error" in logs[1], logs[1][-2000:]
    assert "rank 0 stopped: another rank failed building the stage" in logs[0], logs[0][-2000:]
    assert not (tmp_path / "run" / "final").exists()
