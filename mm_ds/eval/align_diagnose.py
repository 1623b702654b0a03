"""`mm-ds align OUT --diagnose`: what decides a primary model's MLM-level score, its Step-2 embeddings or the head
it is read through? (issue 39; the measurement in docs/results.md, 2026-11-27.)

For each Step-2 run, with the untrained embeddings E0 (step 0: the control) and the last checkpoint's E', on the
alignment check's held-out tokens:
  (a) the primary's main head with the output bias Step 2 left (what the check scored before 2026-11-27);
  (b) the main head with its output bias refit on `fit_sequences` training sequences, to convergence
      (mlm_measure.refit_bias; embeddings, body and head frozen; the same budget for every system and control);
  (c) a fresh linear read-out of the primary's top layer (a weight row and a bias per piece, no MLM head), fitted
      on the same training sequences by L-BFGS with a small L2 penalty: what E' buys through the body, whatever
      head reads it. It predicts the `readout_classes` most frequent target pieces and "other" (always wrong),
      and answers with the likeliest of those pieces ("other" is never right, and where "other" is the likeliest
      class, arg-max over all classes would score a body that knows the ranking of the pieces as zero), so its
      accuracy is over every target, out of at most `coverage`;
beside the mini-model as Step 2 trains it and the target's unigram predictor. OUT/report/align_diagnosis.md.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..config import model_config_from_dict
from ..model import surgery
from ..runtime.checkpointing import checkpoint
from ..systems import system_of
from .align_rows import (Settings, eval_batches, fit_data, initial_group, mlm_metrics, mlm_model, primary_model,
                         training_corpus)
from .heldout import heldout_corpus, heldout_text
from .mlm_measure import head_features, main_head_metrics, refit_bias


def readout(train: dict, held: dict, logp: np.ndarray, classes: int, l2: float = 1e-4, max_iter: int = 300) -> dict:
    """(c): multinomial logistic regression from the top layer's states `train["top"]` to the `classes` most
    frequent pieces (by `logp`) and "other", fitted to convergence (L-BFGS); accuracy on `held`."""
    top_k = torch.as_tensor(np.argsort(-logp)[:classes])
    index = torch.full((len(logp),), classes, dtype=torch.long)
    index[top_k] = torch.arange(classes)
    y, y_held = index[train["labels"]], index[held["labels"]]
    x, x_held = train["top"].float(), held["top"].float()
    w = torch.zeros(classes + 1, x.shape[1], requires_grad=True)
    freq = torch.bincount(y, minlength=classes + 1).float() + 1
    c = (freq / freq.sum()).log().requires_grad_(True)
    opt = torch.optim.LBFGS([w, c], lr=1, max_iter=max_iter, history_size=20, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-6, tolerance_change=1e-10)

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(x @ w.T + c, y) + 0.5 * l2 * w.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        pred = (x_held @ w.T + c)[:, :classes].argmax(-1)  # "other" is never right: predict a piece
        train_loss = float(F.cross_entropy(x @ w.T + c, y))
    return {"readout_acc": float(((pred == y_held) & (y_held < classes)).float().mean()),
            "readout_train_loss": train_loss, "readout_evals": opt.state[opt._params[0]]["func_evals"],
            "coverage": float((y_held < classes).float().mean())}


def diagnose_point(meta: dict, group: dict, mini_sd: tuple | None, batches, fit, classes: int, device) -> dict:
    """(a), (b), (c), the mini-model and the unigram predictor for one language group of a Step-2 run."""
    _, pcfg, psd = primary_model(str(Path(meta["primary"]).resolve()))
    model = mlm_model(*surgery.swap_embeddings(pcfg, psd, group), device)
    emb = model.embed.tokens.weight.detach()
    held, train = head_features(model, batches, device), head_features(model, fit.batches, device)
    bias, info = refit_bias(train["z"], emb, torch.as_tensor(fit.logp, dtype=torch.float32, device=device),
                            tolerance=1e-4, max_steps=2000)
    a, b = main_head_metrics(held, emb, model.head.bias.detach()), main_head_metrics(held, emb, bias)
    mini = mlm_metrics(*mini_sd, batches, device) if mini_sd else {"loss": None, "acc": None}
    return {"step_bias_loss": a["loss"], "step_bias_acc": a["acc"], "refit_loss": b["loss"], "refit_acc": b["acc"],
            "fit_steps": info["steps"], "fit_l1": info["l1"], "mini_loss": mini["loss"], "mini_acc": mini["acc"],
            "unigram_loss": fit.unigram["loss"], "unigram_acc": fit.unigram["acc"], "targets": a["targets"],
            "fit_targets": len(train["labels"])} | readout(train, held, fit.logp, classes)


def diagnose_run(run: Path, texts: dict, out: Path | None, settings: Settings, classes: int, device="cpu",
                 say=print) -> list[dict]:
    """The control (step 0) and the last checkpoint of one Step-2 run."""
    last = checkpoint.list_checkpoints(run)[-1]
    meta, sd = checkpoint.load_final(last)
    root = out / "align" if out is not None else run / "align"
    held = heldout_corpus(heldout_text(meta["lang"], texts, out), meta["lang"], meta["tokenizer"], root)
    batches = eval_batches(held, meta["run_config"]["data"], settings)
    fit = fit_data(training_corpus(meta, out), meta["run_config"]["data"], settings, batches)
    cfg, mini = model_config_from_dict(meta["model"]), system_of(meta["system"]).mini
    rows = []
    for step, group in ((0, initial_group(last)), (meta["step"], surgery.language_group(sd))):
        mini_sd = surgery.swap_embeddings(cfg, sd, group) if mini and not meta.get("depth_phases") else None
        row = {"system": meta["system"], "lang": meta["lang"], "step": step,
               "fit_sequences": sum(len(b["input_ids"]) for b in fit.batches)}
        rows.append(row | diagnose_point(meta, group, mini_sd, batches, fit, classes, device))
        r = rows[-1]
        say(f"[mm-ds] diagnose {meta['system']} {meta['lang']} step {step}: step bias {100 * r['step_bias_acc']:.1f}%, "
            f"refit {100 * r['refit_acc']:.1f}%, read-out {100 * r['readout_acc']:.1f}%, unigram "
            f"{100 * r['unigram_acc']:.1f}%")
    return rows
