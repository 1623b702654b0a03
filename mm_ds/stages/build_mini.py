"""Step 1b: a mini-model aligned with its primary model (paper §2.2).

MINIJOINT: pure extraction (bottom N layers + the secondary head), a stage of zero updates: no engine, and the
mini-model costs no training FLOPs beyond Step 1.
MINIPOST: bottom N layers, embeddings and MLM head of a regular model, frozen, with `mini.new_layers`
fresh layers between them trained with MLM on the source corpus: the bridge that makes it a usable MLM.
"""

from __future__ import annotations

import torch

from ..model import surgery
from ..config import ConfigError, RunConfig
from ..runtime.engine import Stage
from ..model.model import RobertaMLM
from ..systems import MINI_SYSTEMS, system_of
from .common import load_parent, mlm_batches, open_corpus, pack_blocks, stage_flops


def _mini_model(cfg: RunConfig):
    """(parent meta, mini-model config, its state dict), with `cfg` made the stage's: its architecture, and
    for MINIJOINT zero updates in the parent's language."""
    meta, mcfg, sd = load_parent(cfg, ("pretrain",))
    if system_of(cfg.system).mini == "extract":
        if mcfg.secondary_head_layer is None:
            raise ConfigError(f"parent={cfg.parent} has no secondary head; MINIJOINT's mini-model is cut from a "
                              f"model pretrained with model.secondary_head_layer=N (preset */minijoint)")
        mini_cfg, mini_sd = surgery.extract_minijoint(mcfg, sd)
        cfg.mini.layers = mini_cfg.num_layers  # N is the parent's secondary head's, not the preset's mini.layers
        cfg.train.steps = cfg.train.warmup_steps = 0
        cfg.lang = meta.get("lang", cfg.lang)
    else:
        if cfg.mini.layers >= mcfg.num_layers:
            raise ConfigError(f"mini.layers={cfg.mini.layers} must be below the parent's {mcfg.num_layers} layers")
        mini_cfg, mini_sd = surgery.build_minipost(mcfg, sd, n_layers=cfg.mini.layers,
                                                   new_layers=cfg.mini.new_layers, seed=cfg.train.seed)
    cfg.model = mini_cfg
    return meta, mini_cfg, mini_sd


def preflight(cfg: RunConfig) -> None:
    """Checks the parent: a pretrain checkpoint with a secondary head (MINIJOINT) or more layers than mini.layers
    (MINIPOST); and that MINIPOST's corpus has the parent's vocabulary."""
    if not system_of(cfg.system).mini:
        raise ConfigError(f"build-mini is for {' or '.join(MINI_SYSTEMS)}, not system={cfg.system!r}: the "
                          f"baselines adapt over their full model")
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
