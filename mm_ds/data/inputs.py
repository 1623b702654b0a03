"""`mm-ds prepare`'s inputs: file paths, globs and `datasets` specs, read as blocks of whole lines.

    file / glob   UTF-8 text, optionally `.gz`, `.xz` or `.bz2` compressed, in CC-100 layout: one
                  paragraph/sentence per line, a blank line between documents; every file starts a document.
                  A line that is not text (invalid UTF-8, or control bytes such as NUL) is skipped and
                  counted; a file whose first 64 KiB are mostly such lines (a binary, another encoding) is
                  refused before any work, and one that is mostly such lines throughout when it is encoded.
    hf:NAME[:CONFIG][:SPLIT][:COLUMN]   a Hugging Face `datasets` source, streamed (needs network)
    hf-disk:PATH[:SPLIT][:COLUMN]       a dataset saved with `Dataset.save_to_disk` (offline)

Each row of a `datasets` source is one document; newlines inside a row separate its lines. Everything is
read in ~1 MiB blocks (`chunks`), never whole.
"""

from __future__ import annotations

import bz2
import codecs
import glob
import gzip
import lzma
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CHUNK_BYTES = 1 << 20  # per worker task: large enough to amortise IPC, small enough to keep 2 cores busy
SNIFF_BYTES = 1 << 16  # what `resolve_inputs` reads of each file to tell text from a binary
CONTROL = bytes(b for b in range(32) if b not in b"\t\n\v\f\r")
"""Bytes that text does not hold (NUL and the other C0 controls but whitespace): a line with one is not text."""
_DECOMPRESSORS = {".gz": lambda f: gzip.GzipFile(fileobj=f, mode="rb"), ".xz": lzma.LZMAFile,
                  ".bz2": bz2.BZ2File}  # each wraps an open binary file, so progress can follow raw.tell()


@dataclass(frozen=True)
class InputSource:
    """One resolved input: a local file, or a `datasets` spec (origin 'hf' / 'hf-disk')."""
    origin: str  # "file" | "hf" | "hf-disk"
    path: str  # file path, dataset name or dataset directory
    config: str | None = None
    split: str = "train"
    column: str = "text"

    def describe(self) -> str:
        if self.origin == "file":
            return self.path
        return f"{self.origin}:{self.path}:{self.config or ''}:{self.split}:{self.column}"

    def size(self) -> int:
        return os.path.getsize(self.path) if self.origin == "file" else 0


def resolve_inputs(inputs: list[str]) -> list[InputSource]:
    """Expand globs and parse dataset specs; fail on anything missing or empty before work starts."""
    if not inputs:
        raise ValueError("no inputs given; pass --input with text files, globs or hf:NAME specs")
    sources: list[InputSource] = []
    for spec in inputs:
        if spec.startswith("hf:"):
            name, config, split, column = (spec[3:].split(":") + ["", "", ""])[:4]
            if not name:
                raise ValueError(f"input {spec!r}: expected hf:NAME[:CONFIG][:SPLIT][:COLUMN]")
            sources.append(InputSource("hf", name, config or None, split or "train", column or "text"))
        elif spec.startswith("hf-disk:"):
            path, split, column = (spec[8:].split(":") + ["", ""])[:3]
            if not os.path.isdir(path):
                raise FileNotFoundError(f"input {spec!r}: {path} is not a directory saved with "
                                        "datasets' save_to_disk")
            sources.append(InputSource("hf-disk", path, None, split or "train", column or "text"))
        else:
            paths = sorted(glob.glob(os.path.expanduser(spec))) if glob.has_magic(spec) else [spec]
            if not paths:
                raise FileNotFoundError(f"input pattern {spec!r} matches no file; check --input")
            for p in paths:
                if not os.path.isfile(p):
                    raise FileNotFoundError(f"input file {p} does not exist; check --input")
                if os.path.getsize(p) == 0:
                    raise ValueError(f"input file {p} is empty; remove it from --input")
                _check_text(p)
                sources.append(InputSource("file", os.path.abspath(p)))
    return sources


def not_text_error(path: str, lines: int, bad: int, where: str) -> ValueError | None:
    """The refusal of an input of which most of `lines` non-blank lines (`where`) are not text; None if it is text."""
    if bad * 2 <= lines:
        return None
    return ValueError(f"input file {path} is not UTF-8 text: {bad} of the {lines} non-blank lines {where} are not "
                      f"(invalid UTF-8, or control bytes such as NUL: a binary file, or another encoding?); remove it "
                      f"from --input, or convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8)")


def _check_text(path: str) -> None:
    """Refuse a file whose first SNIFF_BYTES (decompressed) are mostly not text, before any work."""
    opener = _DECOMPRESSORS.get(Path(path).suffix)
    try:
        with open(path, "rb") as raw:
            head = (opener(raw) if opener else raw).read(SNIFF_BYTES)
    except (EOFError, OSError, lzma.LZMAError) as e:
        raise ValueError(f"input file {path} cannot be read/decompressed ({e}); fix or remove it from --input") from e
    if len(head) == SNIFF_BYTES:  # cut short, maybe inside a character: judge the whole ones
        decoder = codecs.getincrementaldecoder("utf-8")()
        try:
            decoder.decode(head, final=False)
            head = head[:len(head) - len(decoder.getstate()[0])]
        except UnicodeDecodeError:
            pass  # not UTF-8 before the end either
    lines, bad = split_lines(head)
    nonblank = sum(bool(line.strip()) for line in lines) + bad
    if error := not_text_error(path, nonblank, bad, f"in its first {len(head):,} bytes"):
        raise error


def _file_chunks(path: str, chunk_bytes: int) -> Iterator[tuple[bytes, bool, int]]:
    """(block of whole lines, starts a new input, compressed bytes consumed) for one file."""
    opener = _DECOMPRESSORS.get(Path(path).suffix)
    with open(path, "rb") as raw:
        stream = opener(raw) if opener else raw
        first, pos = True, 0
        try:
            while block := stream.read(chunk_bytes):
                if not block.endswith(b"\n"):
                    block += stream.readline()  # never cut a line between two chunks
                new_pos = raw.tell()
                yield block, first, new_pos - pos
                first, pos = False, new_pos
        except (EOFError, OSError, lzma.LZMAError) as e:
            raise ValueError(f"input file {path} cannot be read/decompressed ({e}); "
                             "fix or remove it from --input") from e


def _dataset_rows(src: InputSource) -> Iterator[str]:
    import datasets  # only needed for hf inputs; keeps `mm-ds prepare` on files import-light

    if src.origin == "hf-disk":
        ds = datasets.load_from_disk(src.path)
        if isinstance(ds, datasets.DatasetDict):
            if src.split not in ds:
                raise ValueError(f"{src.describe()}: split {src.split!r} not in {list(ds)}")
            ds = ds[src.split]
    else:
        try:
            ds = datasets.load_dataset(src.path, src.config, split=src.split, streaming=True)
        except Exception as e:  # datasets raises many types (network, missing config, bad split)
            raise ValueError(f"input {src.describe()}: cannot load it ({type(e).__name__}: {e}); hf: inputs "
                             "need network access, or save the dataset and pass hf-disk:PATH") from e
    columns = ds.column_names
    if columns is not None and src.column not in columns:
        raise ValueError(f"{src.describe()}: no column {src.column!r} (columns: {columns}); "
                         "name it as the last field of the spec")
    for row in ds:
        yield row[src.column] or ""


def _dataset_chunks(src: InputSource, chunk_bytes: int) -> Iterator[tuple[bytes, bool, int]]:
    """Rows become documents in CC-100 layout (row lines, then a blank line), batched into blocks."""
    parts: list[bytes] = []
    size, first = 0, True
    for text in _dataset_rows(src):
        data = text.strip("\n").encode("utf-8", "surrogatepass") + b"\n\n"
        parts.append(data)
        size += len(data)
        if size >= chunk_bytes:
            yield b"".join(parts), first, size
            parts, size, first = [], 0, False
    if parts:
        yield b"".join(parts), first, size


def total_bytes(sources: list[InputSource]) -> int | None:
    """Progress-bar total: input file bytes (compressed, as read); unknown with `datasets` sources."""
    return sum(s.size() for s in sources) if all(s.origin == "file" for s in sources) else None


def chunks(sources: list[InputSource], chunk_bytes: int | None = None) -> Iterator[tuple[bytes, bool, int]]:
    """(block of whole lines, starts a new input, bytes consumed) over all inputs, in order."""
    chunk_bytes = chunk_bytes or CHUNK_BYTES  # read at call time: tests shrink it to cut many chunks
    for src in sources:
        yield from (_file_chunks(src.path, chunk_bytes) if src.origin == "file"
                    else _dataset_chunks(src, chunk_bytes))


def is_text(line: bytes) -> bool:
    """Valid UTF-8 without control bytes (CONTROL)."""
    if len(line.translate(None, CONTROL)) != len(line):
        return False
    try:
        line.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def split_lines(block: bytes) -> tuple[list[str], int]:
    """Lines of a block, unstripped; lines that are not text (`is_text`) are dropped and counted."""
    if block.endswith(b"\n"):
        block = block[:-1]  # the final newline terminates the last line, it does not open a blank one
    if len(block.translate(None, CONTROL)) == len(block):
        try:
            return block.decode("utf-8").split("\n"), 0
        except UnicodeDecodeError:
            pass
    raw = block.split(b"\n")
    lines = [line.decode("utf-8") for line in raw if is_text(line)]
    return lines, len(raw) - len(lines)
