"""Start from any existing English model, hand results to the Hugging Face ecosystem (paper §2.2: MINIPOST
starts from an existing pretrained model).

    mm-ds import --from hf DIR --out RUN [--tokenizer FILE | --no-tokenizer]     hf_import.import_hf
    mm-ds import --from fairseq DIR --out RUN [--trust-pickle]                   fairseq_import.import_fairseq
    mm-ds import --from deepspeed CKPT --out RUN                                 deepspeed_import.import_deepspeed
    mm-ds export SRC --out HF_DIR [--lang-from ADAPT_RUN] [--mini]               export.export

An import writes `RUN/final/` (model.safetensors, mm_ds.json with stage "pretrain", step 0, FLOPs 0 and
`imported_from`, its tokenizer: spm.model, or tokenizer.json for a model without a SentencePiece model such as
roberta-base): `parent=RUN` for build-mini (MINIPOST) and adapt (BL_BASE); what every import shares:
interop.importers. Key tables: interop.hf (HF_KEYS, HF_TASK_KEYS), fairseq_import.FAIRSEQ_KEYS (fairseq).
Tokenizers: interop.vocab (which, and their rows), interop.spm and interop.hf_vocab (their layouts); the exported
transformers tokenizer: interop.hf_tokenizer.
"""

from __future__ import annotations

import argparse
import json

from .deepspeed_import import import_deepspeed
from .export import export
from .fairseq_import import import_fairseq
from .hf_import import import_hf
from .spm import InteropError

__all__ = ["InteropError", "export", "export_main", "import_deepspeed", "import_fairseq", "import_hf",
           "import_main"]


def import_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mm-ds import", description="a foreign or DeepSpeed checkpoint as an mm-ds "
                                "Step-1 run directory (RUN/final/), usable as parent= by build-mini and adapt")
    p.add_argument("--from", dest="fmt", required=True, choices=["hf", "fairseq", "deepspeed"],
                   help="hf: RoBERTa/XLM-R MLM directory (config.json + model.safetensors or pytorch_model.bin); "
                        "fairseq: model.pt + dict.txt + SentencePiece model; deepspeed: a checkpoint of this system")
    p.add_argument("src", help="the source directory (fairseq: or its .pt file)")
    p.add_argument("--out", required=True, help="run directory to create; weights go to OUT/final/")
    p.add_argument("--tokenizer", help="tokenizer of the source: a SentencePiece model (hf/fairseq) or a "
                                       "tokenizer.json (hf); default: found beside the weights (spm.model, "
                                       "sentencepiece.bpe.model; hf: else its Hugging Face tokenizer)")
    p.add_argument("--no-tokenizer", action="store_true",
                   help="import the weights alone: no overlap initialisation, adapt/finetune refuse it as parent")
    p.add_argument("--trust-pickle", action="store_true",
                   help="fairseq: fully unpickle model.pt when weights_only loading refuses it. Runs code "
                        "from the file: only for checkpoints from a source you trust")
    p.add_argument("--system", default="bl_base", help="system recorded in the meta (default bl_base)")
    p.add_argument("--lang", default="en", help="language recorded in the meta (default en)")
    p.add_argument("--force", action="store_true", help="replace an existing OUT/final/")
    return p


def import_main(argv: list[str]) -> int:
    a = import_parser().parse_args(argv)
    if a.fmt == "deepspeed":
        if a.tokenizer or a.no_tokenizer or a.trust_pickle:
            raise InteropError("--tokenizer, --no-tokenizer and --trust-pickle do not apply to --from deepspeed "
                               "(the checkpoint's meta names its tokenizer)")
        meta = import_deepspeed(a.src, a.out, force=a.force)
    else:
        if a.trust_pickle and a.fmt != "fairseq":
            raise InteropError("--trust-pickle applies to --from fairseq only (HF .bin files load weights_only)")
        kw = dict(tokenizer=a.tokenizer, no_tokenizer=a.no_tokenizer, system=a.system, lang=a.lang, force=a.force)
        meta = (import_hf(a.src, a.out, **kw) if a.fmt == "hf"
                else import_fairseq(a.src, a.out, trust_pickle=a.trust_pickle, **kw))
    print(json.dumps({k: meta.get(k) for k in ("stage", "system", "lang", "model", "tokenizer",
                                               "tokenizer_conversion", "imported_from")}, indent=2))
    if not meta.get("tokenizer"):
        print("[mm-ds] warning: no tokenizer recorded; adapt and finetune need one (re-import with --tokenizer)")
    return 0


def export_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mm-ds export", description="a checkpoint of any stage as a Hugging Face "
                                "directory (config.json, model.safetensors, tokenizer.json + tokenizer_config.json "
                                "for AutoTokenizer, spm.model)")
    p.add_argument("src", help="run directory, its final/, or a checkpoints/step_* directory")
    p.add_argument("--out", required=True, help="HF directory to write")
    p.add_argument("--lang-from", help="adapt run whose language embeddings (and tokenizer) replace the model's")
    p.add_argument("--tokenizer", help="SentencePiece model to ship (default: the one the meta records)")
    p.add_argument("--mini", action="store_true", help="MINIJOINT: export the secondary head's mini-model")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    return p


def export_main(argv: list[str]) -> int:
    a = export_parser().parse_args(argv)
    print(json.dumps(export(a.src, a.out, lang_from=a.lang_from, tokenizer=a.tokenizer, mini=a.mini,
                            force=a.force), indent=2))
    return 0
