"""Configs: presets load, overrides apply, bad keys/types/geometry fail naming what to fix."""

import json

import pytest

from mm_ds import config
from mm_ds.config import ConfigError
from mm_ds.runtime.training import ds_config


@pytest.mark.parametrize("name", config.preset_names())
def test_every_preset_loads(name):
    data = config.read_preset(name)
    if "stage" in data:
        parent = [] if data["stage"] == "pretrain" else ["parent=runs/x"]
        cfg = config.load(name, overrides=parent)
        assert cfg.stage in config.STAGES


def test_stages_after_pretrain_need_a_parent():
    with pytest.raises(ConfigError, match="parent"):
        config.load("tiny/adapt")


def test_paper_minijoint_is_the_paper_recipe():
    cfg = config.load("paper/minijoint")
    m, t = cfg.model, cfg.train
    assert (m.num_layers, m.hidden_size, m.num_heads, m.ffn_size, m.vocab_size, m.secondary_head_layer) == (12, 768, 12, 3072, 50000, 4)
    assert (t.steps, t.lr, t.warmup_steps) == (125_000, 7e-4, 10_000)
    ds, geo = ds_config.resolve(cfg, 8, on_this_machine=False)  # its own bf16 engine config, on 8 GPUs
    assert geo.global_batch == 2048 and geo.global_batch == geo.micro_batch * geo.grad_accum * 8
    assert ds["bf16"]["enabled"] and ds["data_types"]["grad_accum_dtype"] == "fp32" and ds_config.zero_stage(ds) == 1
    sp = ds["scheduler"]["params"]
    assert sp["warmup_type"] == "linear" and sp["total_num_steps"] == 125_000 and sp["warmup_max_lr"] == 7e-4
    assert ds["optimizer"]["params"]["betas"] == [0.9, 0.98] and ds["optimizer"]["params"]["eps"] == 1e-6


def test_overrides_and_precedence(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("train:\n  lr: 0.001\n  steps: 50\n  warmup_steps: 5\n")
    cfg = config.load("tiny/bl_base", str(f), ["train.lr=3e-4", "model.num_layers=3"])
    assert cfg.train.lr == 3e-4 and cfg.train.steps == 50 and cfg.model.num_layers == 3


@pytest.mark.parametrize("override,needle", [
    (["train.lrr=1"], "train.lrr"),
    (["model.hidden=4"], "model.hidden"),
    (["train.steps=abc"], "train.steps"),
    (["model.num_layers=2.5"], "model.num_layers"),
    (["model.secondary_head_layer=9"], "model.secondary_head_layer"),
    (["model.num_heads=5"], "model.num_heads"),
    (["stage=pretrian"], "pretrian"),
    (["data.seq_len=4096"], "data.seq_len"),
    (["lr"], "key=value"),
])
def test_bad_config_values_name_the_key(override, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.").replace("[", r"\[")):
        config.load("tiny/minijoint", overrides=override)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        config.load(file=str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="bad.json"):
        config.load(file=str(bad))
    with pytest.raises(ConfigError, match="unknown preset"):
        config.load("tiny/nonesuch")


def test_batch_geometry_that_deepspeed_cannot_satisfy():
    cfg = config.load("tiny/minijoint", overrides=["train.global_batch=30", "train.micro_batch=4"])
    with pytest.raises(ConfigError, match="not divisible"):
        ds_config.resolve(cfg, 2)


def test_ds_config_guards(tmp_path):
    log_warmup = json.loads((ds_config.find("fp32_zero1.json")).read_text())
    log_warmup["scheduler"]["params"]["warmup_type"] = "log"
    p = tmp_path / "ds.json"
    p.write_text(json.dumps(log_warmup))
    with pytest.raises(ConfigError, match="linear"):
        ds_config.resolve(config.load("tiny/minijoint", overrides=[f"ds_config={p}"]), 1)
    with pytest.raises(ConfigError, match="not found"):
        ds_config.find("nope.json")


def test_a_mistyped_or_renamed_key_gets_the_right_name():
    with pytest.raises(ConfigError, match=r"train.stpes; did you mean train.steps\?"):
        config.load("tiny/bl_base", None, ["train.stpes=2"])
    with pytest.raises(ConfigError, match="model.aux_head_layer is now model.secondary_head_layer"):
        config.load("tiny/minijoint", None, ["model.aux_head_layer=2"])


def _numeric_keys(cls, prefix: str = "") -> set[str]:
    """Every key of a config dataclass whose values are numbers (int, float, lists of them, optional or not)."""
    import dataclasses
    import typing

    keys = set()
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            keys |= _numeric_keys(tp, f"{prefix}{f.name}.")
        elif {int, float} & {a for t in [tp, *typing.get_args(tp)] for a in [t, *typing.get_args(t)]}:
            keys.add(prefix + f.name)
    return keys


def test_every_numeric_key_has_a_range():
    """A numeric key added without a row in config.RANGES (or recipe.RANGES) would take any finite value."""
    from mm_ds.pipeline.recipe import RANGES as RECIPE_RANGES
    from mm_ds.pipeline.recipe import PrepareKeys, Recipe, WorldKeys

    assert _numeric_keys(config.RunConfig) == set(config.RANGES)
    assert (_numeric_keys(Recipe) | _numeric_keys(PrepareKeys, "prepare.") | _numeric_keys(WorldKeys, "world.")
            == set(RECIPE_RANGES))


@pytest.mark.parametrize("override, message", [
    ("train.lr=nan", "train.lr=nan is not a finite number; it must be > 0"),
    ("train.lr=.inf", "train.lr=inf is not a finite number; it must be > 0"),
    ("model.dropout=-inf", "model.dropout=-inf is not a finite number; it must be in [0, 1)"),
    ("finetune.warmup_ratio=1.5", "finetune.warmup_ratio=1.5 must be in [0, 1]"),
    ("train.checkpoint_steps=[100,-5]", "train.checkpoint_steps[1]=-5 must be >= 1"),
    ("peak_tflops=0", "peak_tflops=0.0 must be > 0"),
    ("launch.master_port=0", "launch.master_port=0 must be in [1, 65535]"),
    ("data.random_prob=0.95", "data.random_prob=0.95 and data.keep_prob=0.1 are shares of the selected tokens"),
])
def test_numbers_are_finite_and_in_range(override, message):
    with pytest.raises(ConfigError) as e:
        config.load("tiny/bl_base", overrides=[override])
    assert message in str(e.value)


def test_a_stage_dry_run_refuses_a_non_finite_number(tmp_path, capsys):
    from mm_ds import cli

    assert cli.main(["pretrain", "--preset", "tiny/bl_base", "--out", str(tmp_path / "run"), "--dry-run",
                     "train.lr=nan"]) == 2
    assert "mm-ds pretrain: error: train.lr=nan is not a finite number; it must be > 0" in capsys.readouterr().err


def test_a_recipe_check_refuses_bad_numbers_in_its_keys_and_its_stages(tmp_path, capsys):
    from mm_ds import cli
    from mm_ds.pipeline.recipe import load_recipe

    with pytest.raises(ConfigError, match=r"with seeds=\[1, -2\]: seeds\[1\]=-2 must be >= 0"):
        load_recipe("tiny", ["seeds=[1, -2]"])
    with pytest.raises(ConfigError, match=r"world.task_sizes.dev=0 must be >= 1"):
        load_recipe("tiny", ["world.task_sizes={dev: 0}"])
    with pytest.raises(ConfigError, match=r"prepare.character_coverage=nan is not a finite number; it must be in \(0, 1\]"):
        load_recipe("tiny", ["prepare.character_coverage=nan"])
    rc = cli.main(["run", "tiny", "--check", "--out", str(tmp_path / "out"), "--set", "overrides.adapt=[train.lr=inf]"])
    out = capsys.readouterr().out
    assert rc == 1 and "train.lr=inf is not a finite number; it must be > 0" in out, out
