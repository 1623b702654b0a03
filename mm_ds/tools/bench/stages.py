"""`mm-ds bench`'s stages: its presets (the model shapes it times), the stage kinds and the stage run each is (its
stage module, system, parent and FLOPs formula), each built by its own stage module's `build()` over the bench's
corpus (`Stages`), and one stage's engine timed through `engine.train_step` (`run_engine_stage`). The command, its
measurements and its report: mm_ds/tools/bench/bench.py.
"""

from __future__ import annotations

import contextlib
import importlib
import io
from dataclasses import dataclass, replace
from pathlib import Path

from ...config import (DataConfig, FinetuneConfig, MiniConfig, ModelConfig, RunConfig, TrainConfig, from_dict,
                       read_preset)
from ...runtime.training import ds_config as dsc
from ...runtime.training import engine as eng
from ...runtime.training.peaks import measure_matmul_peak
from ...systems import SYSTEMS
from .data import pair_batches, write_pair_task
from .pairs import EngineSteps, alternate

STAGES = ("pretrain", "pretrain_secondary", "build_mini", "adapt_full", "adapt_mini", "finetune")
PEER_STAGES = ("pretrain", "adapt_full", "adapt_mini")  # the peer has no secondary head, bridge or task loop here


@dataclass(frozen=True)
class Preset:
    model: str  # packaged model preset
    vocab: int  # used where the model preset leaves vocab_size to the tokenizer
    seq: int
    mini_layers: int  # N: MINIJOINT's secondary head, the mini-model, MINIPOST's frozen bottom
    new_layers: int  # MINIPOST's bridge
    micro_batch: int
    steps: int
    warmup: int
    corpus_mb: float  # synthetic text for the corpus
    encode_mb: float  # that text repeated, for the encode-speed measurement


PRESETS = {
    "tiny": Preset("models/tiny", 4000, 128, 2, 2, micro_batch=8, steps=3, warmup=1, corpus_mb=2,
                   encode_mb=2),
    "small": Preset("models/small", 50000, 512, 4, 2, micro_batch=2, steps=3, warmup=1, corpus_mb=12,
                    encode_mb=48),
    "base": Preset("models/base", 50000, 512, 4, 2, micro_batch=2, steps=3, warmup=1, corpus_mb=12,
                    encode_mb=48),
}

STAGE_TITLES = {
    "pretrain": "Step 1, single head",
    "pretrain_secondary": "Step 1, secondary head (MINIJOINT)",
    "build_mini": "Step 1b (MINIPOST bridge)",
    "adapt_full": "Step 2, full model",
    "adapt_mini": "Step 2, mini-model",
    "finetune": "Step 3, finetune (cls)",
}

# bench stage -> (stage module, system, the parent it starts from, FLOPs kind)
STAGE_RUNS = {
    "pretrain": ("pretrain", "bl_base", None, "pretrain"),
    "pretrain_secondary": ("pretrain", "minijoint", None, "pretrain_secondary"),
    "build_mini": ("build_mini", "minipost", "pretrain", "build_mini"),
    "adapt_full": ("adapt", "bl_base", "pretrain", "adapt"),
    "adapt_mini": ("adapt", "minijoint", "mini", "adapt"),
    "finetune": ("finetune", "bl_base", "pretrain", "finetune"),
}
# parent -> (stage module, system, its own parent): BL_BASE's and MINIJOINT's pretraining, MINIJOINT's Step 1b
PARENT_RUNS = {"pretrain": ("pretrain", "bl_base", None), "secondary": ("pretrain", "minijoint", None),
               "mini": ("build_mini", "minijoint", "secondary")}

def matmul_peak(n: int = 2048, reps: int = 5) -> dict:
    return measure_matmul_peak(n, reps)


def base_model_cfg(preset: Preset) -> ModelConfig:
    mcfg = from_dict(ModelConfig, read_preset(preset.model)["model"], prefix="model.")
    if mcfg.vocab_size is None:
        mcfg.vocab_size = preset.vocab
    mcfg.check()
    return mcfg


# ----------------------------------------------------------------------------------------------- stages

class Stages:
    """Each bench stage as its stage module builds it, from a `RunConfig` over the bench's corpus; the
    parents are written on first use under work/parents/ by `engine.train` with zero updates."""

    def __init__(self, work: Path, corpus: Path, text: Path, mcfg: ModelConfig, preset: Preset, seq: int,
                 micro_batch: int, ds_config: str, say):
        self.work, self.corpus, self.mcfg, self.preset, self.seq = work, corpus, mcfg, preset, seq
        self.micro_batch, self.ds_config, self.say, self.parents = micro_batch, ds_config, say, {}
        self.tasks = write_pair_task(work / "tasks", text)

    def config(self, module: str, system: str, parent: Path | None) -> RunConfig:
        secondary = SYSTEMS[system].step1 == "pretrain_secondary"  # the parent of MINIJOINT's extraction has one
        model = replace(self.mcfg, secondary_head_layer=self.preset.mini_layers if secondary else None)
        return RunConfig(stage=module, system=system, parent=str(parent or ""), model=model,
                         data=DataConfig(corpus=str(self.corpus), seq_len=self.seq), ds_config=self.ds_config,
                         train=TrainConfig(seed=0, global_batch=self.micro_batch, micro_batch=self.micro_batch,
                                           log_every=10 ** 9, checkpoint_steps=[]),
                         mini=MiniConfig(layers=self.preset.mini_layers, new_layers=self.preset.new_layers),
                         finetune=FinetuneConfig(task="xnli", data_root=str(self.tasks), max_length=self.seq))

    def build(self, module: str, system: str, parent: str | None) -> eng.Stage:
        cfg = self.config(module, system, parent and self.parent(parent))
        out = io.StringIO()  # the builders' progress lines: to the log, not between the tables
        with contextlib.redirect_stdout(out):
            stage = importlib.import_module(f"mm_ds.stages.{module}").build(cfg)
        for line in out.getvalue().splitlines():
            self.say(line)
        return stage

    def parent(self, name: str) -> Path:
        if name not in self.parents:
            stage = self.build(*PARENT_RUNS[name])
            stage.cfg.train.steps = 0  # the model as built, untrained: a parent's shape is what the bench needs
            with contextlib.redirect_stdout(io.StringIO()):
                eng.train(stage, self.work / "parents" / name, progress=False)
            self.parents[name] = self.work / "parents" / name
        return self.parents[name]

    def timed(self, name: str, steps: int) -> eng.Stage:
        """Bench stage `name`, built by its module, with the bench's schedule and (Step 3) batches."""
        module, system, parent, _ = STAGE_RUNS[name]
        stage = self.build(module, system, parent)
        stage.cfg.train = replace(stage.cfg.train, steps=steps, warmup_steps=1, lr=1e-4)  # Step 3 set its own
        if name == "finetune":
            stage.batches = pair_batches(stage.cfg.model.vocab_size, self.seq)
        return stage


def run_engine_stage(stage: eng.Stage, warmup: int, steps: int, rank: int, world: int) -> dict:
    """The engine as `engine.train` builds it (`engine.build_engine`), and `engine.train_step` timed."""
    steps_of = EngineSteps(stage, world, rank)
    raw = alternate({"stage": steps_of}, warmup, steps)["stage"]
    built = steps_of.built
    steps_of.close()
    return raw | {"trainable_params": built.n_train, "total_params": built.n_total,
                  "zero_stage": dsc.zero_stage(built.ds_cfg), "grad_accum": built.geo.grad_accum,
                  "optimizer": built.ds_cfg["optimizer"]}
