"""The whole pipeline: `mm-ds run` on a miniature recipe (all four systems, 2 ranks under the deepspeed
launcher), then bitwise checks on what each stage may and may not change, re-run skipping, and the
pipeline's bad-input errors.

The engine configs are the shipped bf16 ones (the GPU path: BF16_Optimizer or the ZeRO optimizers over
DeepSpeed's FusedAdam, gradients accumulated in fp32 over 2 micro-steps), ZeRO 1, 2 and 3 spread over the
systems so that every stage kind trains under more than one. So the hand-off checks below hold in mixed
precision: a stage's frozen parameters in final/ are bit for bit its parent's fp32 weights."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

from mm_ds.config import ConfigError, model_config_from_dict
from mm_ds.model import surgery
from mm_ds.model.model import LANGUAGE_PARAMS
from mm_ds.pipeline.recipe import load_recipe
from mm_ds.runtime.checkpointing import checkpoint
from mm_ds.runtime.distributed.dist import free_port

SMALL = ["model.hidden_size=32", "model.num_heads=2", "model.ffn_size=64"]
MICRO = ["train.micro_batch=8"]  # 32 sequences on 2 ranks: 2 micro-steps, accumulated in fp32
ZERO = [("pretrain", "bl_base", 1), ("pretrain", "bl_small", 2), ("pretrain", "minijoint", 3),
        ("build_mini", "minipost", 2),
        ("adapt", "bl_base", 3), ("adapt", "bl_small", 1), ("adapt", "minijoint", 2), ("adapt", "minipost", 1),
        ("finetune", "bl_base", 2), ("finetune", "bl_small", 3), ("finetune", "minijoint", 1)]
# One run of each stage kind is also resumed from checkpoint k (test_bf16_stages_resume_...); the next checkpoint,
# k + 1, is where the uninterrupted and the resumed runs are compared.
RESUMED = {("pretrain", "minijoint"): 6, ("build_mini", "minipost"): 3, ("adapt", "bl_base"): 4,
           ("finetune", "bl_small"): 2}
RECIPE = {
    "systems": ["bl_base", "bl_small", "minijoint", "minipost"],
    "langs": ["t1"],
    "tasks": ["xnli", "xquad"],  # QA windows must fit the tiny model's 128 positions
    "seeds": [1],
    "world": {"seed": 0, "sentences": 3000, "target_sentences": 2000,
              "task_sizes": {"nli_train": 200, "paws_train": 50, "qa_train": 50, "dev": 50, "test": 100}},
    "prepare": {"vocab_size": 800, "model_type": "bpe"},
    "presets": {"pretrain": "tiny/{system}", "build_mini": "tiny/build_mini", "adapt": "tiny/adapt",
                "finetune": "tiny/finetune"},
    "overrides": {
        "pretrain": [*SMALL, "train.steps=12", "train.warmup_steps=2", "train.checkpoint_steps=[6]", *MICRO],
        "build_mini": ["train.steps=6", "train.warmup_steps=2", "train.checkpoint_steps=[]", *MICRO],
        "adapt": ["train.steps=8", "train.warmup_steps=2", "train.checkpoint_steps=[4]", *MICRO],
        "finetune": ["finetune.epochs=1", "finetune.max_train_examples=160", *MICRO],
        **{f"{stage}/{system}": [f"ds_config=bf16_zero{zero}.json",
                                 *([f"train.checkpoint_steps=[{RESUMED[stage, system]},{RESUMED[stage, system] + 1}]"]
                                   if (stage, system) in RESUMED else [])]
           for stage, system, zero in ZERO},
    },
    "launch": {"ranks": 2, "launcher": "deepspeed", "master_port": free_port()},
    "mode": "one_job",  # one deepspeed launch for all stages; tests/test_pipeline_resume.py runs per_stage
    "curve": True,
}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline")
    recipe = root / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    out = root / "run"
    proc = subprocess.run([sys.executable, "-m", "mm_ds.cli", "run", str(recipe), "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return recipe, out, proc.stdout


def weights(run):
    return checkpoint.load_final(run)


@pytest.mark.ranks
def test_all_four_systems_have_results(finished):
    _, out, stdout = finished
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    for system in RECIPE["systems"]:
        kinds = {r["condition"] for r in rows if r["system"] == system}
        assert kinds == {"source", "adapted", "control"}, (system, kinds)
        steps = sorted(r["step"] for r in rows
                       if r["system"] == system and r["condition"] == "adapted" and r["task"] == "xnli")
        assert steps == [4, 5, 8] if system == "bl_base" else [4, 8]  # the curve: every Step-2 checkpoint
    assert "MINIPOST" in stdout and "ctrl" in stdout
    # What a person watching sees: each stage start and end, with its log; the results' paths at the end.
    assert "[mm-ds run] pretrain/bl_base: started (1/" in stdout and "[mm-ds run] adapt/minipost/t1: done in" in stdout
    assert f"results: {out / 'results.md'}" in stdout and str(out / "report" / "curves_avg.png") in stdout
    assert "DeepSpeed" not in stdout and "[rank" not in stdout  # the ranks' output is in logs/job.log
    assert (out / "report" / "report.json").is_file()  # near-maximal performance, speedups, curves


@pytest.mark.ranks
def test_every_stage_kind_trained_in_bf16_under_each_zero_stage(finished):
    _, out, _ = finished
    job = (out / "logs" / "job.log").read_text()
    optimizer = {1: "BF16_Optimizer over FusedAdam", 2: "DeepSpeedZeroOptimizer over FusedAdam",
                 3: "DeepSpeedZeroOptimizer_Stage3 over FusedAdam"}
    for stage, system, zero in ZERO:
        run = {"pretrain": f"pretrain/{system}", "build_mini": f"build_mini/{system}",
               "adapt": f"adapt/{system}/t1", "finetune": f"finetune/{system}/xnli/seed1"}[stage]
        world = 1 if stage == "finetune" else 2  # Step 3: single-device runs, two at once on the job's ranks
        meta = json.loads((out / run / "final" / "mm_ds.json").read_text())
        assert (meta["precision"], meta["zero_stage"], meta["world_size"]) == ("bf16", zero, world), run
        log = job if world == 2 else (out / "logs" / f"finetune_{run.replace('/', '_')}.log").read_text()
        assert f"{system}/{stage} lang=" in log and f"zero={zero} bf16; optimizer {optimizer[zero]}" in log
        ds = json.loads((out / run / "ds_config.json").read_text())
        assert ds["data_types"]["grad_accum_dtype"] == "fp32" and ds["gradient_accumulation_steps"] == 4 // world
        weights = checkpoint.load_final(out / run)[1]
        assert all(v.dtype == torch.float32 for v in weights.values()), run
    assert "evaluation: " in job and "units on 2 rank(s)" in job  # Step 4 shared by the job's ranks
    from mm_ds.tools.plan.plan import Cluster, plan_evaluation
    units = json.loads((out / "logs" / "eval-units.json").read_text())["units"]
    assert plan_evaluation(load_recipe(str(finished[0])), Cluster()).units == len(units)  # `mm-ds plan` counts them


@pytest.mark.ranks
def test_qa_runs_through_every_step(finished):
    _, out, _ = finished
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    qa = [r for r in rows if r["task"] == "xquad"]
    assert {(r["system"], r["condition"]) for r in qa} >= {(s, k) for s in RECIPE["systems"]
                                                       for k in ("source", "adapted", "control")}
    assert all(0.0 <= r["score"] <= 100.0 for r in qa)
    meta, _ = weights(out / "finetune" / "bl_base" / "xquad" / "seed1")
    assert meta["task_type"] == "extractive_qa" and meta["train_features"] >= 50


@pytest.mark.ranks
def test_qa_training_windows_fit_the_model(finished):
    from mm_ds.stages.finetune import _train_features

    _, out, _ = finished
    features, _ = _train_features("xquad", str(out / "world"), str(out / "data" / "en" / "spm.model"), 40, None)
    assert all(len(f.input_ids) <= 40 for f in features)
    assert len(features) > RECIPE["world"]["task_sizes"]["qa_train"]  # long contexts take several windows


@pytest.mark.ranks
def test_minipost_step1b_changes_only_the_new_layers(finished):
    _, out, _ = finished
    (pmeta, psd), (mmeta, msd) = weights(out / "pretrain" / "bl_base"), weights(out / "build_mini" / "minipost")
    n = mmeta["mini_layers"]
    mcfg = model_config_from_dict(mmeta["model"])
    assert mcfg.num_layers == n + 2
    _, init = surgery.build_minipost(model_config_from_dict(pmeta["model"]), psd, n, 2, seed=0)
    for k, v in msd.items():
        if k.startswith(tuple(f"layers.{i}." for i in range(n, n + 2))):
            continue
        assert torch.equal(v, init[k]), f"{k} changed in Step 1b"
    assert not torch.equal(msd[f"layers.{n}.ffn.fc1.weight"], init[f"layers.{n}.ffn.fc1.weight"])


@pytest.mark.ranks
def test_minijoint_mini_model_is_the_bottom_of_its_primary(finished):
    _, out, _ = finished
    (pmeta, psd), (mmeta, msd) = weights(out / "pretrain" / "minijoint"), weights(out / "build_mini" / "minijoint")
    surgery.check_compatible(model_config_from_dict(pmeta["model"]), psd, model_config_from_dict(mmeta["model"]), msd)
    assert torch.equal(msd["head.dense.weight"], psd["secondary_head.dense.weight"])


@pytest.mark.parametrize("system,parent", [("bl_base", "pretrain/bl_base"), ("bl_small", "pretrain/bl_small"),
                                           ("minijoint", "build_mini/minijoint"), ("minipost", "build_mini/minipost")])
@pytest.mark.ranks
def test_step2_changes_only_the_language_group(finished, system, parent):
    _, out, _ = finished
    (_, psd), (ameta, asd) = weights(out / parent), weights(out / "adapt" / system / "t1")
    for k, v in asd.items():
        if k in LANGUAGE_PARAMS:
            assert v.shape[0] == ameta["model"]["vocab_size"]
            continue
        assert torch.equal(v, psd[k]), f"{k} changed in Step 2"
    assert ameta["overlap"]["overlap"] > 0  # numbers and names are shared with English


@pytest.mark.ranks
def test_finetuning_keeps_source_embeddings_frozen(finished):
    _, out, _ = finished
    (_, psd), (fmeta, fsd) = weights(out / "pretrain" / "bl_base"), weights(out / "finetune" / "bl_base" / "xnli" / "seed1")
    assert torch.equal(fsd["embed.tokens.weight"], psd["embed.tokens.weight"])
    assert not torch.equal(fsd["layers.0.ffn.fc1.weight"], psd["layers.0.ffn.fc1.weight"])
    assert fmeta["task"] == "xnli" and fmeta["num_labels"] == 3


@pytest.mark.ranks
def test_rerun_skips_every_finished_stage(finished):
    recipe, out, _ = finished
    proc = subprocess.run([sys.executable, "-m", "mm_ds.cli", "run", str(recipe), "--out", str(out), "--list-stage-runs"],
                          capture_output=True, text=True)
    assert proc.returncode == 0
    lines = [line for line in proc.stdout.strip().splitlines() if not line.startswith("#")]
    assert lines and all(line.startswith("done") for line in lines), proc.stdout
    n = sum(" finetune " in line for line in lines)  # one per primary model and task (MINIPOST shares BL_BASE's)
    assert n and re.search(rf"Step 3 \(finetune\) +{n} runs, +{n} done; single-device runs, 2 at once", proc.stdout)


def _run_dir(stage: str, system: str) -> str:
    return {"pretrain": f"pretrain/{system}", "build_mini": f"build_mini/{system}", "adapt": f"adapt/{system}/t1",
            "finetune": f"finetune/{system}/xnli/seed1"}[stage]


@pytest.mark.ranks
def test_bf16_stages_resume_from_their_checkpoints_after_a_kill(finished, tmp_path):
    """One run of each stage kind, bf16 under ZeRO 3, 2, 3 and 3 (pretraining, Step 1b, Step 2, finetuning), cut
    back to its checkpoint k as after a crash; `mm-ds run` again, with rank 1 SIGKILLed in Step 2 after its
    checkpoint k + 1; `mm-ds run` once more. At checkpoint k + 1 every resumed run holds the uninterrupted run's
    weights: the engine, the fp32 masters, Adam's moments and step and the LR schedule came back from k.
    Not bitwise: DeepSpeed's CPU Adam keeps beta^t as a running product while it steps and recomputes it
    with pow() after a load, which moves the fp32 masters by an ulp (its GPU FusedAdam recomputes every step)."""
    recipe, out, _ = finished
    copy = tmp_path / "run"
    shutil.copytree(out, copy, symlinks=True)
    for (stage, system), k in RESUMED.items():
        run = copy / _run_dir(stage, system)
        shutil.rmtree(run / "final")
        for ck in checkpoint.list_checkpoints(run):
            if int(ck.name.split("_")[1]) > k:
                shutil.rmtree(ck)
        (run / "checkpoints" / "latest").write_text(checkpoint.tag_for(k))
    cmd = [sys.executable, "-m", "mm_ds.cli", "run", str(recipe), "--out", str(copy)]
    trace = tmp_path / "hashed.txt"
    killed = subprocess.run(cmd, capture_output=True, text=True, env={
        **os.environ, "MM_DS_KILL_AT": "6:1", "MM_DS_KILL_STAGE": "adapt", "MM_DS_TRACE_HASHES": str(trace)})
    assert killed.returncode != 0
    adapt = copy / _run_dir("adapt", "bl_base")
    assert not (adapt / "final").exists() and checkpoint.latest_tag(adapt) == checkpoint.tag_for(5)
    # One rank hashes on resume: each resume point, and the parent both later stages start from, is read for
    # its sums once, by rank 0 (the other rank takes its verdict), though every rank of the job checks the stage.
    hashed = [line.split(" ", 1) for line in trace.read_text().splitlines()]
    for (stage, system), k in [(s, k) for s, k in RESUMED.items() if s[0] != "finetune"]:
        ckpt = copy / _run_dir(stage, system) / "checkpoints" / checkpoint.tag_for(k)
        files = [str(ckpt / f) for f in json.loads((ckpt / "manifest.json").read_text())["files"]]
        assert len(files) > 2 and all([r for r, p in hashed if p == f] == ["0"] for f in files), (stage, hashed)
    parent = str(copy / "pretrain" / "bl_base" / "final" / "model.safetensors")
    assert [r for r, p in hashed if p == parent] == ["0"], hashed
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    job = (copy / "logs" / "job.log").read_text()
    for (stage, system), k in RESUMED.items():
        run = _run_dir(stage, system)
        resumed_at = 5 if stage == "adapt" else k  # Step 2 was resumed twice: from 4, then after the kill from 5
        log = job if stage != "finetune" else (copy / "logs" / f"finetune_{run.replace('/', '_')}.log").read_text()
        assert f"resumed from {copy / run / 'checkpoints' / checkpoint.tag_for(resumed_at)} at step {resumed_at}" in log
        a = checkpoint.consolidate(out / run / "checkpoints" / checkpoint.tag_for(k + 1))
        b = checkpoint.consolidate(copy / run / "checkpoints" / checkpoint.tag_for(k + 1))
        assert a.keys() == b.keys()
        for key in a:  # an ulp of the masters, where a lost moment, step or master would move them by ~1e-3
            assert torch.allclose(a[key], b[key], rtol=0, atol=1e-6 * float(a[key].abs().max()) + 1e-12), (run, key)
        assert checkpoint.load_final(copy / run)[0]["step"] == checkpoint.load_final(out / run)[0]["step"]


@pytest.mark.ranks
def test_a_run_tree_moved_elsewhere_skips_and_scores_the_same(finished, tmp_path):
    """Checkpoints find their parents and tokenizers relative to themselves: a run tree copied to another
    path, with the original gone and a different working directory, is complete and scores the same."""
    recipe, out, _ = finished
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    hidden = out.with_name(out.name + ".hidden")
    out.rename(hidden)
    try:
        proc = subprocess.run([sys.executable, "-m", "mm_ds.cli", "run", str(recipe), "--out", str(moved)],
                              capture_output=True, text=True, cwd=tmp_path)
    finally:
        hidden.rename(out)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "in one job" not in proc.stdout and "skip adapt/minipost/t1: complete" in proc.stdout
    assert (moved / "results.jsonl").read_text() == (out / "results.jsonl").read_text()


@pytest.mark.ranks
def test_transfer_refuses_mismatched_inputs(finished):
    from mm_ds.eval.transfer import transfer

    _, out, _ = finished
    root = str(out / "world")
    with pytest.raises(ConfigError, match="finetuned for task 'xnli', not 'pawsx'"):
        transfer("pawsx", "t1", [str(out / "finetune" / "bl_base" / "xnli" / "seed1")], root,
                 str(out / "adapt" / "bl_base" / "t1"))
    with pytest.raises(ConfigError, match="own primary model"):  # MINIJOINT embeddings into BL_BASE's model
        transfer("xnli", "t1", [str(out / "finetune" / "bl_base" / "xnli" / "seed1")], root,
                 str(out / "adapt" / "minijoint" / "t1"))
    with pytest.raises(ConfigError, match="not a Step-2"):
        transfer("xnli", "t1", [str(out / "finetune" / "bl_base" / "xnli" / "seed1")], root,
                 str(out / "pretrain" / "bl_base"))


@pytest.mark.ranks
def test_adapt_refuses_a_parent_of_the_wrong_kind(finished, tmp_path):
    _, out, _ = finished
    proc = subprocess.run([sys.executable, "-m", "mm_ds.cli", "adapt", "--preset", "tiny/adapt", "--out",
                           str(tmp_path / "a"), "system=minijoint", f"parent={out / 'pretrain' / 'minijoint'}",
                           f"data.corpus={out / 'data' / 't1'}"], capture_output=True, text=True)
    assert proc.returncode == 2 and "run build-mini first" in proc.stderr
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("bad,needle", [({"systems": ["bl_huge"]}, "bl_huge"), ({"tasks": ["nerd"]}, "nerd"),
                                        ({"langs": ["zz"]}, "zz"), ({"presets": {}}, "presets.pretrain"),
                                        ({"overrides": {"xquad": []}}, "overrides.xquad names no stage"),
                                        ({"overrides": {"finetune/nerd": []}}, "finetune/nerd")])
def test_recipe_errors(tmp_path, bad, needle):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(RECIPE | bad))
    with pytest.raises(ConfigError, match=needle):
        load_recipe(str(path))


def test_task_overrides_reach_only_that_tasks_finetuning(tmp_path):
    from mm_ds.pipeline.stage_runs import stage_runs

    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(RECIPE | {"overrides": {"finetune": ["finetune.lr=1e-4"],
                                                           "finetune/xquad": ["finetune.epochs=20"]}}))
    nodes = [n for n in stage_runs(load_recipe(str(path)), tmp_path / "run") if n.name.startswith("finetune/")]
    assert nodes
    for n in nodes:
        qa = "finetune.task=xquad" in n.argv
        assert ("finetune.epochs=20" in n.argv) == qa
        assert "finetune.lr=1e-4" in n.argv
        if qa:  # the task's override comes after the stage's, so it wins
            assert n.argv.index("finetune.epochs=20") > n.argv.index("finetune.lr=1e-4")


# ---------------------------------------------------------------- side by side (launch.spread) and --only prepare

def _two_nodes(tmp_path, spread=2, **launch):
    from mm_ds.config import LaunchConfig
    from mm_ds.pipeline import spread as sp

    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=1  # node 0\n127.0.0.1 slots=1\n")  # two "nodes", both this machine
    cfg = LaunchConfig(ranks=1, hostfile=str(hosts), nodes=2, spread=spread, master_port=free_port(), **launch)
    return cfg, sp.write_groups(cfg, tmp_path / "out")


@pytest.mark.ranks
def test_side_by_side_runs_two_stage_runs_at_once_on_two_local_nodes(corpus, tmp_path):
    """launch.spread=2 on a hostfile of two loopback "nodes" of 1 rank: two independent pretrainings start together,
    each a launch of its own group (its hostfile line, 1 node, master port base + K), each trained at world size 1
    and finished; a run's log and progress are its own."""
    import time

    from mm_ds.pipeline import spread as sp
    from mm_ds.stages.resolve import StageRun

    launch, groups = _two_nodes(tmp_path)
    assert [g.hostfile.read_text() for g in groups] == ["localhost slots=1\n", "127.0.0.1 slots=1\n"]
    assert not any("launch.force_multi=true" in g.overrides for g in groups)  # loopback: deepspeed runs it here
    tiny = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.ffn_size=64", "data.seq_len=32",
            "model.max_positions=32", "train.global_batch=8", "train.micro_batch=4", "train.steps=4",
            "train.warmup_steps=1", "train.checkpoint_steps=[2]", "train.checkpoint_every=1000000",
            f"data.corpus={corpus}", "launch.launcher=deepspeed", f"launch.hostfile={launch.hostfile}",
            "launch.nodes=2", "launch.ranks=1", f"launch.master_port={launch.master_port}"]
    runs = [StageRun("pretrain", tmp_path / "out" / "pretrain" / s, f"tiny/{s}", (f"system={s}", *tiny),
                     f"pretrain/{s}") for s in ("bl_base", "bl_small")]
    started = {}

    def start(run, group, log):
        started[run.name] = time.time()
        return sp.start(run, group, log)

    sp.side_by_side(runs, groups, tmp_path / "out" / "logs", start, poll_s=0.2)
    for k, run in enumerate(runs):
        meta = json.loads((run.out / "final" / "mm_ds.json").read_text())
        assert meta["step"] == 4 and meta["world_size"] == 1
        used = yaml.safe_load((run.out / "run_config.yaml").read_text())["launch"]
        assert (used["hostfile"], used["nodes"], used["master_port"]) == (str(groups[k].hostfile), 1,
                                                                          launch.master_port + k)
        assert (tmp_path / "out" / "logs" / f"pretrain_{run.out.name}.log").is_file()
    first_done = min((r.out / "final" / "mm_ds.json").stat().st_mtime for r in runs)
    assert max(started.values()) < first_done  # the second started before the first ended


def test_side_by_side_stops_starting_runs_after_a_failure(tmp_path):
    """A failed run stops the scheduling: the run in flight finishes, the queued one never starts, then the failure
    is raised naming the run and its log's last lines. An interruption terminates every run in flight."""
    import subprocess

    from mm_ds.pipeline import spread as sp
    from mm_ds.pipeline.progress import StageFailed
    from mm_ds.stages.resolve import StageRun

    groups = [sp.Group(k, [], tmp_path / f"g{k}", ()) for k in range(2)]
    runs = [StageRun("adapt", tmp_path / name, None, (), f"adapt/{name}") for name in ("de", "fr", "sw")]
    script = {"de": "echo boom; exit 3", "fr": "sleep 1.5; echo done", "sw": "true"}
    procs = {}

    def start(run, group, log):
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as f:
            procs[run.out.name] = subprocess.Popen(["sh", "-c", script[run.out.name]], stdout=f)
        return procs[run.out.name], 0

    with pytest.raises(StageFailed, match=r"(?s)adapt/de failed with exit code 3; its output is in .*adapt_de.log:\nboom"):
        sp.side_by_side(runs, groups, tmp_path / "logs", start, poll_s=0.1)
    assert set(procs) == {"de", "fr"} and procs["fr"].returncode == 0  # fr finished; sw never started
    assert (tmp_path / "logs" / "adapt_fr.log").read_text() == "done\n"

    def interrupted(run, group, log):
        if run.out.name == "fr":
            raise KeyboardInterrupt
        procs["long"] = subprocess.Popen(["sleep", "30"])
        return procs["long"], 0

    with pytest.raises(KeyboardInterrupt):
        sp.side_by_side(runs, groups, tmp_path / "logs", interrupted, poll_s=0.1)
    assert procs["long"].returncode is not None and procs["long"].returncode < 0  # terminated, not left running


def test_spread_runs_a_step_side_by_side_only_with_a_run_per_group(tmp_path):
    """Step 1's 2 runs and Step 2's 3 go side by side on 2 groups; Step 1b's single run goes one after another on
    every node (run_stages)."""
    from types import SimpleNamespace

    from mm_ds.pipeline import spread as sp
    from mm_ds.stages.resolve import StageRun

    launch, _ = _two_nodes(tmp_path)
    recipe = SimpleNamespace(launch={k: getattr(launch, k) for k in ("ranks", "hostfile", "nodes", "spread",
                                                                     "master_port")})
    todo = [StageRun(stage, tmp_path / name, None, (), f"{stage}/{name}") for stage, name in
            [("pretrain", "a"), ("pretrain", "b"), ("build_mini", "c"), ("adapt", "d"), ("adapt", "e"), ("adapt", "f")]]
    calls = []

    class Finished:  # a launch that has already exited 0
        returncode = 0

        def poll(self):
            return 0

    def start(run, group, log):
        calls.append((group.index, run.name))
        return Finished(), 0

    sp.run_spread(todo, recipe, tmp_path / "out", lambda runs: calls.append(("every node", [r.name for r in runs])),
                  start_run=start)
    assert calls == [(0, "pretrain/a"), (1, "pretrain/b"), ("every node", ["build_mini/c"]),
                     (0, "adapt/d"), (1, "adapt/e"), (0, "adapt/f")]


def _runner_on_path(tmp_path, monkeypatch):
    """pdsh and ssh stand-ins on PATH: what `--check` looks for on a login node that reaches the nodes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("pdsh", "ssh"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_check_says_how_the_groups_run_and_refuses_what_cannot(tmp_path, monkeypatch):
    """`mm-ds run --check` with launch.spread: the groups, ports and geometry in a note; refused with the reason: a
    split that is not even, srun, DeepSpeed's slurm runner, one job; a group whose world size cannot keep a global
    batch names the values of launch.spread that can."""
    from mm_ds.pipeline.check import check

    _runner_on_path(tmp_path, monkeypatch)
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(f"gpu0{i} slots=8\n" for i in range(1, 5)))
    base = [f"launch.hostfile={hosts}", "launch.nodes=4", "launch.ranks=8"]

    def found(*sets):
        return check(load_recipe("paper", [*base, *sets]), tmp_path / "out", strict=False)

    ok = found("launch.spread=4")
    assert not ok.problems, ok.format()
    assert ("launch.spread=4: 56 adapt runs side by side on 4 groups of 1 node(s) x 8 ranks (gpu01 | gpu02 | gpu03 | "
            "gpu04), master ports 29500-29503; global batch kept (adapt/bl_base/ar: 32 per rank x 8 micro-steps x 8 "
            "ranks = 2048)") in ok.notes
    for sets, why in [(["launch.spread=3"], "launch.spread=3: 4 nodes do not split into 3 groups of equal size; "
                                            "choose launch.spread from 1, 2, 4"),
                      (["launch.spread=2", "launch.ds_launcher=slurm"], "DeepSpeed's slurm runner lets srun choose"),
                      (["launch.spread=2", "mode=one_job"], "side by side needs mode: per_stage")]:
        assert any(why in msg for _, msg in found(*sets).problems), (sets, found(*sets).format())
    srun = check(load_recipe("paper", ["launch.launcher=srun", "launch.nodes=4", "launch.ranks=8", "launch.spread=2"]),
                 tmp_path / "out", strict=False)
    assert any("use launch.launcher=deepspeed or mpirun with launch.hostfile" in m for _, m in srun.problems)
    # 3 nodes of 1 rank, 96 sequences at most 64 a rank: 32 each on all 3, but 96 on one is no multiple of 64
    hosts.write_text("a slots=1\nb slots=1\nc slots=1\n")
    small = [f"overrides.{s}=[train.global_batch=96,train.micro_batch=64]" for s in ("pretrain", "build_mini", "adapt")]
    bad = check(load_recipe("paper", [f"launch.hostfile={hosts}", "launch.nodes=3", "launch.ranks=1",
                                      "launch.spread=3", *small]), tmp_path / "out", strict=False)
    assert [m for _, m in bad.problems if "launch.spread" in m][0].startswith(
        "launch.spread=3 runs it on 1 node(s) x 1 = 1 ranks: global batch 96 is not divisible by micro batch 64 x "
        "world size 1") and bad.problems[0][1].endswith("keeps its global batch on these 3 nodes: 1")


def test_only_prepare_prepares_the_data_apart(tmp_path, capsys):
    """`--only prepare` prepares the recipe's languages and nothing else (`--lang`: some of them), is idempotent,
    and with --check lists them; a missing input is named before any work; `mm-ds run` then finds the data ready."""
    from mm_ds.pipeline import run as pipeline
    from mm_ds.pipeline.prepare import prepare_data
    from support.textgen import write_corpus

    for lang in ("en", "de"):
        write_corpus(tmp_path / f"{lang}.txt", n_docs=30, per_doc=5)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"systems": ["bl_base"], "langs": ["de"], "text": {"en": ["en.txt"],
                                      "de": ["de.txt"]}, "prepare": {"vocab_size": 60}, "presets": {
                                      "pretrain": "tiny/{system}", "adapt": "tiny/adapt"}}))
    out = tmp_path / "out"

    def run(*args):  # in this process; each language's `mm-ds prepare` is its own, as in `mm-ds run`
        code = pipeline.main([str(recipe), "--out", str(out), *args])
        return code, capsys.readouterr().out

    code, listed = run("--only", "prepare", "--check")
    assert code == 0 and listed.startswith(f"mm-ds run {recipe} --only prepare --check: ok: 2 language(s) to prepare\n"
                                           f"  en: {tmp_path}/en.txt (") and not out.exists()
    code, _ = run("--only", "prepare", "--lang", "de")
    assert code == 0 and (out / "data" / "de" / "meta.json").is_file() and not (out / "data" / "en").exists()
    assert not (out / "pretrain").exists()  # nothing but data
    code, both = run("--only", "prepare")
    assert code == 0 and "skip prepare de: complete" in both and "prepare --lang en" in both
    assert "ok: 0 language(s) to prepare" in run("--only", "prepare", "--check")[1]
    prepare_data(load_recipe(str(recipe)), out)  # what `mm-ds run` does first: nothing left, the GPU stages next
    assert capsys.readouterr().out.splitlines() == ["[mm-ds run] skip prepare en: complete",
                                                    "[mm-ds run] skip prepare de: complete"]
    (tmp_path / "en.txt").unlink()
    shutil.rmtree(out / "data" / "en")
    code, missing = run("--only", "prepare")
    assert code == 1 and f"prepare/en: text input '{tmp_path}/en.txt' matches no file" in missing
    assert not (out / "data" / "en").exists()
    with pytest.raises(ConfigError, match="--lang fr: the recipe prepares en, de"):
        run("--only", "prepare", "--lang", "fr")


def test_a_group_of_one_other_machine_goes_through_the_runner(tmp_path):
    """launch.spread=4 on four hosts: each group is one node, which deepspeed would run on the machine it starts on;
    a group that is another machine is started through the runner (pdsh, --force_multi) with its own hostfile line
    and port, and rank 0's address is that machine's loopback; without force_multi the launch is refused."""
    from mm_ds import config
    from mm_ds.config import LaunchConfig
    from mm_ds.pipeline import spread as sp
    from mm_ds.runtime.distributed import launch

    hosts = tmp_path / "hosts"
    hosts.write_text("".join(f"gpu0{i} slots=8\n" for i in range(1, 5)))
    base = LaunchConfig(ranks=8, hostfile=str(hosts), spread=4, master_port=29600)
    groups = sp.write_groups(base, tmp_path / "out")
    stage = [f"launch.hostfile={hosts}", "launch.ranks=8"]
    for g in groups:
        cfg = config.load("paper/bl_base", None, [*stage, *g.overrides]).launch
        assert (cfg.nodes, cfg.force_multi, cfg.master_port) == (1, True, 29600 + g.index)
        launch.check_hosts(cfg)  # not refused as a one-node launch of another machine
        cmd = launch.command(cfg, ["noop"])
        assert cmd[cmd.index("--hostfile") + 1] == str(g.hostfile) and "--force_multi" in cmd
        assert cmd[cmd.index("--launcher") + 1] == "pdsh" and cmd[cmd.index("--master_addr") + 1] == "127.0.0.1"
    one = config.load("paper/bl_base", None, [*stage, *groups[1].overrides, "launch.force_multi=false"]).launch
    with pytest.raises(ConfigError, match="runs a one-node launch's ranks on the machine it starts on"):
        launch.check_hosts(one)
