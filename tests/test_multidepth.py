"""Multi-depth MINIJOINT (paper §7): several secondary heads in Step 1 (the main head keeps half the loss), one
mini-model per depth cut in Step 1b, and a Step 2 that moves from the shallowest to deeper ones on a schedule
(fixed shares or a plateau of the target MLM loss), resumed exactly, with its FLOPs counted per phase."""

import json
import re
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from mm_ds import config
from mm_ds.config import ConfigError, ModelConfig
from mm_ds.model import flops, surgery
from mm_ds.model.model import RobertaMLM, is_language_param, param_shapes
from mm_ds.pipeline.costs import recipe_costs, step2_phases
from mm_ds.runtime.distributed.dist import free_port
from mm_ds.runtime.training.phases import DepthSchedule, schedule_for
from mm_ds.runtime.training.train_log import Settled
from mm_ds.stages.command import stage_config
from mm_ds.systems import system_of

TINY = dict(vocab_size=40, hidden_size=16, num_layers=5, num_heads=2, ffn_size=32, max_positions=32)


def _model(depths, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = ModelConfig(**{**TINY, **kw}, secondary_head_layer=depths)
    cfg.check()
    return cfg, RobertaMLM(cfg).eval()


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 40, (3, 12), generator=g)
    labels = torch.where(torch.rand(3, 12, generator=g) < 0.4, ids, torch.full_like(ids, -100))
    return ids, labels


# ---------------------------------------------------------------- configuration

def test_secondary_head_layer_takes_an_int_or_an_ascending_list():
    load = lambda *o: config.load(None, None, ["stage=pretrain", "model.num_layers=6", *o])  # noqa: E731
    assert load("model.secondary_head_layer=[1,2,4]").model.secondary_depths == (1, 2, 4)
    assert load("model.secondary_head_layer=[3]").model.secondary_head_layer == 3  # a 1-item list is the int
    assert load("model.secondary_head_layer=2").model.secondary_depths == (2,)
    assert load().model.secondary_depths == ()
    for bad, needle in [("[4,2]", "ascending"), ("[2,2]", "ascending"), ("[1,9]", "between 1 and"),
                        ("x", "expected int or list")]:
        with pytest.raises(ConfigError, match=needle):
            load(f"model.secondary_head_layer={bad}")
    assert load("mini.depth_shares=[1,0,2]").mini.depth_shares == [1.0, 0.0, 2.0]
    for bad, needle in [(["mini.depth_shares=[1,-1]"], "must be >= 0"), (["mini.depth_shares=[0,0]"], "positive sum"),
                        (["mini.depth_shares=[1,1]", "mini.plateau_window=5"], "not both"),
                        (["mini.plateau_window=-1"], ">= 0")]:
        with pytest.raises(ConfigError, match=needle):
            load(*bad)


def test_multidepth_stage_configs_carry_the_variants_depths():
    row = system_of("minijoint@1+2")
    assert row.overrides("pretrain") == ["model.secondary_head_layer=[1,2]"]
    argv = ["--preset", "tiny/minijoint", "--out", "/tmp/x", "system=minijoint@1+2"]
    for given in ("[1,2]", "[1, 2]"):
        cfg = stage_config("pretrain", [*argv, f"model.secondary_head_layer={given}"])[1]
        assert row.depth_mismatch(cfg) is None and cfg.model.secondary_depths == (1, 2)
    with pytest.raises(ConfigError, match=r"add model.secondary_head_layer=\[1,2\]"):
        stage_config("pretrain", argv)  # the preset's single depth 2 must not pass for [1,2]
    with pytest.raises(ConfigError, match="add"):
        stage_config("pretrain", [*argv, "model.secondary_head_layer=[1,2,3]"])
    assert row.adapted_depths(cfg.model, cfg.mini) == (1, 2)
    assert system_of("minipost@3").adapted_depths(ModelConfig(), SimpleNamespace(layers=3, new_layers=2)) == (5,)
    assert system_of("bl_small").adapted_depths(ModelConfig(num_layers=4), None) == (4,)


# ---------------------------------------------------------------- Step 1: one model, several heads

def test_the_main_head_keeps_half_the_loss_and_names_are_back_compatible():
    """The paper's loss with one secondary head is the mean of two: the main head's half. With heads at [1, 2, 4] the main head
    keeps 1/2 and the secondary heads share the rest (model.main_head_weight); 0.25 is the mean over all four."""
    cfg, m = _model([1, 2, 4])
    ids, labels = _batch()
    out = m(ids, labels)
    heads = ["loss_main", "loss_secondary@1", "loss_secondary@2", "loss_secondary@4"]
    assert torch.allclose(out["loss"], out["loss_main"] / 2 + sum(out[k] for k in heads[1:]) / 6)
    _, mean = _model([1, 2, 4], main_head_weight=0.25)
    assert torch.allclose(mean(ids, labels)["loss"], torch.stack([out[k] for k in heads]).mean())
    _, dual = _model(2)
    two = dual(ids, labels)
    assert torch.allclose(two["loss"], (two["loss_main"] + two["loss_secondary"]) / 2)
    for bad in (0.0, 1.0):
        with pytest.raises(ConfigError, match=f"model.main_head_weight={bad} must be in \\(0, 1\\)"):
            _model(2, main_head_weight=bad)
    assert {k for k in out if k.startswith("correct")} == {"correct" + k[4:] for k in heads}
    assert set(m.state_dict()) == set(param_shapes(cfg))
    assert {k for k in m.state_dict() if is_language_param(k)} == {
        "embed.tokens.weight", "head.bias", "secondary_head.bias", "secondary_heads.2.bias", "secondary_heads.4.bias"}
    # the single-head case keeps its names and log keys (checkpoints and logs of before read the same)
    single_cfg, single = _model(2)
    assert not any(k.startswith("secondary_heads.") for k in single.state_dict())
    assert {k for k in single(ids, labels) if k.startswith("loss")} == {"loss", "loss_main", "loss_secondary"}
    for name, lang in [("embed.tokens.weight", True), ("head.bias", True), ("secondary_heads.4.bias", True),
                       ("secondary_heads.4.dense.bias", False), ("secondary_head.norm.bias", False)]:
        assert is_language_param(name) is lang
    with pytest.raises(ValueError, match="depth=3"):
        m(ids, labels, depth=3)


# ---------------------------------------------------------------- Step 1b: the cut

def test_extract_keeps_the_bottom_layers_and_every_head_bitwise():
    cfg, m = _model([1, 2, 4])
    sd = m.state_dict()
    mini_cfg, mini_sd = surgery.extract_minijoint(cfg, sd)
    assert (mini_cfg.num_layers, mini_cfg.secondary_head_layer) == (4, [1, 2])
    assert set(mini_sd) == set(param_shapes(mini_cfg))
    assert not any(k.startswith("layers.4.") for k in mini_sd)
    for k, v in mini_sd.items():
        src = "secondary_heads.4." + k[5:] if k.startswith("head.") else k
        assert torch.equal(v, sd[src]) and v.data_ptr() != sd[src].data_ptr()
    mini = RobertaMLM(mini_cfg).eval()
    mini.load_state_dict(mini_sd)
    ids, labels = _batch(1)
    full = m(ids)
    for depth, head in [(1, "secondary@1"), (2, "secondary@2"), (4, "secondary@4")]:
        (got,) = mini(ids, depth=depth).values()
        assert torch.equal(got, full[f"logits_{head}"])
        assert torch.equal(mini(ids, labels, depth=depth)["loss"], m(ids, labels)[f"loss_{head}"])
    two_cfg, two = _model([1, 3])
    two_cfg, _ = surgery.extract_minijoint(two_cfg, two.state_dict())
    assert (two_cfg.num_layers, two_cfg.secondary_head_layer) == (3, 1)  # one shallower head: the int
    one_cfg, one = _model(3)
    one_cfg, one_sd = surgery.extract_minijoint(one_cfg, one.state_dict())
    assert (one_cfg.num_layers, one_cfg.secondary_head_layer) == (3, None) and "secondary_head.bias" not in one_sd


# ---------------------------------------------------------------- Step 2's schedule

def test_schedule_by_shares():
    s = DepthSchedule((1, 2, 4), 9)
    assert [s.depth_for(i) for i in range(9)] == [1, 1, 1, 2, 2, 2, 4, 4, 4]
    s = DepthSchedule((1, 2, 4), 8, [1, 0, 3])  # 0 skips depth 2
    assert [s.depth_for(i) for i in range(8)] == [1] * 2 + [4] * 6
    assert s.phases_until(8) == [(1, 0, 2), (4, 2, 8)] and s.phases_until(1) == [(1, 0, 1)]
    with pytest.raises(ValueError, match="one share per depth"):
        DepthSchedule((1, 2), 10, [1, 1, 1])
    mini = SimpleNamespace(depth_shares=[], plateau_window=0, plateau_delta=0.0)
    assert schedule_for((4,), 10, mini) is None
    with pytest.raises(ValueError, match="one head"):
        schedule_for((4,), 10, SimpleNamespace(depth_shares=[1.0], plateau_window=0, plateau_delta=0.0))


def test_schedule_by_plateau():
    s = DepthSchedule((1, 2, 4), 100, window=2, delta=0.1)
    losses = [5.0, 4.0, 3.0, 2.95, 2.94,  # improves by 1, 1, then < 0.1 over the last 2: switch after step 4
              3.5, 3.0, 2.5, 2.0, 1.95, 1.9, 1.99,  # depth 2: switch after step 11
              9.0, 9.0, 9.0, 9.0]  # the deepest runs to the end
    depths = []
    for step, loss in enumerate(losses):  # read after every update: the switch follows the plateau at once
        depths.append(s.depth_for(step))
        s.observe(Settled([step], [[]], [False], [loss]), step + 1)
    assert depths == [1] * 5 + [2] * 7 + [4] * 4
    assert s.phases_until(16) == [(1, 0, 5), (2, 5, 12), (4, 12, 16)]
    assert s.phases_until(7) == [(1, 0, 5), (2, 5, 7)]
    # Read every 3 updates (the loop's log rows): the plateau found after step 4 switches at the read after
    # step 5, and the rest of that read is not observed; a skipped update is not observed at all.
    late = DepthSchedule((1, 2, 4), 100, window=2, delta=0.1)
    for first in range(0, 12, 3):
        late.observe(Settled(list(range(first, first + 3)), [[]] * 3, [False] * 3, losses[first:first + 3]),
                     first + 3)
    assert late.phases_until(12) == [(1, 0, 6), (2, 6, 12)]
    skipping = DepthSchedule((1, 2), 100, window=2, delta=0.1)
    skipping.observe(Settled([0, 1, 2, 3], [[]] * 4, [False, False, True, False], [5.0, 4.0, 9.0, 3.95]), 4)
    assert skipping.phases_until(4) == [(1, 0, 4)] and skipping.state_dict()["recent"] == [4.0, 3.95]
    again = DepthSchedule((1, 2, 4), 100, window=2, delta=0.1)
    again.load_state_dict(json.loads(json.dumps(s.state_dict())))  # checkpoints hold it as plain values
    assert again.state_dict() == s.state_dict() and again.depth_for(16) == 4
    with pytest.raises(ValueError, match="depths"):
        DepthSchedule((1, 2), 100, window=2).load_state_dict(s.state_dict())


# ---------------------------------------------------------------- FLOPs

def test_flops_per_phase_and_per_head():
    shape = dict(hidden=64, vocab=1000, seq_len=32, mask_prob=0.15, global_batch=8)
    a3 = {d: flops.stage_flops_per_step("adapt", layers=d, **shape) for d in (1, 2, 4)}
    s = DepthSchedule((1, 2, 4), 12, [1, 1, 2])
    assert s.flops_until(12, a3.__getitem__) == 3 * a3[1] + 3 * a3[2] + 6 * a3[4]
    assert s.flops_until(4, a3.__getitem__) == 3 * a3[1] + a3[2]
    one = flops.stage_flops_per_step("pretrain_secondary", layers=6, **shape)
    three = flops.stage_flops_per_step("pretrain_secondary", layers=6, secondary_heads=3, **shape)
    base = flops.stage_flops_per_step("pretrain", layers=6, **shape)
    assert three - base == pytest.approx(3 * (one - base))
    adapt = SimpleNamespace(train=config.TrainConfig(steps=12, checkpoint_steps=[3, 4], checkpoint_every=100),
                            mini=config.MiniConfig(depth_shares=[1, 1, 2]))
    assert step2_phases(adapt, (1, 2, 4)) == [(1, 3, 1), (2, 3, 1), (4, 6, 1)]
    assert step2_phases(adapt, (6,)) == [(6, 12, 3)]


def test_recipe_costs_count_step2_per_depth():
    from mm_ds.pipeline.recipe import load_recipe
    recipe = load_recipe("tiny", ["systems=[minijoint,minijoint@1+2]", "seeds=[1]", "tasks=[xnli]", "langs=[t1]",
                                  "overrides.adapt/minijoint@1+2=['mini.depth_shares=[1,3]']"])
    rows = recipe_costs(recipe, vocab=200)
    multi = [r for r in rows if r.system == "MINIJOINT@1+2"]
    step2 = [r for r in multi if r.step == "step2"]
    steps = sum(r.steps for r in step2)
    assert [(r.layers, r.steps) for r in step2] == [(1, round(steps / 4)), (2, steps - round(steps / 4))]
    assert [r.secondary_heads for r in multi if r.step == "step1"] == [2]
    single = next(r for r in rows if r.system == "MINIJOINT" and r.step == "step1")
    assert multi[0].flops > single.flops  # one extra head's cost


# ---------------------------------------------------------------- Step 2 trained, resumed across a switch

STAGE_SCRIPT = textwrap.dedent('''
    import shutil, sys, torch
    from pathlib import Path
    from mm_ds.runtime.checkpointing import checkpoint
    from mm_ds.runtime.training import engine
    from mm_ds.config import ModelConfig, RunConfig, TrainConfig, LaunchConfig
    from mm_ds.model.model import RobertaMLM, is_language_param
    from mm_ds.runtime.training.phases import DepthSchedule
    from mm_ds.stages.common import stage_flops

    root, mode = Path(sys.argv[1]), sys.argv[2]
    mcfg = ModelConfig(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2, ffn_size=32, max_positions=32,
                       secondary_head_layer=1, dropout=0.1)

    def stage():
        torch.manual_seed(0)
        cfg = RunConfig(stage="adapt", system="minijoint@1+2", model=mcfg, peak_tflops=1.0,
                        train=TrainConfig(steps=8, warmup_steps=1, lr=1e-2, global_batch=4, micro_batch=2,
                                          checkpoint_steps=[2], checkpoint_every=0, log_every=3),
                        launch=LaunchConfig(launcher="none"))
        cfg.data.seq_len = 12
        # plateau at once: found at the read after update 6 (window 3; reads at the checkpoint 2 and the rows
        # 3 and 6), the switch to depth 2 comes past the checkpoint at 2
        schedule = (DepthSchedule((1, 2), 8, window=3, delta=100.0) if mode == "plateau"
                    else DepthSchedule((1, 2), 8, [3, 5]))

        def batches(step, micro, rank, geo):
            g = torch.Generator().manual_seed(1000 * step + micro)
            ids = torch.randint(5, 40, (2, 12), generator=g)
            labels = torch.where(torch.rand(2, 12, generator=g) < 0.3, ids, torch.full_like(ids, -100))
            return {"input_ids": ids, "labels": labels}  # the loop adds the schedule's depth

        return engine.Stage(cfg=cfg, model=RobertaMLM(mcfg), trainable=is_language_param, batches=batches,
                            flops_per_step=stage_flops(cfg, "adapt", 2), tokens_per_sample=12, schedule=schedule)

    a, b = root / "a", root / "b"
    engine.train(stage(), a, progress=False)
    shutil.copytree(a, b)
    for p in (b / "final", b / "logs", checkpoint.checkpoints_dir(b) / checkpoint.tag_for(8)):
        shutil.rmtree(p)
    engine.train(stage(), b, resume=True, progress=False)
''')


@pytest.mark.ranks
@pytest.mark.parametrize("mode", ["plateau", "shares"])
def test_step2_resumes_exactly_across_a_depth_switch(tmp_path, mode):
    proc = subprocess.run([sys.executable, "-c", STAGE_SCRIPT, str(tmp_path), mode], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resumed from" in proc.stdout and "at step 2" in proc.stdout
    from mm_ds.runtime.checkpointing import checkpoint
    (meta_a, sd_a), (meta_b, sd_b) = (checkpoint.load_final(tmp_path / r / "final") for r in "ab")
    assert sd_a.keys() == sd_b.keys() and all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)
    switch = 6 if mode == "plateau" else 3
    assert meta_a["depth_phases"] == meta_b["depth_phases"] == [[1, 0, switch], [2, switch, 8]]
    shape = dict(hidden=16, vocab=40, seq_len=12, mask_prob=0.15, global_batch=4)
    want = sum(flops.stage_flops_per_step("adapt", layers=d, **shape) * (e - s) for d, s, e in meta_a["depth_phases"])
    assert meta_a["flops"] == pytest.approx(want)
    rows = [json.loads(line) for line in (tmp_path / "a" / "logs" / "train.jsonl").read_text().splitlines()]
    # rows every 3 updates, and one where a phase ends: no row spans two depths
    want_rows = [(3, 0, 1), (6, 0, 1), (8, 1, 2)] if mode == "plateau" else [(3, 0, 1), (6, 1, 2), (8, 1, 2)]
    assert [(r["step"], r["phase"], r["depth"]) for r in rows] == want_rows
    assert rows[-1]["flops"] == pytest.approx(want)
    # the deeper head's output bias moved only once its phase began; the shallower one trained first
    assert "secondary_head.bias" in sd_a and not torch.equal(sd_a["head.bias"], torch.zeros(40))


def test_the_recipe_check_passes_a_multidepth_recipe_and_refuses_a_bad_schedule(tmp_path):
    from mm_ds.pipeline.check import check
    from mm_ds.pipeline.recipe import load_recipe
    base = ["systems=[bl_base,minijoint@1+2]", "seeds=[1]", "tasks=[xnli]", "langs=[t1]"]
    report = check(load_recipe("tiny", [*base, "overrides.adapt/minijoint@1+2=['mini.plateau_window=20']"]),
                   tmp_path / "a", strict=False)
    assert not report.problems, report.format()
    for bad, needle in [("overrides.adapt/minijoint@1+2=['mini.depth_shares=[1,1,1]']", "one share per depth"),
                        ("overrides.adapt=['mini.depth_shares=[1,1]']", "adapt/bl_base/t1.* one head")]:
        report = check(load_recipe("tiny", [*base, bad]), tmp_path / "b", strict=False)
        assert any(re.search(needle, p) for p in map(str, report.problems)), report.format()


# ---------------------------------------------------------------- the GPU path, on CPU

@pytest.mark.ranks
def test_a_multidepth_run_trains_in_bf16_under_zero_on_two_ranks_launched_per_stage(tmp_path):
    """What a cluster run of minijoint@1+2 takes: per-stage deepspeed launches of 2 ranks, bf16 with the shipped
    ZeRO 3 (Step 1, three heads) and ZeRO 2 (Step 2: a head unused in each phase gets no gradient) configs."""
    import yaml

    small = ["model.hidden_size=32", "model.num_heads=2", "model.ffn_size=64", "train.micro_batch=8"]
    recipe = {
        "systems": ["bl_base", "minijoint@1+2"], "langs": ["t1"], "tasks": ["xnli"], "seeds": [1],
        "world": {"seed": 0, "sentences": 3000, "target_sentences": 2000,
                  "task_sizes": {"nli_train": 200, "paws_train": 50, "qa_train": 50, "dev": 50, "test": 100}},
        "prepare": {"vocab_size": 800, "model_type": "bpe"},
        "presets": {"pretrain": "tiny/{system}", "build_mini": "tiny/build_mini", "adapt": "tiny/adapt",
                    "finetune": "tiny/finetune"},
        "overrides": {"pretrain": [*small, "train.steps=12", "train.warmup_steps=2", "train.checkpoint_steps=[]"],
                      "adapt": ["train.steps=8", "train.warmup_steps=2", "train.checkpoint_steps=[4]",
                                "train.micro_batch=8"],
                      "finetune": ["finetune.epochs=1", "finetune.max_train_examples=160", "train.micro_batch=8"],
                      "pretrain/minijoint@1+2": ["ds_config=bf16_zero3.json"],
                      "adapt/minijoint@1+2": ["ds_config=bf16_zero2.json"]},
        "launch": {"ranks": 2, "launcher": "deepspeed", "master_port": free_port()},
        "mode": "per_stage", "curve": True,
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    proc = subprocess.run([sys.executable, "-m", "mm_ds.cli", "run", str(tmp_path / "recipe.yaml"), "--out",
                           str(tmp_path / "run")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    from mm_ds.runtime.checkpointing import checkpoint
    meta, sd = checkpoint.load_final(tmp_path / "run" / "adapt" / "minijoint@1+2" / "t1")
    assert (meta["precision"], meta["zero_stage"], meta["world_size"]) == ("bf16", 2, 2)
    assert meta["depth_phases"] == [[1, 0, 4], [2, 4, 8]]
    assert {"secondary_head.bias", "head.bias"} <= set(sd)
    rows = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert any(r["system"] == "minijoint@1+2" and r["condition"] == "adapted" and r["lang"] == "t1" for r in rows)
