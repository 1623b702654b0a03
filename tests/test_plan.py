"""`mm-ds plan`: parameter counts match the model, communication follows the ZeRO stage and the trainable set,
the paper plan prints, and the compute model can be checked against `mm-ds bench` output."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mm_ds.recipe import load_recipe
from mm_ds.tools import plan
from mm_ds.tools.costs import recipe_costs
from mm_ds.config import ModelConfig
from mm_ds.model import LANGUAGE_PARAMS, RobertaMLM

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("kind, layers, secondary", [("pretrain", 3, None), ("pretrain_dual", 3, 2), ("adapt", 2, None)])
def test_parameter_counts_match_the_model(kind, layers, secondary):
    h, V, s = 64, 1000, 32
    model = RobertaMLM(ModelConfig(vocab_size=V, hidden_size=h, num_layers=layers, num_heads=4, ffn_size=4 * h,
                                   max_positions=s, secondary_head_layer=secondary))
    pc = plan.stage_params(kind, h, V, layers, s)
    assert pc.total == sum(p.numel() for p in model.parameters())
    if kind == "adapt":
        assert pc.trainable == sum(p.numel() for n, p in model.named_parameters() if n in LANGUAGE_PARAMS)


def test_step2_communicates_the_embedding_group_only():
    base = plan.stage_params("pretrain", 768, 50_000, 12, 512)
    step2 = plan.stage_params("adapt", 768, 50_000, 12, 512)
    assert round(step2.trainable / 1e6, 2) == 38.45 and 124e6 < base.total < 126e6
    n = 32
    v1 = plan.comm_bytes_per_step(1, n, base.trainable, base.total, 2, "bf16")
    assert v1 == pytest.approx(2 * (n - 1) / n * base.trainable * 2)  # = ring all-reduce volume
    assert v1 == plan.comm_bytes_per_step(0, n, base.trainable, base.total, 2, "bf16")
    v2 = plan.comm_bytes_per_step(1, n, step2.trainable, step2.total, 2, "bf16")
    assert v2 / v1 == pytest.approx(step2.trainable / base.trainable)
    assert plan.comm_bytes_per_step(2, n, base.trainable, base.total, 4, "bf16") > v1  # reduce-scatter per micro-step
    assert plan.comm_bytes_per_step(3, n, step2.trainable, step2.total, 1, "bf16") > 3 * v2  # gathers frozen weights
    assert plan.comm_bytes_per_step(1, 1, base.trainable, base.total, 2, "bf16") == 0


def test_paper_plan_numbers():
    c = plan.Cluster(nodes=4, gpus_per_node=8, peak_tflops=989, mfu=0.45)
    rows = {(r.system, r.stage): r for r in plan.plan_stages(recipe_costs(load_recipe("paper")), c)}
    r = rows[("BL_BASE", "step1")]
    assert r.compute_s == pytest.approx(r.flops_per_step / (32 * 989e12 * 0.45))
    assert r.grad_accum == 2 and r.checkpoints == 29  # steps 1000-4000, every 5000, the last
    assert r.hours == pytest.approx(r.step_s * 125_000 / 3600) and r.gpu_hours == pytest.approx(32 * r.hours)
    # MINIJOINT's Step 2 over 4 layers costs what BL_SMALL's does, and far less than BL_BASE's.
    assert rows[("MINIJOINT", "step2")].step_s == pytest.approx(rows[("BL_SMALL", "step2")].step_s)
    assert rows[("BL_BASE", "step2")].step_s / rows[("MINIJOINT", "step2")].step_s > 2
    # Checkpoint: bf16 weights of everything + fp32 master and two moments of what trains.
    s2 = rows[("BL_BASE", "step2")]
    assert s2.ckpt_bytes == s2.params * 2 + s2.trainable * 12 and s2.final_bytes == s2.params * 4
    one_node = {(r.system, r.stage): r for r in plan.plan_stages(recipe_costs(load_recipe("paper")), plan.Cluster(nodes=1))}
    assert one_node[("BL_BASE", "step1")].comm_s < r.comm_s  # NVLink instead of the network


def mm_ds(*args):
    return subprocess.run([sys.executable, "-m", "mm_ds.cli", *args], capture_output=True, text=True, cwd=ROOT)


class Out:
    def __init__(self, capsys, *args):
        self.returncode = plan.main(list(args))
        cap = capsys.readouterr()
        self.stdout, self.stderr = cap.out, cap.err


def test_plan_cli_prints_the_paper_plan():
    out = mm_ds("plan", "paper", "--nodes", "4", "--gpus-per-node", "8", "--peak-tflops", "989", "--mfu", "0.45",
                "--usd-per-gpu-hour", "2", "--measured-tflops", "300")
    assert out.returncode == 0, out.stderr
    assert "4 node(s) x 8 GPUs = 32" in out.stdout and "| MINIPOST | step1b | build_mini | 6 |" in out.stdout
    assert "Step 2 (per new language)" in out.stdout and "USD" in out.stdout
    assert "measured 300 TFLOP/s per GPU" in out.stdout
    js = json.loads(mm_ds("plan", "--json", "--system", "BL_BASE").stdout)  # registered in the CLI
    assert [s["stage"] for s in js["stages"]] == ["step1", "step2"]


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


def test_the_paper_depth_sweep_is_planned(capsys):
    """`mm-ds plan paper-depths`: each depth's own Step 1 and its Step 2 over N layers, costed by the same formulas."""
    out = Out(capsys, "paper-depths")
    assert out.returncode == 0, out.stderr
    rows = {(r.system, r.stage): r for r in plan.plan_stages(recipe_costs(load_recipe("paper-depths")), plan.Cluster())}
    assert {s for s, _ in rows} == {"BL_BASE", *(f"MINIJOINT@{n}" for n in (2, 4, 6, 8, 10, 12))}
    step2 = [rows[(f"MINIJOINT@{n}", "step2")] for n in (2, 4, 6, 8, 10, 12)]
    assert [r.layers for r in step2] == [2, 4, 6, 8, 10, 12]
    assert all(a.step_s < b.step_s for a, b in zip(step2, step2[1:]))  # deeper mini-models cost more per update
    assert rows[("MINIJOINT@4", "step2")].checkpoints == 29 and rows[("MINIJOINT@6", "step2")].checkpoints == 25
    assert "| MINIJOINT@12 | step2 |" in out.stdout
