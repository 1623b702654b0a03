"""`mm-ds plan`: parameter counts match the model, communication follows the ZeRO stage and the trainable set,
the paper plan prints, and the compute model can be checked against `mm-ds bench` output."""

import contextlib
import io
import json
import subprocess
from pathlib import Path

import pytest

from mm_ds import cli
from mm_ds.config import ModelConfig
from mm_ds.model.model import LANGUAGE_PARAMS, RobertaMLM
from mm_ds.pipeline.costs import recipe_costs
from mm_ds.pipeline.recipe import load_recipe
from mm_ds.tools.plan import plan

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("kind, layers, secondary", [("pretrain", 3, None), ("pretrain_secondary", 3, 2),
                                                     ("adapt", 2, None)])
def test_parameter_counts_match_the_model(kind, layers, secondary):
    h, V, s = 64, 1000, 32
    model = RobertaMLM(ModelConfig(vocab_size=V, hidden_size=h, num_layers=layers, num_heads=4, ffn_size=4 * h,
                                   max_positions=s, secondary_head_layer=secondary))
    pc = plan.stage_params(kind, h, V, layers, s)
    assert pc.total == sum(p.numel() for p in model.parameters())
    assert pc.persistent == sum(p.numel() for p in model.parameters() if p.numel() <= plan.PERSISTENCE)
    if kind == "adapt":
        assert pc.trainable == sum(p.numel() for n, p in model.named_parameters() if n in LANGUAGE_PARAMS)


def test_step2_communicates_the_embedding_group_only():
    """The traffic of the collectives DeepSpeed makes (recorded on 2 ranks by tests/test_reduction_dtype.py):
    gradients in fp32 under bf16, weights in bf16, of the trainable parameters but ZeRO-3's weight gathers."""
    base = plan.stage_params("pretrain", 768, 50_000, 12, 512)
    step2 = plan.stage_params("adapt", 768, 50_000, 12, 512)
    assert round(step2.trainable / 1e6, 2) == 38.45 and 124e6 < base.total < 126e6
    n, T = 32, base.trainable
    s = (n - 1) / n
    v1 = plan.comm_bytes_per_step(1, n, T, base.total, 2, "bf16")
    assert v1 == pytest.approx(2 * s * T * 4 + s * T * 2)  # BF16_Optimizer: fp32 all-reduce, bf16 all-gather
    assert plan.comm_bytes_per_step(1, n, T, base.total, 2, "bf16", "bf16") == pytest.approx(3 * s * T * 2)
    assert plan.comm_bytes_per_step(0, n, T, base.total, 2, "fp32") == pytest.approx(2 * s * T * 4)
    v2 = plan.comm_bytes_per_step(1, n, step2.trainable, step2.total, 2, "bf16")
    assert v2 / v1 == pytest.approx(step2.trainable / T)
    assert plan.comm_bytes_per_step(2, n, T, base.total, 4, "bf16") == pytest.approx(4 * 2 * s * T * 4 + s * T * 2)
    z3 = plan.comm_bytes_per_step(3, n, step2.trainable, step2.total, 4, "bf16", persistent=step2.persistent)
    gathered = 4 * (step2.total - step2.persistent) + step2.persistent  # frozen weights too, each micro-step
    assert z3 == pytest.approx(4 * s * step2.trainable * 4 + s * gathered * 2) and z3 > 3 * v2
    assert plan.comm_bytes_per_step(1, 1, T, base.total, 2, "bf16") == 0


def test_the_reduction_dtype_is_the_configs():
    """The plan's default is what mm-ds resolves for a config of that dtype (the shipped bf16 JSONs say fp32)."""
    from mm_ds.runtime.training import ds_config

    assert plan.Cluster().reduction_dtype == "fp32" and plan.Cluster(dtype="fp16").reduction_dtype == "fp16"
    assert plan.Cluster(comm_dtype="bf16").reduction_dtype == "bf16"
    for zero in (1, 2, 3):
        ds = json.loads(ds_config.find(f"bf16_zero{zero}.json").read_text())
        assert ds_config.reduction_dtype(ds) == plan.Cluster(dtype="bf16").reduction_dtype


def test_paper_plan_numbers():
    c = plan.Cluster(nodes=4, gpus_per_node=8, peak_tflops=989, mfu=0.45)
    rows = {(r.system, r.step): r for r in plan.plan_stages(recipe_costs(load_recipe("paper")), c)}
    r = rows[("BL_BASE", "step1")]
    assert r.compute_s == pytest.approx(r.flops_per_step / (32 * 989e12 * 0.45))
    assert r.grad_accum == 2 and r.checkpoints == 29  # steps 1000-4000, every 5000, the last
    assert r.hours == pytest.approx(r.step_s * 125_000 / 3600) and r.gpu_hours == pytest.approx(32 * r.hours)
    # MINIJOINT's Step 2 over 4 layers costs what BL_SMALL's does, and far less than BL_BASE's.
    assert rows[("MINIJOINT", "step2")].step_s == pytest.approx(rows[("BL_SMALL", "step2")].step_s)
    assert rows[("BL_BASE", "step2")].compute_s / rows[("MINIJOINT", "step2")].compute_s > 2
    # Both send the same language group (fp32 gradients, not overlapped by default): the step times are closer.
    assert rows[("BL_BASE", "step2")].comm_s == pytest.approx(rows[("MINIJOINT", "step2")].comm_s)
    assert rows[("BL_BASE", "step2")].step_s / rows[("MINIJOINT", "step2")].step_s > 1.5
    # Checkpoint: bf16 weights of everything + fp32 master and two moments of what trains.
    s2 = rows[("BL_BASE", "step2")]
    assert s2.ckpt_bytes == s2.params * 2 + s2.trainable * 12 and s2.final_bytes == s2.params * 4
    one_node = {(r.system, r.step): r for r in plan.plan_stages(recipe_costs(load_recipe("paper")), plan.Cluster(nodes=1))}
    assert one_node[("BL_BASE", "step1")].comm_s < r.comm_s  # NVLink instead of the network
    # Each stage at its config's micro batch, at most: 12 layers at 32 per GPU, 4-6 at 64 (the host keeps ahead
    # of a GPU: tools/bench/host.py), down to a rank's share of 2048 (32 GPUs: 64; 64 GPUs: 32)
    deep = {("BL_BASE", "step1"), ("BL_BASE", "step2"), ("MINIJOINT", "step1"), ("MINIPOST", "step1")}
    assert len(rows) == 9 and all(r.micro_batch == (32 if k in deep else 64) for k, r in rows.items())
    sixty_four = plan.plan_stages(recipe_costs(load_recipe("paper")), plan.Cluster(nodes=8))
    assert {(r.micro_batch, r.grad_accum) for r in sixty_four} == {(32, 1)}
    forced = plan.plan_stages(recipe_costs(load_recipe("paper")), plan.Cluster(micro_batch=16))  # --micro-batch
    assert {(r.micro_batch, r.grad_accum) for r in forced} == {(16, 4)}


def mm_ds(*args):
    """`mm-ds ARGS` through the CLI's table, in this process (a process start costs more than the plan)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return subprocess.CompletedProcess(["mm-ds", *args], code, out.getvalue(), err.getvalue())


class Out:
    def __init__(self, capsys, *args):
        self.returncode = plan.main(list(args))
        cap = capsys.readouterr()
        self.stdout, self.stderr = cap.out, cap.err


def test_plan_cli_prints_the_paper_plan():
    out = mm_ds("plan", "paper", "--nodes", "4", "--gpus-per-node", "8", "--peak-tflops", "989", "--mfu", "0.45",
                "--usd-per-gpu-hour", "2", "--measured-tflops", "300")
    assert out.returncode == 0, out.stderr
    assert "bf16 (gradients reduced in fp32), ZeRO-1" in out.stdout
    assert "4 node(s) x 8 GPUs = 32" in out.stdout and "| MINIPOST | step1b | 6 | 14.18 | 125,000 | 64 x 1 |" in out.stdout
    assert "Step 2 (per new language)" in out.stdout and "USD" in out.stdout
    assert "measured 300 TFLOP/s per GPU" in out.stdout
    js = json.loads(mm_ds("plan", "--json", "--system", "BL_BASE").stdout)  # registered in the CLI
    assert [s["step"] for s in js["stages"]] == ["step1", "step2"]


def test_plan_bad_input(capsys):
    out = Out(capsys, "--micro-batch", "48")
    assert out.returncode == 2 and "not divisible by micro batch 48 x 32 GPUs" in out.stderr
    out = Out(capsys, "--mfu", "1.5")
    assert out.returncode == 2 and "--mfu" in out.stderr


def test_compute_model_against_bench_output(tmp_path, capsys):
    # The layout `mm-ds bench --json` writes; numbers as if adapt ran at 80% of pretraining's efficiency.
    peak = 100e9
    stages = {"pretrain": {"kind": "pretrain", "flops_per_step": 50e9, "step_time_s": 1.0},
              "adapt_mini": {"kind": "adapt", "flops_per_step": 10e9, "step_time_s": 0.25}}
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"peak": {"used_flops": peak}, "stages": stages, "setup": {"preset": "base"}}))
    out = Out(capsys, "--bench", str(bench))
    assert out.returncode == 0, out.stderr
    lines = {l.split("|")[1].strip(): l for l in out.stdout.splitlines() if l.startswith("| pretrain ") or
             l.startswith("| adapt_mini ")}
    assert lines["pretrain"].rstrip().endswith("| 1.00 |")  # the reference calibrates itself
    assert lines["adapt_mini"].rstrip().endswith("| 1.25 |")  # 0.25 s measured vs 0.2 s predicted
    assert "measured MFU of pretrain: 50.0%" in out.stdout
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"stages": {"x": {"step_time_s": 1}}}))
    out = Out(capsys, "--bench", str(bad))
    assert out.returncode == 2 and "lacks flops_per_step" in out.stderr


def test_the_paper_evaluation_estimate():
    """Units by hand: per task 3 source-language units (one per primary model) and per target language it covers
    BL_BASE's 125 Step-2 checkpoints (every 1000 updates) + a control, BL_SMALL's 25 + 1, and MINIJOINT's and
    MINIPOST's 29 + 1 in de, es, fr and zh, 25 + 1 elsewhere (footnote 3); Table 5's mini-model on XNLI: 1."""
    e = plan.plan_evaluation(load_recipe("paper"), plan.Cluster())
    targets = {"xnli": "ar bg de el es fr hi ru sw th tr ur vi zh", "pawsx": "de es fr zh",
               "mlqa": "ar de es hi vi zh", "xquad": "ar de el es hi ru th tr vi zh"}
    mini = lambda lang: 30 if lang in ("de", "es", "fr", "zh") else 26  # noqa: E731
    assert e.units == sum(3 + len(L.split()) * (126 + 26) + 2 * sum(map(mini, L.split()))
                          for L in targets.values()) + 1 == 7061
    assert e.model_runs == 5 * e.units
    quick = plan.plan_evaluation(load_recipe("paper", ["eval_examples=10", "curve=false"]), plan.Cluster())
    assert quick.units == sum(3 + len(L.split()) * 4 * 2 for L in targets.values()) + 1
    assert quick.sequences == 10 * quick.model_runs


def test_plan_totals_are_what_mm_ds_run_launches():
    """The totals price every stage run `mm-ds run` would launch (its stage list): the three pretrainings once
    (MINIPOST's is BL_BASE's), Step 2 in each of the 14 languages, the 60 finetunings as single-GPU runs packed
    onto the cluster (and Table 5's five of MINIJOINT's mini-model), the evaluation units, the alignment check of
    every Step-2 run; and they say what `--check` refuses at a cluster's size."""
    import math
    from collections import Counter

    from mm_ds.model import flops
    from mm_ds.pipeline.stage_runs import stage_configs, stage_runs
    from mm_ds.tools.plan.totals import makespan, recipe_totals, refusals

    recipe, c = load_recipe("paper"), plan.Cluster(nodes=4, gpus_per_node=8)
    cfgs = stage_configs(recipe)
    evaluation = plan.plan_evaluation(recipe, c, cfgs)
    totals = {t.step: t for t in recipe_totals(recipe, cfgs, c, evaluation)}
    launched = Counter(n.name.split("/")[0] for n in stage_runs(recipe, Path("OUT")))
    assert {s: totals[s].runs for s in ("Step 1", "Step 1b", "Step 2", "Step 3")} == {
        "Step 1": launched["pretrain"], "Step 1b": launched["build_mini"], "Step 2": launched["adapt"],
        "Step 3": launched["finetune"]} == {"Step 1": 3, "Step 1b": 2, "Step 2": 56, "Step 3": 65}
    per_system = {(r.system, r.step): r for r in plan.plan_stages(recipe_costs(recipe, cfgs=cfgs), c)}
    assert totals["Step 1"].hours == pytest.approx(sum(per_system[s, "step1"].hours
                                                       for s in ("BL_BASE", "BL_SMALL", "MINIJOINT")))
    assert totals["Step 2"].gpu_hours == pytest.approx(14 * sum(r.gpu_hours for (s, st), r in per_system.items()
                                                                if st == "step2"))
    # Step 3 by hand: 3 epochs of each English training set in batches of 32 on one GPU, 5 seeds per (primary, task)
    one_gpu = 989e12 * 0.45
    seconds = []
    for layers in (12, 4, 12):  # BL_BASE, BL_SMALL, MINIJOINT
        for n, seq in ((392_702, 128), (49_401, 128), (87_599, 384), (87_599, 384)):
            steps = math.ceil(3 * n / 32)
            seconds += 5 * [steps * flops.finetune_flops(768, layers, seq, 32, 1) / one_gpu]
    seconds += 5 * [math.ceil(3 * 392_702 / 32) * flops.finetune_flops(768, 4, 128, 32, 1) / one_gpu]  # Table 5
    assert totals["Step 3"].busy_gpu_hours == pytest.approx(sum(seconds) / 3600)
    assert totals["Step 3"].hours == pytest.approx(makespan(seconds, 32) / 3600) and max(seconds) / 3600 <= \
        totals["Step 3"].hours < sum(seconds) / 3600 / 16
    assert totals["Step 4"].runs == evaluation.units == 7061
    # The alignment check, by the rule the run follows (alignment.aligned_runs): every system's Step 2 in the 14
    # languages, whose held-out text is their prepared corpus's slice (prepare.heldout); each checkpoint and step 0 of
    # BL_BASE (125 + 1), BL_SMALL (25 + 1), MINIJOINT and MINIPOST (29 + 1 in de, es, fr, zh; 25 + 1 elsewhere).
    from mm_ds.pipeline.alignment import aligned_runs

    align = totals["alignment check"]
    assert align.runs == sum(cfgs[f"adapt/{s}/{lang}"].train.checkpoints() + 1 for s, lang in aligned_runs(recipe)) \
        == 14 * (126 + 26) + 2 * (4 * 30 + 10 * 26) == 2888
    # row_for's passes over 64 sequences: the primary with each checkpoint's embeddings and "bias only" (one model at
    # step 0), the mini-model (MINIJOINT 4 layers, MINIPOST 4 + 2) at every point; a language's runs on one GPU.
    fwd = lambda layers: 64 * flops.forward_flops(512, 768, 50_000, layers, 0.15) / one_gpu  # noqa: E731
    lang_s = [(1 + 2 * 125) * fwd(12) + (1 + 2 * 25) * fwd(4) + (1 + 2 * c) * 2 * fwd(12) + (c + 1) * (fwd(4) + fwd(6))
              for c in [29] * 4 + [25] * 10]
    assert align.busy_gpu_hours == pytest.approx(sum(lang_s) / 3600)
    assert align.hours == pytest.approx(max(lang_s) / 3600) and align.gpu_hours == pytest.approx(32 * align.hours)
    assert sum(t.gpu_hours for t in totals.values()) > 4 * 406  # the old "all stages" sum: one language, no Step 3
    for gpus in (1, 8, 16, 32, 64, 128):  # at most 64 or 32 per GPU: 2048 over 128 GPUs is 16 each, one micro-step
        assert refusals(recipe, cfgs, gpus) == []
    keep = ("(48 ranks cannot share it evenly, whatever the micro batch). World sizes that keep it: 1, 2, 4, 8, 16, 32, "
            "64, 128, 256, 512, 1024, 2048 (launch.nodes x launch.ranks). Changing train.global_batch instead departs "
            "from the paper's protocol (the update's size is part of it)")
    assert refusals(recipe, cfgs, 48) == [
        f"pretrain/bl_base (and 15 more like it): global batch 2048 is not divisible by micro batch 32 x world size 48 {keep}",
        f"pretrain/bl_small (and 44 more like it): global batch 2048 is not divisible by micro batch 64 x world size 48 {keep}"]


def test_the_printed_totals_of_the_paper_plan(capsys):
    """`mm-ds plan paper` prints the totals as a table, a row per step, then their sum, then whether `mm-ds run
    --check` would pass the recipe's batch geometry at the cluster's size: on 32 and 128 GPUs it does; with a
    finetuning micro batch that does not divide its batch, it refuses."""
    import re

    out = Out(capsys, "paper", "--nodes", "4", "--gpus-per-node", "8")
    assert out.returncode == 0, out.stderr
    lines = out.stdout[out.stdout.index("the whole recipe as `mm-ds run` runs it on 32 GPUs (every language, "
                                        "shared stages once):"):].splitlines()
    assert lines[1:3] == ["| step | runs | how | hours | GPU-h | busy GPU-h | disk GB |",
                          "|---|---:|---|---:|---:|---:|---:|"]
    rows = [line.strip("| ").split(" | ") for line in lines[3:9]]
    assert [r[:3] for r in rows] == [
        ["Step 1", "3", "data-parallel on 32 GPUs, one run after another"],
        ["Step 1b", "2", "data-parallel on 32 GPUs, one run after another"],
        ["Step 2", "56", "data-parallel on 32 GPUs, one run after another"],
        ["Step 3", "65", "single-GPU runs, 32 at once"], ["Step 4", "7,061", "units over 32 GPUs"],
        ["alignment check", "2,888", "checkpoints of 56 Step-2 runs, a language per GPU, 14 at once"]]
    hours, gpu_h, busy, disk = ([float(r[i].replace(",", "")) for r in rows] for i in (3, 4, 5, 6))
    total = re.fullmatch(r"all steps in sequence: ([\d.]+) h = ([\d.]+) days, ([\d,]+) GPU-h \(([\d,]+) busy\), "
                         r"([\d.]+) TB of checkpoints", lines[9])
    assert total, lines[9]
    h, days, g, b, tb = (float(x.replace(",", "")) for x in total.groups())
    assert h == pytest.approx(sum(hours), abs=0.1) and days == pytest.approx(h / 24, abs=0.05)  # cells are rounded
    assert g == pytest.approx(sum(gpu_h), abs=3) and g == pytest.approx(32 * h, rel=0.01)
    assert b == pytest.approx(sum(busy), abs=3) and b < g and tb == pytest.approx(sum(disk) / 1000, abs=0.01)
    assert lines[10:13] == ["(Step 4 and the alignment check add reading each checkpoint they score)",
                            "`mm-ds run --check` passes the batch geometry of every stage on 32 GPUs", ""]

    # 128 GPUs: 16 sequences each, one micro-step (a micro batch is the most a GPU runs at once)
    out = Out(capsys, "paper", "--nodes", "16", "--gpus-per-node", "8")
    assert out.returncode == 0, out.stderr
    assert "`mm-ds run --check` passes the batch geometry of every stage on 128 GPUs\n" in out.stdout
    assert "| BL_BASE | step1 | 12 | 124.49 | 125,000 | 16 x 1 |" in out.stdout
    # a finetuning micro batch that does not divide its batch of 32 on its one GPU: the plan prices it, --check refuses
    out = Out(capsys, "paper", "--set", "overrides.finetune=[train.micro_batch=5]")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    refused = lines.index("`mm-ds run --check` would refuse the recipe on 32 GPUs:")
    assert lines[refused - 2].startswith("all steps in sequence: ")
    reason = lines[refused + 1:lines.index("", refused)]  # folded to 120 columns
    assert " ".join(line.strip() for line in reason) == (
        "finetune/bl_base/xnli/seed1 (and 64 more like it): global batch 32 is not divisible by micro batch 5 x "
        "world size 1 (a rank's share, 32 sequences, is not a multiple of 5). World sizes that keep it: 8, 16, 32 "
        "(launch.nodes x launch.ranks), or a train.micro_batch that divides 32, e.g. 4. Changing train.global_batch "
        "instead departs from the paper's protocol (the update's size is part of it)")
    # 48 GPUs divide 2048 at no micro batch: the plan itself stops, naming the stage
    out = Out(capsys, "paper", "--nodes", "6", "--gpus-per-node", "8")
    assert out.returncode == 2 and out.stdout == "" and "BL_BASE step1: global batch 2048 is not divisible by " \
        "micro batch 32 x 48 GPUs" in out.stderr


def test_the_paper_depth_sweep_is_planned(capsys):
    """`mm-ds plan paper-depths`: each depth's own Step 1 and its Step 2 over N layers, costed by the same formulas."""
    out = Out(capsys, "paper-depths")
    assert out.returncode == 0, out.stderr
    rows = {(r.system, r.step): r for r in plan.plan_stages(recipe_costs(load_recipe("paper-depths")), plan.Cluster())}
    assert {s for s, _ in rows} == {"BL_BASE", *(f"MINIJOINT@{n}" for n in (2, 4, 6, 8, 10, 12))}
    step2 = [rows[(f"MINIJOINT@{n}", "step2")] for n in (2, 4, 6, 8, 10, 12)]
    assert [r.layers for r in step2] == [2, 4, 6, 8, 10, 12]
    assert all(a.step_s < b.step_s for a, b in zip(step2, step2[1:]))  # deeper mini-models cost more per update
    assert rows[("MINIJOINT@4", "step2")].checkpoints == 29 and rows[("MINIJOINT@6", "step2")].checkpoints == 25
    assert "| MINIJOINT@12 | step2 |" in out.stdout


# ---------------------------------------------------------------- the budget: money, jobs, MFU, side by side, data

def test_a_budget_for_four_nodes_of_eight_fits_120_columns(capsys):
    """The issue's command prints the USD total, the jobs under a 48 h limit, the data preparation and the start-up
    per launch, at three MFUs, one after another and side by side (one group per node), in 120 columns."""
    import re

    out = Out(capsys, "paper", "--nodes", "4", "--gpus-per-node", "8", "--usd-per-gpu-hour", "2.5", "--time-limit", "48h")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(map(len, lines)) <= 120, max(lines, key=len)
    text = " ".join(line.strip() for line in lines)
    assert "budget: the whole recipe with start-ups (30 s per launch, 10 s per job), in jobs of at most 48 h, at 2.5 " \
           "USD per GPU-hour" in text
    rows = {(r[0], r[1]): r for r in (line.strip("| ").split(" | ") for line in lines
                                       if re.match(r"\| 0\.\d+ \| (one after|side by)", line))}
    assert set(rows) == {(m, h) for m in ("0.225", "0.45", "0.675")
                         for h in ("one after another", "side by side, launch.spread=4")}
    seq, side = rows["0.45", "one after another"], rows["0.45", "side by side, launch.spread=4"]
    hours, gpu_h, usd, jobs = float(seq[2]), float(seq[3].replace(",", "")), float(seq[4].replace(",", "")), int(seq[5])
    assert 57.1 < hours < 58.5 and gpu_h == pytest.approx(32 * hours, abs=1) and usd == pytest.approx(2.5 * gpu_h, abs=3)
    assert jobs == 2 and int(rows["0.225", "one after another"][5]) == 3  # 57 h and 96 h of work in 48-h jobs
    assert float(side[2]) < hours - 14 and int(side[5]) == 1
    assert re.search(r"side by side saves 14\.\d h = 4\d\d GPU-h of the whole recipe \([\d,]+ USD\)", text)
    assert "start-up per launch 30 s (the upper end of 15.8-31.0 s measured for a 2-rank CPU launch" in text
    assert re.search(r"data preparation \(`mm-ds run paper --only prepare`, a CPU job before the GPU allocation\): 15 "
                     r"language\(s\), 1,197\.4 GB of text \(CC-100 sizes, the paper's Table 1\): one job 2\d\.\d h; a "
                     r"job per language \(`--lang L`\) \d\.\d h \(en, 301\.0 GB\)", text), text[-800:]
    wide = Out(capsys, "paper", "--wide").stdout.splitlines()
    assert max(map(len, wide)) > 120 and any(line.startswith("| BL_BASE | step1 | pretrain | 12 | 124.5 |")
                                             for line in wide)


def test_jobs_under_a_time_limit_lose_the_work_since_a_checkpoint():
    """A launch cut by the limit keeps its work up to its last resumable checkpoint and starts again in the next job;
    side-by-side lanes share each job's limit; a limit that cannot hold a start-up and one interval is refused."""
    from mm_ds.tools.plan.budget import parse_duration, submissions
    from mm_ds.tools.plan.totals import Launch, Phase

    def phase(*lanes):
        return Phase("Step 2", "", sum(map(len, lanes)), tuple(tuple(lane) for lane in lanes), 0.0, 0.0)

    h = 3600.0
    # 10 h of work in 4-h jobs, 1 h between checkpoints, 0.1 h start-up, no job start: 3.9 h kept in job 1 (3 h
    # after the interval's floor), then 3.9 -> 3, then the last 4 h need a third job and 0.1 h more -> a fourth
    one = [phase([Launch("a", 10 * h, h)])]
    assert submissions(one, 4 * h, 0.1 * h, 0.0) == (4, pytest.approx(3 * 4 * h + 1.1 * h))
    assert submissions(one, None, 0.1 * h, 0.0) == (1, pytest.approx(10.1 * h))
    assert submissions([phase([Launch("a", 10 * h, 0.0)])], 4 * h, 0.1 * h, 0.0)[0] == 3  # no loss: 3.9 + 3.9 + 2.2
    # two lanes side by side end together; the next phase starts after the longer
    two = [phase([Launch("a", 3 * h, h)], [Launch("b", 5 * h, h)]), phase([Launch("c", 1 * h, h)])]
    assert submissions(two, 4 * h, 0.0, 0.0) == (2, pytest.approx(4 * h + 2 * h))  # b: 4 h kept, then 1 h; then c
    with pytest.raises(ValueError, match="cannot hold a's start-up"):
        submissions(one, 1.05 * h, 0.1 * h, 0.0)
    assert parse_duration("48h") == parse_duration("2d") == parse_duration("2-00:00:00") == 48 * h
    assert parse_duration("90m") == parse_duration("1:30:00") == 1.5 * h
    with pytest.raises(ValueError, match="--time-limit '48'"):
        parse_duration("48")


def test_side_by_side_prices_each_run_on_its_group(capsys):
    """Step 2's 56 runs on 4 groups of one node each: each run's step at 8 GPUs with NVLink's bandwidth, taken in
    the recipe's order by the group that frees up first; the allocation pays all 32 GPUs for the longest group.
    A step with fewer runs than groups (Step 1: 3) stays one after another. A group too small to keep a global batch
    at its micro batch is refused, naming the group sizes that keep it, and the budget prices one after another."""
    from dataclasses import replace

    from mm_ds.pipeline.costs import stage_run_costs
    from mm_ds.pipeline.stage_runs import stage_configs
    from mm_ds.tools.plan.totals import lanes_in_order, recipe_phases

    recipe, c = load_recipe("paper"), plan.Cluster(nodes=4, gpus_per_node=8)
    cfgs = stage_configs(recipe)
    runs, evaluation = stage_run_costs(recipe, cfgs), plan.plan_evaluation(recipe, c, cfgs)
    seq = {p.step: p for p in recipe_phases(recipe, cfgs, c, evaluation, 1, runs)}
    side = {p.step: p for p in recipe_phases(recipe, cfgs, c, evaluation, 4, runs)}
    node = replace(c, nodes=1)
    step2 = [(k, rows) for k, rows in runs if k.startswith("adapt/")]
    seconds = [sum(r.hours for r in plan.plan_stages(rows, node)) * 3600 for _, rows in step2]
    assert [launch.seconds for lane in side["Step 2"].lanes for launch in lane] != seconds  # spread over 4 lanes
    assert sorted(launch.seconds for lane in side["Step 2"].lanes for launch in lane) == pytest.approx(sorted(seconds))
    lanes = lanes_in_order([plan_totals_launch(k, s) for (k, _), s in zip(step2, seconds)], 4)
    assert side["Step 2"].seconds == pytest.approx(max(sum(x.seconds for x in lane) for lane in lanes))
    assert side["Step 2"].total(32).gpu_hours == pytest.approx(32 * side["Step 2"].seconds / 3600)
    assert side["Step 2"].total(32).busy_gpu_hours == pytest.approx(8 * sum(seconds) / 3600)
    assert side["Step 2"].seconds < 0.75 * seq["Step 2"].seconds  # the network's share of each step is gone
    assert side["Step 1"] == seq["Step 1"] and side["Step 1b"] == seq["Step 1b"]
    # 96 sequences at most 64 per GPU: 32 each on 3 GPUs, but 96 on one (one node a group) is not 64 x micro-steps
    batch = [f"--set=overrides.{s}=[train.global_batch=96,train.micro_batch=64]" for s in ("pretrain", "build_mini",
                                                                                           "adapt")]
    out = Out(capsys, "paper", "--nodes", "3", "--gpus-per-node", "1", *batch)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "side by side (--spread 3, 1 node(s) a group) is refused: BL_BASE step1: global batch 96 is not divisible " \
           "by micro batch 64 x 1 GPUs" in text and "--spread values whose groups keep every global batch: 1" in text
    assert "launch.spread=" not in text  # the budget: one after another only
    out = Out(capsys, "paper", "--nodes", "4", "--gpus-per-node", "8", "--spread", "3")
    assert out.returncode == 2 and "--spread 3: 4 nodes do not split into 3 groups of equal size; choose from 1, " \
        "2, 4" in out.stderr


def plan_totals_launch(name, seconds):
    from mm_ds.tools.plan.totals import Launch
    return Launch(name, seconds, 0.0)


def test_the_data_preparation_estimate():
    """The paper recipe's languages at CC-100's sizes (Table 1): English's 301 GB sets a job per language's time;
    files that are here are measured instead (the real recipe's xz files, x the measured compression)."""
    from mm_ds.tools.plan.budget import CC100_GB, COMPRESSION, prepare_seconds, prepare_times

    times = {t.lang: t for t in prepare_times(load_recipe("paper"))}
    assert set(times) == set(CC100_GB) and times["sw"].text_bytes == 1.7e9
    assert max(times.values(), key=lambda t: t.seconds).lang == "en"
    assert 5 * 3600 < times["en"].seconds < 7 * 3600  # 301 GB read twice at 26 and 30 MB/s, and a minute of training
    assert prepare_seconds(1e9, workers=1) > prepare_seconds(1e9, workers=2) == prepare_seconds(1e9, workers=32)
    real = load_recipe("real")
    if (ROOT.parent / "shared" / "data" / "text" / "en.txt.xz").is_file():
        en = next(t for t in prepare_times(real) if t.lang == "en")
        assert en.source == "its files" and en.text_bytes == pytest.approx(
            COMPRESSION * (ROOT.parent / "shared" / "data" / "text" / "en.txt.xz").stat().st_size)


def test_a_gpu_bench_is_read_as_the_gpus(tmp_path, capsys):
    """`mm-ds bench --device cuda --json` (faked, as it writes it on an H100 PCIe): plan names the GPU, estimates
    at its datasheet peak, says the plan prices another GPU, and gives the cluster at the measured Step 1 rate."""
    peak = 756e12
    stages = {"pretrain": {"kind": "pretrain", "flops_per_step": 15.12e12, "step_time_s": 0.05},  # 40% MFU
              "adapt_mini": {"kind": "adapt", "flops_per_step": 3.0e12, "step_time_s": 0.0125}}
    bench = tmp_path / "bench-gpu.json"
    bench.write_text(json.dumps({"peak": {"used_flops": peak, "source": "datasheet, dense bf16",
                                          "gpu": "NVIDIA H100 PCIe"}, "stages": stages,
                                 "setup": {"device": "cuda", "gpu": "NVIDIA H100 PCIe", "precision": "bf16",
                                           "dtype": "bf16"}}))
    out = Out(capsys, "--bench", str(bench))
    assert out.returncode == 0, out.stderr
    assert "on NVIDIA H100 PCIe, bf16: peak 756 TFLOP/s (datasheet, dense bf16)" in out.stdout
    assert "pass --peak-tflops 756" in out.stdout  # the plan's default prices an H100 SXM
    row = next(line for line in out.stdout.splitlines() if line.startswith("| pretrain "))
    assert "| 0.050 | 302.4000 | 40.0% | 0.044 |" in row  # measured, TFLOP/s, MFU, est. at 756 x 0.45
    assert "measured MFU of pretrain: 40.0% against the plan's 45%" in out.stdout
    assert "NVIDIA H100 PCIe's measured Step 1 rate" in out.stdout and "measured 302.4 TFLOP/s per GPU" in out.stdout
    js = json.loads(mm_ds("plan", "--json", "--bench", str(bench)).stdout)["bench"]
    assert (js["device"], js["gpu"], js["precision"], js["peak_flops"]) == ("cuda", "NVIDIA H100 PCIe", "bf16", peak)
    cpu = tmp_path / "bench-cpu.json"  # what a CPU bench writes (no device before this change: read as a CPU's)
    cpu.write_text(json.dumps({"peak": {"used_flops": 1e11}, "stages": stages}))
    out = Out(capsys, "--bench", str(cpu))
    assert "measured in that run" in out.stdout and "measured Step 1 rate" not in out.stdout
    unknown = tmp_path / "bench-unknown.json"  # a GPU bench did not know the peak of: NaN in its JSON
    unknown.write_text(bench.read_text().replace("756000000000000.0", "NaN"))
    out = Out(capsys, "--bench", str(unknown))
    assert out.returncode == 0 and "its peak unknown: calibrated estimate only" in out.stdout
