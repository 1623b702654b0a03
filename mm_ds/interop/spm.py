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

The model file is read and written as `sentencepiece_model_pb2.ModelProto` (needs `protobuf`).
"""

from __future__ import annotations

from pathlib import Path

import sentencepiece as spm
from google.protobuf.message import DecodeError
from sentencepiece import sentencepiece_model_pb2 as pb

from ..data.tokenizer import has_our_ids, pieces
from ..tokens import SPECIAL_PIECES


class InteropError(ValueError):
    """A foreign checkpoint or tokenizer that cannot be imported or exported; the message names file and key."""


Piece = pb.ModelProto.SentencePiece
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED = (Piece.NORMAL, Piece.UNKNOWN, Piece.CONTROL, Piece.USER_DEFINED,
                                                  Piece.UNUSED)
SPECIAL_TYPES = {"<s>": CONTROL, "<pad>": CONTROL, "</s>": CONTROL, "<unk>": UNKNOWN, "<mask>": USER_DEFINED}
FAIRSEQ_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # fairseq Dictionary's first four rows; <mask> is appended
# TrainerSpec fields that record the special ids: rewritten with the pieces' new order
TRAINER_IDS = {"unk_id": "<unk>", "bos_id": "<s>", "eos_id": "</s>", "pad_id": "<pad>"}


def read_proto(path: str | Path) -> pb.ModelProto:
    """The SentencePiece model file as its protobuf message."""
    proto = pb.ModelProto()
    try:
        proto.ParseFromString(Path(path).read_bytes())
    except DecodeError as e:
        raise InteropError(f"{path}: not a SentencePiece model ({e})") from e
    return proto


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
    proto = read_proto(src)
    by_name = {p.piece: p for p in proto.pieces}
    body, seen, unused = [], set(), 0
    for i, name in enumerate(rows):
        if i < 5:
            body.append(Piece(piece=name, score=0.0, type=SPECIAL_TYPES[name]))
        elif name in seen or name not in by_name or by_name[name].type in (UNKNOWN, CONTROL):
            body.append(Piece(piece=f"<mm-ds-unused-{i}>", score=0.0, type=UNUSED))
            unused += 1
        else:  # score and type unchanged: segmentation is the source's
            p = by_name[name]
            body.append(Piece(piece=name, score=p.score, type=p.type))
        seen.add(name)
    dropped = sum(1 for name, p in by_name.items() if name not in seen and p.type not in (UNKNOWN, CONTROL)
                  and name not in SPECIAL_PIECES)
    del proto.pieces[:]
    proto.pieces.extend(body)
    proto.trainer_spec.vocab_size = len(rows)
    for field, piece in TRAINER_IDS.items():
        setattr(proto.trainer_spec, field, SPECIAL_PIECES.index(piece))
    # Drop what this pb2 does not model: the self-test samples (ModelProto field 4) were written for the
    # old ids, and older SentencePiece releases check them on load.
    proto.DiscardUnknownFields()
    Path(out).write_bytes(proto.SerializeToString())
    sp = load(out)
    if not has_our_ids(sp) or sp.get_piece_size() != len(rows):
        raise InteropError(f"internal: the converted tokenizer {out} does not have mm-ds's special ids")
    return {"pieces": len(rows), "unused_rows": unused, "dropped_pieces": dropped}
