"""A language's SentencePiece model as a `transformers` tokenizer, for `mm-ds export`.

mm-ds's ids are the SentencePiece ids (<s>=0 <pad>=1 </s>=2 <unk>=3 <mask>=4, then the pieces): exactly the
vocabulary order of transformers' (>= 5) `XLMRobertaTokenizer`, which keeps XLM-R's fairseq offset in its
vocabulary list rather than in code. So a unigram model becomes an `XLMRobertaTokenizer` whose vocabulary is
the model's pieces in id order. That class is unigram-only; a BPE model (the tiny recipes') becomes the
generic `TokenizersBackend` with the same pipeline and a BPE model.

Both give mm-ds's encoding (mm_ds.data.features): `<s> A </s>` and `<s> A </s></s> B </s>`. Normalisation is
the model's precompiled charsmap, whitespace splitting and the ▁ prefix are the pre-tokenizer: SentencePiece's
defaults, the ones `mm-ds prepare` trains with. `check` compares the two encodings on the model's own pieces,
so a model trained with other options is caught at export rather than in a user's pipeline.
"""

from __future__ import annotations

from pathlib import Path

import sentencepiece as spm

from ..data.tokenizer import load_tokenizer_json
from ..tokens import SPECIAL_IDS, SPECIAL_PIECES
from .spm import read_proto

UNIGRAM, BPE = 1, 2  # TrainerSpec.ModelType
# Keyword arguments of a transformers tokenizer naming mm-ds's special pieces (mm_ds.tokens)
SPECIAL_TOKENS = {"bos_token": "<s>", "cls_token": "<s>", "pad_token": "<pad>", "eos_token": "</s>",
                  "sep_token": "</s>", "unk_token": "<unk>", "mask_token": "<mask>"}


class TokenizerMismatch(ValueError):
    """The transformers tokenizer does not reproduce SentencePiece's ids; the message shows the first text."""


def build(spm_path: str | Path, max_length: int):
    """The transformers tokenizer of `spm_path` (mm-ds's special ids), `model_max_length=max_length`."""
    from transformers import TokenizersBackend, XLMRobertaTokenizer

    proto = read_proto(spm_path)
    kind = proto.trainer_spec.model_type or UNIGRAM
    charsmap = proto.normalizer_spec.precompiled_charsmap or None
    prefix = proto.normalizer_spec.add_dummy_prefix
    kw = SPECIAL_TOKENS | {"model_max_length": max_length, "add_prefix_space": prefix}
    if kind == UNIGRAM:
        vocab = [(p.piece, p.score) for p in proto.pieces]
        return XLMRobertaTokenizer(vocab=vocab, _spm_precompiled_charsmap=charsmap, **kw)
    if kind == BPE:
        return TokenizersBackend(tokenizer_object=_bpe_backend(proto, charsmap, prefix), **kw)
    raise TokenizerMismatch(f"{spm_path}: SentencePiece model_type {kind} has no transformers tokenizer here "
                            f"(unigram and bpe do)")


def _bpe_backend(proto, charsmap: bytes | None, prefix: bool):
    """XLMRobertaTokenizer's pipeline around a BPE model whose merges follow the pieces' order."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers.tokenization_utils_base import generate_merges

    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=generate_merges(vocab), unk_token="<unk>", fuse_unk=True,
                               byte_fallback=proto.trainer_spec.byte_fallback))
    if charsmap:
        tok.normalizer = normalizers.Precompiled(charsmap)
    scheme = "always" if prefix else "never"
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme)])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme)
    bos, eos = (SPECIAL_PIECES[0], SPECIAL_IDS[0]), (SPECIAL_PIECES[2], SPECIAL_IDS[2])
    tok.post_processor = processors.TemplateProcessing(single=f"{bos[0]} $A {eos[0]}",
                                                       pair=f"{bos[0]} $A {eos[0]} {eos[0]} $B {eos[0]}",
                                                       special_tokens=[bos, eos])
    return tok


def check(tokenizer, spm_path: str | Path, lines: int = 64) -> None:
    """Raise TokenizerMismatch unless `tokenizer` encodes as SentencePiece plus <s> ... </s> does, on text
    made of the model's pieces (every piece appears, runs of pieces cross word boundaries)."""
    sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    words = [sp.id_to_piece(i).replace("▁", " ") for i in range(len(SPECIAL_IDS), sp.get_piece_size())
             if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i))]
    step = max(1, len(words) // lines)
    texts = ["".join(words[i:i + 2 * step]) for i in range(0, len(words), step)]
    for text in texts:
        want = [SPECIAL_IDS[0], *sp.encode(text), SPECIAL_IDS[2]]
        got = tokenizer(text, verbose=False).input_ids  # no length warning: this is not model input
        if got != want:
            raise TokenizerMismatch(f"{spm_path}: for {text!r} the transformers tokenizer gives {got}, "
                                    f"SentencePiece {want}")


def from_json(path: str | Path, max_length: int):
    """A tokenizer.json whose ids are the embedding rows (an imported source's own: interop.hf_vocab) as a
    transformers tokenizer, `model_max_length=max_length`."""
    from transformers import TokenizersBackend

    return TokenizersBackend(tokenizer_object=load_tokenizer_json(path), model_max_length=max_length,
                             **SPECIAL_TOKENS)
