"""Engine configs through DeepSpeed's own parser, before any rank starts: every shipped JSON, "auto" values,
typos at the top level and inside blocks, precision rules, monitor blocks as DeepSpeed defines them."""

import json

import pytest
import torch

from mm_ds import config
from mm_ds.config import ConfigError
from mm_ds.runtime.training import ds_config

SHIPPED = ds_config.shipped()


def cfg_with(ds: dict | str, tmp_path, *overrides):
    if isinstance(ds, dict):
        path = tmp_path / "ds.json"
        path.write_text(json.dumps(ds))
        ds = str(path)
    return config.load("tiny/bl_base", overrides=[f"ds_config={ds}", *overrides])


def base(name="bf16_zero1.json") -> dict:
    return json.loads(ds_config.find(name).read_text())


def test_the_shipped_configs_are_the_documented_ones():
    assert "bf16_zero0.json" not in SHIPPED  # bf16 + ZeRO 0 cannot accumulate in fp32 (see ds_config.py)
    assert {"bf16_zero1.json", "bf16_zero2.json", "bf16_zero3.json", "fp16_zero1.json", "fp32_zero0.json"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
@pytest.mark.parametrize("world", [1, 2, 8])
def test_every_shipped_config_passes_deepspeeds_parser(name, world):
    """With its own batch geometry, on the world sizes the presets and recipes use (a GPU machine's rules:
    fp16 is checked as a GPU would run it)."""
    cfg = config.load("paper/bl_base", overrides=[f"ds_config={name}", "train.global_batch=null",
                                                  "train.micro_batch=null"])
    ds, geo = ds_config.resolve(cfg, world, on_this_machine=False)
    assert geo.global_batch == 2048 and geo.global_batch == geo.micro_batch * geo.grad_accum * world
    if ds_config.precision(ds) == "bf16":  # over 8-64 micro-steps bf16 accumulation loses the gradient's low bits
        assert ds["data_types"]["grad_accum_dtype"] == "fp32" and ds_config.zero_stage(ds) >= 1
        # ... and so would a bf16 reduction of the gradients across ranks (tests/test_reduction_dtype.py)
        assert json.loads(ds_config.find(name).read_text())["communication_data_type"] == "fp32"
    assert ds_config.reduction_dtype(ds) == {"bf16": "fp32"}.get(ds_config.precision(ds), ds_config.precision(ds))


def test_a_micro_batch_is_the_most_a_rank_runs_at_once(tmp_path):
    """A micro batch above a rank's share of the global batch runs the share in one micro-step (the paper recipe's
    shallow stages: 64 per GPU on 8 GPUs, 32 on 64); one that does not divide the share is refused as before."""
    G = ds_config.Geometry
    assert ds_config.split(2048, 64, 8) == G(2048, 64, 4, 8)
    assert ds_config.split(2048, 64, 64) == G(2048, 32, 1, 64)
    assert ds_config.split(2048, 32, 128) == G(2048, 16, 1, 128)
    assert ds_config.split(2048, 32, 48) is None and ds_config.split(10, 4, 2) is None  # shares 42.7, 5
    assert ds_config.split(2048, 48, 16) is None  # a share of 128 is not 48s
    out, geo = ds_config.resolve(cfg_with(base(), tmp_path, "train.global_batch=8", "train.micro_batch=8"), 2,
                                 on_this_machine=False)  # DeepSpeed's parser agrees with the geometry written
    assert (geo.micro_batch, geo.grad_accum) == (4, 1) and out["train_micro_batch_size_per_gpu"] == 4
    assert out["gradient_accumulation_steps"] == 1 and out["train_batch_size"] == 8
    auto = cfg_with(base() | {"train_micro_batch_size_per_gpu": "auto"}, tmp_path, "train.micro_batch=null")
    assert ds_config.micro_batch(auto) is None  # `mm-ds plan` then asks for --micro-batch
    text = cfg_with(base() | {"train_micro_batch_size_per_gpu": "32"}, tmp_path, "train.micro_batch=null")
    with pytest.raises(ConfigError, match="train_micro_batch_size_per_gpu='32' must be a positive integer"):
        ds_config.micro_batch(text)  # named, not a TypeError inside `mm-ds plan`


def test_auto_values_are_filled_in_where_mm_ds_owns_them(tmp_path):
    ds = base() | {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                   "gradient_accumulation_steps": "auto"}
    ds["optimizer"]["params"]["lr"] = "auto"
    ds["scheduler"]["params"].update(total_num_steps="auto", warmup_max_lr="auto", warmup_num_steps="auto")
    out, geo = ds_config.resolve(cfg_with(ds, tmp_path, "train.global_batch=32", "train.micro_batch=8"), 2,
                                 on_this_machine=False)
    assert (geo.global_batch, geo.micro_batch, geo.grad_accum) == (32, 8, 2)
    assert out["train_batch_size"] == 32 and out["optimizer"]["params"]["lr"] == 1e-3
    assert out["scheduler"]["params"]["total_num_steps"] == 2500


def test_auto_without_a_value_to_fill_in_names_the_key(tmp_path):
    ds = base() | {"train_batch_size": "auto"}
    with pytest.raises(ConfigError, match="batch geometry unset"):
        ds_config.resolve(cfg_with(ds, tmp_path, "train.global_batch=null"), 1, on_this_machine=False)
    ds = base()
    ds["optimizer"]["params"]["weight_decay"] = "auto"
    with pytest.raises(ConfigError, match=r"optimizer\.params\.weight_decay is \"auto\""):
        ds_config.resolve(cfg_with(ds, tmp_path), 1, on_this_machine=False)


@pytest.mark.parametrize("edit,needle", [
    (lambda d: d["zero_optimization"].update(stagee=1), r"zero_optimization.*stagee.*Extra inputs"),
    (lambda d: d["zero_optimization"].update(stage="one"), r"zero_optimization.*stage"),
    (lambda d: d.update(zero_optimisation={"stage": 2}), r"'zero_optimisation' \(did you mean 'zero_optimization'\?\)"),
    (lambda d: d.update(tensorbaord={"enabled": True}), r"'tensorbaord' \(did you mean 'tensorboard'\?\)"),
    (lambda d: d["bf16"].update(enabeld=True), r"bf16.*enabeld"),
    (lambda d: d["optimizer"]["params"].update(betaz=[0.9, 0.99]), r"optimizer\.params\.betaz .*did you mean 'betas'"),
    (lambda d: d["scheduler"]["params"].update(warmup_step=3), r"scheduler\.params\.warmup_step .*warmup_num_steps"),
    (lambda d: d.update(gradient_clipping="big"), r"gradient_clipping='big' should be float"),
    (lambda d: d.update(prescale_gradients="yes"), r"prescale_gradients=.yes. should be bool"),
    (lambda d: d.update(train_batch_size=12.5), r"train_batch_size=12\.5 must be a positive integer"),
])
def test_a_bad_deepspeed_config_fails_before_launch_naming_the_key(tmp_path, edit, needle):
    ds = base()
    edit(ds)
    with pytest.raises(ConfigError, match=needle):  # the JSON's own geometry, so that its values are read
        ds_config.resolve(cfg_with(ds, tmp_path, "train.global_batch=null", "train.micro_batch=null"), 2,
                          on_this_machine=False)


def test_bf16_with_zero_0_is_refused_with_the_way_out(tmp_path):
    ds = base() | {"zero_optimization": {"stage": 0}}
    with pytest.raises(ConfigError, match=r"bf16 with zero_optimization.stage 0.*bf16_zero1.json"):
        ds_config.resolve(cfg_with(ds, tmp_path), 1, on_this_machine=False)


def test_a_users_bf16_config_accumulates_and_reduces_in_fp32_unless_it_says_otherwise(tmp_path):
    ds = base("bf16_zero2.json")
    del ds["data_types"], ds["communication_data_type"]
    out, _ = ds_config.resolve(cfg_with(ds, tmp_path), 1, on_this_machine=False)
    assert out["data_types"]["grad_accum_dtype"] == "fp32" and out["communication_data_type"] == "fp32"
    ds |= {"data_types": {"grad_accum_dtype": "bf16"}, "communication_data_type": "bf16"}
    out, _ = ds_config.resolve(cfg_with(ds, tmp_path), 1, on_this_machine=False)
    assert out["data_types"]["grad_accum_dtype"] == "bf16" and ds_config.reduction_dtype(out) == "bf16"
    fp32, _ = ds_config.resolve(cfg_with("fp32_zero1.json", tmp_path), 1, on_this_machine=False)
    assert "communication_data_type" not in fp32 and ds_config.reduction_dtype(fp32) == "fp32"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU rule")
def test_fp16_needs_a_gpu_bf16_does_not(tmp_path):
    with pytest.raises(ConfigError, match="fp16, which needs a GPU"):
        ds_config.resolve(cfg_with("fp16_zero1.json", tmp_path), 1)
    ds, _ = ds_config.resolve(cfg_with("bf16_zero1.json", tmp_path), 1)  # slow on CPU, but it runs
    assert ds_config.precision(ds) == "bf16"


def test_monitor_blocks_get_only_the_fields_deepspeed_defines(tmp_path):
    """W&B's block has no output_path or job_name (DeepSpeed rejects them); TensorBoard's and CSV's do."""
    ds = base() | {"wandb": {"enabled": True, "project": "mm-ds"}, "tensorboard": {"enabled": True}}
    out, _ = ds_config.resolve(cfg_with(ds, tmp_path, "monitor.csv=true"), 1, run_dir=tmp_path / "run",
                               on_this_machine=False)
    assert out["wandb"] == {"enabled": True, "project": "mm-ds"}
    assert out["tensorboard"] == {"enabled": True, "output_path": str(tmp_path / "run" / "logs"), "job_name": "pretrain"}
    assert out["csv_monitor"]["output_path"] == str(tmp_path / "run" / "logs")


@pytest.mark.ranks
@pytest.mark.parametrize("how", ["engine JSON", "monitor.*"])
def test_tensorboard_and_wandb_log_a_run(corpus, tmp_path, how):
    """Both monitors enabled in a user's JSON or by the run config's monitor.*: TensorBoard writes event files
    and W&B (offline) a run, both under RUN/logs, with mm-ds's training metrics."""
    import os
    import subprocess
    import sys

    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    ds = json.loads(ds_config.find("fp32_zero1.json").read_text())
    monitor = ["monitor.tensorboard=true", "monitor.wandb=true", "monitor.wandb_project=mm-ds-test"]
    if how == "engine JSON":
        ds |= {"tensorboard": {"enabled": True}, "wandb": {"enabled": True, "project": "mm-ds-test"}}
        monitor = []
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "mm_ds.cli", "pretrain", "--preset", "tiny/bl_base", "--out", str(out), "--no-progress",
         f"data.corpus={corpus}", f"ds_config={tmp_path / 'ds.json'}", "launch.launcher=none", "launch.ranks=1",
         "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2", "model.ffn_size=32", "data.seq_len=16",
         "model.max_positions=16", "train.steps=4", "train.log_every=2", "train.global_batch=4", "train.micro_batch=4",
         "train.warmup_steps=1", "train.checkpoint_steps=[]", *monitor],
        capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    events = list((out / "logs" / "pretrain").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    assert {"train/loss", "train/mfu"} <= set(acc.Tags()["scalars"])
    assert [e.step for e in acc.Scalars("train/loss")] == [2, 4]
    runs = list((out / "logs" / "wandb").glob("offline-run-*"))
    assert runs and list(runs[0].glob("*.wandb")), list((out / "logs").rglob("*"))[:20]


def test_monitor_keys_of_the_run_config_turn_deepspeeds_monitors_on(tmp_path):
    """`monitor.*` reaches DeepSpeed's blocks as it defines them, outputs under RUN/logs; the JSON's keys win."""
    cfg = cfg_with(base(), tmp_path, "monitor.tensorboard=true", "monitor.wandb=true", "monitor.wandb_group=exp1",
                   "monitor.csv=true")
    out, geo = ds_config.resolve(cfg, 1, run_dir=tmp_path / "run", on_this_machine=False)
    logs = str(tmp_path / "run" / "logs")
    assert out["tensorboard"] == {"enabled": True, "output_path": logs, "job_name": "pretrain"}
    assert out["wandb"] == {"enabled": True, "project": "mm-ds", "group": "exp1"}
    assert out["csv_monitor"]["enabled"] and out["csv_monitor"]["output_path"] == logs
    ds_config.validate(out, geo, "resolved")  # DeepSpeed's parser accepts the blocks
    from deepspeed.monitor.config import get_monitor_config
    assert get_monitor_config(out).tensorboard.enabled and get_monitor_config(out).wandb.group == "exp1"

    mine = base() | {"tensorboard": {"enabled": False}, "csv_monitor": {"enabled": False}}
    out, _ = ds_config.resolve(cfg_with(mine, tmp_path, "monitor.tensorboard=true"), 1, run_dir=tmp_path / "run",
                               on_this_machine=False)
    assert not out["tensorboard"]["enabled"] and not out["csv_monitor"]["enabled"]
    out, _ = ds_config.resolve(cfg_with(base(), tmp_path), 1, run_dir=tmp_path / "run", on_this_machine=False)
    assert not {"csv_monitor", "tensorboard", "wandb"} & set(out)  # CSV is off by default: train.jsonl has the rows


def test_the_engine_gets_no_monitor_and_no_syncing_timer(tmp_path, capsys):
    """DeepSpeed's throughput timer (on and synchronized by default) is off; given a monitor the engine would write
    the LR to it at every update on rank 0, so it gets none (mm-ds's row writer has them). A JSON that turns a
    syncing option on is kept, and named, with why."""
    cfg = cfg_with(base(), tmp_path, "monitor.csv=true", "monitor.tensorboard=true")
    out, _ = ds_config.resolve(cfg, 1, run_dir=tmp_path / "run", on_this_machine=False)
    assert out["timers"] == {"throughput": {"enabled": False}} and ds_config.syncing(out) == []
    engine = ds_config.engine_config(out)
    assert "timers" in engine and not set(ds_config.MONITORS) & set(engine) and out["csv_monitor"]["enabled"]
    from deepspeed.runtime.config import DeepSpeedConfig
    parsed = DeepSpeedConfig(engine)
    assert not parsed.timers_config.enabled and not parsed.monitor_config.enabled

    for on, named in [({"timers": {"throughput": {"enabled": True}}}, "timers.throughput"),
                      ({"wall_clock_breakdown": True}, "wall_clock_breakdown"),
                      ({"flops_profiler": {"enabled": True}}, "flops_profiler.enabled"),
                      ({"comms_logger": {"enabled": True}}, "comms_logger.enabled")]:
        out, _ = ds_config.resolve(cfg_with(base() | on, tmp_path), 1, on_this_machine=False)
        assert [w.split(":")[0] for w in ds_config.syncing(out)] == [named], on
    quiet = base() | {"timers": {"throughput": {"enabled": True, "synchronized": False}}}  # host clock only
    assert ds_config.syncing(ds_config.resolve(cfg_with(quiet, tmp_path), 1, on_this_machine=False)[0]) == []
    ds_config.warn_if_slow(ds_config.resolve(cfg_with(base() | on, tmp_path), 1, on_this_machine=False)[0])
    assert "syncs the device every micro-step: comms_logger.enabled: it calls get_accelerator().synchronize() " \
           "after every collective" in capsys.readouterr().out
