"""Step 1: pretrain an English MLM from scratch (BL_BASE, BL_SMALL; MINIJOINT with its secondary head(s))."""

from __future__ import annotations

import torch

from ..config import RunConfig
from ..model.model import RobertaMLM
from ..runtime.training.build import Stage
from .common import mlm_batches, open_corpus, pack_blocks, resolve_vocab, stage_flops


def preflight(cfg: RunConfig) -> None:
    """Checks model.vocab_size against the corpus's SentencePiece model (and takes it from there when null)."""
    resolve_vocab(cfg, open_corpus(cfg))


def build(cfg: RunConfig) -> Stage:
    pack_blocks(cfg)
    corpus = open_corpus(cfg)
    resolve_vocab(cfg, corpus)
    torch.manual_seed(cfg.train.seed)
    model = RobertaMLM(cfg.model)
    heads = len(cfg.model.secondary_depths)
    formula = "pretrain_secondary" if heads else "pretrain"
    return Stage(cfg=cfg, model=model, trainable=lambda name: True, batches=mlm_batches(cfg, corpus),
                 flops_per_step=stage_flops(cfg, formula, cfg.model.num_layers, secondary_heads=heads or 1),
                 tokens_per_sample=cfg.data.seq_len,
                 meta={"tokenizer": str(corpus.spm_model.resolve())})
