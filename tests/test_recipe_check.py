"""`mm-ds run RECIPE --check` and the same check before `mm-ds run` starts: every packaged recipe passes; what
would fail after days of training fails first, naming the stage; tasks are evaluated in the languages they
cover and leave gaps elsewhere; bad input stops before any data work with nothing written."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mm_ds.config import ConfigError, recipe_names
from mm_ds.pipeline import recipe as recipe_mod
from mm_ds.pipeline import run as pipeline
from mm_ds.pipeline.check import check
from mm_ds.pipeline.recipe import load_recipe
from mm_ds.pipeline.stage_runs import stage_runs
from support.rehearsal_tasks import build as build_tasks

PACKAGED = Path(pipeline.__file__).parents[1] / "presets" / "recipes"
REHEARSAL = Path(__file__).parent / "rehearsal.yaml"


def run(*argv):
    """`mm-ds run ARGV` in a subprocess, as a user types it."""
    return subprocess.run([sys.executable, "-m", "mm_ds.cli", "run", *argv], capture_output=True, text=True)


def run_here(capsys, *argv) -> tuple[int, str, str]:
    """The same in this process (the CLI's exit code and output, without a second interpreter's start-up)."""
    from mm_ds import cli

    rc = cli.main(["run", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("name", recipe_names())
def test_every_packaged_recipe_passes_the_check(name, tmp_path):
    """At the recipe's own world size, engine configs through DeepSpeed's parser, no data needed."""
    report = check(load_recipe(name), tmp_path / "out", strict=False)
    assert not report.problems, report.format()
    assert report.stages > 10


def test_the_paper_recipe_checks_from_the_command_line(tmp_path):
    proc = run("paper", "--check", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok: 126 stage runs can start" in proc.stdout  # 121 + Table 5's mini-model finetuned on XNLI, 5 seeds
    # PAWS-X, MLQA and XQuAD each cover only some of the paper's 14 languages: gaps, listed, not errors
    assert "gaps" in proc.stdout and "pawsx: ar bg el hi ru sw th tr ur vi" in proc.stdout
    assert not (tmp_path / "out").exists()
    # the paper's protocol, as the stage configs have it: footnote 3's checkpoints, Figure 1's tasks, Table 5
    assert "note: Step-2 checkpoints, early ones only where early_checkpoints says (footnote 3):\n" \
           "  every 1000 updates, the last of 125000 (125 checkpoints): bl_base in ar bg de el es fr hi ru sw th tr " \
           "ur vi zh\n" \
           "  every 5000 updates, the last of 125000 (25 checkpoints): bl_small in ar bg de el es fr hi ru sw th tr " \
           "ur vi zh; minijoint, minipost in ar bg el hi ru sw th tr ur vi\n" \
           "  every 5000 updates, at 1000 2000 3000 4000, the last of 125000 (29 checkpoints): minijoint, minipost " \
           "in de es fr zh\n" in proc.stdout
    assert "note: headline speedup (Figure 1, the report's avg row) averages xnli, mlqa, pawsx\n" in proc.stdout
    assert "note: Table 5 (english.md): BL_BASE, BL_SMALL, MINIJOINT, MINIJOINT's mini-model in English xnli" \
        in proc.stdout


@pytest.fixture
def pdsh(tmp_path, monkeypatch):
    """pdsh and ssh on PATH (stand-ins: `--check` looks for them, never runs them)."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("pdsh", "ssh"):
        (tools / name).write_text("#!/bin/sh\nexit 1\n")
        (tools / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{Path(sys.executable).parent}:/usr/bin:/bin")


@pytest.mark.parametrize("nodes,ranks", [(1, 1), (1, 8), (2, 8), (4, 8), (8, 8)])
def test_the_paper_recipe_passes_the_check_at_every_cluster_size(nodes, ranks, tmp_path, pdsh):
    """1, 8, 16, 32 and 64 GPUs: Steps 1, 1b and 2 divide their 2048 sequences over every rank; Step 3's runs are
    single-device runs packed onto the ranks (each its batch of 32 on one device), whatever their number."""
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(f"node{i} slots=8\n" for i in range(8)))
    sets = [f"launch.nodes={nodes}", f"launch.ranks={ranks}"] + ([f"launch.hostfile={hosts}"] if nodes > 1 else [])
    report = check(load_recipe("paper", sets), tmp_path / "out", strict=False)
    assert not report.problems, report.format()
    nodes_of = {n.name: n for n in stage_runs(load_recipe("paper", sets), tmp_path / "out")}
    assert all(("launch.launcher=none" in n.argv) == n.packed == n.name.startswith("finetune/")
               for n in nodes_of.values())


def test_a_geometry_that_cannot_divide_fails_the_check_naming_the_stage(tmp_path, capsys):
    """A finetuning micro batch that does not divide its 32 sequences on its one device is found by the check, not
    at Step 3 after all of Steps 1, 1b and 2; so is a cluster that Step 1's 2048 sequences cannot divide over."""
    recipe = yaml.safe_load((PACKAGED / "paper.yaml").read_text())
    recipe.setdefault("overrides", {})["finetune"] = ["train.micro_batch=5"]
    path = tmp_path / "paper.yaml"
    path.write_text(yaml.safe_dump(recipe))
    rc, stdout, _ = run_here(capsys, str(path), "--check", "--out", str(tmp_path / "out"))
    assert rc == 1
    assert "finetune/bl_base/xnli/seed1 (and 64 more like it): global batch 32 is not divisible by micro batch 5 " \
           "x world size 1" in stdout
    rc, stdout, _ = run_here(capsys, "paper", "--check", "--out", str(tmp_path / "out"), "--launch", "ranks=6")
    assert rc == 1 and "global batch 2048 is not divisible by micro batch 32 x world size 6" in stdout


def test_the_check_shows_the_world_a_hostfile_makes(tmp_path, capsys, pdsh, monkeypatch):
    """4 hosts and no node count: 4 nodes x 8 = 32 ranks, in `--check`'s launch line and geometry and in each
    stage's command; what the check could not see from here is said, never passed over."""
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(f"gpu0{i} slots=8\n" for i in range(1, 5)))
    argv = ["paper", "--check", "--out", str(tmp_path / "out"), "--launch", f"hostfile={hosts}", "--launch", "ranks=8"]
    rc, out, _ = run_here(capsys, *argv)
    assert rc == 0, out
    assert "launch: deepspeed through DeepSpeed's pdsh runner: 4 node(s) x 8 rank(s) = world size 32 on gpu01, gpu02, " \
           "gpu03, gpu04; master gpu01:29500\n" in out
    assert "    pretrain: 32 x 2 x 32 = 2048 (bl_base, minijoint); 64 x 1 x 32 = 2048 (bl_small)\n" in out
    assert "note: master address gpu01 not checked: not resolvable from here" in out
    pretrain = stage_runs(load_recipe("paper", [f"launch.hostfile={hosts}", "launch.ranks=8"]), tmp_path)[0]
    assert "launch.nodes=4" in pretrain.argv and pretrain.config().launch.world_size == 32
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:/nonexistent")  # no pdsh, no ssh here
    rc, out, _ = run_here(capsys, *argv)
    assert rc == 1 and "launch.ds_launcher=pdsh needs pdsh, ssh on this machine" in out, out
    rc, _, err = run_here(capsys, *argv, "--launch", "ds_launcher=pdssh")
    assert rc == 2 and "launch.ds_launcher='pdssh' is not one of DeepSpeed's runners (did you mean 'pdsh'?)" in err


def test_a_world_size_that_cannot_keep_the_batch_names_those_that_can(tmp_path, capsys):
    """3 nodes x 8 GPUs cannot share 2048 sequences: the world sizes that can, no micro-batch advice (no micro batch
    helps), and the global batch is the paper's."""
    rc, out, _ = run_here(capsys, "paper", "--check", "--out", str(tmp_path / "out"), "--launch", "ranks=24")
    assert rc == 1
    assert "global batch 2048 is not divisible by micro batch 32 x world size 24 (24 ranks cannot share it evenly, " \
           "whatever the micro batch). World sizes that keep it: 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048 " \
           "(launch.nodes x launch.ranks). Changing train.global_batch instead departs from the paper's protocol" in out
    assert "train.micro_batch" not in out


def test_a_stage_run_gives_the_config_its_command_line_gives():
    """`mm-ds run` launches `StageRun.argv` but checks and prices `StageRun.config()`: they must be one config."""
    from mm_ds.stages.command import stage_config

    for node in stage_runs(load_recipe("paper"), Path("/tmp/out")):
        assert node.config() == stage_config(node.argv[0], node.argv[1:])[1], node.name


def _checkpoints(recipe, where: str) -> list[int]:
    """The steps at which each planned Step-2 run under `where` (adapt/SYSTEM/LANG) writes a checkpoint."""
    cfg = {n.name: n for n in stage_runs(recipe, Path("/tmp/out"))}[f"adapt/{where}"].config()
    steps = [s for s in range(1, cfg.train.steps + 1) if cfg.train.is_checkpoint_step(s)]
    assert cfg.train.checkpoints() == len(steps)  # the plan's count (no walk) is the engine's
    return steps


def test_the_paper_recipe_checkpoints_step2_as_the_paper_did():
    """Footnote 3: BL_BASE's Step 2 every 1000 updates; BL_SMALL, MINIJOINT and MINIPOST every 5000, and the two
    MINI* systems also at 1000-4000 in de, fr, es and zh only. Without early_checkpoints: 1000-4000 everywhere."""
    paper, every_5k, early = load_recipe("paper"), list(range(5000, 125_001, 5000)), [1000, 2000, 3000, 4000]
    assert _checkpoints(paper, "adapt/bl_base/ar") == list(range(1000, 125_001, 1000))
    for where in ("bl_small/de", "bl_small/ar", "minijoint/ar", "minipost/tr", "minijoint/sw"):
        assert _checkpoints(paper, f"adapt/{where}") == every_5k, where
    for where in ("minijoint/de", "minipost/zh", "minijoint/fr", "minipost/es"):
        assert _checkpoints(paper, f"adapt/{where}") == early + every_5k, where
    finer = load_recipe("paper", ["early_checkpoints=null"])  # mm-ds's default: the early ones in every run
    assert _checkpoints(finer, "adapt/bl_small/ar") == _checkpoints(finer, "adapt/minijoint/ar") == early + every_5k


def test_the_paper_plan_lists_the_protocol(tmp_path, capsys):
    rc, stdout, stderr = run_here(capsys, "paper", "--plan", "--out", str(tmp_path / "out"))
    assert rc == 0 and not (tmp_path / "out").exists()
    # after the summary's comment lines, one command a line, for scripts
    assert all(line.startswith(("todo  mm-ds ", "#")) for line in stdout.splitlines())
    lines = stdout.splitlines()
    bl_small = next(line for line in lines if f"--out {tmp_path / 'out' / 'adapt' / 'bl_small' / 'de'} " in line)
    minijoint = next(line for line in lines if f"--out {tmp_path / 'out' / 'adapt' / 'minijoint' / 'de'} " in line)
    assert "train.checkpoint_steps=[]" in bl_small and "train.checkpoint_steps" not in minijoint
    lines = stderr.splitlines()
    assert "# Step-2 checkpoints, early ones only where early_checkpoints says (footnote 3):" in lines
    assert "#   every 5000 updates, at 1000 2000 3000 4000, the last of 125000 (29 checkpoints): minijoint, minipost " \
           "in de es fr zh" in lines
    assert "# headline speedup (Figure 1, the report's avg row) averages xnli, mlqa, pawsx" in lines


def test_the_plan_summary_counts_the_stage_list_and_what_is_done(tmp_path, capsys):
    """`mm-ds run paper --plan` starts with a summary: per step, the stage runs of the stage list and how many of them
    are done (their final/ verifies: two written here as a stage publishes one), Step 4's results and the alignment
    check's Step-2 runs (every system in the 14 languages, held-out text from the prepared slices) and rows."""
    from collections import Counter

    import torch

    from mm_ds.runtime.checkpointing import checkpoint

    out = tmp_path / "out"
    runs = stage_runs(load_recipe("paper"), out)
    assert Counter(n.name.split("/")[0] for n in runs) == {"pretrain": 3, "build_mini": 2, "adapt": 56, "finetune": 65}
    for where in ("pretrain/bl_base", "finetune/bl_small/xnli/seed3"):
        checkpoint.write_final(out / where / checkpoint.FINAL, {"w": torch.zeros(2)},
                               {"format": checkpoint.FORMAT, "stage": where.split("/")[0]})
    for f in ("eval/a.json", "eval/b.json", "align/minipost/de/init.json"):
        (out / f).parent.mkdir(parents=True, exist_ok=True)
        (out / f).write_text("{}")
    rc, stdout, _ = run_here(capsys, "paper", "--plan", "--out", str(out))
    assert rc == 0
    lines = stdout.splitlines()
    assert lines[:8] == [
        f"# 126 stage runs into {out}, 2 done (final/ verifies):",
        "#   Step 1 (pretrain)        3 runs,    1 done; each data-parallel on 8 rank(s), one after another",
        "#   Step 1b (build-mini)     2 runs,    0 done; each data-parallel on 8 rank(s), one after another",
        "#   Step 2 (adapt)          56 runs,    0 done; each data-parallel on 8 rank(s), one after another",
        "#   Step 3 (finetune)       65 runs,    1 done; single-device runs, 8 at once",
        "#   Step 4 (evaluation)   units over every Step-2 checkpoint, task and language (`mm-ds plan` counts them): "
        f"2 results in {out / 'eval'}",
        f"#   alignment check         56 Step-2 runs in 14 language(s), each checkpoint and step 0: 1 scored in "
        f"{out / 'align'}",
        "# the stage commands, in order:"]
    commands = lines[8:]
    assert len(commands) == len(runs) and [c.split()[0] for c in commands].count("done") == 2
    assert "done  mm-ds pretrain " in commands[0] and f"--out {out / 'pretrain' / 'bl_base'} " in commands[0]


def test_the_paper_depth_sweep_is_packaged_as_the_paper_ran_it(tmp_path):
    """§5.2: N in 2..12 (each its own Step 1), ar/de/tr, four tasks, 5 seeds; A.4: checkpoints every 5000, N=4
    (the main experiments' MINIJOINT) also at 1000-4000 where those had them (de); BL_BASE every 1000."""
    sweep = load_recipe("paper-depths")
    assert sweep.langs == ["ar", "de", "tr"] and sweep.seeds == [1, 2, 3, 4, 5] and len(sweep.tasks) == 4
    runs = {n.name: n.argv for n in stage_runs(sweep, tmp_path)}
    for n in (2, 4, 6, 8, 10, 12):
        assert f"model.secondary_head_layer={n}" in runs[f"pretrain/pretrain/minijoint@{n}"]
        assert f"adapt/adapt/minijoint@{n}/tr" in runs
    every_5k = list(range(5000, 125_001, 5000))
    assert _checkpoints(sweep, "adapt/minijoint@4/de") == [1000, 2000, 3000, 4000] + every_5k
    for where in ("minijoint@4/ar", "minijoint@2/de", "minijoint@12/de", "minijoint@6/tr"):
        assert _checkpoints(sweep, f"adapt/{where}") == every_5k, where
    assert _checkpoints(sweep, "adapt/bl_base/de") == list(range(1000, 125_001, 1000))
    report = check(sweep, tmp_path / "out", strict=False)
    assert not report.problems, report.format()
    assert report.gaps == {"mlqa": ["tr"], "pawsx": ["ar", "tr"]}


def test_the_paper_recipe_finetunes_minijoints_mini_model_for_table5():
    """§5.3: Table 5 is English XNLI of BL_BASE, BL_SMALL, MINIJOINT and MINIJOINT's mini-model: that mini-model
    only, on XNLI only, every seed; Step 4 scores it in English."""
    from mm_ds.pipeline.items import eval_units

    paper = load_recipe("paper")
    minis = [n.name for n in stage_runs(paper, Path("/tmp/out")) if "/mini/" in n.name]
    assert minis == [f"finetune/finetune/mini/minijoint/xnli/seed{s}" for s in range(1, 6)]
    units = [u for u in eval_units(load_recipe("paper", ["curve=false"]), Path("/tmp/out")) if u.condition == "mini"]
    assert [(u.task, u.lang, u.systems) for u in units] == [("xnli", "en", ("minijoint",))]


@pytest.mark.parametrize("sets,needle", [
    (["headline_tasks=[xnil]"], "headline_tasks: unknown task 'xnil' (did you mean 'xnli'?)"),
    (["tasks=[xquad]"], "headline_tasks ['xnli', 'mlqa', 'pawsx'] holds no task of the recipe (xquad); set "
                        "headline_tasks=[] for every task"),
    (["tasks=[pawsx]"], "english_tasks ['xnli'] holds no task of the recipe (pawsx)"),
    (["english_minis=[bl_small]"], "english_minis: 'bl_small' has no mini-model; list mini-model systems (those of "
                                   "the recipe: minijoint, minipost)"),
    (["early_checkpoints.minijiont=[de]"], "early_checkpoints.minijiont: system='minijiont' is not one of"),
    (["early_checkpoints.minijoint@2=[de]"], "early_checkpoints.minijoint@2 is no system of the recipe"),
    (["early_checkpoints.minijoint=de"], "early_checkpoints.minijoint must be a list of target languages, got 'de'"),
    (["early_checkpoints=[de]"], "early_checkpoints must map systems to target languages"),
])
def test_the_protocol_keys_name_what_is_wrong(sets, needle):
    with pytest.raises(ConfigError) as e:
        load_recipe("paper", sets)
    assert needle in str(e.value)


def test_coverage_follows_the_task_table_and_the_recipe():
    paper = load_recipe("paper")
    assert paper.evaluated("xnli") == ["en", *paper.langs]
    assert paper.evaluated("pawsx") == ["en", "de", "es", "fr", "zh"]
    assert "sw" not in paper.evaluated("mlqa") and "sw" in paper.evaluated("xnli")
    rehearsal = load_recipe(str(REHEARSAL), ["task_root=tasks"])
    assert rehearsal.evaluated("pawsx") == ["de"] and rehearsal.evaluated("xquad") == ["en", "de"]
    assert load_recipe("tiny").evaluated("pawsx") == ["en", "t1", "t2"]  # the world has every task everywhere


def _real(tmp_path, **change) -> Path:
    """A copy of the rehearsal recipe with its data in `tmp_path/data`, its task files in `tmp_path/tasks`."""
    recipe = yaml.safe_load(REHEARSAL.read_text()) | change
    recipe["data_root"], recipe["task_root"] = str(tmp_path / "data"), str(tmp_path / "tasks")
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture
def data(tmp_path, shared_data):
    """The shared data's layout: links to its files, so that single files can be taken away; and the rehearsal's task
    directory made from them (tmp_path/tasks)."""
    root = tmp_path / "data"
    for f in shared_data.rglob("*"):
        if f.is_file():
            (root / f.relative_to(shared_data)).parent.mkdir(parents=True, exist_ok=True)
            (root / f.relative_to(shared_data)).symlink_to(f)
    build_tasks(root, tmp_path / "tasks")
    return root


def test_the_rehearsal_passes_the_strict_check_on_the_shared_data(tmp_path, data):
    report = check(load_recipe(str(_real(tmp_path))), tmp_path / "out", strict=True)
    assert not report.problems, report.format()
    assert report.gaps == {"pawsx": ["en", "sw"], "mlqa": ["en", "sw"], "xquad": ["sw"]}


@pytest.mark.parametrize("change,remove,needle", [
    ({"langs": ["de", "ur"], "tasks": ["pawsx"], "coverage": {"pawsx": ["de"]},
      "text": {"en": ["text/en.txt.xz"], "de": ["text/de.txt.xz"], "ur": ["text/ur.txt.xz"]}}, None,
     "no task of the recipe is evaluated in 'ur'"),
    ({}, "tasks/xnli/xnli.test.sw.tsv", "evaluate/xnli/sw: no xnli test file for 'sw'"),
    ({}, "data/text/sw.txt.xz", "prepare/sw: text input"),
    ({"eval_splits": {"xquad": "dev"}}, None, "xquad has no 'dev' split"),
    ({}, "tasks/squad/train-v1.1.json", "finetune/xquad: "),
])
def test_bad_input_stops_mm_ds_run_before_any_data_work(tmp_path, data, capsys, change, remove, needle):
    if remove:
        (tmp_path / remove).unlink()
    out = tmp_path / "out"
    rc, _, err = run_here(capsys, str(_real(tmp_path, **change)), "--out", str(out))
    assert rc == 2, err
    assert "the recipe cannot run" in err and needle in err, err
    assert not out.exists()  # nothing half-written: no world, no prepared data, no logs


@pytest.mark.ranks
def test_launch_values_are_typed_before_any_data_work(tmp_path, capsys):
    out = tmp_path / "out"
    proc = run("tiny", "--out", str(out), "--launch", "ranks=x")
    assert proc.returncode == 2 and "launch.ranks: expected an integer, got 'x'" in proc.stderr
    rc, _, err = run_here(capsys, "tiny", "--out", str(out), "--launch", "launcher=torchrun")
    assert rc == 2 and "launch.launcher='torchrun'" in err
    assert not out.exists()
    recipe = load_recipe("tiny", ["launch.ranks=4"])  # --launch ranks=4 is the number 4, not the text
    assert recipe.launch["ranks"] == 4


def test_an_unwritable_out_stops_before_any_data_work(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    rc, _, err = run_here(capsys, "tiny", "--out", str(blocker / "out"))
    assert rc == 2 and "--out:" in err and "is not a directory" in err
    rc, _, err = run_here(capsys, "tiny", "--out", "/proc/mm-ds-out")  # not writable even for root
    assert rc == 2 and "/proc/mm-ds-out cannot be written" in err


def test_a_stage_config_problem_names_its_stage(tmp_path):
    recipe = yaml.safe_load((PACKAGED / "tiny.yaml").read_text())
    recipe["overrides"] = {"adapt/minijoint": ["data.seq_len=4096"], "build_mini": ["mini.layers=9"]}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    report = check(load_recipe(str(path)), tmp_path / "out", strict=False)
    problems = dict(report.problems)
    assert "data.seq_len=4096 exceeds model.max_positions" in problems["adapt/minijoint/t1"]
    assert "mini.layers=9 must lie in [1, 6)" in problems["build_mini/minipost"]
    assert "adapt/minipost/t1" not in problems


def test_recipe_sets_and_their_errors(tmp_path):
    assert load_recipe("tiny", ["seeds=[3]", "tasks=[xnli]"]).seeds == [3]
    with pytest.raises(ConfigError, match="coverage.nerd is not a task"):
        load_recipe("tiny", ["coverage={nerd: [t1]}"])
    with pytest.raises(ConfigError, match="overrides.adapt/bl_huge names no stage"):
        load_recipe("tiny", ["overrides={adapt/bl_huge: []}"])


def test_task_root_hub_reaches_the_stages_and_is_a_note_in_the_check(tmp_path):
    """`task_root: hub`: finetuning and evaluation read the hub (tests/test_tasks.py runs both offline); the
    check cannot download, so it notes that, and still refuses a language the hub has no split for."""
    out = tmp_path / "out"
    recipe = load_recipe("paper", ["task_root=hub"])
    assert str(recipe_mod.task_root(recipe, out)) == "hub"  # eval.json's data_root
    assert recipe_mod.task_root(load_recipe("paper", ["task_root=./hub"]), out) == Path("hub").absolute()
    finetuning = [n for n in stage_runs(recipe, out) if n.argv[0] == "finetune"]
    assert finetuning and all("finetune.data_root=hub" in n.argv for n in finetuning)
    report = check(recipe, out, strict=False)
    assert not report.problems, report.format()
    assert any(n.startswith("task_root: hub: task data is read from the Hugging Face hub") for n in report.notes)
    report = check(load_recipe("paper", ["task_root=hub", "coverage.pawsx=[en,sw]"]), out, strict=False)
    assert report.problems == [("evaluate/pawsx/sw", "pawsx is not evaluated in 'sw' on the hub; languages: "
                                                     "en de es fr ja ko zh; or leave sw out of coverage.pawsx")]


def test_a_recipe_files_relative_paths_start_at_its_folder_for_the_check_and_the_run(tmp_path, monkeypatch, capsys):
    """A recipe beside its data, run from elsewhere: `--check` and the run resolve text inputs and task_root
    alike, against the recipe file's folder (a packaged recipe's: the working directory), and say against what."""
    proj, elsewhere, out = tmp_path / "proj", tmp_path / "elsewhere", tmp_path / "out"
    for f in ("text/en.txt", "text/t1.txt", "tasks/xnli/xnli.test.t1.tsv", "tasks/xnli/xnli.test.en.tsv",
              "tasks/mnli/multinli_1.0_train.jsonl"):
        (proj / f).parent.mkdir(parents=True, exist_ok=True)
        (proj / f).write_text("x\n")
    recipe = yaml.safe_load((PACKAGED / "tiny.yaml").read_text()) | {
        "world": None, "langs": ["t1"], "tasks": ["xnli"], "seeds": [1], "task_root": "tasks", "coverage": {"xnli": ["en", "t1"]},
        "text": {"en": ["text/en.txt"], "t1": ["text/*.txt"]}}
    (proj / "r.yaml").write_text(yaml.safe_dump(recipe))
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = load_recipe("../proj/r.yaml")
    assert recipe_mod.text_inputs(loaded, "en") == [str(proj / "text" / "en.txt")]
    assert recipe_mod.task_root(loaded, out) == proj / "tasks"
    for strict in (False, True):
        report = check(loaded, out, strict=strict)
        assert not report.problems, report.format()
        assert f"relative paths of the recipe (text, task_root, heldout) start at data_root={proj}" in report.notes
        assert not any("not checked" in n for n in report.notes)
    assert load_recipe("../proj/r.yaml", ["data_root=data"]).data_root == str(proj / "data")  # --set: the same rule
    assert load_recipe("real").data_root == str((elsewhere.parent / "shared" / "data"))  # packaged: the cwd

    for f in (proj / "text").iterdir():  # the data is not here (yet): a note for --check, a refusal for the run
        f.unlink()
    rc, stdout, _ = run_here(capsys, "../proj/r.yaml", "--check", "--out", str(out))
    assert rc == 0 and f"text inputs not checked: none of them is here (e.g. {proj / 'text' / 'en.txt'}); " \
                       f"`mm-ds run` refuses to start without them" in stdout
    rc, _, err = run_here(capsys, "../proj/r.yaml", "--out", str(out))
    assert rc == 2 and f"prepare/en: text input '{proj / 'text' / 'en.txt'}' matches no file" in err
    assert "lists the same" not in err and "data that is absent altogether for data still to come" in err
    assert not out.exists()


def test_a_recipe_without_tasks_is_measured_at_the_mlm_level(tmp_path):
    """No tasks: no task files, finetuning preset or coverage to check (the real recipe); but then the MLM-level
    measure is all there is, so it may not be switched off."""
    recipe = load_recipe("real")
    assert recipe.tasks == [] and "finetune" not in recipe.presets
    assert not check(recipe, tmp_path / "out", strict=False).problems
    assert not [n for n in stage_runs(recipe, tmp_path / "out") if n.name.startswith("finetune/")]
    with pytest.raises(ConfigError, match=r"needs a task \(tasks\), or the MLM-level measure"):
        load_recipe("real", ["align_sequences=0"])
    assert recipe_mod.prepare_options(recipe)["heldout"] == recipe_mod.HELDOUT == 0.02  # real text: a held-out slice
    assert "heldout" not in recipe_mod.prepare_options(load_recipe("tiny"))  # a world brings its own
