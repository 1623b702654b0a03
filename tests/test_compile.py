"""train.compile (mm_ds/runtime/training/compiled.py): the models compile without a graph break into a bounded number of
graphs, every stage kind trains compiled on 2 CPU ranks as it trains eager, and a compiled run resumes exactly.

`make test` runs one 2-rank launch (tests/compile_ranks.py, ~85 CPU-seconds, so ~45 s of `make test`'s two workers):
every stage kind once for `UPDATES` updates each side, the kinds spread over the engine configs fp32 ZeRO 0, 1, 2 and
bf16 ZeRO 1 (every config by some kind); aot_eager for six kinds (the compiled graphs, forward and backward, run by
eager kernels: they compile in seconds and equal the eager losses bit for bit), inductor for MINIJOINT's pretraining
(the generated kernels: losses within `FP32_TOLERANCE`); frozen parameters bitwise as built; and a multi-depth Step 2
with dropout, compiled, resumed from its first checkpoint across its depth switch, to the uninterrupted run's weights.
In this process: the graphs and graph breaks of the multi-depth MLM and the QA model, and the detectors' own tests.
Behind the `compile_full` marker (`make test-compile`: 17 minutes on 2 cores shared at load 11, a fresh inductor
cache): every stage kind under every one of the four configs with inductor, and every kind resumed;
tests/fault_harness.py's subset with train.compile on (real processes killed, resumed bitwise); and an inductor
embedding's backward, the same bit for bit at every pass on 2 threads (the cause of inexact compiled resumes). The
split: compiling a graph costs seconds of CPU (inductor: tens), 28 of them do not fit `make test`'s budget.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mm_ds import config
from mm_ds.config import ConfigError, ModelConfig
from mm_ds.data import features
from mm_ds.model.heads import RobertaForTask
from mm_ds.model.model import RobertaMLM
from mm_ds.runtime.distributed.dist import free_port
from mm_ds.runtime.training import compiled
from mm_ds.runtime.training import ds_config as dsc
from mm_ds.runtime.training.train_log import LogWindow

HERE = Path(__file__).resolve().parent
FP32_TOLERANCE = 1e-5
"""Relative difference of a compiled (inductor) loss from the eager one, per update, in fp32 at dropout 0: inductor
fuses and reorders sums (measured, every stage kind and fp32 config: at most 1.2e-7 over 20 updates)."""
BF16_TOLERANCE = 2e-3
"""The same in bf16: inductor keeps fused intermediates in fp32 where eager rounds each op to bf16 (measured, every
stage kind: at most 2.1e-4 over 20 updates)."""
MLM = dict(vocab_size=64, hidden_size=16, num_layers=3, num_heads=2, ffn_size=32, max_positions=32)


# ---------------------------------------------------------------- graphs, graph breaks, recompiles (one process)

def _mlm_batch(B=2, T=16, padded=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 64, (B, T), generator=g)
    ids[:, 0] = 0
    labels = torch.full((B, T), -100)
    labels[:, 3], labels[:, 7] = ids[:, 3], ids[:, 7]
    mask = torch.ones(B, T, dtype=torch.bool)
    if padded:
        mask[:, -4:] = False
    found = (labels.reshape(-1) != -100).nonzero().squeeze(1)
    positions = torch.cat([found, torch.zeros(B * 3 - len(found), dtype=torch.long)])  # padded, as MLMBatches does
    return {"input_ids": ids, "labels": labels, "attention_mask": mask if padded else None,
            "masked_positions": positions}


def _train(model, batches, **kw):
    model.train()
    for batch in batches:
        model(**batch, **kw)["loss"].backward()


@pytest.mark.engine
def test_the_mlm_compiles_without_a_graph_break_one_graph_per_mask_and_depth():
    """The multi-depth MLM at each of its depths and its full one, with and without a mask: exactly one graph each.
    (One head and one secondary head compile in the 2-rank launch below, checked for graph breaks there too.)"""
    model = RobertaMLM(ModelConfig(**MLM, secondary_head_layer=[1, 2]))
    runs = [{"depth": 1}, {"depth": 2}, {"depth": None}]
    made = compiled.compile_forward(model, "eager", 2 * len(runs))
    for kw in runs:
        _train(model, [_mlm_batch(), _mlm_batch(seed=1), _mlm_batch(padded=True), _mlm_batch(padded=True, seed=2)],
               **kw)
    s = made.stats()
    assert s["graph_breaks"] == 0, compiled.graph_break_reasons()
    assert s["graphs"] == 2 * len(runs) and s["recompiles"] == s["graphs"] - 1, s
    compiled.release(model)
    assert "forward" not in model.__dict__ and compiled.of(model) is None


@pytest.mark.engine
@pytest.mark.parametrize("task_type, num_labels", [("extractive_qa", 0)])  # pair classification: the launch below
def test_the_task_models_compile_without_a_graph_break(task_type, num_labels):
    model = RobertaForTask(ModelConfig(**MLM), task_type, num_labels)
    made = compiled.compile_forward(model, "eager", 2)
    model.train()
    for seed in range(2):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(5, 64, (2, 16), generator=g)
        rows = [ids[0, :12].tolist(), ids[1].tolist()]
        batch = (features.collate_pairs([features.PairFeature(r, 1) for r in rows], width=16)
                 if num_labels else {**features.collate_pairs([features.PairFeature(r, 0) for r in rows], width=16),
                                     "start_positions": torch.tensor([1, 2]), "end_positions": torch.tensor([3, 4])})
        if not num_labels:
            batch.pop("labels")
        model(**batch)["loss"].backward()
    s = made.stats()
    assert (s["graph_breaks"], s["graphs"], s["recompiles"]) == (0, 1, 0), (s, compiled.graph_break_reasons())


@pytest.mark.engine
def test_the_counters_see_a_graph_break_and_a_recompile():
    """The detectors above can fail: a host read in a forward is a graph break; a new shape, a recompile; past the
    region's limit dynamo runs the frame eager (no more graphs)."""

    class Reads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            y = self.lin(x)
            if float(y.sum()) > 1e9:  # a read of a device value: the graph ends here
                y = y * 2
            return y

    model = Reads()
    made = compiled.compile_forward(model, "eager", 2)
    for n in (2, 3, 5, 7):  # dynamic=False: every new batch size is a new graph, up to the limit of 2
        model(torch.ones(n, 4))
    s = made.stats()
    assert s["graph_breaks"] >= 1 and any("item" in r or "Tensor" in r or "float" in r.lower()
                                          for r in compiled.graph_break_reasons()), compiled.graph_break_reasons()
    assert s["recompiles"] >= 1


@pytest.mark.engine
def test_a_graph_break_in_the_encoder_is_counted(monkeypatch):
    """The counters the launch's `graph_breaks == 0` reads see a break put into the layer stack: a host read in each
    layer's forward, as a `.item()` in a model change would be."""
    from mm_ds.model import model as mm

    layer_forward = mm.Layer.forward

    def reading(self, x, key_mask, seq_len):
        torch._dynamo.graph_break()
        return layer_forward(self, x, key_mask, seq_len)

    monkeypatch.setattr(mm.Layer, "forward", reading)
    model = RobertaMLM(ModelConfig(**MLM))
    made = compiled.compile_forward(model, "eager", 2)
    _train(model, [_mlm_batch()])
    compiled.release(model)
    s = made.stats()
    assert s["graph_breaks"] >= 1 and s["graphs"] > 1, (s, compiled.graph_break_reasons())


@pytest.mark.engine
def test_dropout_compiled_keeps_the_rate_and_is_a_function_of_the_seed():
    """Compiled, mm_ds/model/model.py's CPU dropout is F.dropout (inductor's masks in production): its masks follow
    torch's seed, as the loop's per-micro-step seeding needs for an exact resume, and keep about 1 - p."""
    from mm_ds.model import model as mm

    @torch.compile(backend="aot_eager", dynamic=False)
    def drop(x):
        return mm.dropout(x, 0.25, True)

    x = torch.ones(4000)
    torch.manual_seed(3)
    a = drop(x)
    torch.manual_seed(3)
    assert torch.equal(a, drop(x))
    assert abs(float(a.ne(0).float().mean()) - 0.75) < 0.03 and torch.allclose(a[a.ne(0)], torch.tensor(4 / 3))


def test_inductor_on_a_cpu_holds_deterministic_algorithms_while_compiled(monkeypatch):
    """compile_forward turns torch's deterministic algorithms on (warn only, no fill of new memory) for an inductor
    module on a CPU and gives the setting back at release; aot_eager's eager kernels need nothing, and a user's own
    setting is left as it is. Compiling is lazy: nothing compiles here."""
    monkeypatch.setitem(compiled._state, "deterministic_was", None)
    assert not torch.are_deterministic_algorithms_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    compiled.compile_forward(a, "aot_eager", 2)
    assert not torch.are_deterministic_algorithms_enabled()
    compiled.compile_forward(b, "inductor", 2)
    assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.utils.deterministic.fill_uninitialized_memory is False
    compiled.release(a)
    assert torch.are_deterministic_algorithms_enabled()  # b still compiled
    compiled.release(b)
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.utils.deterministic.fill_uninitialized_memory == fill
    torch.use_deterministic_algorithms(True)  # the user's: kept, not warn-only, after release too
    try:
        compiled.compile_forward(b, "inductor", 2)
        compiled.release(b)
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.compile_full
@pytest.mark.engine
def test_an_inductor_embedding_backward_is_the_same_every_time():
    """The defect behind inexact compiled resumes (module docstring of compiled.py, Exact resume): inductor's C++
    backward of an embedding adds rows with atomic adds from every thread, and with 2 threads two backward passes of
    the same input differed in the last bits (28 distinct gradients in 30 passes, measured). Compiled through
    compile_forward, every pass gives the same gradient bitwise."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        g = torch.Generator().manual_seed(0)
        emb = torch.nn.Embedding(50, 64)
        ids = torch.randint(0, 50, (8, 256), generator=g)
        up = torch.randn(8, 256, 64, generator=g) * torch.logspace(-4, 4, 256).view(1, 256, 1)  # order matters
        compiled.compile_forward(emb, "inductor", 1)
        grads = set()
        for _ in range(10):
            emb.weight.grad = None
            emb(ids).backward(up)
            grads.add(emb.weight.grad.numpy().tobytes())
        compiled.release(emb)
    finally:
        torch.set_num_threads(threads)
    assert len(grads) == 1, f"{len(grads)} different gradients in 10 backward passes of one input"


# ---------------------------------------------------------------- configuration, environment, throughput

def _resolve(*overrides, ds="fp32_zero1.json"):
    cfg = config.load(None, None, ["stage=pretrain", "train.global_batch=8", "train.micro_batch=4",
                                   f"ds_config={ds}", *overrides])
    return dsc.resolve(cfg, 1)


def test_compile_is_refused_with_zero3_and_deepspeeds_own_compile_block(tmp_path):
    _resolve("train.compile=true")
    _resolve("train.compile=true", ds="bf16_zero1.json")
    _resolve(ds="fp32_zero3.json")  # eager ZeRO 3 stays fine
    with pytest.raises(ConfigError, match=r"train.compile=true with .*ZeRO 3.*graph break.*ZeRO 0-2"):
        _resolve("train.compile=true", ds="fp32_zero3.json")
    with pytest.raises(ConfigError, match="train.compile_backend='cudagraph': choose one of inductor, aot_eager"):
        _resolve("train.compile=true", "train.compile_backend=cudagraph")
    ds = json.loads(dsc.find("fp32_zero1.json").read_text()) | {"compile": {"deepcompile": True}}
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    with pytest.raises(ConfigError, match=r"\"compile\" block .*never calls engine.compile\(\).*train.compile=true"):
        _resolve(ds=str(tmp_path / "ds.json"))


def test_torchdynamo_disable_is_ours_while_nothing_compiles_and_the_users_otherwise(monkeypatch):
    monkeypatch.delenv(compiled.DISABLE, raising=False)
    monkeypatch.setitem(compiled._state, "disabled_by_us", False)
    assert compiled.dynamo_switch(False) is False and os.environ[compiled.DISABLE] == "1"
    assert compiled.dynamo_switch(True) is True and compiled.DISABLE not in os.environ  # ours: taken back
    compiled.dynamo_switch(False)
    assert compiled.dynamo_switch(True) is True
    monkeypatch.setenv(compiled.DISABLE, "1")  # the user's: train.compile then trains eager
    assert compiled.dynamo_switch(True) is False and os.environ[compiled.DISABLE] == "1"
    monkeypatch.setenv(compiled.DISABLE, "0")
    assert compiled.dynamo_switch(False) is False and os.environ[compiled.DISABLE] == "0"


def test_a_log_rows_time_leaves_out_compile_seconds(monkeypatch):
    clock = {"now": 100.0, "compile": 0.0}
    monkeypatch.setattr(compiled, "seconds", lambda: clock["compile"])
    monkeypatch.setattr("mm_ds.runtime.training.train_log.time.perf_counter", lambda: clock["now"])
    window = LogWindow(1)
    clock["now"] += 50.0
    clock["compile"] += 45.0  # 45 of the window's 50 s compiled
    window.add(0, {"loss": torch.tensor(2.0, dtype=torch.float64)}, False, 0.0)
    settled = window.read(True)
    assert window.seconds() == pytest.approx(5.0) and settled.logs["compile_s"] == pytest.approx(45.0)
    window.reset()
    clock["now"] += 2.0
    window.add(1, {"loss": torch.tensor(2.0, dtype=torch.float64)}, False, 0.0)
    assert "compile_s" not in window.read(True).logs and window.seconds() == pytest.approx(2.0)


def test_finetuning_batches_pad_to_one_width_only_when_compiling():
    rows = [features.PairFeature([0, 7, 8, 2], 1), features.PairFeature([0, 7, 2], 0)]
    eager, fixed = features.collate_pairs(rows), features.collate_pairs(rows, width=8)
    assert eager["input_ids"].shape == (2, 4) and eager["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert fixed["input_ids"].shape == (2, 8) and torch.equal(fixed["input_ids"][:, :4], eager["input_ids"])
    assert fixed["attention_mask"][:, 4:].sum() == 0 and torch.equal(fixed["labels"], eager["labels"])


# ---------------------------------------------------------------- every stage kind on 2 ranks

STUCK = {("adapt_full", "bf16_zero1.json"): "head.bias", ("finetune", "bf16_zero1.json"): "embed.norm.weight"}
"""(kind, config) -> a trainable parameter whose gradient the case zeroes (tests/compile_ranks.py): the one trainable
parameter the frozen check must find bitwise unchanged after the updates (it must see every other move). Under bf16
the check reads the fp32 masters: the bf16 copies of finetuning's LayerNorm weights (1.0, lr 1e-5) never move in 20
updates, eager or compiled; the stuck LayerNorm weight shows the masters' check still finds one that truly does not."""
UPDATES = 20
"""Updates per side of each eager-against-compiled case: the tolerances above hold over this many."""
KINDS = ("pretrain", "pretrain_secondary", "build_mini", "adapt_full", "adapt_mini", "adapt_multidepth", "finetune")
CONFIGS = ("fp32_zero0.json", "fp32_zero1.json", "fp32_zero2.json", "bf16_zero1.json")


def _plan(full: bool) -> dict:
    if full:
        cases = [{"kind": k, "ds_config": ds, "backend": "inductor", "updates": UPDATES, "dropout": 0.0,
                  "stuck": STUCK.get((k, ds))} for k in KINDS for ds in CONFIGS]
        resumes = [{"kind": k, "backend": "inductor", "updates": 6, "checkpoint": 3} for k in KINDS]
    else:  # every kind and config once; MINIJOINT's pretraining with inductor, the others aot_eager (module docstring)
        cases = [{"kind": k, "ds_config": CONFIGS[i % len(CONFIGS)], "updates": UPDATES, "dropout": 0.0,
                  "backend": "inductor" if k == "pretrain_secondary" else "aot_eager",
                  "stuck": STUCK.get((k, CONFIGS[i % len(CONFIGS)]))} for i, k in enumerate(KINDS)]
        resumes = [{"kind": "adapt_multidepth", "backend": "aot_eager", "updates": 4, "checkpoint": 2}]
    return {"cases": cases, "resumes": resumes}


def _two_ranks(corpus: Path, work: Path, plan: dict, timeout: int) -> tuple[list[dict], str]:
    work.mkdir(parents=True, exist_ok=True)
    (work / "plan.json").write_text(json.dumps(plan))
    port, procs = free_port(), []
    for r in range(2):
        env = os.environ | {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                            "PYTHONPATH": f"{HERE.parent}:{HERE}",
                            "TORCHINDUCTOR_COMPILE_THREADS": "1"}  # no pool of compile workers: 2 ranks on 2 cores
        procs.append(subprocess.Popen([sys.executable, str(HERE / "compile_ranks.py"), str(corpus), str(work),
                                       str(work / "plan.json")], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    for p, o in zip(procs, outs):
        assert p.returncode == 0, o[-4000:]
    return [json.loads((work / f"rank{r}.json").read_text()) for r in range(2)], outs[0]


@pytest.fixture(scope="module")
def two_ranks(corpus, tmp_path_factory):
    return _two_ranks(corpus, tmp_path_factory.mktemp("compile"), _plan(full=False), timeout=900)


def _check_cases(ranks: list[dict]) -> None:
    for rank in ranks:
        for c in rank["cases"]:
            where = f"{c['kind']} {c['ds_config']} {c['backend']}"
            eager, comp = c["losses"]["eager"], c["losses"]["compiled"]
            assert len(comp) == c["updates"] and all(x == x for x in comp), (where, comp)
            if c["backend"] == "aot_eager":  # the same kernels in the same order: bit for bit
                assert comp == eager, where
            else:
                tol = BF16_TOLERANCE if c["ds_config"].startswith("bf16") else FP32_TOLERANCE
                assert comp == pytest.approx(eager, rel=tol), where
            assert not c["frozen_moved"], (where, c["frozen_moved"][:4])
            assert c["trainable_unmoved"] == [c["stuck"]] * bool(c["stuck"]), (where, c["trainable_unmoved"])
            depths = 2 if c["kind"] == "adapt_multidepth" else 1
            s = c["stats"]
            assert s["graph_breaks"] == 0, (where, c["breaks"])
            assert 1 <= s["graphs"] <= 2 * depths and s["recompiles"] <= 2 * depths - 1, (where, s)
    frozen = {c["kind"]: c["frozen"] for c in ranks[0]["cases"]}  # parameters checked for not moving
    assert all((v == 0) == k.startswith("pretrain") for k, v in frozen.items()), frozen


@pytest.mark.ranks
def test_every_stage_kind_trains_compiled_as_it_trains_eager(two_ranks):
    ranks, _ = two_ranks
    assert {c["kind"] for c in ranks[0]["cases"]} == set(KINDS)
    assert {c["ds_config"] for c in ranks[0]["cases"]} == set(CONFIGS)
    assert [c["stuck"] for c in ranks[0]["cases"] if c["stuck"]] == ["head.bias"]  # the check finds a stuck one
    _check_cases(ranks)


@pytest.mark.ranks
def test_a_compiled_run_resumes_to_the_uninterrupted_runs_weights(two_ranks):
    ranks, _ = two_ranks
    for r in ranks[0]["resumes"]:
        assert not r["unequal"], (r["kind"], r["unequal"][:4])
        assert "resumed from" in r["printed"] and "[mm-ds] compiled in" in r["printed"], r["printed"][-2000:]
        first = r["rows"][0]  # the compile is reported in the row and left out of its time
        assert first["compile_s"] > first["step_time_s"] > 0, first
    depths = [row.get("depth") for row in ranks[0]["resumes"][0]["rows"]]
    assert depths == [1, 1, 2, 2], depths  # the multi-depth run recompiled across its switch, and resumed past it


@pytest.mark.compile_full
@pytest.mark.ranks
def test_compiled_runs_killed_at_random_points_resume_bitwise(tmp_path):
    """tests/fault_harness.py's CI subset with train.compile (inductor) on every run: real processes killed (a rank,
    the launcher, a save), resumed with the same command, final weights bitwise those of an uninterrupted compiled
    run."""
    import fault_harness

    reports = fault_harness.sweep(tmp_path, full=False, extra=("train.compile=true",))
    bad = [r for r in reports if not r["ok"]]
    assert {r["stage"] for r in reports} == set(fault_harness.STAGE_KINDS) and not bad, json.dumps(bad, indent=1)


@pytest.mark.compile_full
@pytest.mark.ranks
def test_every_stage_kind_under_every_config_with_inductor_for_20_updates(corpus, tmp_path):
    ranks, _ = _two_ranks(corpus, tmp_path, _plan(full=True), timeout=3600)
    _check_cases(ranks)
    for r in ranks[0]["resumes"]:
        assert not r["unequal"], (r["kind"], r["unequal"][:4])
