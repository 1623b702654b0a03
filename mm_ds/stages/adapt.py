"""Step 2: learn a target language's embeddings over a frozen body (paper §2.1, footnote 1).

The parent is a mini-model (MINIJOINT, MINIPOST: from build-mini) or a full model (BL_BASE, BL_SMALL:
from pretrain). Target embeddings start from the parent's rows for pieces both vocabularies share
(specials included) and N(0, 0.02) elsewhere; only the language group trains (token embeddings, tied to
the output projection, and the output bias). Cost per update: formula A3.

Multi-depth MINIJOINT (§7): the parent holds mini-models of several depths over one embedding table (a
secondary head after each shallower depth); Step 2 runs over the shallowest first and moves deeper on the
schedule of mm_ds/runtime/training/phases.py (mini.depth_shares or mini.plateau_window), the embeddings carried over.
Each update costs A3 at its depth.
"""

from __future__ import annotations

import torch

from ..config import ConfigError, ModelConfig, RunConfig
from ..data.tokenizer import pieces
from ..model import surgery
from ..model.model import RobertaMLM, is_language_param
from ..runtime.training.build import Stage
from ..runtime.training.phases import DepthSchedule, schedule_for
from ..systems import system_of
from .common import Parent, load_parent, mlm_batches, open_corpus, pack_blocks, stage_flops


def inherit(cfg: RunConfig, parent: Parent) -> None:
    """What Step 2 needs of its parent: the run its system adapts over (a mini-model, or a baseline's pretraining),
    whose positions hold data.seq_len and whose depths the schedule can walk (multi-depth MINIJOINT)."""
    want = system_of(cfg.system).adapts_over
    if parent.stage != want:
        raise ConfigError(f"{cfg.system} adapts over a {want} run, but {parent.name} is a {parent.stage} run"
                          + ("; run build-mini first" if want == "build_mini" else ""))
    if cfg.data.seq_len > parent.model.max_positions:
        raise ConfigError(f"data.seq_len={cfg.data.seq_len} exceeds the parent's model.max_positions="
                          f"{parent.model.max_positions}")
    try:
        schedule_for((*parent.model.secondary_depths, parent.model.num_layers), cfg.train.steps, cfg.mini)
    except ValueError as e:
        raise ConfigError(f"{parent.name}: {e}") from None


def hands_on(cfg: RunConfig, parent: ModelConfig) -> ModelConfig:
    """The model Step 2 hands on: its parent's architecture (the vocabulary is the target tokenizer's)."""
    return parent


def _target_model(cfg: RunConfig):
    meta, mcfg, sd = load_parent(cfg, inherit)
    if not meta.get("tokenizer"):
        raise ConfigError(f"parent={cfg.parent} records no source tokenizer; overlap initialisation needs the "
                          f"source pieces (re-import it with --tokenizer)")
    corpus = open_corpus(cfg)
    tgt_cfg, lang_sd, report = surgery.init_target_embeddings(mcfg, sd, pieces(meta["tokenizer"]),
                                                              pieces(corpus.spm_model), seed=cfg.train.seed)
    surgery.check_vocab(lang_sd, corpus.vocab_size)
    new_cfg, new_sd = surgery.swap_embeddings(mcfg, sd, lang_sd)
    return meta, new_cfg, new_sd, corpus, report


def preflight(cfg: RunConfig) -> None:
    """Checks the parent (`inherit`: the checkpoint this system adapts over, its positions and depths; and that it
    records its tokenizer) and the corpus's vocabulary against it (overlap initialisation)."""
    _, new_cfg, _, _, report = _target_model(cfg)
    cfg.model = new_cfg  # as build() makes it: a resumed run's checkpoint is checked against it
    print(f"[mm-ds] {cfg.lang}: {report['overlap']} of {report['vocab_size']} pieces overlap the source "
          f"vocabulary ({100 * report['share']:.1f}%); their embeddings start from the source's")


def depth_schedule(cfg: RunConfig) -> DepthSchedule | None:
    """The depth schedule over `cfg.model` (the parent's architecture): None for a model with one head."""
    try:
        return schedule_for((*cfg.model.secondary_depths, cfg.model.num_layers), cfg.train.steps, cfg.mini)
    except ValueError as e:
        raise ConfigError(f"parent={cfg.parent}: {e}") from None


def build(cfg: RunConfig) -> Stage:
    pack_blocks(cfg)
    meta, new_cfg, new_sd, corpus, report = _target_model(cfg)
    cfg.model = new_cfg  # the architecture is the parent's; only the vocabulary changes
    model = RobertaMLM(new_cfg)
    model.load_state_dict(new_sd, strict=True)
    torch.manual_seed(cfg.train.seed)
    # Multi-depth: the loop passes each update's depth from the schedule (engine.train_step).
    return Stage(cfg=cfg, model=model, trainable=is_language_param, schedule=depth_schedule(cfg),
                 batches=mlm_batches(cfg, corpus), flops_per_step=stage_flops(cfg, "adapt", new_cfg.num_layers),
                 tokens_per_sample=cfg.data.seq_len, parent=cfg.parent,
                 parent_flops=meta.get("flops_cumulative", 0.0),  # reports use this stage's own "flops" (§3)
                 meta={"tokenizer": str(corpus.spm_model.resolve()), "overlap": report,
                       "primary": meta.get("primary", cfg.parent)})
