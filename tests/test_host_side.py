"""The host never makes the device wait: no synchronization and no read of a device value outside log and
checkpoint updates (DeepSpeed's that no setting removes are named), no file opened by rank 0's training thread
and no rank waiting for rank 0's log rows, batches built ahead (bitwise the batches the loop would build),
masked positions without `nonzero`, and a non-finite update skipped on the device. The counter is
tests/support/host_reads.py; `mm-ds bench` measures the host's time."""

import json
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from mm_ds.config import ModelConfig
from mm_ds.data.mlm import MLMBatches
from mm_ds.data.shards import TokenCorpus
from mm_ds.model.heads import RobertaForTask
from mm_ds.model.model import RobertaMLM
from mm_ds.runtime.training.ds_config import Geometry
from mm_ds.runtime.training.prefetch import Prefetcher
from mm_ds.tokens import IGNORE_INDEX
from support.host_reads import HostReads, summary

HERE = Path(__file__).resolve().parent


def test_the_counter_counts_and_attributes_reads():  # a test that cannot fail is a defect
    reads = HostReads()
    reads.update = 1
    x = torch.tensor([0.0, 1.0, 2.0])
    with reads:
        x.sum().item()
        x.nonzero()
        x.tolist()
        bool(x[0])
        x.new_tensor(3)
        x.sum()  # not a read
    whats = [r[3] for r in reads.records]
    assert whats == ["_local_scalar_dense", "nonzero", "tolist", "_local_scalar_dense", "lift_fresh"]
    assert {r[1] for r in reads.records} == {"other"}  # called from this test, not from mm_ds or deepspeed


def test_forward_passes_read_nothing_back():
    cfg = ModelConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, ffn_size=32, max_positions=16,
                      secondary_head_layer=1, dropout=0.0)
    ids = torch.randint(5, 50, (2, 16))
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[:, 3] = ids[:, 3]
    positions = torch.tensor([3, 19, 0, 0])  # padded with a position whose label is ignored
    mlm, task = RobertaMLM(cfg), RobertaForTask(cfg, "pair_classification", 3)
    with HostReads() as reads:
        reads.update = 1
        out = mlm(ids, labels, masked_positions=positions)
        out["loss"].backward()
        task(ids, labels=torch.tensor([0, 2]).clone())["loss"].backward()
    assert [r for r in reads.records if r[3] != "lift_fresh" or r[1] == "mm_ds"] == []
    # the padded selection computes what the searched one does
    ref = mlm(ids, labels)
    assert int(out["masked_tokens"]) == 2 and torch.allclose(out["loss"], ref["loss"])
    assert torch.equal(out["correct_main"], ref["correct_main"])


def test_masked_positions_are_fixed_length_complete_and_padded_with_ignored_labels(corpus):
    mlm = MLMBatches(TokenCorpus(corpus), 32, seed=3, vocab_size=TokenCorpus(corpus).vocab_size)
    for step in range(20):
        b = mlm.batch(step, 0, 0, 1, 4)
        pos, labels = b["masked_positions"], b["labels"].reshape(-1)
        assert pos.shape == (4 * mlm.max_masked(),)
        found = labels.ne(IGNORE_INDEX).nonzero().squeeze(1)
        assert torch.equal(pos[:len(found)], found) and (labels[pos[len(found):]] == IGNORE_INDEX).all()


def _geo() -> Geometry:
    return Geometry(8, 2, 2, 2)


def test_prefetched_batches_are_the_loops_batches(corpus):
    mlm = MLMBatches(TokenCorpus(corpus), 32, seed=1, vocab_size=TokenCorpus(corpus).vocab_size)
    fn = lambda s, m, r, g: mlm.batch(s, m, r, g.world_size, g.micro_batch, g.grad_accum)  # noqa: E731
    rng = torch.get_rng_state()
    with Prefetcher(fn, 1, _geo(), 3, 9, ahead=3) as ahead:
        got = [ahead.get(s, m) for s in range(3, 9) for m in range(2)]
    assert torch.equal(torch.get_rng_state(), rng)  # building batches drew nothing from torch's generator
    fresh = MLMBatches(TokenCorpus(corpus), 32, seed=1, vocab_size=TokenCorpus(corpus).vocab_size)
    want = [fresh.batch(s, m, 1, 2, 2, 2) for s in range(3, 9) for m in range(2)]
    for a, b in zip(got, want):
        assert a.keys() == b.keys()
        assert all((a[k] is None and b[k] is None) or torch.equal(a[k], b[k]) for k in a)


def test_prefetch_errors_order_and_shutdown():
    def broken(step, micro, rank, geo):
        if step == 2:
            raise ValueError("shard 7 is unreadable")
        return {"x": torch.tensor([step, micro])}

    with Prefetcher(broken, 0, _geo(), 0, 5, ahead=2) as ahead:
        assert ahead.get(0, 0)["x"].tolist() == [0, 0]
        with pytest.raises(RuntimeError, match="out of order"):
            ahead.get(1, 1)
    with Prefetcher(broken, 0, _geo(), 0, 5, ahead=2) as ahead:
        for s, m in [(0, 0), (0, 1), (1, 0), (1, 1)]:
            ahead.get(s, m)
        with pytest.raises(ValueError, match="shard 7"):  # the builder's error, raised in the loop
            ahead.get(2, 0)
    before = threading.active_count()
    with Prefetcher(broken, 0, _geo(), 0, 2, ahead=1):
        pass  # closed with batches unread: the thread ends
    assert threading.active_count() == before


def _reads(corpus: Path, out: Path, stage: str, ds_config: str, env=None, *overrides: str, world: int = 1
           ) -> list[dict]:
    """tests/support/host_reads.py on `world` ranks started as a launcher starts them: each rank's records."""
    import os

    from mm_ds.runtime.distributed.dist import free_port

    port, procs = free_port(), []
    for rank in range(world):
        ranks = {} if world == 1 else {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                                       "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, str(HERE / "support" / "host_reads.py"), str(corpus), str(out),
                                       stage, ds_config, *overrides], env=(env or os.environ) | ranks,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0] * world, "\n".join(err[-3000:] for _, err in outs)
    return [json.loads(out.splitlines()[-1]) for out, _ in outs]


def test_the_counter_counts_syncs_stream_and_event_waits_and_files():  # a test that cannot fail is a defect
    from deepspeed.accelerator import get_accelerator

    from support.host_reads import AsyncDevice, allowed_by

    reads = HostReads()
    with reads, AsyncDevice(reads):
        acc = get_accelerator()
        assert not acc.is_synchronized_device()  # DeepSpeed takes its CUDA paths
        reads.update = 1
        early = acc.Event()
        early.record()
        acc.synchronize()
        torch.cpu.synchronize()  # (torch.cuda's is counted the same way)
        acc.Stream().synchronize()
        acc.current_stream().wait_stream(acc.Stream())  # ordering on the device: the host does not wait
        now = acc.Event()
        now.record()
        now.synchronize()
        reads.update = 2
        early.synchronize()  # recorded an update ago: it waits for old work only
        with open(__file__) as f:
            f.read(1)
        torch.zeros(1).add_(1)  # not a wait
    assert get_accelerator().is_synchronized_device()  # put back
    assert [r[3] for r in reads.records] == ["synchronize", "torch.cpu.synchronize", "stream.synchronize",
                                             "event.synchronize", "event.synchronize (lagged)"]
    assert [(r[0], r[3]) for r in reads.opens] == [(2, __file__)]
    quiet = {"steps": 3, "log_every": 3, "grad_accum": 1, "checkpoints": [], "reads": reads.records}
    assert summary(quiet)[("other", reads.records[0][2], "synchronize")] == 0.5  # lagged ones are not counted
    assert len(summary(quiet)) == 4 and not summary(quiet, {("other", "tests/test_host_side.py", None): "why"})
    assert allowed_by({("other", "tests/test_host_side.py test_the", "synchronize"): "why"}, *reads.records[0][1:])


# DeepSpeed 0.19.8's own waits that no engine setting removes (docs/gpus.md says why, and what each costs).
DEEPSPEED_WAITS = {
    ("deepspeed", "runtime/utils.py is_invalid_grad_norm", "_local_scalar_dense"):
        "per update: its optimizers (BF16_Optimizer, ZeRO 1-3) read the gradient norm's validity to skip a "
        "non-finite update; the engine then decides on the host whether the LR scheduler steps",
    ("deepspeed", "runtime/utils.py mask_nan_or_inf_with_val_inplace", "lift_fresh"):
        "per update: that norm's -1 sentinel, a tensor made from a host value",
    ("deepspeed", "zero/stage3.py get_grad_norm_direct", "lift_fresh"): "per update, ZeRO 3: the same sentinel",
    ("deepspeed", "zero/stage_1_and_2.py has_overflow", "_local_scalar_dense"):
        "per update, ZeRO 2 under bf16: bf16.check_grad_overflow (on by default) also reads an overflow flag; "
        "turned off, ZeRO 2 skips no non-finite update at all",
    ("deepspeed", "zero/partition_parameters.py _allgather_params_coalesced", "synchronize"):
        "per update, ZeRO 3: after the step it gathers its persistent (small) parameters and synchronizes",
    ("deepspeed", "zero/stage3.py independent_gradient_partition_epilogue", "stream.synchronize"):
        "per micro-step, ZeRO 3: every backward ends waiting for its gradient reduce-scatter, with or without "
        "overlap_comm",
}
# mm-ds's own, outside log and checkpoint updates: none. A new one is declared here with its reason, e.g. a read of
# a host copy of an earlier update's result whose event was recorded then (that event's wait is a lagged one).
MM_DS_WAITS = {
    ("mm_ds", "training/boundary.py read", "tolist"):
        "per update: the stop/resume agreement's result (LaggedMax), read one update after its all-reduce was "
        "queued; on CUDA it is a pinned host copy behind a CUDA event recorded in the earlier update, so the read "
        "waits for that update's work only, never for the queue the host has just filled (the counter cannot tell a "
        "host tensor from a device one on this CPU: it sees the copy's `tolist`)",
}
ZERO3_TRACE = {(("deepspeed", f, None)): "ZeRO 3 records its parameter-fetch trace in the first update and checks "
               "it against every rank's" for f in ("zero/utils.py", "zero/partition_parameters.py",
                                                   "zero/partitioned_param_coordinator.py")}
BF16 = [("adapt", "bf16_zero1.json"), ("pretrain", "bf16_zero2.json"), ("pretrain", "bf16_zero3.json")]


@pytest.fixture(scope="module", params=BF16, ids=[c for _, c in BF16])
def bf16_run(request, corpus, tmp_path_factory) -> tuple[str, list[dict]]:
    """One 2-rank run of each shipped bf16 config, on a device that runs behind the host (`AsyncDevice`): the
    tests below share it. Two ranks: DeepSpeed's data-parallel world of one takes shortcuts (ZeRO 3 gathers
    nothing)."""
    stage, ds_config = request.param
    out = tmp_path_factory.mktemp(ds_config.split(".")[0])
    return ds_config, _reads(corpus, out, stage, ds_config, None, "train.micro_batch=2", world=2)


@pytest.mark.ranks
def test_the_device_never_waits_for_the_host_outside_log_and_checkpoint_updates(bf16_run):
    """Syncs, stream and event waits and reads of device values, per micro-step, through DeepSpeed's
    forward/backward/step with the shipped GPU configs: none of mm-ds's, none of DeepSpeed's but those named."""
    ds_config, ranks = bf16_run
    for rank, result in enumerate(ranks):
        assert result["grad_accum"] == 2 and result["world"] == 2
        waits = summary(result, DEEPSPEED_WAITS | MM_DS_WAITS, ZERO3_TRACE)
        assert not waits, f"{ds_config}, rank {rank}: waits per micro-step outside log/checkpoint updates: {waits}"


@pytest.mark.ranks
def test_rank_0_opens_no_file_in_the_training_thread_outside_checkpoints(bf16_run):
    """Not at a log row either: a thread of rank 0's writes logs/train.jsonl and the monitors (CSV off by
    default); DeepSpeed's engine, given no monitor, writes none at every update."""
    ds_config, ranks = bf16_run
    checkpoints = set(ranks[0]["checkpoints"])
    assert not [o for o in ranks[0]["opens"] if o[0] not in checkpoints], ranks[0]["opens"]
    logs = ranks[0]["log_dir"]
    assert [json.loads(line)["step"] for line in Path(logs, "train.jsonl").read_text().splitlines()] == [3, 6]


@pytest.mark.ranks
def test_no_rank_waits_for_rank_0s_log_row(bf16_run):
    """A row update has one collective of mm-ds's more than a quiet one, on every rank: the log window's."""
    ds_config, ranks = bf16_run
    for rank, result in enumerate(ranks):
        per = {u: Counter((w.split(":")[0], w.split(" ")[-1], what) for v, o, w, what in result["collectives"]
                          if v == u and o == "mm_ds") for u in (2, 3)}  # quiet, row
        assert per[3] - per[2] == Counter({("distributed/dist.py", "all_reduce_tensor", "all_reduce"): 1}), (rank, per)
        assert not per[2] - per[3], (rank, per)


@pytest.mark.ranks
def test_the_loop_reads_the_device_only_at_log_and_checkpoint_updates(corpus, tmp_path):
    """MINIJOINT's secondary head, torch's fused AdamW with a non-finite update in a quiet update (skipped on the
    device, counted at the next read), fp32 ZeRO 0: no wait at all outside log and checkpoint updates."""
    import os
    result, = _reads(corpus, tmp_path, "pretrain", "fp32_zero0.json", os.environ | {"MM_DS_NAN_AT": "2"})
    waits = summary(result, MM_DS_WAITS)
    assert not waits, f"waits per micro-step outside log/checkpoint updates: {waits}"
    rows = [json.loads(line) for line in (tmp_path / "run" / "logs" / "train.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 3 and rows[0]["nonfinite_steps"] == 1  # the skip of update 2 was counted at 3
    assert all(r["loss"] == r["loss"] for r in rows)  # no NaN logged


def test_presets_log_rows_at_a_rate_scaled_to_the_stage():
    """Each log row reads the device's window back (a wait for the queued work, and an all-reduce): at most ~2,000
    rows a stage (the paper's 125k updates: every 100th). Finetuning's steps come from its epochs (paper/finetune
    logs every 50 of XNLI's ~37k); models/* hold model shapes only."""
    from mm_ds import config

    rows = {n: (c.train.steps // c.train.log_every) for n in config.preset_names() if not n.startswith("models/")
            for c in [config.load(n, check=False)] if c.stage != "finetune"}
    assert rows["paper/adapt"] == rows["paper/bl_base"] == 1250
    assert all(n <= 2000 for n in rows.values()), rows


RUN_TWICE = textwrap.dedent('''
    import sys, torch
    from pathlib import Path
    from mm_ds.runtime.checkpointing import checkpoint
    from mm_ds.runtime.training import engine
    from mm_ds import config
    from mm_ds.stages import pretrain

    corpus, root = sys.argv[1], Path(sys.argv[2])
    tiny = ["model.hidden_size=16", "model.num_layers=2", "model.num_heads=2", "model.ffn_size=32",
            "model.max_positions=32", "data.seq_len=32", f"data.corpus={corpus}", "train.global_batch=8",
            "train.micro_batch=4", "train.steps=5", "train.warmup_steps=1", "train.log_every=2",
            "train.checkpoint_steps=[]", "ds_config=fp32_zero0.json", "model.secondary_head_layer=1"]
    for ahead in (0, 3):
        engine.train(pretrain.build(config.load("tiny/minijoint", None, tiny + [f"data.prefetch={ahead}"])),
                     root / str(ahead), progress=False)
    a, b = (checkpoint.load_final(root / r)[1] for r in ("0", "3"))
    assert all(torch.equal(a[k], b[k]) for k in a), "prefetching changed training"
    print("same")
''')


@pytest.mark.ranks
def test_training_with_batches_built_ahead_is_bitwise_the_same(corpus, tmp_path):
    proc = subprocess.run([sys.executable, "-c", RUN_TWICE, str(corpus), str(tmp_path)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and "same" in proc.stdout, proc.stderr[-3000:]


def test_fused_adamw_skips_on_a_device_flag_without_touching_its_state():
    p = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.AdamW([p], lr=0.1, fused=True)
    p.grad = torch.ones(4)
    opt.step()
    state = {k: v.clone() for k, v in opt.state[p].items()}
    before = p.detach().clone()
    p.grad = torch.full((4,), float("nan"))
    opt.found_inf = torch.ones(())  # what engine.skip_nonfinite hands it
    opt.step()
    assert torch.equal(p.detach(), before) and all(torch.equal(opt.state[p][k], v) for k, v in state.items())
    opt.found_inf = torch.zeros(())
    p.grad = torch.ones(4)
    opt.step()
    assert not torch.equal(p.detach(), before) and float(opt.state[p]["step"]) == 2.0
    np.testing.assert_array_less(p.detach().numpy(), before.numpy())


def test_tf32_follows_the_precision_and_the_key(monkeypatch):
    from mm_ds.runtime.training import build
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    build.use_tf32(True)
    assert torch.backends.cuda.matmul.fp32_precision == torch.backends.cudnn.fp32_precision == "tf32"
    build.use_tf32(False)
    assert torch.backends.cuda.matmul.fp32_precision == torch.backends.cudnn.fp32_precision == "ieee"



HOOKS = textwrap.dedent("""
    import json, sys, torch, deepspeed
    from mm_ds.runtime.distributed import dist
    dist.init()
    for ds in json.loads(sys.stdin.read()):
        ds.update(train_batch_size=2, train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=2)
        ds["optimizer"]["params"]["lr"] = 1e-3
        ds.pop("scheduler")
        m = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(3)])
        engine, *_ = deepspeed.initialize(model=m, model_parameters=m.parameters(), config=ds)
        print("hooks", len(engine.optimizer._grad_acc_hooks), flush=True)
    import os
    os._exit(0)  # past gloo's threads at finalization, as dist.finish leaves a rank
""")


@pytest.mark.ranks
def test_fp32_zero1_runs_no_python_hook_per_parameter_per_micro_step():
    """DeepSpeed's `contiguous_gradients` (on by default) hooks every trainable tensor's backward under ZeRO 1,
    to stage gradients it reduces only at the update's end: ~7 us per tensor per micro-step of host time. The fp32
    ZeRO-1 configs turn it off (same weights bit for bit); the GPU one holds the same ZeRO block."""
    from mm_ds.runtime.training import ds_config
    shipped = json.loads(ds_config.find("fp32_zero1.json").read_text())
    assert json.loads(ds_config.find("fp32_zero1_gpu.json").read_text())["zero_optimization"] == \
        shipped["zero_optimization"]
    default = shipped | {"zero_optimization": {"stage": 1}}  # DeepSpeed's default: the control
    proc = subprocess.run([sys.executable, "-c", HOOKS], input=json.dumps([shipped, default]), capture_output=True,
                          text=True, timeout=300)
    assert [line for line in proc.stdout.splitlines() if line.startswith("hooks")] == ["hooks 0", "hooks 6"], \
        proc.stderr[-3000:]
