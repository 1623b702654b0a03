"""Crash at any point, resume, lose nothing (tests/fault_harness.py on tiny runs of every stage kind), plus
non-finite updates, a full disk and corrupted checkpoints. The full sweep: `python tests/fault_harness.py --full`."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import fault_harness as harness
from mm_ds.runtime.checkpointing import checkpoint
from mm_ds.tools import verify


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The CI subset: a 2-rank pretraining run interrupted in a save and then by a SIGKILLed launcher; one
    seeded random fault in each of Step 1b (MINIPOST), Step 2 and finetuning (1 rank). MM_DS_FAULT_SEED
    picks other points."""
    root = tmp_path_factory.mktemp("faults")
    reports = harness.sweep(root, full=False, seed=int(os.environ.get("MM_DS_FAULT_SEED", 0)))
    return root, reports


@pytest.mark.ranks
def test_every_stage_kind_survives_a_kill_and_resumes_bitwise(sweep):
    _, reports = sweep
    assert {r["stage"] for r in reports} == set(harness.STAGE_KINDS)
    bad = [r for r in reports if not r["ok"]]
    assert not bad, json.dumps(bad, indent=1)
    kinds = " ".join(f for r in reports for f in r["faults"])
    assert "the launcher" in kinds and "in save" in kinds  # the orphan/port check ran after the launcher kill


def _fresh_copy(ref: Path, dst: Path) -> Path:
    shutil.copytree(ref, dst)
    shutil.rmtree(dst / "final")
    return dst


@pytest.mark.ranks
def test_corrupt_newest_checkpoint_is_refused_and_resume_falls_back(sweep, tmp_path, capsys):
    root, _ = sweep
    ref = root / "reference" / "pretrain_r2"
    run = _fresh_copy(ref, tmp_path / "run")
    newest = checkpoint.list_checkpoints(run)[-1]
    victim = sorted(p for p in newest.iterdir() if p.suffix == ".pt")[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))

    assert verify.main([str(newest)]) == 1
    assert verify.main([str(run)]) == 1
    out = capsys.readouterr().out
    previous = checkpoint.list_checkpoints(run)[-2]
    assert f"BAD   {victim}: sha256 differs" in out and f"--resume would use: {previous.name}" in out
    with pytest.raises(checkpoint.CheckpointError, match=victim.name):
        checkpoint.load_final(newest)
    assert checkpoint.find_resume_point(run) == previous
    assert "skipping checkpoint that fails verification" in capsys.readouterr().out

    ws = harness.Workspace(root, ranks=2)
    refused = ws.run(ws.argv("pretrain"), run, check=False)  # the same command without --resume
    assert refused.returncode == 2 and "pass --resume to continue it" in refused.stderr
    assert checkpoint.list_checkpoints(run)[-1] == newest  # nothing overwritten
    proc = ws.run(ws.argv("pretrain"), run, resume=True)
    assert f"resumed from {previous}" in proc.stdout
    assert harness.same_weights(ref, run) == []


@pytest.mark.ranks
def test_truncated_or_unmanifested_weights_never_load(sweep, tmp_path):
    root, _ = sweep
    final = tmp_path / "final"
    shutil.copytree(root / "reference" / "pretrain_r2" / "final", final)
    assert verify.main([str(final)]) == 0
    w = final / checkpoint.WEIGHTS
    w.write_bytes(w.read_bytes()[:-100])
    with pytest.raises(checkpoint.CheckpointError, match=r"model.safetensors: \d+ bytes, manifest says"):
        checkpoint.load_final(final)
    step = tmp_path / "step"
    shutil.copytree(checkpoint.list_checkpoints(root / "reference" / "pretrain_r2")[0], step)
    (step / checkpoint.MANIFEST).unlink()
    with pytest.raises(checkpoint.CheckpointError, match="no manifest.json"):
        checkpoint.load_into_engine(None, step)  # refused before DeepSpeed unpickles anything
    with pytest.raises(checkpoint.CheckpointError, match="no manifest.json"):
        checkpoint.consolidate(step)


def _nan_run(root: Path, out: Path, config: str, nan_at: str, *extra: str, steps: int = 6):
    ws = harness.Workspace(root, ranks=1)
    argv = ws.argv("pretrain") + [f"train.steps={steps}", "train.checkpoint_every=1", "train.warmup_steps=1",
                                  f"ds_config={config}", *extra]
    return ws.run(argv, out, env={"MM_DS_NAN_AT": nan_at}, check=False)


# fp32 ZeRO 0: mm-ds drops the gradients; ZeRO 1-3 (and bf16's BF16_Optimizer): DeepSpeed 0.19.8 skips itself
@pytest.mark.ranks
@pytest.mark.parametrize("config", ["fp32_zero0.json", "fp32_zero1.json", "bf16_zero1.json"])
def test_nonfinite_update_is_skipped_not_applied(sweep, tmp_path, config):
    root, _ = sweep
    out = tmp_path / "run"
    proc = _nan_run(root, out, config, "4::loss_main", "train.max_nonfinite_steps=2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "skipped the update of step 4 (head(s): loss_main); 1 non-finite update(s) so far" in proc.stdout
    ck = {c.name: checkpoint.consolidate(c) for c in checkpoint.list_checkpoints(out)}
    before, skipped, after = ck["step_00000003"], ck["step_00000004"], ck["step_00000005"]
    assert all(torch.equal(before[k], skipped[k]) for k in before)  # the update did not apply
    assert not all(torch.equal(skipped[k], after[k]) for k in before)  # training went on
    assert all(torch.isfinite(v).all() for v in after.values())
    rows = [json.loads(l) for l in (out / "logs" / "train.jsonl").read_text().splitlines()]
    assert rows[-1]["nonfinite_steps"] == 1 and all(r["loss"] == r["loss"] for r in rows)  # no NaN logged


@pytest.mark.ranks
def test_nonfinite_budget_exhausted_stops_with_a_diagnostic(sweep, tmp_path):
    root, _ = sweep
    out = tmp_path / "run"
    proc = _nan_run(root, out, "fp32_zero1.json", "3,4", "train.max_nonfinite_steps=1")
    assert proc.returncode == 2
    msg = proc.stderr
    assert "non-finite loss or gradients at step 4 (head(s): loss)" in msg
    assert "2 non-finite update(s) so far, budget train.max_nonfinite_steps=1" in msg
    assert "Last good checkpoint: step_00000003" in msg
    assert not (out / "final").exists() and checkpoint.find_resume_point(out).name == "step_00000003"


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


@pytest.mark.ranks
def test_disk_full_while_saving(sweep, tmp_path):
    """A real full filesystem (a small tmpfs; needs root, else skipped): the save fails with a message that
    says so, the previous checkpoint stays intact and published, and the run stops instead of going on."""
    root, _ = sweep
    disk = tmp_path / "disk"
    if os.geteuid() != 0 or not _mount_tmpfs(disk, "4m"):
        pytest.skip("mounting a small tmpfs needs root; the save error path is covered by test_bad_input")
    try:
        ws = harness.Workspace(root, ranks=1)
        argv = ws.argv("pretrain") + ["train.steps=8"]
        out = disk / "run"
        ws.run(argv, out, env={"MM_DS_KILL_AT": "4"}, check=False)  # one checkpoint: measure it
        used = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        one = sum(p.stat().st_size for p in (out / "checkpoints" / "step_00000004").rglob("*"))
        subprocess.run(["mount", "-o", f"remount,size={(used + one // 2) // 1024 + 8}k", str(disk)], check=True)
        proc = ws.run(argv, out, resume=True, check=False)
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert "saving checkpoint" in proc.stderr and "step_00000008 failed" in proc.stderr
        assert "No space left on device" in proc.stderr or "disk full?" in proc.stderr, proc.stderr[-2000:]
        assert "previous checkpoint (step_00000004) is intact" in proc.stderr
        assert checkpoint.latest_tag(out) == "step_00000004" and not (out / "final").exists()
        assert not list((out / "checkpoints").glob("*.tmp"))
        checkpoint.verify(out / "checkpoints" / "step_00000004")
        checkpoint.consolidate(out / "checkpoints" / "step_00000004")
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
