"""What `mm-ds extend` says about its result: held-out target text, the result's held-out MLM loss and accuracy
next to the untrained-embedding control, and the model card (the exported directory's README.md).

Held-out text is never training text: `--heldout FILE`, or the tail of `--text` (`split_heldout`: the last
tenth of its lines, at most HELDOUT_LINES; Step 2 trains on the rest, a copy under OUT/data/text/). The
result is the source model with Step 2's embeddings swapped in (what the export holds); the control swaps in
the embeddings Step 2 started from (overlap initialisation, transfer.control_group), so the margin is what
Step 2 learnt. Both are scored as the alignment check scores a model (mm_ds.eval.align: the same packing, masks
and metrics), on the same held-out sequences.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import deque
from pathlib import Path

from ..config import model_config_from_dict
from ..data.inputs import chunks, resolve_inputs, split_lines
from ..eval.align import Settings, eval_batches, heldout_corpus, mlm_metrics
from ..eval.transfer import control_group
from ..model import surgery
from ..runtime.checkpointing import checkpoint
from ..tokens import IGNORE_INDEX

HELDOUT_LINES = 2000
"""At most this many lines of --text are held out (a tenth of a shorter text)."""
CARD = "card.json"
"""OUT/card.json: the held-out metrics of the exported result, keyed by what they were computed from."""


def split_heldout(files: list[str], where: Path, lang: str) -> tuple[Path, Path]:
    """(training text, held-out text) of `files`: the last tenth of their lines (at most HELDOUT_LINES) is
    held out, the rest copied in order, a blank line (a document break) between files. Written once."""
    train, held = where / f"{lang}.train.txt", where / f"{lang}.heldout.txt"
    if train.is_file() and held.is_file():
        return train, held
    where.mkdir(parents=True, exist_ok=True)
    tail: deque[str] = deque()
    n = 0
    with open(f"{train}.partial", "w", encoding="utf-8") as out:
        for block, first, _ in chunks(resolve_inputs(files)):
            lines, _ = split_lines(block)
            if first and n:
                lines = ["", *lines]
            for line in lines:
                tail.append(line)
                n += 1
                if len(tail) > HELDOUT_LINES:
                    out.write(tail.popleft() + "\n")
        k = min(HELDOUT_LINES, n // 10)
        while len(tail) > k:
            out.write(tail.popleft() + "\n")
    checkpoint.write_text_atomic(held, "".join(line + "\n" for line in tail))
    os.replace(f"{train}.partial", train)  # last: both files there means the split is complete
    return train, held


def _digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()


def heldout_metrics(primary: Path, adapted: Path, heldout: Path, out: Path) -> dict:
    """Held-out target MLM loss and accuracy of the result (`primary` with `adapted`'s language group) and of
    the control (with the group Step 2 started from); cached in OUT/card.json."""
    key = _digest(checkpoint.manifest_of(adapted), checkpoint.manifest_of(primary), heldout)
    try:
        saved = json.loads((out / CARD).read_text())
    except (OSError, ValueError):
        saved = {}
    if saved.get("key") == key:
        return saved["metrics"]
    meta, group_sd = checkpoint.load_final(adapted)
    text = heldout.read_bytes()
    metrics = {"heldout": str(heldout), "lines": text.count(b"\n")}
    batches = (eval_batches(heldout_corpus(heldout, meta["lang"], meta["tokenizer"], out),
                            meta["run_config"]["data"], Settings()) if text.strip() else [])
    if any((b["labels"] != IGNORE_INDEX).any() for b in batches):  # a text too short may mask nothing
        pmeta, psd = checkpoint.load_final(primary)
        pcfg = model_config_from_dict(pmeta["model"])
        if pcfg.secondary_head_layer is not None:  # MINIJOINT: the export holds the main head
            pcfg, psd = surgery.drop_secondary_head(pcfg, psd)
        groups = {"result": surgery.language_group(group_sd),
                  "control": control_group(meta, meta["run_config"]["train"]["seed"])}
        for name, group in groups.items():
            metrics[name] = mlm_metrics(*surgery.swap_embeddings(pcfg, psd, group), batches)
        metrics["sequences"] = sum(len(b["input_ids"]) for b in batches)
    checkpoint.write_json_atomic(out / CARD, {"key": key, "metrics": metrics})
    return metrics


def base_model(src: Path) -> str:
    """The name the source model goes by: its hub id when config.json records one, else its directory name."""
    try:
        name = json.loads((src / "config.json").read_text()).get("_name_or_path") or ""
    except (OSError, ValueError):
        name = ""
    return name if name and not name.startswith(("/", ".", "~")) and not Path(name).exists() else src.name


def card(plan, stages: list[dict], vocab: dict, metrics: dict, exported_readme: str) -> str:
    """The model card: YAML front matter for the Hub, what was trained, the held-out table, then the export's
    notes on loading and tokenizing. `stages`: the metas of Step 1b (if any) and Step 2, in order."""
    row = plan.row
    tags = "".join(f"- {t}\n" for t in ("mm-ds", "mini-model-adaptation", row.name))
    front = (f"---\nlanguage:\n- {plan.lang}\nbase_model: {base_model(plan.src)}\nlibrary_name: transformers\n"
             f"pipeline_tag: fill-mask\ntags:\n{tags}---\n")
    trained = "".join(f"| {_STEP[m['stage']]} | {m['step']:,} updates, {m['tokens']:,} tokens of {m['lang']} text |\n"
                      for m in stages)
    table = (f"| | |\n|---|---|\n| source model | `{plan.src}` ({plan.source_lang}) |\n"
             f"| system | {row.label} (mini-model adaptation, Marchisio et al. 2023) |\n{trained}"
             f"| target vocabulary | {vocab['vocab_size']:,} SentencePiece pieces; {vocab['overlap']:,} of them "
             f"overlap the source vocabulary and started from its embeddings |\n")
    if "result" in metrics:
        r, c = metrics["result"], metrics["control"]
        heldout = (f"On {metrics['sequences']} held-out {plan.lang} sequences ({r['targets']:,} masked tokens; "
                   f"{metrics['lines']:,} lines never trained on), masked as in training:\n\n"
                   f"| model | MLM loss | MLM accuracy |\n|---|---|---|\n"
                   f"| this model | {r['loss']:.3f} | {100 * r['acc']:.1f}% |\n"
                   f"| control: Step 2's initial (untrained) embeddings | {c['loss']:.3f} | {100 * c['acc']:.1f}% |\n")
    else:
        heldout = (f"No held-out score: the held-out text ({metrics['lines']} lines) is too short to mask a "
                   f"token; pass --heldout FILE with more {plan.lang} text.\n")
    demo = f"\n> **{demo_warning(plan)}**\n" if plan.presets == "extend" else ""
    body = exported_readme.split("\n", 1)[1] if exported_readme.startswith("# ") else exported_readme
    return (f"{front}\n# {base_model(plan.src)} for {plan.lang}: a masked LM extended with mm-ds\n{demo}\n"
            f"The source model's transformer body, unchanged, with new {plan.lang} token embeddings and tokenizer "
            f"learnt over a frozen body (`mm-ds extend`).\n\n{table}\n## Held-out {plan.lang} MLM\n\n{heldout}{body}")


_STEP = {"build_mini": "Step 1b (mini-model bridge layers)", "adapt": "Step 2 (target embeddings)"}


def real_size_command(plan) -> str:
    """The user's command at the paper's stage sizes, into a new OUT (its stages would not be reused)."""
    args = [*(f"--text {t}" for t in plan.text), *(f"--source-text {t}" for t in plan.source_text)]
    for flag, value, default in (("--source-lang", plan.source_lang, "en"), ("--tokenizer", plan.tokenizer, None),
                                 ("--vocab-size", plan.vocab_size, None), ("--model-type", plan.model_type, "unigram"),
                                 ("--heldout", plan.heldout, None)):
        if value != default:
            args.append(f"{flag} {value}")
    return (f"mm-ds extend {plan.src} --lang {plan.lang} {' '.join(args)} --system {plan.system} --out "
            f"{plan.out}-paper --presets paper")


def demo_warning(plan) -> str:
    return (f"Demo-sized: this ran at the `extend/*` presets (seconds on a CPU), far too few updates for a usable "
            f"{plan.lang} model. Real sizes (the paper's schedule, per stage 125k updates of 2048 x 512 tokens on "
            f"8 GPUs): `{real_size_command(plan)}`, or set them with train.steps=... train.global_batch=...")
