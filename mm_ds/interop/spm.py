"""SentencePiece models whose ids equal a checkpoint's embedding rows, with mm-ds's special ids.

mm-ds assumes a language's SentencePiece ids *are* its embedding rows, with <s>=0 <pad>=1 </s>=2 <unk>=3
<mask>=4 (mm_ds.tokens). Foreign checkpoints keep a different layout:

    HF XLM-R       spm ids 0..2 = <unk> <s> </s>; embedding row = spm id + 1 (fairseq offset), row 1 = <pad>,
                   the last row = <mask>
    fairseq        rows 0..3 = <s> <pad> </s> <unk>, then dict.txt's pieces in file order (by frequency,
                   not spm order), then <mask>

An import describes the source layout as `rows` (the piece of every embedding row), moves the five special
rows to 0..4 keeping the others in order (`our_layout`), permutes the language-specific tensors the same way
and writes a SentencePiece model with the pieces in that order (`write_model`). Each piece keeps its score
and type, so segmentation is unchanged; the forward pass is the source's up to that id permutation.

The model file is rewritten at the protobuf wire level (the few fields involved are stable since
SentencePiece 0.1), so no `protobuf` package is needed.
"""

from __future__ import annotations

import struct
from pathlib import Path

import sentencepiece as spm

from ..data.tokenizer import has_our_ids, pieces
from ..tokens import SPECIAL_PIECES


class InteropError(ValueError):
    """A foreign checkpoint or tokenizer that cannot be imported or exported; the message names file and key."""


# SentencePiece piece types (sentencepiece_model.proto)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED = 1, 2, 3, 4, 5
SPECIAL_TYPES = {"<s>": CONTROL, "<pad>": CONTROL, "</s>": CONTROL, "<unk>": UNKNOWN, "<mask>": USER_DEFINED}
FAIRSEQ_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # fairseq Dictionary's first four rows; <mask> is appended

# ModelProto fields: 1 pieces (repeated SentencePiece), 2 trainer_spec, 4 self_test_data.
# SentencePiece fields: 1 piece, 2 score (float), 3 type. TrainerSpec: 4 vocab_size, 40..43 unk/bos/eos/pad id.
_TRAINER_IDS = {4: None, 40: "<unk>", 41: "<s>", 42: "</s>", 43: "<pad>"}


# ---------------------------------------------------------------- protobuf wire format (the few bits we need)

def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _varint(v: int) -> bytes:
    v &= (1 << 64) - 1  # negative int32 fields are 10-byte varints
    out = bytearray()
    while True:
        b, v = v & 0x7F, v >> 7
        out.append(b | 0x80 if v else b)
        if not v:
            return bytes(out)


def _records(buf: bytes, where: str):
    """(field, wire type, value, raw bytes of the whole record) for each top-level record of a message."""
    i = 0
    while i < len(buf):
        start = i
        key, i = _read_varint(buf, i)
        field, wt = key >> 3, key & 7
        if wt == 0:
            val, i = _read_varint(buf, i)
        elif wt == 1:
            val, i = buf[i:i + 8], i + 8
        elif wt == 2:
            n, i = _read_varint(buf, i)
            val, i = buf[i:i + n], i + n
        elif wt == 5:
            val, i = buf[i:i + 4], i + 4
        else:
            raise InteropError(f"{where}: not a SentencePiece model (protobuf wire type {wt})")
        if i > len(buf):
            raise InteropError(f"{where}: truncated SentencePiece model")
        yield field, wt, val, buf[start:i]


def _field(num: int, wt: int, payload: bytes) -> bytes:
    key = _varint(num << 3 | wt)
    return key + (_varint(len(payload)) + payload if wt == 2 else payload)


def _piece(name: str, score: bytes, type_: int) -> bytes:
    body = _field(1, 2, name.encode()) + _field(2, 5, score) + _field(3, 0, _varint(type_))
    return _field(1, 2, body)


def read_pieces(path: str | Path) -> list[tuple[str, bytes, int]]:
    """(piece, score as its 4 raw bytes, type) in id order."""
    out = []
    for field, _, val, _ in _records(Path(path).read_bytes(), str(path)):
        if field == 1:
            name, score, type_ = "", struct.pack("<f", 0.0), NORMAL
            for f, _, v, _ in _records(val, str(path)):
                if f == 1:
                    name = v.decode()
                elif f == 2:
                    score = v
                elif f == 3:
                    type_ = v
            out.append((name, score, type_))
    return out


# ---------------------------------------------------------------- source layouts

def load(path: str | Path) -> spm.SentencePieceProcessor:
    try:
        return spm.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as e:
        raise InteropError(f"{path} is not a readable SentencePiece model: {e}") from e


def rows_of(path: str | Path, vocab_size: int, weights: str) -> list[str]:
    """The piece of every embedding row of a checkpoint shipping this SentencePiece model with no dict.txt:
    mm-ds's own layout (ids = rows), or HF XLM-R's fairseq offset. `weights` names the embedding tensor."""
    sp = load(path)
    n = sp.get_piece_size()
    if has_our_ids(sp):
        rows = pieces(sp)
        layout = "mm-ds (ids = rows)"
    elif (sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, 1, 2) and sp.pad_id() < 0:
        # XLM-R: row 0..3 = <s> <pad> </s> <unk>, row = spm id + 1 for the others, <mask> last
        rows = FAIRSEQ_SPECIALS + [sp.id_to_piece(i) for i in range(3, n)] + ["<mask>"]
        layout = "fairseq offset (XLM-R: row = spm id + 1, <pad> row 1, <mask> last)"
    else:
        raise InteropError(f"{path}: SentencePiece special ids <s>={sp.bos_id()} <pad>={sp.pad_id()} "
                           f"</s>={sp.eos_id()} <unk>={sp.unk_id()} <mask>={sp.piece_to_id('<mask>')} match "
                           f"neither mm-ds's layout (0, 1, 2, 3, 4) nor XLM-R's (<unk>=0 <s>=1 </s>=2, no <pad>); "
                           f"pass --tokenizer with a model whose ids equal the embedding rows")
    if len(rows) != vocab_size:
        raise InteropError(f"tokenizer {path} ({n} pieces, {layout} layout) gives {len(rows)} embedding rows, "
                           f"but {weights} has {vocab_size}: the tokenizer belongs to another model")
    return rows


def rows_of_fairseq_dict(dict_path: str | Path) -> list[str]:
    """fairseq Dictionary order: <s> <pad> </s> <unk>, dict.txt's pieces in file order, then <mask>."""
    pieces = []
    for n, line in enumerate(Path(dict_path).read_text(encoding="utf-8").splitlines(), start=1):
        line = line.rstrip()
        if line.endswith(" #fairseq:overwrite"):
            line = line[: -len(" #fairseq:overwrite")]
        if not line:
            continue
        piece, sep, count = line.rpartition(" ")
        if not sep or not count.lstrip("-").isdigit():
            raise InteropError(f"{dict_path}:{n}: expected '<piece> <count>', got {line!r}")
        pieces.append(piece)
    return FAIRSEQ_SPECIALS + pieces + ["<mask>"]


def our_layout(rows: list[str], where: str) -> list[int]:
    """Source row of each new row: the five specials first (mm_ds.tokens order), the rest in source order."""
    first: dict[str, int] = {}
    for i, p in enumerate(rows):
        first.setdefault(p, i)
    missing = [s for s in SPECIAL_PIECES if s not in first]
    if missing:
        raise InteropError(f"{where}: no embedding row for {', '.join(missing)}")
    special_rows = [first[s] for s in SPECIAL_PIECES]
    taken = set(special_rows)
    return special_rows + [i for i in range(len(rows)) if i not in taken]


def write_model(src: str | Path, rows: list[str], out: str | Path) -> dict:
    """Write `src` with its pieces reordered to `rows` (already in mm-ds layout: specials at 0..4).

    A row whose piece the model lacks (fairseq's madeupword padding, a duplicate) becomes an UNUSED piece:
    it keeps its row but is never produced. A model piece no row names is dropped (fairseq mapped it to
    <unk> anyway). Returns counts for the import report."""
    if tuple(rows[:5]) != SPECIAL_PIECES:
        raise InteropError(f"internal: rows must start with {SPECIAL_PIECES}, got {rows[:5]}")
    src = Path(src)
    buf = src.read_bytes()
    by_name = {name: (score, t) for name, score, t in read_pieces(src)}
    zero = struct.pack("<f", 0.0)
    body, seen, unused = [], set(), 0
    for i, name in enumerate(rows):
        if i < 5:
            body.append(_piece(name, zero, SPECIAL_TYPES[name]))
        elif name in seen or name not in by_name or by_name[name][1] in (UNKNOWN, CONTROL):
            body.append(_piece(f"<mm-ds-unused-{i}>", zero, UNUSED))
            unused += 1
        else:
            score, t = by_name[name]
            body.append(_piece(name, score, t))
        seen.add(name)
    dropped = sum(1 for name, (_, t) in by_name.items() if name not in seen and t not in (UNKNOWN, CONTROL)
                  and name not in SPECIAL_PIECES)
    parts = []
    for field, wt, val, raw in _records(buf, str(src)):
        if field == 1:
            if body:  # the pieces go where the first one was
                parts.extend(body)
                body = []
        elif field == 2:  # trainer spec: record the new special ids and size
            spec = b"".join(r for f, _, _, r in _records(val, str(src)) if f not in _TRAINER_IDS)
            spec += _field(4, 0, _varint(len(rows)))
            spec += b"".join(_field(f, 0, _varint(SPECIAL_PIECES.index(p))) for f, p in _TRAINER_IDS.items() if p)
            parts.append(_field(2, 2, spec))
        elif field == 4:  # self-test samples were written for the old model: drop them
            continue
        else:
            parts.append(raw)
    Path(out).write_bytes(b"".join(parts))
    sp = load(out)
    if not has_our_ids(sp) or sp.get_piece_size() != len(rows):
        raise InteropError(f"internal: the converted tokenizer {out} does not have mm-ds's special ids")
    return {"pieces": len(rows), "unused_rows": unused, "dropped_pieces": dropped}
