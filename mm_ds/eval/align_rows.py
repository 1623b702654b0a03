"""One row of the alignment check (mm_ds/eval/align.py, whose docstring says what a row holds): one Step-2
checkpoint's primary model, read through its main head with a refit output bias (mlm_measure.py) and with the bias
Step 2 left, its mini-model, and the target's unigram predictor, on the same held-out tokens."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from ..config import ConfigError, model_config_from_dict
from ..model import flops, surgery
from ..model.model import RobertaMLM
from ..runtime.checkpointing import checkpoint
from ..systems import system_of
from .mlm_measure import Fit, head_features, main_head_metrics, masked_batches, piece_logp, refit_bias, unigram_metrics
from .transfer import control_group

INIT = "init"
"""The tag of step 0: the language group Step 2 starts from."""
ROWS_VERSION = 3
"""Part of every row's fingerprint: bump when a row's definition changes (2: all-<mask> targets, bias-only; 3: the
primary read with a refit bias, the step bias and the unigram beside it)."""


@dataclass(frozen=True)
class Settings:
    """What the check reads per checkpoint: part of every row's fingerprint."""

    sequences: int = 64
    """Held-out sequences per checkpoint (at most the held-out text's packed blocks)."""
    seed: int = 0
    """Seed of the evaluation masks (the same for every checkpoint); the refit's training sequences use seed + 1."""
    batch: int = 16
    fit_sequences: int | None = None
    """Training sequences the output-bias refit reads per checkpoint (None: as many as `sequences`)."""


# ---------------------------------------------------------------- one model, one checkpoint

def mlm_model(cfg, sd: dict, device="cpu"):
    """A RobertaMLM holding `sd`, in eval mode on `device`."""
    model = RobertaMLM(cfg)
    model.load_state_dict(sd, strict=True)
    return model.to(device).eval()


def mlm_metrics(cfg, sd: dict, batches: list[dict], device="cpu", depth: int | None = None) -> dict:
    """Token-weighted MLM loss and accuracy of the main head (`depth`: of the head after that layer, through
    the bottom `depth` layers only) over every masked token of `batches`."""
    model = mlm_model(cfg, sd, device)
    loss = correct = targets = 0.0
    with torch.no_grad():
        for b in batches:
            mask = b["attention_mask"]
            out = model(b["input_ids"].to(device), b["labels"].to(device), None if mask is None else mask.to(device),
                        depth=depth)
            n = int(out["masked_tokens"])
            (hit,) = [k for k in out if k.startswith("correct_")] if depth is not None else ["correct_main"]
            loss += float(out["loss" if depth is not None else "loss_main"]) * n
            correct += int(out[hit])
            targets += n
    return {"loss": loss / targets, "acc": correct / targets, "targets": int(targets)}


def eval_batches(heldout_dir: Path, data_cfg: dict, settings: Settings) -> list[dict]:
    """The fixed evaluation batches: the first `sequences` samples of the held-out corpus, packed as Step 2's
    training batches are (its seq_len and mask rate), with `settings.seed`; every selected token is <mask>."""
    return masked_batches(heldout_dir, data_cfg, settings.sequences, settings.seed, settings.batch)


def training_corpus(meta: dict, out: Path | None) -> Path:
    """Step 2's training corpus of a checkpoint: OUT/data/<lang> in a recipe output (a moved tree keeps it), else
    the one its run config names."""
    if out is not None and (out / "data" / meta["lang"] / "meta.json").is_file():
        return out / "data" / meta["lang"]
    corpus = meta.get("run_config", {}).get("data", {}).get("corpus")
    if not corpus or not (Path(corpus) / "meta.json").is_file():
        raise ConfigError(f"Step 2's training corpus {corpus} (run_config data.corpus of the {meta['lang']} run) is "
                          f"not there: the output-bias refit reads it; check the run inside its recipe output, "
                          f"or prepare the corpus again at that path")
    return Path(corpus)


def fit_data(corpus: Path, data_cfg: dict, settings: Settings, heldout: list[dict]):
    """A Step-2 run's mlm_measure.Fit: `settings.fit_sequences` training sequences of `corpus`, masked as the
    held-out ones are with seed + 1."""
    batches = masked_batches(corpus, data_cfg, settings.fit_sequences or settings.sequences, settings.seed + 1,
                             settings.batch)
    return Fit(batches, piece_logp(corpus), unigram_metrics(corpus, heldout))


@lru_cache(maxsize=1)  # a run's checkpoints share their primary model (runs come one at a time)
def primary_model(path: str):
    meta, sd = checkpoint.load_final(path)
    cfg = model_config_from_dict(meta["model"])
    if cfg.secondary_head_layer is not None:  # MINIJOINT: the full model's prediction is its main head's
        cfg, sd = surgery.drop_secondary_head(cfg, sd)
    return meta, cfg, sd


def initial_group(ckpt: Path) -> dict:
    """The language group Step 2 started from (the control), rebuilt from the adapt run's parent."""
    meta = checkpoint.read_meta(ckpt)
    return control_group(meta, meta["run_config"]["train"]["seed"])


def primary_scores(pcfg, psd: dict, group: dict, batches: list[dict], fit, device="cpu") -> dict:
    """The primary model with `group` swapped in, read through its main head on `batches`: with the output bias
    refit on `fit`'s training sequences (the measure: loss, acc) and with the group's own bias (step_bias_*)."""
    model = mlm_model(*surgery.swap_embeddings(pcfg, psd, group), device)
    emb = model.embed.tokens.weight.detach()
    if len(fit.logp) != len(emb):
        raise ConfigError(f"the training corpus has {len(fit.logp)} pieces but the embeddings {len(emb)} rows: "
                          f"the corpus belongs to another tokenizer")
    held = head_features(model, batches, device)
    logp = torch.as_tensor(fit.logp, dtype=torch.float32, device=device)
    bias, info = refit_bias(head_features(model, fit.batches, device)["z"], emb, logp)
    refit, stepped = main_head_metrics(held, emb, bias), main_head_metrics(held, emb, model.head.bias.detach())
    return {"loss": refit["loss"], "acc": refit["acc"], "targets": refit["targets"], "step_bias_loss": stepped["loss"],
            "step_bias_acc": stepped["acc"], "fit_steps": info["steps"], "fit_l1": info["l1"]}


def row_for(ckpt: Path, batches: list[dict], device="cpu", init: bool = False, init_group: dict | None = None,
            fit=None) -> dict:
    """One row: the primary model of `ckpt` with the checkpoint's language group (`init`: with the group Step 2
    started from instead, at step 0) read with a refit bias and with its own, the mini-model (mini-model
    systems), the unigram predictor. `init_group`: that initial group, if known; `fit`: the run's mlm_measure.Fit,
    if known (else built from the checkpoint's training corpus, as many sequences as `batches` hold)."""
    meta, sd = checkpoint.load_final(ckpt)
    if meta.get("stage") != "adapt":
        raise ConfigError(f"{ckpt} is a {meta.get('stage')!r} checkpoint, not a Step-2 (adapt) one")
    if not meta.get("primary"):
        raise ConfigError(f"{ckpt} records no primary model (meta key primary); it cannot be checked against one")
    cfg = model_config_from_dict(meta["model"])
    if init:
        cfg, sd = surgery.swap_embeddings(cfg, sd, init_group if init_group is not None else initial_group(ckpt))
    if fit is None:
        fit = fit_data(training_corpus(meta, None), meta["run_config"]["data"],
                       Settings(sequences=sum(len(b["input_ids"]) for b in batches)), batches)
    _, pcfg, psd = primary_model(str(Path(meta["primary"]).resolve()))
    primary = primary_scores(pcfg, psd, surgery.language_group(sd), batches, fit, device)
    # A multi-depth mini-model (§7) is scored at the depth Step 2 was training at (its first one at step 0).
    phases = meta.get("depth_phases") or [[None]]
    depth = phases[0 if init else -1][0]
    mini = mlm_metrics(cfg, sd, batches, device, depth) if system_of(meta["system"]).mini else None
    step, f = (0, 0.0) if init else (meta["step"], meta["flops"])
    return {"kind": "target", "system": meta.get("system"), "lang": meta.get("lang"), "step": step, "flops": f,
            "v100_days": flops.to_v100_days(f), "sequences": sum(len(b["input_ids"]) for b in batches),
            "targets": primary["targets"], "mini_loss": mini and mini["loss"], "mini_acc": mini and mini["acc"],
            "primary_loss": primary["loss"], "primary_acc": primary["acc"],
            "step_bias_loss": primary["step_bias_loss"], "step_bias_acc": primary["step_bias_acc"],
            "unigram_loss": fit.unigram["loss"], "unigram_acc": fit.unigram["acc"],
            "fit_sequences": sum(len(b["input_ids"]) for b in fit.batches), "fit_steps": primary["fit_steps"],
            "fit_l1": primary["fit_l1"], "mini_layers": (depth or cfg.num_layers) if mini else None,
            "primary_layers": pcfg.num_layers}
