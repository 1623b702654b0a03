"""A language's tokenizer: a SentencePiece model trained on a sample of `mm-ds prepare`'s inputs, checked for
mm-ds's special ids, read back as its list of pieces; or a source model's own Hugging Face tokenizer.

Training: a deterministic reservoir sample of `sample_sentences` non-blank lines (vectorised Algorithm R,
seeded), then a unigram model (as XLM-R), nmt_nfkc normalisation, ids fixed by mm_ds.tokens (<s>=0 <pad>=1
</s>=2 <unk>=3, user-defined <mask>=4) so special ids line up across languages. The vocabulary size is an
upper bound (hard_vocab_limit=False): a corpus too small to reach it gets the largest vocabulary
SentencePiece can build.

A source model need not tokenize with SentencePiece (roberta-base: byte-level BPE). `mm-ds import` then writes
its own `tokenizers` tokenizer with the ids renumbered to the embedding rows (mm_ds.interop.hf_vocab), a
`tokenizer.json`; every function here that takes a tokenizer file reads either kind (`is_tokenizer_json`):
prepare encodes MINIPOST's source text with it, and `pieces` spells its vocabulary as SentencePiece does, so
Step 2's overlap initialisation compares pieces across kinds (see `pieces`).
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from itertools import chain
from pathlib import Path

import numpy as np
import sentencepiece as spm
from tqdm import tqdm

from mm_ds import tokens
from mm_ds.data.inputs import InputSource, chunks, is_text, total_bytes

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
    # Lines that are not text are counted during encoding, where every line is looked at.
    return [line.decode("utf-8").strip() for line in reservoir if is_text(line)], seen


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
        raise ValueError(f"SentencePiece training on {len(sample)} sampled lines failed ({e}); check the "
                         f"vocabulary size ({vocab_size}) and the character coverage ({character_coverage})") from e


def load_spm(path: str | Path) -> spm.SentencePieceProcessor:
    """A SentencePiece model, loaded once per process per content: a 50k-piece model takes ~40 ms to load and
    ~1 ms to read, and prepare loads it twice (the check of the file named, then the encoder of its copy)."""
    return _load_spm(Path(path).read_bytes())


@functools.lru_cache(maxsize=4)
def _load_spm(model: bytes) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_proto=model)  # encoding is const in C++: threads may share it


def check_spm(path: Path) -> int:
    """Vocabulary size of a model whose special ids match mm_ds.tokens; a clear error otherwise."""
    try:
        sp = load_spm(path)
    except (OSError, RuntimeError) as e:
        raise ValueError(f"SentencePiece model {path} is unreadable ({e})") from e
    got, want = special_ids(sp), dict(zip(tokens.SPECIAL_PIECES, tokens.SPECIAL_IDS))
    if got != want:
        raise ValueError(f"SentencePiece model {path} has special ids {got}, this project needs {want}: use a "
                         f"model `mm-ds prepare` trained, or the one `mm-ds import` wrote for a foreign model "
                         f"(it moves XLM-R's and fairseq's special ids)")
    return sp.get_piece_size()


def check_tokenizer(path: Path) -> int:
    """Vocabulary size of a SentencePiece model or a tokenizer.json with mm_ds.tokens' special ids."""
    if not is_tokenizer_json(path):
        return check_spm(path)
    vocab = _vocab(path)
    got = {p: vocab.get(p, -1) for p in tokens.SPECIAL_PIECES}
    if tuple(got.values()) != tokens.SPECIAL_IDS:
        raise ValueError(f"tokenizer {path} has special ids {got}, this project needs "
                         f"{dict(zip(tokens.SPECIAL_PIECES, tokens.SPECIAL_IDS))}: use the tokenizer.json "
                         f"`mm-ds import` wrote for the model (it renumbers the ids to the embedding rows)")
    return len(vocab)


def special_ids(sp: spm.SentencePieceProcessor) -> dict[str, int]:
    """The id the model gives each special piece, <s> <pad> </s> <unk> <mask> (-1: none)."""
    return dict(zip(tokens.SPECIAL_PIECES, (sp.bos_id(), sp.pad_id(), sp.eos_id(), sp.unk_id(),
                                            sp.piece_to_id("<mask>"))))


def has_our_ids(sp: spm.SentencePieceProcessor) -> bool:
    """The special ids are mm_ds.tokens' (0..4), so the model's ids can be a checkpoint's embedding rows."""
    return tuple(special_ids(sp).values()) == tokens.SPECIAL_IDS


def pieces(sp: spm.SentencePieceProcessor | str | Path) -> list[str]:
    """Every piece of a tokenizer (a SentencePiece model or its file, or a tokenizer.json) in id order: the
    vocabulary as surgery's overlap initialisation and the tokenizer conversions compare it.

    Pieces are spelled as SentencePiece spells them, whatever the tokenizer: the text a piece stands for, a
    space (a word start) as ▁, a byte that is no whole UTF-8 character as <0xNN> (SentencePiece's byte
    fallback). Two pieces are the same when they stand for the same text at the same place in a word, so a
    byte-level BPE's `ĠHaus` (GPT-2's bytes-as-characters, Ġ the space byte) and `ĠfÃ¼r` are SentencePiece's
    `▁Haus` and `▁für`, its `haus` is `haus`, and neither matches `▁haus`. Special tokens keep their name."""
    if isinstance(sp, spm.SentencePieceProcessor):
        return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    if is_tokenizer_json(sp):
        return _spelled(sp)
    return pieces(spm.SentencePieceProcessor(model_file=str(sp)))


# ---------------------------------------------------------------- a source model's Hugging Face tokenizer

def is_tokenizer_json(path: str | Path) -> bool:
    """A `tokenizers` file (JSON), not a SentencePiece model (a protobuf, whose first byte is never `{`)."""
    with open(path, "rb") as f:
        return f.read(1) == b"{"


def load_tokenizer_json(path: str | Path):
    """The `tokenizers.Tokenizer` of a tokenizer.json; a clear error when the library is missing."""
    try:
        from tokenizers import Tokenizer
    except ImportError as e:
        raise ValueError(f"{path} is a Hugging Face tokenizer: reading it needs the `tokenizers` package "
                         f"(pip install transformers)") from e
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises its own Exception type
        raise ValueError(f"{path} is not a readable tokenizer.json ({e})") from e


def _vocab(path: str | Path) -> dict[str, int]:
    return load_tokenizer_json(path).get_vocab(with_added_tokens=True)


def _byte_level(piece: str) -> str:
    """GPT-2's byte-level spelling (each byte as a printable character) -> SentencePiece's."""
    if any(c not in BYTE_OF for c in piece):  # not byte-level spelled: no text of the model's
        return piece
    raw = bytes(BYTE_OF[c] for c in piece)
    text = raw.decode("utf-8", "surrogateescape")  # a byte of no whole character -> U+DC80..U+DCFF
    return "".join(f"<0x{ord(c) - 0xDC00:02X}>" if 0xDC80 <= ord(c) <= 0xDCFF else c for c in text).replace(" ", "▁")


def _byte_chars() -> dict[str, int]:
    """GPT-2's table (transformers' `bytes_to_unicode`): printable bytes stand for themselves, the others for
    chr(256 + n) in byte order, so the space byte is `Ġ`."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


BYTE_OF = _byte_chars()
# How a tokenizer spells word starts, by the type of its decoder; a piece -> SentencePiece's spelling
SPELLINGS: dict[str, Callable[[str, dict], str]] = {
    "ByteLevel": lambda p, d: _byte_level(p),  # roberta-base, GPT-2: Ġ is a space byte, bytes as characters
    "Metaspace": lambda p, d: p.replace(d.get("replacement", "▁"), "▁"),  # XLM-R, any SentencePiece conversion
    "WordPiece": lambda p, d: p[len(d.get("prefix", "##")):] if p.startswith(d.get("prefix", "##")) else "▁" + p,
}


def spelling(tokenizer_json: dict) -> tuple[Callable[[str, dict], str], dict] | None:
    """(SPELLINGS row, decoder settings) of a tokenizer's JSON, None when mm-ds does not know its spelling."""
    decoder = tokenizer_json.get("decoder") or {}
    return (SPELLINGS[decoder["type"]], decoder) if decoder.get("type") in SPELLINGS else None


def _spelled(path: str | Path) -> list[str]:
    tok = load_tokenizer_json(path)
    known = spelling(json.loads(tok.to_str()))
    if known is None:
        raise ValueError(f"{path}: its decoder is not one whose pieces mm-ds can spell ({', '.join(SPELLINGS)})")
    spell, decoder = known
    model = tok.get_vocab(with_added_tokens=False)
    added = {t.content: t.special for t in tok.get_added_tokens_decoder().values()}
    by_id = {i: p for p, i in tok.get_vocab(with_added_tokens=True).items()}

    def spelled(p: str) -> str:  # an added token is matched as the raw text it is, before the model sees it
        if p in added and (added[p] or p not in model):
            return p if added[p] else p.replace(" ", "▁")
        return spell(p, decoder)
    return [spelled(by_id[i]) for i in range(len(by_id))]


Encoded = tuple[np.ndarray, np.ndarray]  # (every line's ids concatenated, int32; each line's id count, int64)


def encoder(path: str | Path) -> Callable[[list[str]], Encoded]:
    """Lines -> their ids as arrays (no <s> </s>), as `mm-ds prepare` encodes a corpus; a blank line -> no
    id. A SentencePiece model encodes a batch on the calling thread, with the GIL released (prepare runs one
    call per worker thread); a tokenizer.json batch on the `tokenizers` thread pool."""
    if not is_tokenizer_json(path):
        sp = load_spm(path)
        return _id_buffers(sp) or (lambda lines: _as_arrays(sp.encode(lines, out_type=int, num_threads=1)))
    tok = load_tokenizer_json(path)
    # stripped, as fairseq encoded RoBERTa's text (and as SentencePiece drops surrounding space itself)
    return lambda lines: _as_arrays([e.ids for e in tok.encode_batch([ln.strip() for ln in lines],
                                                                     add_special_tokens=False)])


def _as_arrays(ids: list[list[int]]) -> Encoded:
    lens = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    return np.fromiter(chain.from_iterable(ids), dtype=np.int32, count=int(lens.sum())), lens


_PROBE = ["Hello world .", "", "   ", "Ünïcödé 漢字 ☃ naïve", "x" * 300, " two  spaces\tand a tab "]


def _id_buffers(sp: spm.SentencePieceProcessor) -> Callable[[list[str]], Encoded] | None:
    """SentencePiece's batch encode into one int32 buffer per line (what its out_type='numpy' wraps, without
    an array per line), joined: no Python int per id. Those ints, built under the GIL, were a third of a
    one-thread encode and serialised prepare's worker threads. The call is the bindings' private one, so it
    must give `encode`'s ids on a probe; else None (the caller uses `encode`)."""
    raw = getattr(sp._processor, "_EncodeAsBufferBatch", None)

    def encode(lines: list[str]) -> Encoded:
        # (input, num_threads, thread_pool, enable_sampling, nbest_size, alpha, add_bos, add_eos, reverse)
        bufs = raw(lines, 1, None, False, -1, 0.1, False, False, False)
        lens = np.fromiter((memoryview(b).nbytes for b in bufs), dtype=np.int64, count=len(bufs)) // 4
        return np.frombuffer(b"".join(bufs), dtype=np.int32), lens
    try:
        got, want = encode(_PROBE), _as_arrays(sp.encode(_PROBE, out_type=int))
        if all(np.array_equal(a, b) for a, b in zip(got, want)):
            return encode
    except (TypeError, ValueError, AttributeError):  # another sentencepiece's bindings
        pass
    print(f"warning: sentencepiece {spm.__version__}'s buffer encode is not the one mm-ds knows; encoding "
          "through Python lists (slower; constraints.txt has the tested version)", file=sys.stderr)
    return None


def decoder(path: str | Path) -> Callable[[list[list[int]]], list[str]]:
    """Lists of ids -> their text: `encoder`'s inverse up to normalisation."""
    if not is_tokenizer_json(path):
        sp = spm.SentencePieceProcessor(model_file=str(path))
        return sp.decode
    tok = load_tokenizer_json(path)
    return lambda ids: tok.decode_batch(ids, skip_special_tokens=False)
