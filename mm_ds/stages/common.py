"""What several stages share: the parent a stage inherits from and opening its checkpoint, the corpus, MLM batches and
FLOPs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError, ModelConfig, RunConfig, model_config_from_dict
from ..data import blocks
from ..data.mlm import MLMBatches
from ..data.shards import TokenCorpus
from ..model import flops
from ..runtime.checkpointing import checkpoint
from ..runtime.distributed import dist
from ..runtime.training.ds_config import Geometry


@dataclass(frozen=True)
class Parent:
    """What a stage inherits from its parent, as each stage's `inherit` checks it: from the parent's checkpoint (the
    stage's preflight, `load_parent`) or from the parent stage's config (`mm-ds run --check`: pipeline/check.py)."""
    stage: str
    system: str
    model: ModelConfig
    """The model the parent hands on (its final/)."""
    name: str
    """The parent in messages: `parent=PATH`, or the stage run of a plan."""


def load_parent(cfg: RunConfig, inherit) -> tuple[dict, ModelConfig, dict]:
    """(meta, model config, fp32 state dict) of `cfg.parent`, which the stage's `inherit(cfg, Parent)` accepts;
    errors name the parent and what is wrong."""
    if not cfg.parent:
        raise ConfigError(f"stage {cfg.stage} needs parent=RUN_DIR (the run it starts from)")
    if not Path(cfg.parent).exists():
        raise ConfigError(f"parent={cfg.parent} does not exist; run the parent stage first")
    meta, sd = checkpoint.load_final(cfg.parent)
    model = model_config_from_dict(meta["model"])
    inherit(cfg, Parent(meta.get("stage"), meta.get("system"), model, f"parent={cfg.parent}"))
    return meta, model, sd


def open_corpus(cfg: RunConfig) -> TokenCorpus:
    if not cfg.data.corpus:
        raise ConfigError("data.corpus is unset: point it at a directory written by `mm-ds prepare`, "
                          "e.g. data.corpus=data/en")
    return TokenCorpus(cfg.data.corpus)


def resolve_vocab(cfg: RunConfig, corpus: TokenCorpus) -> None:
    if cfg.model.vocab_size is None:
        cfg.model.vocab_size = corpus.vocab_size
    elif cfg.model.vocab_size != corpus.vocab_size:
        raise ConfigError(f"model.vocab_size={cfg.model.vocab_size} but the tokenizer of {cfg.data.corpus} has "
                          f"{corpus.vocab_size} pieces; set model.vocab_size=null to take it from the tokenizer")


def pack_blocks(cfg: RunConfig) -> None:
    """Collective, first in the build of a stage that draws MLM blocks (before anything that may fail on one rank
    only, so that every rank reaches it): rank 0 packs data.corpus into blocks of data.seq_len and writes their
    cache, unless `mm-ds prepare --seq-len` did, while the other ranks wait; then each rank maps that one file
    (mm_ds/data/blocks.py). Without it every rank of every node would pack the corpus and write the same file."""
    dist.on_rank0(lambda: blocks.write_cache(open_corpus(cfg), cfg.data.seq_len),
                  f"packing {cfg.data.corpus} into blocks of data.seq_len={cfg.data.seq_len}")


def mlm_batches(cfg: RunConfig, corpus: TokenCorpus):
    mlm = MLMBatches(corpus, cfg.data.seq_len, seed=cfg.train.seed, mask_prob=cfg.data.mask_prob,
                     random_prob=cfg.data.random_prob, keep_prob=cfg.data.keep_prob, vocab_size=corpus.vocab_size)

    def batch(step: int, micro: int, rank: int, geo: Geometry) -> dict:
        return mlm.batch(step, micro, rank, geo.world_size, geo.micro_batch, geo.grad_accum)

    return batch


def stage_flops(cfg: RunConfig, formula: str, layers: int, trainable_layers: int | None = None, seq_len=None,
                secondary_heads: int = 1):
    """(global batch, depth=None) -> FLOPs of one update; `depth` (multi-depth Step 2) replaces `layers`."""
    m = cfg.model

    def per_step(global_batch: int, depth: int | None = None) -> float:
        return flops.stage_flops_per_step(formula, hidden=m.hidden_size, vocab=m.vocab_size, layers=depth or layers,
                                          seq_len=seq_len or cfg.data.seq_len, mask_prob=cfg.data.mask_prob,
                                          global_batch=global_batch, trainable_layers=trainable_layers,
                                          secondary_heads=secondary_heads)

    return per_step
