"""A language's SentencePiece model: trained on a sample of `mm-ds prepare`'s inputs, checked for
mm-ds's special ids, read back as its list of pieces.

Training: a deterministic reservoir sample of `sample_sentences` non-blank lines (vectorised Algorithm R,
seeded), then a unigram model (as XLM-R), nmt_nfkc normalisation, ids fixed by mm_ds.tokens (<s>=0 <pad>=1
</s>=2 <unk>=3, user-defined <mask>=4) so special ids line up across languages. The vocabulary size is an
upper bound (hard_vocab_limit=False): a corpus too small to reach it gets the largest vocabulary
SentencePiece can build.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import sentencepiece as spm
from tqdm import tqdm

from mm_ds import tokens
from mm_ds.data.inputs import InputSource, chunks, total_bytes

MAX_SAMPLE_LINE_BYTES = 8192  # also SentencePiece's max_sentence_length: longer lines are not sampled
MODEL_TYPES = ("unigram", "bpe")


def reservoir_sample(sources: list[InputSource], k: int, seed: int, progress: bool,
                     exclude=None) -> tuple[list[str], int]:
    """Deterministic reservoir sample (Algorithm R, vectorised per chunk) of non-blank lines; `exclude(line)`
    true leaves a line out (a held-out line: no tokenizer sees it).

    Returns (sample in corpus order of acceptance, number of non-blank lines seen)."""
    rng = np.random.default_rng([seed, 0x5A3])
    reservoir: list[bytes] = []
    seen = 0
    total = total_bytes(sources)
    with tqdm(total=total, unit="B", unit_scale=True, desc="sample", disable=not progress,
              file=sys.stderr) as bar:
        for block, _, consumed in chunks(sources):
            lines = [ln for ln in block.split(b"\n") if ln.strip() and len(ln) <= MAX_SAMPLE_LINE_BYTES
                     and not (exclude and exclude(ln))]
            fill = min(max(k - len(reservoir), 0), len(lines))
            reservoir.extend(lines[:fill])
            rest = len(lines) - fill
            if rest:
                t = np.arange(seen + fill + 1, seen + len(lines) + 1, dtype=np.float64)
                j = (rng.random(rest) * t).astype(np.int64)  # uniform in [0, t): replace slot j if j < k
                for idx in np.flatnonzero(j < k):
                    reservoir[j[idx]] = lines[fill + idx]
            seen += len(lines)
            bar.update(consumed)
    sample = []
    for line in reservoir:
        try:
            sample.append(line.decode("utf-8").strip())
        except UnicodeDecodeError:
            pass  # counted during encoding, where every line is looked at
    return sample, seen


def train_spm(sample: list[str], prefix: Path, vocab_size: int, character_coverage: float,
              threads: int, seed: int, model_type: str = "unigram") -> None:
    # The sample is already bounded and random: SentencePiece must use all of it, in order.
    kwargs = dict(
        model_prefix=str(prefix), model_type=model_type, vocab_size=vocab_size,
        character_coverage=character_coverage, bos_id=tokens.BOS, pad_id=tokens.PAD, eos_id=tokens.EOS,
        unk_id=tokens.UNK, bos_piece="<s>", pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
        user_defined_symbols=["<mask>"], input_sentence_size=0, shuffle_input_sentence=False,
        max_sentence_length=MAX_SAMPLE_LINE_BYTES, num_threads=threads, hard_vocab_limit=False,
        minloglevel=2)
    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(sample), **kwargs)
    except RuntimeError as e:
        raise ValueError(f"SentencePiece training on {len(sample)} sampled lines failed ({e}); check "
                         "--vocab-size and --character-coverage") from e


def check_spm(path: Path) -> int:
    """Vocabulary size of a model whose special ids match mm_ds.tokens; a clear error otherwise."""
    try:
        sp = spm.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as e:
        raise ValueError(f"SentencePiece model {path} is unreadable ({e}); pass a valid --spm-model") from e
    got, want = special_ids(sp), dict(zip(tokens.SPECIAL_PIECES, tokens.SPECIAL_IDS))
    if got != want:
        raise ValueError(f"SentencePiece model {path} has special ids {got}, this project needs {want} "
                         "(train with bos_id=0 pad_id=1 eos_id=2 unk_id=3 user_defined_symbols=<mask>), "
                         "or omit --spm-model to let prepare train one")
    return sp.get_piece_size()


def special_ids(sp: spm.SentencePieceProcessor) -> dict[str, int]:
    """The id the model gives each special piece, <s> <pad> </s> <unk> <mask> (-1: none)."""
    return dict(zip(tokens.SPECIAL_PIECES, (sp.bos_id(), sp.pad_id(), sp.eos_id(), sp.unk_id(),
                                            sp.piece_to_id("<mask>"))))


def has_our_ids(sp: spm.SentencePieceProcessor) -> bool:
    """The special ids are mm_ds.tokens' (0..4), so the model's ids can be a checkpoint's embedding rows."""
    return tuple(special_ids(sp).values()) == tokens.SPECIAL_IDS


def pieces(sp: spm.SentencePieceProcessor | str | Path) -> list[str]:
    """Every piece of a SentencePiece model (or model file) in id order: the vocabulary as surgery's
    overlap initialisation and the tokenizer conversions compare it."""
    if not isinstance(sp, spm.SentencePieceProcessor):
        sp = spm.SentencePieceProcessor(model_file=str(sp))
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
