"""Step 1b: a mini-model aligned with its primary model (paper §2.2).

MINIJOINT: pure extraction (bottom N layers + the secondary head), a stage of zero updates: no engine, and the
mini-model costs no training FLOPs beyond Step 1.
MINIPOST: bottom N layers, embeddings and MLM head of a regular model, frozen, with `mini.new_layers`
fresh layers between them trained with MLM on the source corpus: the bridge that makes it a usable MLM.
"""

from __future__ import annotations

import torch

from ..config import ConfigError, ModelConfig, RunConfig
from ..model import surgery
from ..model.model import RobertaMLM
from ..runtime.training.build import Stage
from ..systems import MINI_SYSTEMS, system_of
from .common import Parent, load_parent, mlm_batches, open_corpus, pack_blocks, stage_flops


def inherit(cfg: RunConfig, parent: Parent) -> None:
    """What Step 1b needs of its parent: a pretraining, with a secondary head (MINIJOINT) or more layers than
    mini.layers (MINIPOST), whose positions hold data.seq_len."""
    mini = system_of(cfg.system).mini
    if mini is None:
        raise ConfigError(f"build-mini is for {' or '.join(MINI_SYSTEMS)}, not system={cfg.system!r}: the "
                          f"baselines adapt over their full model")
    if parent.stage != "pretrain":
        raise ConfigError(f"{parent.name} is a {parent.stage!r} run; stage build_mini starts from a pretrain run")
    if mini == "extract" and parent.model.secondary_head_layer is None:
        raise ConfigError(f"{parent.name} has no secondary head; MINIJOINT's mini-model is cut from a model "
                          f"pretrained with model.secondary_head_layer=N (preset */minijoint)")
    if mini == "build" and not 0 < cfg.mini.layers < parent.model.num_layers:
        raise ConfigError(f"mini.layers={cfg.mini.layers} must lie in [1, {parent.model.num_layers}) (the parent's "
                          f"layers)")
    if cfg.data.seq_len > parent.model.max_positions:
        raise ConfigError(f"data.seq_len={cfg.data.seq_len} exceeds the parent's model.max_positions="
                          f"{parent.model.max_positions}")


def hands_on(cfg: RunConfig, parent: ModelConfig) -> ModelConfig:
    """The model Step 1b hands on, from the parent's: the mini-model's depth, a secondary head after each shallower
    one (a multi-depth MINIJOINT: surgery.extract_minijoint)."""
    depths = system_of(cfg.system).adapted_depths(parent, cfg.mini) or (parent.num_layers,)
    return ModelConfig(**{**parent.__dict__, "num_layers": depths[-1], "secondary_head_layer": list(depths[:-1]) or None})


def _mini_model(cfg: RunConfig):
    """(parent meta, mini-model config, its state dict), with `cfg` made the stage's: its architecture, and
    for MINIJOINT zero updates in the parent's language."""
    meta, mcfg, sd = load_parent(cfg, inherit)
    if system_of(cfg.system).mini == "extract":
        mini_cfg, mini_sd = surgery.extract_minijoint(mcfg, sd)
        cfg.mini.layers = mini_cfg.num_layers  # N is the parent's secondary head's, not the preset's mini.layers
        cfg.train.steps = cfg.train.warmup_steps = 0
        cfg.lang = meta.get("lang", cfg.lang)
    else:
        mini_cfg, mini_sd = surgery.build_minipost(mcfg, sd, n_layers=cfg.mini.layers,
                                                   new_layers=cfg.mini.new_layers, seed=cfg.train.seed)
    cfg.model = mini_cfg
    return meta, mini_cfg, mini_sd


def preflight(cfg: RunConfig) -> None:
    """Checks the parent (`inherit`: a pretrain checkpoint with a secondary head for MINIJOINT, more layers than
    mini.layers for MINIPOST); and that MINIPOST's corpus has the parent's vocabulary."""
    _, mini_cfg, _ = _mini_model(cfg)
    if system_of(cfg.system).mini == "build":
        corpus = open_corpus(cfg)
        if corpus.vocab_size != mini_cfg.vocab_size:
            raise ConfigError(f"data.corpus={cfg.data.corpus} has {corpus.vocab_size} pieces but the parent's "
                              f"embeddings have {mini_cfg.vocab_size}: Step 1b trains on the parent's own language")


def build(cfg: RunConfig) -> Stage:
    if system_of(cfg.system).mini == "build":  # MINIPOST trains on the source corpus; MINIJOINT reads nothing
        pack_blocks(cfg)
    meta, mini_cfg, mini_sd = _mini_model(cfg)
    model = RobertaMLM(mini_cfg)
    model.load_state_dict(mini_sd, strict=True)
    # mini_layers: the bottom layers the mini-model shares with its primary, as built (_mini_model sets them)
    stage_meta = {"tokenizer": meta.get("tokenizer"), "primary": cfg.parent, "mini_layers": cfg.mini.layers}
    common = dict(cfg=cfg, model=model, tokens_per_sample=cfg.data.seq_len, parent=cfg.parent,
                  parent_flops=meta.get("flops_cumulative", 0.0), meta=stage_meta)
    if system_of(cfg.system).mini == "extract":  # nothing trains, nothing is read
        return Stage(trainable=lambda name: False, batches=None, flops_per_step=lambda global_batch: 0.0,
                     **common)
    corpus = open_corpus(cfg)
    torch.manual_seed(cfg.train.seed)
    return Stage(trainable=surgery.minipost_trainable(mini_cfg, cfg.mini.layers), batches=mlm_batches(cfg, corpus),
                 flops_per_step=stage_flops(cfg, "build_mini", mini_cfg.num_layers, cfg.mini.new_layers), **common)
