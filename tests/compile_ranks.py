"""One rank of tests/test_compile.py's 2-rank runs: every stage kind trained eager and compiled side by side in one
process, and a compiled run resumed from a checkpoint against the same run uninterrupted.

    python tests/compile_ranks.py CORPUS WORK PLAN.json     # under RANK, WORLD_SIZE, MASTER_* (the test starts two)

PLAN.json: {"cases": [{"kind", "ds_config", "backend", "updates", "dropout"}], "resumes": [{"kind", "backend"}]}.
Each rank writes WORK/rank{r}.json.

A case builds its stage twice from one config (its module's `build()`; the parents are the untrained models the
product's zero-update path writes), once with train.compile and once without, each through `engine.build_engine` on
the 2 ranks, and steps the two engines in turn with `engine.train_step`: per update each side's summed loss on this
rank, the compiled side's graphs, graph breaks and recompiles, which of the compiled engine's frozen parameters are
not bitwise what the stage built (in the engine's dtype), which trainable ones are (it must see those move), and the
largest difference of the trainable ones from the eager side's at the end. A trainable parameter is read as the
optimizer holds it (`held`): under bf16 its fp32 master, since the bf16 copy of a weight near 1.0 moves only once the
master has moved by half a bf16 step there (2^-9): finetuning's LayerNorm weights at lr 1e-5 never do in 20 updates,
eager or compiled (`copy_unmoved`, each side's trainable parameters whose model-dtype copy is as built). A case's
optional "stuck" names a trainable parameter whose gradient a hook zeroes on both sides (no weight decay on it): a
truly frozen trainable parameter, which the check must find.
A resume trains the compiled stage through `engine.train` twice: uninterrupted to the end, and from a copy of that
run rolled back to its first checkpoint (as a killed run leaves it), with --resume; their final/ weights are compared.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
import time
from pathlib import Path

import torch

from mm_ds import config
from mm_ds.runtime.checkpointing import checkpoint as ck
from mm_ds.runtime.distributed import dist
from mm_ds.runtime.training import compiled
from mm_ds.runtime.training import engine as eng
from mm_ds.tools.bench.data import write_pair_task

TINY = ["model.hidden_size=32", "model.num_layers=3", "model.num_heads=2", "model.ffn_size=64", "data.seq_len=32",
        "model.max_positions=32", "model.vocab_size=null", "train.global_batch=8", "train.micro_batch=2",
        "train.warmup_steps=1", "train.lr=3e-3", "train.log_every=1", "train.checkpoint_steps=[]",
        "train.checkpoint_every=1000000", "peak_tflops=1"]
# kind -> (stage module, system, parent, overrides); parents are written untrained (`parent`)
KINDS = {
    "pretrain": ("pretrain", "bl_base", None, ["model.secondary_head_layer=null"]),
    "pretrain_secondary": ("pretrain", "minijoint", None, ["model.secondary_head_layer=1"]),
    "build_mini": ("build_mini", "minipost", "full", ["mini.layers=1", "mini.new_layers=1"]),
    "adapt_full": ("adapt", "bl_base", "full", []),
    "adapt_mini": ("adapt", "minijoint", "mini", []),
    "adapt_multidepth": ("adapt", "minijoint", "mini_multi", ["mini.depth_shares=[1,1]"]),
    "finetune": ("finetune", "bl_base", "full", ["finetune.task=xnli", "finetune.max_length=32"]),
}
PARENTS = {
    "full": ("pretrain", "bl_base", None, ["model.secondary_head_layer=null"]),
    "secondary": ("pretrain", "minijoint", None, ["model.secondary_head_layer=2"]),
    "mini": ("build_mini", "minijoint", "secondary", []),
    "secondary_multi": ("pretrain", "minijoint", None, ["model.secondary_head_layer=[1,2]"]),
    "mini_multi": ("build_mini", "minijoint", "secondary_multi", []),
}


class Runs:
    def __init__(self, corpus: Path, work: Path):
        self.corpus, self.work, self.parents = corpus, work, {}
        self.tasks = work / "tasks"
        dist.on_rank0(lambda: write_pair_task(self.tasks, corpus.parent / "en.txt"), "writing the pair task")

    def config(self, module: str, system: str, parent: str | None, extra: list[str]) -> config.RunConfig:
        dropout = [x for x in extra if x.startswith("model.dropout=")]  # a later stage's is its parent's
        where = [f"parent={self.parent(parent, dropout)}"] if parent else []
        return config.load(None, None, [f"stage={module}", f"system={system}", f"data.corpus={self.corpus}",
                                        f"finetune.data_root={self.tasks}", *TINY, *where, *extra])

    def build(self, module: str, system: str, parent: str | None, extra: list[str]) -> eng.Stage:
        import importlib

        cfg = self.config(module, system, parent, extra)
        with contextlib.redirect_stdout(io.StringIO()):  # the builders' progress lines
            stage = importlib.import_module(f"mm_ds.stages.{module}").build(cfg)
        steps = [x.split("=", 1)[1] for x in extra if x.startswith("train.steps=")]
        if steps:  # finetuning sets its own from its epochs
            stage.cfg.train.steps = int(steps[-1])
            stage.cfg.train.warmup_steps = 1
        return stage

    def parent(self, name: str, dropout: list[str]) -> Path:
        key = (name, *dropout)
        if key not in self.parents:
            module, system, parent, extra = PARENTS[name]
            stage = self.build(module, system, parent, [*extra, *dropout])
            stage.cfg.train.steps = 0  # the model as built: `engine.train`'s zero-update path writes final/
            out = self.work / "parents" / "_".join(key).replace("=", "")
            with contextlib.redirect_stdout(io.StringIO()):
                eng.train(stage, out, progress=False)
            self.parents[key] = out
        return self.parents[key]

    def stage(self, kind: str, extra: list[str]) -> eng.Stage:
        module, system, parent, own = KINDS[kind]
        return self.build(module, system, parent, [*own, *extra])


def held(engine) -> dict[str, torch.Tensor]:
    """Each parameter of `engine` as its optimizer holds it: a trainable one's fp32 master under ZeRO 1-2 and bf16
    (DeepSpeed's full copy, gathered: a collective every rank calls), else the module's own."""
    from deepspeed.utils import safe_get_full_fp32_param

    out = {}
    for n, p in engine.module.named_parameters():
        master = safe_get_full_fp32_param(p) if p.requires_grad else None
        out[n] = (master if master is not None else p).detach()
    return out


def as_built(engine, built_as: dict[str, torch.Tensor], now: dict[str, torch.Tensor]) -> set[str]:
    """The parameters `now` holds bitwise as the stage built them: in the module's dtype first (a bf16 engine's
    master is the fp32 of its bf16 copy), then in the held one's."""
    module = dict(engine.module.named_parameters())
    return {n for n, v in built_as.items() if torch.equal(now[n], v.to(module[n].dtype).to(now[n].dtype))}


def case(runs: Runs, c: dict, rank: int, world: int) -> dict:
    extra = [f"ds_config={c['ds_config']}", f"train.steps={c['updates']}", f"model.dropout={c['dropout']}",
             f"train.compile_backend={c['backend']}"]
    # Both built compiling (finetuning then pads every batch to one shape), the eager one's engine then without it:
    # the two sides see the same batches.
    stages = {side: runs.stage(c["kind"], [*extra, "train.compile=true"]) for side in ("eager", "compiled")}
    stages["eager"].cfg.train.compile = False
    built_as = {n: p.detach().clone() for n, p in stages["compiled"].model.named_parameters()}
    built = {side: eng.build_engine(stage, world) for side, stage in stages.items()}
    for b in built.values():
        b.engine.train()
        if c.get("stuck"):
            b.engine.module.get_parameter(c["stuck"]).register_hook(torch.zeros_like)
    losses = {side: [] for side in stages}
    t0 = time.perf_counter()
    for step in range(c["updates"]):
        for side in (("eager", "compiled") if step % 2 == 0 else ("compiled", "eager")):
            sums, _, _ = eng.train_step(built[side].engine, stages[side], step, rank, built[side].geo)
            losses[side].append(float(sums["loss"]))
    engine = built["compiled"].engine
    unmoved = as_built(engine, built_as, held(engine))
    trainable = {n for n in built_as if stages["compiled"].trainable(n)}
    copies = {side: as_built(b.engine, built_as, {n: p.detach() for n, p in b.engine.module.named_parameters()})
              for side, b in built.items()}
    eager, mine = dict(built["eager"].engine.module.named_parameters()), dict(engine.module.named_parameters())
    diff = max(float((eager[n].detach().float() - p.detach().float()).abs().max())
               for n, p in mine.items() if p.requires_grad)
    out = {**c, "losses": losses, "stats": built["compiled"].compiled.stats(), "frozen": len(built_as) - len(trainable),
           "frozen_moved": sorted(set(built_as) - unmoved - trainable),
           "trainable_unmoved": sorted(trainable & unmoved),
           "copy_unmoved": {side: sorted(trainable & u) for side, u in copies.items()},
           "trainable_max_diff": diff, "seconds": time.perf_counter() - t0, "breaks": compiled.graph_break_reasons()}
    for b in built.values():
        eng.release(b.engine)
    return out


def resume(runs: Runs, r: dict) -> dict:
    """The compiled stage through `engine.train`: uninterrupted, then resumed from its first checkpoint."""
    extra = ["train.compile=true", f"train.compile_backend={r['backend']}", f"train.steps={r['updates']}",
             f"train.checkpoint_steps=[{r['checkpoint']}]", f"ds_config={r.get('ds_config', 'fp32_zero1.json')}"]
    whole, again = runs.work / f"whole_{r['kind']}", runs.work / f"resumed_{r['kind']}"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        eng.train(runs.stage(r["kind"], extra), whole, progress=False)

    def roll_back():  # what a run killed after its first checkpoint leaves
        shutil.copytree(whole, again)
        shutil.rmtree(again / ck.FINAL)
        for later in ck.list_checkpoints(again)[1:]:
            shutil.rmtree(later)

    dist.on_rank0(roll_back, "rolling the run back")
    with contextlib.redirect_stdout(out):
        eng.train(runs.stage(r["kind"], extra), again, resume=True, progress=False)
    _, a = ck.load_final(whole)
    _, b = ck.load_final(again)
    rows = [json.loads(line) for line in (whole / "logs" / "train.jsonl").read_text().splitlines()]
    return {**r, "unequal": sorted(k for k in a if not torch.equal(a[k], b[k])), "rows": rows,
            "printed": out.getvalue()}


def main(argv: list[str]) -> int:
    corpus, work, plan = Path(argv[0]), Path(argv[1]), json.loads(Path(argv[2]).read_text())
    rank, _, world = dist.init()
    runs = Runs(corpus, work)
    result = {"cases": [case(runs, c, rank, world) for c in plan.get("cases", [])],
              "resumes": [resume(runs, r) for r in plan.get("resumes", [])]}
    (work / f"rank{rank}.json").write_text(json.dumps(result, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
