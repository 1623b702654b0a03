"""`mm-ds prepare`: SentencePiece training, sharded encoding, the on-disk format and its error cases."""

import gzip
import json
import lzma
import random
import re
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as pb

from mm_ds import tokens
from mm_ds.data import corpus as corpus_mod
from mm_ds.data import inputs as inputs_mod
from mm_ds.data.corpus import decode_shard_lines, prepare
from mm_ds.data.shards import TokenCorpus, shard_dtype

ALPHABET = "abcdefghijklmnopqrstuvwxyz"


def make_docs(n_docs: int, seed: int = 0, max_lines: int = 5, vocab: int = 400) -> list[list[str]]:
    """Random-word documents; lowercase ASCII with single spaces, so SentencePiece decodes them exactly."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(2, 8))) for _ in range(vocab)]
    return [[" ".join(rng.choices(words, k=rng.randint(2, 25))) for _ in range(rng.randint(1, max_lines))]
            for _ in range(n_docs)]


def cc100(docs: list[list[str]]) -> str:
    """CC-100 layout: one line per paragraph, a blank line after each document."""
    return "".join("\n".join(d) + "\n\n" for d in docs)


def decoded_docs(corpus_dir) -> list[list[str]]:
    """Documents back from the shards, using the document index."""
    docs: list[list[str]] = [[]]
    for line in decode_shard_lines(corpus_dir):
        if line == "":
            docs.append([])
        else:
            docs[-1].append(line)
    return docs


def looks_complete(path: Path) -> bool:
    return (path / "meta.json").exists()


def leftovers(tmp_path: Path, out: Path) -> list[str]:
    return [p.name for p in tmp_path.iterdir() if p.name.startswith(out.name)]


def test_round_trip_with_documents_and_shards(tmp_path, monkeypatch):
    # Tiny chunks and shards: document boundaries must survive chunk and shard cuts.
    monkeypatch.setattr(inputs_mod, "CHUNK_BYTES", 300)
    docs = make_docs(120)
    (tmp_path / "a.txt").write_text(cc100(docs[:70]))
    (tmp_path / "b.txt").write_text(cc100(docs[70:]).rstrip("\n"))  # no final newline: still a line
    out = tmp_path / "out"
    meta = prepare("xx", [str(tmp_path / "*.txt")], str(out), vocab_size=300, workers=1,
                   shard_tokens=2000, progress=False)
    assert meta["num_documents"] == 120 and meta["num_lines"] == sum(map(len, docs))
    assert meta["dtype"] == "uint16" and meta["skipped_lines"] == 0 and len(meta["shards"]) > 3
    assert decoded_docs(out) == docs
    c = TokenCorpus(out)
    assert c.vocab_size == 300 and c.num_documents == 120 and c.spm_model.is_file()
    assert all(c.line(i)[-1] == tokens.EOS for i in range(c.num_lines))
    assert (c.line_lengths() >= 2).all() and c.line_lengths().sum() == c.num_tokens
    starts = c.document_starts()
    assert starts[0] == 0 and (np.diff(starts) > 0).all()
    assert json.loads((out / "meta.json").read_text())["format_version"] == 1


def test_special_ids_are_fixed(tmp_path):
    (tmp_path / "a.txt").write_text(cc100(make_docs(40)))
    prepare("xx", [str(tmp_path / "a.txt")], str(tmp_path / "out"), vocab_size=200, workers=1, progress=False)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "out" / "spm.model"))
    assert [sp.id_to_piece(i) for i in tokens.SPECIAL_IDS] == list(tokens.SPECIAL_PIECES)
    assert (sp.bos_id(), sp.pad_id(), sp.eos_id(), sp.unk_id()) == (0, 1, 2, 3)
    assert sp.get_piece_size() == 200


def test_parallel_compressed_inputs_match_serial(tmp_path, monkeypatch):
    monkeypatch.setattr(inputs_mod, "CHUNK_BYTES", 500)
    docs = make_docs(90, seed=1)
    text = cc100(docs[:30]), cc100(docs[30:60]), cc100(docs[60:])
    (tmp_path / "a.txt").write_text(text[0])
    with gzip.open(tmp_path / "b.txt.gz", "wt") as f:
        f.write(text[1])
    with lzma.open(tmp_path / "c.txt.xz", "wt") as f:
        f.write(text[2])
    inputs = [str(tmp_path / n) for n in ("a.txt", "b.txt.gz", "c.txt.xz")]
    serial = prepare("xx", inputs, str(tmp_path / "s"), vocab_size=250, workers=1, progress=False)
    parallel = prepare("xx", inputs, str(tmp_path / "p"), vocab_size=250, workers=2,
                       spm_model=str(tmp_path / "s" / "spm.model"), progress=False)
    assert decoded_docs(tmp_path / "p") == docs
    assert parallel["num_tokens"] == serial["num_tokens"] and parallel["num_documents"] == 90
    for name in ("shard_00000.bin", "shard_00000.idx.npy", "shard_00000.docs.npy"):
        assert (tmp_path / "s" / name).read_bytes() == (tmp_path / "p" / name).read_bytes()


def test_undecodable_lines_are_skipped_and_counted(tmp_path, capsys):
    docs = make_docs(30, seed=2)
    raw = cc100(docs).encode().split(b"\n")
    raw.insert(3, b"caf\xe9 latin-1 line")
    raw.insert(10, b"\xff\xfe\xfd")
    (tmp_path / "a.txt").write_bytes(b"\n".join(raw))
    meta = prepare("xx", [str(tmp_path / "a.txt")], str(tmp_path / "out"), vocab_size=200, workers=1,
                   progress=False)
    assert meta["skipped_lines"] == 2
    assert "skipped 2 input lines that are not UTF-8 text" in capsys.readouterr().err
    assert decoded_docs(tmp_path / "out") == docs


def _binary(kind: str) -> bytes:
    rng = random.Random(7)
    if kind == "random":  # compressed or encrypted data, an image: invalid UTF-8 nearly everywhere
        return rng.randbytes(200_000)
    if kind == "gzip_named_txt":  # compressed text under a .txt name
        return gzip.compress(cc100(make_docs(400, seed=7)).encode(), mtime=0)
    # a numeric dump (.npy, .pt, an executable): readable bits between NUL-padded binary records
    return b"".join(b"record %d\x00\x00\x00\x01\x02\n" % i + rng.randbytes(20).replace(b"\n", b" ") + b"\n"
                    for i in range(3000))


@pytest.mark.parametrize("kind", ["random", "gzip_named_txt", "nul_padded"])
def test_a_binary_input_is_refused_naming_it(tmp_path, kind, capsys):
    """Before any work, nothing written: through `mm-ds prepare` as a user runs it, beside a text input."""
    from mm_ds import cli

    good, bad, out = tmp_path / "good.txt", tmp_path / "data.txt", tmp_path / "out"
    good.write_text(cc100(make_docs(20, seed=6)))
    bad.write_bytes(_binary(kind))
    rc = cli.main(["prepare", "--lang", "xx", "--input", str(good), "--input", str(bad), "--out", str(out),
                   "--vocab-size", "150", "--workers", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and f"mm-ds prepare: error: input file {bad} is not UTF-8 text: " in err, err
    assert re.search(r"non-blank lines in its first [\d,]+ bytes are not", err) and "remove it from --input" in err
    assert leftovers(tmp_path, out) == []


def test_an_input_that_turns_binary_after_its_head_is_refused_when_encoded(tmp_path):
    """Text for its first 64 KiB, then mostly NUL-padded records: refused at the end of the encoding pass, and
    the partial output is gone."""
    f, out = tmp_path / "mixed.txt", tmp_path / "out"
    head = cc100(make_docs(400, seed=8)).encode()
    assert len(head) > inputs_mod.SNIFF_BYTES
    f.write_bytes(head + b"\x00\x00 padding\n" * 40_000)
    with pytest.raises(ValueError, match=f"input file {f} is not UTF-8 text: 40000 of the .* non-blank lines "
                                         f"in the whole file are not"):
        prepare("xx", [str(f)], str(out), vocab_size=150, workers=1, progress=False)
    assert leftovers(tmp_path, out) == []
    assert inputs_mod.split_lines(b"ok\nnul\x00\n\xff\n") == (["ok"], 2)


def test_vocabulary_a_small_corpus_cannot_reach_shrinks_with_a_warning(tmp_path, capsys):
    (tmp_path / "a.txt").write_text(cc100(make_docs(20, seed=9, vocab=30)))
    meta = prepare("xx", [str(tmp_path / "a.txt")], str(tmp_path / "out"), vocab_size=20000, workers=1,
                   progress=False)
    assert "supports only" in capsys.readouterr().err
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "out" / "spm.model"))
    assert meta["vocab_size"] == sp.get_piece_size() < 20000
    assert meta["settings"]["vocab_size"] == 20000  # what was asked, so a re-run is recognised
    assert TokenCorpus(tmp_path / "out").vocab_size == meta["vocab_size"]


def test_shard_dtype_choice():
    assert shard_dtype(50000) == np.uint16 and shard_dtype(65536) == np.uint16
    assert shard_dtype(65537) == np.uint32 and shard_dtype(250002) == np.uint32
    with pytest.raises(ValueError, match="vocab-size"):
        shard_dtype(2**32 + 1)


def _pb_pieces(pieces: list[tuple[str, float]]) -> bytes:
    """A serialised ModelProto holding only NORMAL pieces: appended to a model file, it adds them."""
    return pb.ModelProto(pieces=[pb.ModelProto.SentencePiece(piece=p, score=s) for p, s in pieces]).SerializeToString()


def test_uint32_shards_for_large_vocabularies(tmp_path):
    # A real >65536-piece model needs far more text than a test has: append pieces to a small one
    # (repeated protobuf fields concatenate), whole-word pieces last so their ids exceed uint16.
    docs = make_docs(40, seed=3, vocab=60)
    (tmp_path / "a.txt").write_text(cc100(docs))
    prepare("xx", [str(tmp_path / "a.txt")], str(tmp_path / "small"), vocab_size=90, workers=1, progress=False)
    small = spm.SentencePieceProcessor(model_file=str(tmp_path / "small" / "spm.model"))
    words = sorted({w for d in docs for line in d for w in line.split()
                    if small.piece_to_id("\u2581" + w) == tokens.UNK})
    extra = _pb_pieces([(f"\u2581zz{i}q", -50.0) for i in range(66000)] + [("\u2581" + w, 0.0) for w in words])
    big = tmp_path / "big.model"
    big.write_bytes((tmp_path / "small" / "spm.model").read_bytes() + extra)
    meta = prepare("xx", [str(tmp_path / "a.txt")], str(tmp_path / "out"), spm_model=str(big), workers=1,
                   progress=False)
    assert meta["dtype"] == "uint32" and meta["vocab_size"] == small.get_piece_size() + 66000 + len(words)
    c = TokenCorpus(tmp_path / "out")
    assert c.dtype == np.uint32 and int(np.max(c.shard_tokens(0))) > 65535
    assert decoded_docs(tmp_path / "out") == docs


def test_hf_disk_dataset_rows_are_documents(tmp_path):
    datasets = pytest.importorskip("datasets")
    docs = make_docs(25, seed=4)
    datasets.Dataset.from_dict({"body": ["\n".join(d) for d in docs]}).save_to_disk(str(tmp_path / "ds"))
    meta = prepare("xx", [f"hf-disk:{tmp_path / 'ds'}::body"], str(tmp_path / "out"), vocab_size=200,
                   workers=1, progress=False)
    assert meta["num_documents"] == 25
    assert decoded_docs(tmp_path / "out") == docs
    with pytest.raises(ValueError, match="no column 'text'"):
        prepare("xx", [f"hf-disk:{tmp_path / 'ds'}"], str(tmp_path / "o2"), vocab_size=200, workers=1,
                progress=False)


def test_hf_specs_parse_without_network():
    (src,) = inputs_mod.resolve_inputs(["hf:cc100:de::content"])
    assert (src.origin, src.path, src.config, src.split, src.column) == ("hf", "cc100", "de", "train", "content")
    (src,) = inputs_mod.resolve_inputs(["hf:wikitext"])
    assert (src.config, src.split, src.column) == (None, "train", "text")


def test_same_settings_reuse_different_settings_refused(tmp_path):
    (tmp_path / "a.txt").write_text(cc100(make_docs(40, seed=5)))
    args = ("xx", [str(tmp_path / "a.txt")], str(tmp_path / "out"))
    first = prepare(*args, vocab_size=200, workers=1, progress=False)
    bin_file = tmp_path / "out" / "shard_00000.bin"
    mtime = bin_file.stat().st_mtime_ns
    assert prepare(*args, vocab_size=200, workers=1, progress=False) == first
    assert bin_file.stat().st_mtime_ns == mtime
    with pytest.raises(ValueError, match=r"different prepared corpus.*vocab_size.*choose another --out"):
        prepare(*args, vocab_size=150, workers=1, progress=False)
    assert TokenCorpus(tmp_path / "out").meta == first  # untouched


def test_leftover_partial_output_is_replaced(tmp_path):
    (tmp_path / "a.txt").write_text(cc100(make_docs(20, seed=8)))
    (tmp_path / "out.partial").mkdir()
    (tmp_path / "out.partial" / "shard_00000.bin").write_bytes(b"junk")
    prepare("xx", [str(tmp_path / "a.txt")], str(tmp_path / "out"), vocab_size=150, workers=1, progress=False)
    assert TokenCorpus(tmp_path / "out").num_documents == 20
    assert not (tmp_path / "out.partial").exists()


@pytest.mark.parametrize("case", ["missing", "glob", "empty_file", "blank_only", "dtype", "dir", "interrupted",
                                  "bad_spm"])
def test_errors_leave_nothing_that_looks_complete(tmp_path, monkeypatch, case):
    good = tmp_path / "good.txt"
    good.write_text(cc100(make_docs(20, seed=6)))
    out = tmp_path / "out"
    kwargs = dict(vocab_size=150, workers=1, progress=False)
    inputs = [str(good)]
    if case == "missing":
        inputs, exc, msg = [str(tmp_path / "nope.txt")], FileNotFoundError, "nope.txt does not exist"
    elif case == "glob":
        inputs, exc, msg = [str(tmp_path / "*.gz")], FileNotFoundError, "matches no file"
    elif case == "empty_file":
        (tmp_path / "empty.txt").write_text("")
        inputs, exc, msg = [str(good), str(tmp_path / "empty.txt")], ValueError, "empty.txt is empty"
    elif case == "blank_only":
        (tmp_path / "blank.txt").write_text("\n  \n\n")
        inputs, exc, msg = [str(tmp_path / "blank.txt")], ValueError, "no non-blank UTF-8 line"
    elif case == "dtype":
        kwargs["vocab_size"], exc, msg = 2**32 + 7, ValueError, "does not fit the largest shard dtype"
    elif case == "dir":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
        exc, msg = ValueError, "not empty but holds no prepared corpus"
    elif case == "interrupted":
        def boom(*a, **k):
            raise KeyboardInterrupt
        monkeypatch.setattr(corpus_mod.ShardWriter, "finish", boom)
        exc, msg = KeyboardInterrupt, None
    else:  # a SentencePiece model with SentencePiece's default ids (<unk>=0 <s>=1 </s>=2)
        spm.SentencePieceTrainer.train(input=str(good), model_prefix=str(tmp_path / "foreign"), vocab_size=100,
                                       minloglevel=2)
        kwargs["spm_model"], exc, msg = str(tmp_path / "foreign.model"), ValueError, "special ids"
    with pytest.raises(exc, match=msg):
        prepare("xx", inputs, str(out), **kwargs)
    assert not looks_complete(out)
    assert leftovers(tmp_path, out) == (["out"] if case == "dir" else [])


def test_token_corpus_rejects_missing_or_corrupt(tmp_path):
    with pytest.raises(FileNotFoundError, match="mm-ds prepare"):
        TokenCorpus(tmp_path / "absent")
    (tmp_path / "a.txt").write_text(cc100(make_docs(20, seed=7)))
    out = tmp_path / "out"
    prepare("xx", [str(tmp_path / "a.txt")], str(out), vocab_size=150, workers=1, progress=False)
    meta = json.loads((out / "meta.json").read_text())
    (out / "meta.json").write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(ValueError, match="format_version=99"):
        TokenCorpus(out)
    (out / "meta.json").write_text(json.dumps(meta))
    with open(out / "shard_00000.bin", "r+b") as f:
        f.truncate(10)
    with pytest.raises(ValueError, match="shard_00000.bin has 10 bytes"):
        TokenCorpus(out)


def test_real_text_small_vocab(tmp_path, shared_data):
    src = shared_data / "text" / "de.txt.xz"
    if not src.is_file():
        pytest.skip(f"{src} not found")
    with lzma.open(src, "rt", encoding="utf-8") as f:
        lines = [next(f).rstrip("\n") for _ in range(3000)]
    (tmp_path / "de.txt").write_text("\n".join(lines) + "\n")
    meta = prepare("de", [str(tmp_path / "de.txt")], str(tmp_path / "out"), vocab_size=2000, workers=2,
                   progress=False)
    assert meta["num_lines"] == sum(1 for ln in lines if ln.strip()) and meta["num_documents"] == 1
    back = list(decode_shard_lines(tmp_path / "out"))
    exact = sum(a == " ".join(b.split()) for a, b in zip(back, (ln for ln in lines if ln.strip())))
    assert exact / len(back) > 0.95  # NFKC and rare characters (<unk>) account for the rest


def test_the_heldout_slice_is_disjoint_from_training_and_deterministic(tmp_path, monkeypatch):
    """`--heldout F`: about F of the lines, chosen by their text alone, go to heldout.txt and never into the shards
    or the SentencePiece sample; the same with other chunk cuts and workers; documents keep their boundaries."""
    monkeypatch.setattr(inputs_mod, "CHUNK_BYTES", 400)
    docs = make_docs(200, seed=3)
    docs[5].append(docs[2][0])  # a line that occurs twice: held out both times or neither
    (tmp_path / "a.txt").write_text(cc100(docs))
    lines = [line for d in docs for line in d]
    serial = prepare("xx", [str(tmp_path / "a.txt")], str(tmp_path / "s"), vocab_size=300, workers=1,
                     progress=False, heldout=0.1)
    held = (tmp_path / "s" / "heldout.txt").read_text().splitlines()
    trained = [line for d in decoded_docs(tmp_path / "s") for line in d]
    assert 0.05 * len(lines) < len(held) < 0.15 * len(lines)
    assert not set(held) & set(trained) and sorted(held + trained) == sorted(lines)
    assert held == [line for line in lines if corpus_mod.is_heldout(line.encode(), 0.1)]  # in corpus order
    assert serial["heldout"] == {"file": "heldout.txt", "fraction": 0.1, "lines": len(held),
                                 "rule": corpus_mod.HELDOUT_RULE}
    assert serial["settings"]["heldout"] == 0.1 and serial["num_lines"] == len(trained)
    # documents: every document that kept a line is still one (the held-out lines are cut out of it)
    assert decoded_docs(tmp_path / "s") == [[x for x in d if x not in held] for d in docs if set(d) - set(held)]

    monkeypatch.setattr(inputs_mod, "CHUNK_BYTES", 1 << 20)  # other chunks, two workers: the same slice and shards
    prepare("xx", [str(tmp_path / "a.txt")], str(tmp_path / "p"), vocab_size=300, workers=2, progress=False,
            heldout=0.1, spm_model=str(tmp_path / "s" / "spm.model"))  # SentencePiece itself differs by threads
    for name in ("heldout.txt", "shard_00000.bin", "shard_00000.idx.npy", "shard_00000.docs.npy"):
        assert (tmp_path / "s" / name).read_bytes() == (tmp_path / "p" / name).read_bytes(), name

    from mm_ds.data.inputs import resolve_inputs
    from mm_ds.data.tokenizer import reservoir_sample
    sample, _ = reservoir_sample(resolve_inputs([str(tmp_path / "a.txt")]), 10_000, 0, False,
                                 exclude=lambda line: corpus_mod.is_heldout(line, 0.1))
    assert not set(sample) & set(held)

    # without --heldout: no file, no meta key, the settings a corpus prepared before held-out slices had
    plain = prepare("xx", [str(tmp_path / "a.txt")], str(tmp_path / "n"), vocab_size=300, workers=1, progress=False)
    assert "heldout" not in plain and "heldout" not in plain["settings"] and not (tmp_path / "n" / "heldout.txt").exists()
    with pytest.raises(ValueError, match="--heldout 1.0 must be a fraction"):
        prepare("xx", [str(tmp_path / "a.txt")], str(tmp_path / "bad"), heldout=1.0, progress=False)


ODD_LINES = ["", "  ", "plain words here", " surrounding space ", "tab\tinside", "Ünïcödé 漢字 ☃", "x" * 2000,
             "a", "\u00a0non-breaking\u00a0space", "two  spaces"]


def test_the_encoder_gives_sentencepieces_ids_as_arrays(tmp_path):
    """prepare's encoder reads SentencePiece's int32 buffers (no Python int per id): the ids and per-line counts
    must be `encode`'s, blank and unknown-character lines included; the fallback through lists gives the same."""
    from mm_ds.data import tokenizer as tok
    (tmp_path / "a.txt").write_text(cc100(make_docs(40)))
    prepare("xx", [str(tmp_path / "a.txt")], str(tmp_path / "out"), vocab_size=200, workers=1, progress=False)
    model = tmp_path / "out" / "spm.model"
    sp = spm.SentencePieceProcessor(model_file=str(model))
    lines = ODD_LINES + [line for doc in make_docs(30, seed=3) for line in doc]
    want = sp.encode(lines, out_type=int)
    assert tok._id_buffers(tok.load_spm(model)) is not None  # the pinned sentencepiece takes the buffer path
    flat, lens = tok.encoder(model)(lines)
    assert flat.dtype == np.int32 and lens.tolist() == [len(w) for w in want] and lens[0] == lens[1] == 0
    assert flat.tolist() == [i for w in want for i in w] and tokens.UNK in flat  # 漢字 is unknown to this model

    class OtherBindings:  # a sentencepiece whose private batch call is not the one mm-ds knows
        _processor = object()
        encode = sp.encode
    assert tok._id_buffers(OtherBindings()) is None


def test_prepare_through_the_list_fallback_writes_the_same_shards(tmp_path, monkeypatch):
    from mm_ds.data import tokenizer as tok
    monkeypatch.setattr(inputs_mod, "CHUNK_BYTES", 500)
    (tmp_path / "a.txt").write_text(cc100(make_docs(60, seed=4)) + "\n".join(ODD_LINES) + "\n")
    fast = prepare("xx", [str(tmp_path / "a.txt")], str(tmp_path / "f"), vocab_size=200, workers=2, progress=False)
    monkeypatch.setattr(tok, "_id_buffers", lambda sp: None)
    slow = prepare("xx", [str(tmp_path / "a.txt")], str(tmp_path / "s"), spm_model=str(tmp_path / "f" / "spm.model"),
                   workers=2, progress=False)
    assert slow["num_tokens"] == fast["num_tokens"]
    for name in ("shard_00000.bin", "shard_00000.idx.npy", "shard_00000.docs.npy"):
        assert (tmp_path / "s" / name).read_bytes() == (tmp_path / "f" / name).read_bytes()


def test_a_rewritten_model_file_is_loaded_again(tmp_path):
    """load_spm caches per content: a model written over another at the same path is the new one."""
    from mm_ds.data.tokenizer import load_spm
    (tmp_path / "a.txt").write_text(cc100(make_docs(40)))
    for vocab in (150, 200):
        prepare("xx", [str(tmp_path / "a.txt")], str(tmp_path / f"v{vocab}"), vocab_size=vocab, workers=1,
                progress=False)
    path = tmp_path / "m.model"
    path.write_bytes((tmp_path / "v150" / "spm.model").read_bytes())
    assert load_spm(path).get_piece_size() == 150 and load_spm(path) is load_spm(path)
    path.write_bytes((tmp_path / "v200" / "spm.model").read_bytes())
    assert load_spm(path).get_piece_size() == 200


def test_prepare_packs_the_blocks_of_each_seq_len_once(tmp_path, monkeypatch, capsys):
    """`mm-ds prepare --seq-len` writes the block caches, also into a corpus prepared before (a new length only), so
    that no training run packs them."""
    from mm_ds import cli
    from mm_ds.data import blocks
    from mm_ds.data.mlm import MLMBatches

    (tmp_path / "a.txt").write_text(cc100(make_docs(30, seed=9)))
    out = tmp_path / "out"
    args = ["prepare", "--lang", "xx", "--input", str(tmp_path / "a.txt"), "--out", str(out), "--vocab-size", "150",
            "--workers", "1"]
    assert cli.main(args + ["--seq-len", "16"]) == 0
    corpus = TokenCorpus(out)
    assert blocks.cache_file(corpus, 16).is_file() and not blocks.cache_file(corpus, 24).exists()
    packed, pack = [], blocks.pack_shard
    monkeypatch.setattr(blocks, "pack_shard", lambda offsets, n: packed.append(n) or pack(offsets, n))
    assert cli.main(args + ["--seq-len", "16", "24"]) == 0
    assert packed == [24] * corpus.num_shards and blocks.cache_file(corpus, 24).is_file()
    MLMBatches(corpus, 24, seed=0, vocab_size=150)
    assert packed == [24] * corpus.num_shards  # read from the cache
    assert cli.main(args + ["--seq-len", "1"]) == 2
    assert "--seq-len 1: a block needs at least 2 tokens" in capsys.readouterr().err
