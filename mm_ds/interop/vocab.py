"""A source model's tokenizer as an import takes it: found beside the weights (or given), the piece of each
embedding row in the source's layout, and written again with the rows in mm-ds's layout (importers.finish_import).

    SentencePiece model   spm.model (an mm-ds export), sentencepiece.bpe.model (XLM-R), ...: interop.spm
    Hugging Face          the directory's own fast tokenizer (roberta-base's byte-level BPE: vocab.json +
                          merges.txt or tokenizer.json; XLM-R saved by transformers 5): interop.hf_vocab

A SentencePiece model beside the weights wins (it is the exact tokenizer XLM-R was trained with).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from ..data.tokenizer import is_tokenizer_json, pieces
from . import hf_vocab
from . import spm as spm_io
from .spm import InteropError

SPM_NAMES = ("spm.model", "sentencepiece.bpe.model", "sentencepiece.model")  # ours/exported, XLM-R, others
HF_TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer_config.json")  # AutoTokenizer reads them


@dataclass
class SourceVocab:
    """A source model's tokenizer and the piece of each of its embedding rows (in the source's layout)."""

    path: Path
    """The SentencePiece model, or where the Hugging Face tokenizer came from (directory or tokenizer.json)."""
    rows: list[str]
    hf: object | None = None
    """The `tokenizers.Tokenizer` of a Hugging Face tokenizer (None: a SentencePiece model)."""

    def needs_writing(self, rows: list[str], moved: int) -> bool:
        """Whether the tokenizer must be rewritten for `rows` (mm-ds's layout), not copied as it is."""
        return self.hf is not None or bool(moved) or rows != pieces(spm_io.load(self.path))

    def write(self, final: Path, perm: list[int], rows: list[str], converted: dict | None) -> Path:
        """The tokenizer in `final/`, ids = the new rows (`perm`: source row of each); `converted` gets counts."""
        if self.hf is not None:  # always written: the source may be vocab.json + merges.txt
            dst = final / hf_vocab.TOKENIZER_JSON
            converted |= hf_vocab.write(self.hf, perm, dst, hf_vocab.sample_texts(self.hf))
        elif converted is not None:
            dst = final / "spm.model"
            converted |= spm_io.write_model(self.path, rows, dst)
        else:
            dst = final / "spm.model"
            shutil.copyfile(self.path, dst)
        return dst


def find_tokenizer(src: Path, tokenizer, no_tokenizer: bool, hf_ok: bool = False) -> Path | None:
    """The tokenizer to import: `tokenizer`, else a SentencePiece model beside the weights, else (`hf_ok`) the
    directory itself when it holds a Hugging Face tokenizer; None with `no_tokenizer`."""
    if tokenizer is not None:
        if no_tokenizer:
            raise InteropError("pass either --tokenizer or --no-tokenizer, not both")
        if not Path(tokenizer).is_file():
            raise InteropError(f"--tokenizer {tokenizer} does not exist")
        return Path(tokenizer)
    if no_tokenizer:
        return None
    found = next((src / n for n in SPM_NAMES if (src / n).is_file()), None)
    if found is not None:
        return found
    if hf_ok and any((src / n).is_file() for n in HF_TOKENIZER_FILES):
        return src
    if (src / "vocab.json").is_file() or (src / "merges.txt").is_file():
        raise InteropError(f"{src} has a byte-level BPE tokenizer (vocab.json, merges.txt) and no SentencePiece "
                           f"model: import it as a Hugging Face model (--from hf), which reads that tokenizer")
    names = SPM_NAMES + (HF_TOKENIZER_FILES if hf_ok else ())
    raise InteropError(f"{src}: no tokenizer found (looked for {', '.join(names)}); pass --tokenizer with the "
                       f"model's SentencePiece model" + (" or tokenizer.json" if hf_ok else ""))


def hf_dir_vocab(src: Path, tokenizer, no_tokenizer: bool, vocab_size: int, weights: str) -> SourceVocab | None:
    """The tokenizer of an HF model directory, its pieces checked against the `vocab_size` rows of `weights`."""
    path = find_tokenizer(src, tokenizer, no_tokenizer, hf_ok=True)
    if path is None:
        return None
    if path.is_dir() or is_tokenizer_json(path):
        tok = hf_vocab.load(path)
        return SourceVocab(path, hf_vocab.rows_of(tok, vocab_size, weights, path), tok)
    return SourceVocab(path, spm_io.rows_of(path, vocab_size, weights))
