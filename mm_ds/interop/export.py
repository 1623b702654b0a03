"""Any stage's checkpoint -> a Hugging Face directory loadable by `transformers`.

    pretrain / build_mini / adapt (an MLM)   RobertaForMaskedLM         AutoModelForMaskedLM
    finetune, pair_classification            RobertaForSequenceClassification
    finetune, extractive_qa                  RobertaForQuestionAnswering

`lang_from=ADAPT_RUN` swaps that run's language group (token embeddings, output bias) into the model and
takes its tokenizer: Step 4 of the paper, as a shareable model. A MINIJOINT model exports its main head;
`mini=True` exports its secondary head as its own mini-model (`surgery.extract_minijoint`).

The directory holds config.json, model.safetensors, the language's SentencePiece model (`spm.model`: its
ids are the embedding rows, <s>=0 <pad>=1 </s>=2 <unk>=3 <mask>=4), the same model as a transformers
tokenizer (tokenizer.json, tokenizer_config.json: interop.hf_tokenizer), so `AutoTokenizer` and `pipeline`
load the directory as it is, and a README.md saying how to tokenize. A source model imported with its own
Hugging Face tokenizer (a byte-level BPE: interop.hf_vocab) ships that tokenizer, no spm.model.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import torch

from ..config import ModelConfig, model_config_from_dict
from ..data.tasks import TASKS, task_type_of
from ..data.tokenizer import check_tokenizer, is_tokenizer_json
from ..model import surgery
from ..model.model import param_shapes
from ..runtime.checkpointing import checkpoint
from ..tokens import SPECIAL_IDS, SPECIAL_PIECES
from . import hf, hf_tokenizer
from .spm import InteropError

ARCHS = {None: "RobertaForMaskedLM", "pair_classification": "RobertaForSequenceClassification",
         "extractive_qa": "RobertaForQuestionAnswering"}


def task_to_hf(cfg: ModelConfig, task_type: str, sd: dict) -> dict[str, torch.Tensor]:
    """A `RobertaForTask` state dict as HF's: body by hf.HF_KEYS (no MLM head), head by hf.HF_TASK_KEYS."""
    if task_type not in hf.HF_TASK_KEYS:
        raise InteropError(f"task type {task_type!r} has no HF architecture; types: {', '.join(hf.HF_TASK_KEYS)}")
    body = {k: s for k, s in param_shapes(dataclasses.replace(cfg, secondary_head_layer=None)).items()
            if not k.startswith("head.")}
    head = dict(hf.HF_TASK_KEYS[task_type])
    missing = sorted(set(body) - set(sd)) + sorted(set(head) - set(sd))
    extra = sorted(set(sd) - set(body) - set(head))
    if missing or extra:
        raise InteropError(f"{task_type} model does not match its config: missing {surgery.few_keys(missing)}; "
                           f"unexpected {surgery.few_keys(extra)}")
    for k, s in body.items():
        if tuple(sd[k].shape) != s:
            raise InteropError(f"{task_type} model: {k} has shape {tuple(sd[k].shape)}, expected {s} from its config")
    return hf.to_hf_keys(cfg, sd, mlm_head=False) | {name: sd[ours].clone() for ours, name in head.items()}


def _labels(meta: dict, task_type: str, n: int) -> list[str]:
    if task_type == "extractive_qa":
        return ["start", "end"]
    try:
        names = list(TASKS[meta["task"]].labels)
        if len(names) == n:
            return names
    except KeyError:  # not a task of the table: generic names
        pass
    return [f"LABEL_{i}" for i in range(n)]


def export(src: str | Path, out: str | Path, lang_from: str | Path | None = None,
           tokenizer: str | Path | None = None, mini: bool = False, force: bool = False) -> dict:
    """Write `out` as an HF model directory; returns a summary (architecture, config, tokenizer, notes)."""
    meta, sd = checkpoint.load_final(src)
    cfg = model_config_from_dict(meta["model"])
    task_type = task_type_of(meta)  # None: an MLM, not a finetuned model
    notes = []
    cfg, sd = _one_head(cfg, sd, task_type, mini, src, notes)
    lang = meta.get("lang")
    spm_path = tokenizer or meta.get("tokenizer")
    if lang_from is not None:
        lmeta, lsd = checkpoint.load_final(lang_from)
        cfg, sd = surgery.swap_embeddings(cfg, sd, surgery.language_group(lsd))
        lang = lmeta.get("lang")
        spm_path = tokenizer or lmeta.get("tokenizer")
        notes.append(f"{lang} embeddings from {lang_from}")
    if spm_path is not None:
        if not Path(spm_path).is_file():
            raise InteropError(f"tokenizer {spm_path} does not exist (recorded in the checkpoint's meta or "
                               f"given by --tokenizer)")
        try:
            size = check_tokenizer(Path(spm_path))
        except ValueError as e:
            raise InteropError(str(e)) from e
        if size != cfg.vocab_size:
            raise InteropError(f"tokenizer {spm_path} has {size} pieces but {surgery.TOKENS} has "
                               f"{cfg.vocab_size} rows: export with the tokenizer of this language (mm-ds export "
                               f"--tokenizer), or with the adapt run the embeddings come from (--lang-from)")
    else:
        notes.append("no tokenizer recorded: exported without one")
    hf_tok = _hf_tokenizer(spm_path, cfg.max_positions, notes) if spm_path is not None else None

    hf_cfg, hf_sd = _hf_model(cfg, sd, meta, task_type)
    _write_dir(Path(out), hf_cfg, hf_sd, spm_path, hf_tok, meta | {"exported_from": str(Path(src).resolve())},
               force, lang)
    return {"out": str(out), "architecture": ARCHS[task_type], "lang": lang, "vocab_size": cfg.vocab_size,
            "num_layers": cfg.num_layers, "tokenizer": str(spm_path) if spm_path else None,
            "tokenizer_class": type(hf_tok).__name__ if hf_tok is not None else None, "notes": notes}


def _one_head(cfg: ModelConfig, sd: dict, task_type: str | None, mini: bool, src: str | Path,
              notes: list[str]) -> tuple[ModelConfig, dict]:
    """The model with the one MLM head HF has: a MINIJOINT model's main head, or with `mini` its secondary head's
    mini-model (the deepest of a multi-depth model); any other model as it is."""
    if task_type is None and cfg.secondary_head_layer is not None:
        if mini:
            cfg, sd = surgery.extract_minijoint(cfg, sd)
            notes.append(f"mini-model: layers 1-{cfg.num_layers} and the secondary head of the MINIJOINT model")
            if cfg.secondary_head_layer is not None:  # multi-depth: HF has one head, the deepest mini-model's
                notes.append(f"multi-depth: the deepest mini-model; its heads after layers {cfg.secondary_depths} "
                             f"are dropped")
                cfg, sd = surgery.drop_secondary_head(cfg, sd)
        else:
            cfg, sd = surgery.drop_secondary_head(cfg, sd)
            notes.append("MINIJOINT: main head exported; `mm-ds export --mini` exports the secondary head's mini-model")
    elif mini:
        raise InteropError(f"--mini exports a MINIJOINT model's secondary head, but {src} has none "
                           f"(model.secondary_head_layer is null{', task type ' + task_type if task_type else ''})")
    return cfg, sd


def _hf_model(cfg: ModelConfig, sd: dict, meta: dict, task_type: str | None) -> tuple[dict, dict]:
    """(config.json, state dict) of the HF architecture for `task_type` (ARCHS), a task model's labels named."""
    hf_cfg = hf.hf_config(cfg) | {"architectures": [ARCHS[task_type]]}
    if task_type is None:
        hf_sd = hf.to_hf_roberta(cfg, sd)
    else:
        hf_sd = task_to_hf(cfg, task_type, sd)
        n = int(meta.get("num_labels") or (2 if task_type == "extractive_qa" else 0))
        names = _labels(meta, task_type, n)
        hf_cfg |= {"id2label": {str(i): s for i, s in enumerate(names)},
                   "label2id": {s: i for i, s in enumerate(names)}}
        if task_type == "pair_classification":
            hf_cfg["classifier_dropout"] = None  # = hidden_dropout_prob, as in our head
    return hf_cfg, hf_sd


def _hf_tokenizer(spm_path, max_length: int, notes: list[str]):
    """The transformers tokenizer to ship beside spm.model, or None with a note saying why not."""
    try:
        import transformers  # noqa: F401  (an optional dependency: the export's reader has it)
    except ImportError:
        notes.append("transformers is not installed: no tokenizer.json / tokenizer_config.json written "
                     "(pip install transformers, then export again)")
        return None
    if is_tokenizer_json(spm_path):  # an imported source's own tokenizer: its ids already are the rows
        return hf_tokenizer.from_json(spm_path, max_length)
    try:
        tok = hf_tokenizer.build(spm_path, max_length)
        hf_tokenizer.check(tok, spm_path)
    except hf_tokenizer.TokenizerMismatch as e:
        notes.append(f"no transformers tokenizer written: {e}; tokenize with spm.model (README.md)")
        return None
    return tok


def _write_dir(out: Path, hf_cfg: dict, hf_sd: dict, spm_path, hf_tok, meta: dict, force: bool, lang) -> None:
    from safetensors.torch import save_file

    if out.exists() and any(out.iterdir()) and not force:
        raise InteropError(f"{out} exists and is not empty; pass --force to replace it")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in hf_sd.items()}, str(tmp / "model.safetensors"),
              metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(hf_cfg, indent=2, sort_keys=True) + "\n")
    (tmp / "mm_ds_source.json").write_text(json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")
    has_spm = spm_path is not None and not is_tokenizer_json(spm_path)
    if has_spm:
        shutil.copyfile(spm_path, tmp / "spm.model")
    if hf_tok is not None:
        hf_tok.save_pretrained(str(tmp))
        # older transformers releases read the special tokens from here, 5 from tokenizer_config.json
        (tmp / "special_tokens_map.json").write_text(json.dumps(hf_tokenizer.SPECIAL_TOKENS, indent=2) + "\n")
    (tmp / "README.md").write_text(_readme(hf_cfg["architectures"][0], lang, has_spm, hf_tok is not None))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)


def _readme(arch: str, lang, has_spm: bool, has_hf_tokenizer: bool) -> str:
    ids = " ".join(f"{p}={i}" for p, i in zip(SPECIAL_PIECES, SPECIAL_IDS))
    hf_tok = ("""`AutoTokenizer.from_pretrained(this_dir)` loads its tokenizer (tokenizer.json), whose ids are the
embedding rows: `pipeline("fill-mask" | "text-classification", model=this_dir)` runs as it is, and for
QA `tokenizer(question, context, return_offsets_mapping=True)` gives the model's input and the answer's
characters. """ if has_hf_tokenizer else "")
    tok = (f"""## Tokenizer

{hf_tok}`spm.model` is the same SentencePiece model; its ids are the embedding rows ({ids}). It is not
XLM-R's file layout (no +1 offset): do not pass it to `XLMRobertaTokenizer` as `sentencepiece.bpe.model`.
Encoding with SentencePiece:

```python
import sentencepiece as spm
sp = spm.SentencePieceProcessor(model_file="spm.model")
ids = [0] + sp.encode("a sentence") + [2]                    # <s> ... </s>
pair = [0] + sp.encode("a") + [2, 2] + sp.encode("b") + [2]  # <s> A </s></s> B </s> (tasks, QA)
```
""" if has_spm else f"## Tokenizer\n\n{hf_tok}\n" if has_hf_tokenizer else
           "No tokenizer was recorded for this checkpoint.\n")
    return f"""# {arch} exported by mm-ds (language: {lang})

Load with `transformers` (`AutoModelFor...from_pretrained(this_dir)`). Provenance: `mm_ds_source.json`.

{tok}"""
