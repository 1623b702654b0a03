"""Step 1: pretrain an English MLM from scratch (BL_BASE, BL_SMALL; MINIJOINT with its second head)."""

from __future__ import annotations

import torch

from .. import flops
from ..config import ConfigError, RunConfig
from ..data.mlm import MLMBatches
from ..data.shards import TokenCorpus
from ..engine import Geometry, Stage
from ..model import RobertaMLM


def open_corpus(cfg: RunConfig) -> TokenCorpus:
    if not cfg.data.corpus:
        raise ConfigError("data.corpus is unset: point it at a directory written by `mm-ds prepare`, "
                          "e.g. data.corpus=data/en")
    corpus = TokenCorpus(cfg.data.corpus)
    if cfg.model.vocab_size is None:
        cfg.model.vocab_size = corpus.vocab_size
    elif cfg.model.vocab_size != corpus.vocab_size:
        raise ConfigError(f"model.vocab_size={cfg.model.vocab_size} but the tokenizer of {cfg.data.corpus} has "
                          f"{corpus.vocab_size} pieces; set model.vocab_size=null to take it from the tokenizer")
    return corpus


def preflight(cfg: RunConfig) -> None:
    open_corpus(cfg)


def mlm_batches(cfg: RunConfig, corpus: TokenCorpus):
    mlm = MLMBatches(corpus, cfg.data.seq_len, seed=cfg.train.seed, mask_prob=cfg.data.mask_prob,
                     random_prob=cfg.data.random_prob, keep_prob=cfg.data.keep_prob, vocab_size=corpus.vocab_size)

    def batch(step: int, micro: int, rank: int, geo: Geometry) -> dict:
        return mlm.batch(step, micro, rank, geo.world_size, geo.micro_batch, geo.grad_accum)

    return batch


def mlm_flops(cfg: RunConfig, kind: str, layers: int, trainable_layers: int | None = None):
    m = cfg.model

    def per_step(global_batch: int) -> float:
        return flops.stage_flops_per_step(kind, hidden=m.hidden_size, vocab=m.vocab_size, layers=layers,
                                          seq_len=cfg.data.seq_len, mask_prob=cfg.data.mask_prob,
                                          global_batch=global_batch, trainable_layers=trainable_layers)

    return per_step


def build(cfg: RunConfig) -> Stage:
    corpus = open_corpus(cfg)
    torch.manual_seed(cfg.train.seed)
    model = RobertaMLM(cfg.model)
    kind = "pretrain_dual" if cfg.model.aux_head_layer else "pretrain"
    return Stage(cfg=cfg, model=model, trainable=lambda name: True, batches=mlm_batches(cfg, corpus),
                 flops_per_step=mlm_flops(cfg, kind, cfg.model.num_layers), tokens_per_sample=cfg.data.seq_len,
                 meta={"tokenizer": str(corpus.spm_path)})
