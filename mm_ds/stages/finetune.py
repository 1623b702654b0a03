"""Step 3: finetune the primary model on an English task with its (source) token embeddings frozen.

The primary model is 12 layers for BL_BASE, MINIJOINT and MINIPOST and 4 for BL_SMALL (paper §2). Step 3
does not depend on Step 2, so each (primary model, task, seed) is finetuned once and every Step-2
checkpoint is evaluated by swapping its embeddings in (Step 4).
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch

from ..config import ConfigError, ModelConfig, RunConfig
from ..data import features as feats
from ..data.order import sample_ids
from ..data.task_files import load_split
from ..data.tasks import EXTRACTIVE_QA, get_task
from ..data.tokenizer import is_tokenizer_json
from ..model import flops
from ..model.heads import RobertaForTask
from ..runtime.training import ds_config
from ..runtime.training.build import Stage
from ..runtime.training.ds_config import Geometry
from .common import Parent, load_parent

FROZEN = ("embed.tokens.weight",)  # the language-specific input embeddings (there is no MLM head here)


def inherit(cfg: RunConfig, parent: Parent) -> None:
    """What Step 3 needs of its parent: a primary model (a pretraining), or a mini-model (Step 1b: Table 5)."""
    if parent.stage not in ("pretrain", "build_mini"):
        raise ConfigError(f"{parent.name} is a {parent.stage!r} run; stage finetune starts from a pretrain run (a "
                          f"primary model) or a build_mini run (a mini-model)")


def hands_on(cfg: RunConfig, parent: ModelConfig) -> ModelConfig:
    """The model Step 3 hands on: its parent's body with a task head (no secondary MLM head downstream)."""
    return ModelConfig(**{**parent.__dict__, "secondary_head_layer": None})


def _spec_and_parent(cfg: RunConfig):
    if not cfg.finetune.task:
        raise ConfigError("finetune.task is unset: choose xnli, pawsx, mlqa or xquad")
    spec = get_task(cfg.finetune.task)
    meta, mcfg, sd = load_parent(cfg, inherit)  # a primary model, or a mini-model (Table 5)
    if not meta.get("tokenizer"):
        raise ConfigError(f"parent={cfg.parent} records no tokenizer to encode the English task data with")
    if Path(meta["tokenizer"]).is_file() and is_tokenizer_json(meta["tokenizer"]):
        raise ConfigError(f"parent={cfg.parent} tokenizes with a Hugging Face tokenizer ({meta['tokenizer']}: an "
                          f"imported byte-level BPE model); task data is encoded with SentencePiece only. Finetune "
                          f"the exported model with transformers, or a model with a SentencePiece tokenizer here")
    return spec, meta, mcfg, sd


@lru_cache(maxsize=4)
def _train_features(task: str, data_root: str, tokenizer: str, max_length: int, limit: int | None):
    spec = get_task(task)
    if not data_root:
        raise ConfigError("finetune.data_root is unset: the directory with the task files (e.g. the world), or "
                          "hub to load them from the Hugging Face hub")
    examples, report = load_split(spec, "train", "en", data_root)
    print(f"[mm-ds] {report.summary()}", flush=True)
    examples = examples[:limit] if limit else examples
    sp = spm.SentencePieceProcessor(model_file=tokenizer)
    if spec.task_type == EXTRACTIVE_QA:
        return feats.qa_features(examples, sp, spec.fitted(max_length)), feats.collate_qa
    return feats.pair_features(examples, sp, max_length), feats.collate_pairs


def schedule(cfg: RunConfig, n_features: int, global_batch: int) -> None:
    """Epochs, peak LR and warm-up ratio (task table unless overridden) into the stage's step schedule."""
    spec = get_task(cfg.finetune.task)
    epochs = cfg.finetune.epochs if cfg.finetune.epochs is not None else spec.epochs
    cfg.train.steps = max(1, math.ceil(epochs * n_features / global_batch))
    ratio = cfg.finetune.warmup_ratio if cfg.finetune.warmup_ratio is not None else spec.warmup_ratio
    cfg.train.warmup_steps = max(1, round(ratio * cfg.train.steps))
    cfg.train.lr = cfg.finetune.lr if cfg.finetune.lr is not None else spec.lr


def _features(cfg: RunConfig, spec, meta):
    max_len = min(cfg.finetune.max_length or spec.max_length, meta["model"]["max_positions"])
    return _train_features(spec.name, cfg.finetune.data_root, meta["tokenizer"], max_len,
                           cfg.finetune.max_train_examples)


def preflight(cfg: RunConfig) -> None:
    """Checks the parent (a pretrain checkpoint recording its tokenizer) and the English training examples
    under finetune.data_root, and makes the schedule from their number."""
    spec, meta, mcfg, _ = _spec_and_parent(cfg)
    mcfg.secondary_head_layer = None
    cfg.model = mcfg  # as build() makes it: a resumed run's checkpoint is checked against it
    features, _ = _features(cfg, spec, meta)
    if not features:
        raise ConfigError(f"no English training examples for {spec.name} under {cfg.finetune.data_root}")
    schedule(cfg, len(features), ds_config.global_batch(cfg))


@lru_cache(maxsize=2)
def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """Example order of one epoch: a function of (seed, epoch), so resume and any world size agree."""
    return np.random.default_rng([seed, epoch, 0x5EED]).permutation(n)


def build(cfg: RunConfig) -> Stage:
    spec, meta, mcfg, sd = _spec_and_parent(cfg)
    mcfg.secondary_head_layer = None  # MINIJOINT's primary model: the secondary head plays no part downstream
    features, collate = _features(cfg, spec, meta)
    n = len(features)
    schedule(cfg, n, ds_config.global_batch(cfg))
    cfg.model = mcfg
    torch.manual_seed(cfg.train.seed)
    model = RobertaForTask(mcfg, spec.task_type, spec.num_labels)
    body = {k: v for k, v in sd.items() if k.startswith(("embed.", "layers."))}
    missing, unexpected = model.load_state_dict(body, strict=False)
    if unexpected or any(not k.startswith("task_head.") for k in missing):
        raise ConfigError(f"parent={cfg.parent} does not fit the downstream model: missing {missing}, "
                          f"unexpected {unexpected}")

    seq = min(cfg.finetune.max_length or spec.max_length, mcfg.max_positions)
    width = seq if cfg.train.compile else None  # compiled: one shape (mm_ds/runtime/training/compiled.py); eager: the longest

    def batches(step: int, micro: int, rank: int, geo: Geometry) -> dict:
        ids = sample_ids(step, micro, rank, geo.world_size, geo.micro_batch, geo.grad_accum)
        return collate([features[int(epoch_order(n, cfg.train.seed, g // n)[g % n])] for g in ids.tolist()], width)

    def flops_per_step(global_batch: int) -> float:
        return flops.stage_flops_per_step("finetune", hidden=mcfg.hidden_size, vocab=mcfg.vocab_size,
                                          layers=mcfg.num_layers, seq_len=seq, mask_prob=0.0,
                                          global_batch=global_batch)

    return Stage(cfg=cfg, model=model, trainable=lambda name: name not in FROZEN, batches=batches,
                 flops_per_step=flops_per_step, tokens_per_sample=seq, parent=cfg.parent,
                 parent_flops=meta.get("flops_cumulative", 0.0),
                 meta={"tokenizer": meta["tokenizer"], "task": spec.name, "task_type": spec.task_type,
                       "num_labels": spec.num_labels, "primary": cfg.parent, "train_features": n})
