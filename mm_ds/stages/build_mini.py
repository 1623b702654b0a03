"""Step 1b: a mini-model aligned with its primary model (paper §2.2).

MINIJOINT: pure extraction (bottom N layers + the second head), no training, no engine.
MINIPOST: bottom N layers, embeddings and MLM head of a regular model, frozen, with `mini.new_layers`
fresh layers between them trained with MLM on the source corpus: the bridge that makes it a usable MLM.
"""

from __future__ import annotations

import torch

from .. import checkpoint, surgery
from ..config import ConfigError, RunConfig, to_dict
from ..engine import Stage
from ..model import RobertaMLM
from .common import load_parent, mlm_batches, open_corpus, stage_flops


def trains(cfg: RunConfig) -> bool:
    return cfg.system == "minipost"


def preflight(cfg: RunConfig) -> None:
    if cfg.system not in ("minijoint", "minipost"):
        raise ConfigError(f"build-mini is for minijoint or minipost, not system={cfg.system!r}: the baselines "
                          f"adapt over their full model")
    meta, mcfg, _ = load_parent(cfg, ("pretrain",))
    if cfg.system == "minijoint" and mcfg.aux_head_layer is None:
        raise ConfigError(f"parent={cfg.parent} has no second head; MINIJOINT's mini-model is cut from a "
                          f"model pretrained with model.aux_head_layer=N (preset */minijoint)")
    if cfg.system == "minipost":
        if cfg.mini.layers >= mcfg.num_layers:
            raise ConfigError(f"mini.layers={cfg.mini.layers} must be below the parent's {mcfg.num_layers} layers")
        corpus = open_corpus(cfg)
        if corpus.vocab_size != mcfg.vocab_size:
            raise ConfigError(f"data.corpus={cfg.data.corpus} has {corpus.vocab_size} pieces but the parent's "
                              f"embeddings have {mcfg.vocab_size}: Step 1b trains on the parent's own language")


def _meta(cfg: RunConfig, parent_meta: dict) -> dict:
    return {"tokenizer": parent_meta.get("tokenizer"), "primary": cfg.parent, "mini_layers": cfg.mini.layers}


def run_without_engine(cfg: RunConfig, out) -> None:
    """MINIJOINT: extraction only; the mini-model costs no training FLOPs beyond Step 1."""
    meta, mcfg, sd = load_parent(cfg, ("pretrain",))
    mini_cfg, mini_sd = surgery.extract_minijoint(mcfg, sd)
    cfg.model = mini_cfg
    checkpoint.write_final(out / checkpoint.FINAL, mini_sd, _meta(cfg, meta) | {
        "stage": "build_mini", "system": cfg.system, "lang": meta.get("lang", cfg.lang), "step": 0, "tokens": 0,
        "flops": 0.0, "flops_cumulative": meta.get("flops_cumulative", 0.0), "parent": cfg.parent,
        "model": to_dict(mini_cfg), "time": checkpoint.now()})
    print(f"[mm-ds] extracted a {mini_cfg.num_layers}-layer MINIJOINT mini-model into {out / checkpoint.FINAL}")


def build(cfg: RunConfig) -> Stage:
    meta, mcfg, sd = load_parent(cfg, ("pretrain",))
    mini_cfg, mini_sd = surgery.build_minipost(mcfg, sd, n_layers=cfg.mini.layers, new_layers=cfg.mini.new_layers,
                                               seed=cfg.train.seed)
    cfg.model = mini_cfg
    model = RobertaMLM(mini_cfg)
    model.load_state_dict(mini_sd, strict=True)
    corpus = open_corpus(cfg)
    torch.manual_seed(cfg.train.seed)
    return Stage(cfg=cfg, model=model, trainable=surgery.minipost_trainable(mini_cfg, cfg.mini.layers),
                 batches=mlm_batches(cfg, corpus),
                 flops_per_step=stage_flops(cfg, "build_mini", mini_cfg.num_layers, cfg.mini.new_layers),
                 tokens_per_sample=cfg.data.seq_len, parent=cfg.parent,
                 parent_flops=meta.get("flops_cumulative", 0.0), meta=_meta(cfg, meta))
