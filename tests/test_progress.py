"""What `mm-ds run` prints while it works, from the files stage runs write (tests/test_pipeline.py sees it in a
real run)."""

import json
from dataclasses import asdict

from mm_ds.eval.transfer import Unit
from mm_ds.pipeline.progress import Follow, Watched, clock, last_row
from mm_ds.runtime.checkpointing import checkpoint


def finish(run):
    (run / checkpoint.FINAL).mkdir(parents=True)
    (run / checkpoint.FINAL / checkpoint.MANIFEST).write_text("{}")


def log_row(run, **row):
    (run / "logs").mkdir(parents=True, exist_ok=True)
    with open(run / "logs" / "train.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


def test_stages_start_progress_and_end_in_order(tmp_path, capsys):
    a, b = tmp_path / "pretrain" / "a", tmp_path / "adapt" / "b"
    follow = Follow([Watched("pretrain/a", a, tmp_path / "job.log", 0, 2),
                     Watched("adapt/b", b, tmp_path / "job.log", 1, 2)], interval_s=30)
    follow.poll(now=0)
    log_row(a, step=40, total_steps=100, loss=5.25, tokens_per_s=12_300, step_time_s=0.5)
    follow.poll(now=1)  # within the interval of the start: nothing yet
    follow.poll(now=31)
    log_row(a, step=50, total_steps=100, loss=5.0, tokens_per_s=12_000, step_time_s=0.5)
    follow.poll(now=40)  # a new step, but too soon after the last line
    finish(a)
    follow.poll(now=95)
    finish(b)
    follow.poll(now=100)
    assert capsys.readouterr().out.splitlines() == [
        f"[mm-ds run] pretrain/a: started (1/2); its log: {tmp_path / 'job.log'}",
        "[mm-ds run]   pretrain/a  step 40/100  loss 5.250  12.3k tok/s  ETA 0:30",
        f"[mm-ds run] pretrain/a: done in 1:35; training log: {a / 'logs' / 'train.jsonl'}",
        f"[mm-ds run] adapt/b: started (2/2); its log: {tmp_path / 'job.log'}",
        f"[mm-ds run] adapt/b: done in 0:05; training log: {b / 'logs' / 'train.jsonl'}",
    ]


def test_evaluation_progress_counts_results_once_stages_are_done(tmp_path, capsys):
    spec = tmp_path / "eval-units.json"
    follow = Follow([], spec, interval_s=0)
    follow.poll(now=0)  # no unit list yet (a one-job run writes it after Step 2): silent
    (tmp_path / "eval").mkdir()
    units = [Unit("xnli", lang, "test", "source", ("bl_base",), ("ft/seed1",)) for lang in ("en", "de")]
    spec.write_text(json.dumps({"results": str(tmp_path / "eval"), "units": [asdict(u) for u in units]}))
    follow.poll(now=1)
    (tmp_path / "eval" / f"{units[0].name}.json").write_text("{}")
    follow.poll(now=2)
    follow.poll(now=3)  # unchanged: no line
    assert capsys.readouterr().out.splitlines() == ["[mm-ds run] evaluation: 0/2 units have results",
                                                    "[mm-ds run] evaluation: 1/2 units have results"]


def test_last_row_skips_a_line_being_written(tmp_path):
    path = tmp_path / "train.jsonl"
    assert last_row(path) is None
    path.write_text('{"step": 1}\n{"step": 2}\n{"ste')
    assert last_row(path) == {"step": 2}
    assert (clock(59), clock(61), clock(3725)) == ("0:59", "1:01", "1:02:05")


def test_the_total_comes_from_the_stage_and_a_broken_display_does_not_stop_the_run(tmp_path, capsys):
    run = tmp_path / "finetune"
    log_row(run, step=10, total_steps=40, loss=1.0)  # finetuning counts its updates from epochs, not train.steps
    follow = Follow([Watched("finetune/x", run, tmp_path / "job.log")], interval_s=0)
    follow.poll(now=0)
    assert "step 10/40" in capsys.readouterr().out
    follow.stages = None  # anything going wrong in the display
    follow.poll(now=1)
    follow.poll(now=2)
    assert capsys.readouterr().out.count("the run goes on") == 1


def test_a_process_mm_ds_starts_keeps_what_the_user_set(tmp_path, monkeypatch):
    """One owner of the environment mm-ds gives the processes it starts (mm_ds/runtime/distributed/launch.py
    process_env): a value the user set wins over mm-ds's default, whether `mm-ds run` starts a launcher, a rank or
    `mm-ds prepare`. Before, run_logged put its own OMPI_ALLOW_RUN_AS_ROOT=1 over the user's, where launch_env kept
    the user's."""
    import sys

    from mm_ds.config import LaunchConfig
    from mm_ds.pipeline.progress import run_logged
    from mm_ds.runtime.distributed.launch import launch_env

    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT", "0")
    monkeypatch.delenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", raising=False)
    show = "import os; print(os.environ['OMPI_ALLOW_RUN_AS_ROOT'], os.environ['OMPI_ALLOW_RUN_AS_ROOT_CONFIRM'])"
    run_logged([sys.executable, "-c", show], tmp_path / "shown.log")
    assert (tmp_path / "shown.log").read_text().split() == ["0", "1"]
    env = launch_env(LaunchConfig(launcher="none"))
    assert (env["OMPI_ALLOW_RUN_AS_ROOT"], env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"]) == ("0", "1")
