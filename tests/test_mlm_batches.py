"""MLM batches: FULL-SENTENCES packing, dynamic masking statistics, deterministic per-rank order; the block cache
at cluster scale (one writer, writers on several hosts, memory-mapped reads)."""

import collections
import copy
import json
import os
import random
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from mm_ds import config, tokens
from mm_ds.data import blocks
from mm_ds.data.blocks import pack_shard
from mm_ds.data.corpus import prepare
from mm_ds.data.mlm import MLMBatches
from mm_ds.data.order import sample_ids
from mm_ds.data.shards import TokenCorpus
from mm_ds.runtime.distributed import dist
from mm_ds.stages import pretrain

SEQ = 32
VOCAB = 300


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> TokenCorpus:
    """Random-word text with short and long lines (some longer than SEQ), in several shards."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(2, 7))) for _ in range(500)]
    d = tmp_path_factory.mktemp("mlm")
    with open(d / "a.txt", "w") as f:
        for _ in range(400):
            for _ in range(rng.randint(1, 4)):
                n = rng.choice([2, 5, 9, 14]) if rng.random() < 0.9 else rng.randint(30, 90)
                f.write(" ".join(rng.choices(words, k=n)) + "\n")
            f.write("\n")
    prepare("xx", [str(d / "a.txt")], str(d / "out"), vocab_size=VOCAB, workers=1, shard_tokens=8000,
            progress=False)
    return TokenCorpus(d / "out")


def line_spans(c: TokenCorpus) -> np.ndarray:
    starts = np.concatenate([c.shard_offsets(s)[:-1] + c.token_base[s] for s in range(c.num_shards)])
    return np.stack([starts, starts + c.line_lengths()], axis=1)


def test_pack_shard_by_hand():
    # lines of 3, 5, 20, 2, 2 tokens; seq_len 8 leaves 7 per block after <s>
    offsets = np.cumsum([0, 3, 5, 20, 2, 2])
    spans = pack_shard(offsets, 8).tolist()
    assert spans == [[0, 3], [3, 8], [8, 15], [15, 22], [22, 28], [28, 32]]
    assert pack_shard(np.cumsum([0, 3, 4]), 8).tolist() == [[0, 7]]
    # a 15-token line: its EOS never ends up alone in a block (nothing to mask there)
    assert pack_shard(np.array([0, 15]), 8).tolist() == [[0, 7], [7, 13], [13, 15]]


def test_packing_keeps_lines_whole_and_blocks_short(corpus):
    m = MLMBatches(corpus, SEQ, seed=0, vocab_size=VOCAB)
    spans = m.spans
    assert corpus.num_shards > 2
    assert (spans[:, 1] > spans[:, 0]).all() and (spans[:, 1] - spans[:, 0] <= SEQ - 1).all()
    assert spans[0, 0] == 0 and spans[-1, 1] == corpus.num_tokens and (spans[1:, 0] == spans[:-1, 1]).all()
    lines = line_spans(corpus)
    fits = lines[:, 1] - lines[:, 0] <= SEQ - 1
    assert (~fits).sum() > 5  # the corpus does exercise split lines
    block_of_start = np.searchsorted(spans[:, 0], lines[:, 0], side="right") - 1
    block_of_last = np.searchsorted(spans[:, 0], lines[:, 1] - 1, side="right") - 1
    assert (block_of_start[fits] == block_of_last[fits]).all()  # a line that fits is never split
    # Every cut is a line boundary, except inside lines too long for one block.
    boundaries = set(lines[:, 0].tolist()) | {corpus.num_tokens}
    long_inside = np.zeros(corpus.num_tokens + 1, dtype=bool)
    for a, b in lines[~fits]:
        long_inside[a + 1:b] = True
    for cut in spans[:, 1]:
        assert cut in boundaries or long_inside[cut]
    # Greedy: the next line would not have fit into the block.
    nxt = dict(zip(lines[:, 0].tolist(), lines[:, 1].tolist()))
    for a, b in spans:
        if b in nxt and a in boundaries:
            assert nxt[b] - a > SEQ - 1


def test_blocks_are_cached(corpus, monkeypatch):
    MLMBatches(corpus, 24, seed=0, vocab_size=VOCAB)
    assert (corpus.dir / f"blocks_v{blocks.PACKING_VERSION}_s24.npy").is_file()

    def no_packing(*a, **k):
        raise AssertionError("packing recomputed although cached")
    monkeypatch.setattr(blocks, "pack_shard", no_packing)
    MLMBatches(corpus, 24, seed=0, vocab_size=VOCAB)


def test_batch_layout(corpus):
    m = MLMBatches(corpus, SEQ, seed=3, vocab_size=VOCAB)
    b = m.batch(0, 0, 0, 1, 16)
    ids, labels, att = b["input_ids"], b["labels"], b["attention_mask"]
    assert ids.shape == labels.shape == (16, SEQ) and ids.dtype == labels.dtype == torch.long
    assert (ids[:, 0] == tokens.BOS).all()
    assert att is not None and att.dtype == torch.bool
    assert torch.equal(att, ids != tokens.PAD)
    # Unmasked content equals the packed block: <s> + its tokens, then PAD.
    for row, blk in enumerate(m.blocks_of(sample_ids(0, 0, 0, 1, 16))):
        a, z = m.spans[blk]
        orig = np.full(SEQ, tokens.PAD)
        orig[0] = tokens.BOS
        orig[1:1 + z - a] = corpus.span(a, z)
        sel = (labels[row] != tokens.IGNORE_INDEX).numpy()
        assert (labels[row].numpy()[sel] == orig[sel]).all()
        assert (ids[row].numpy()[~sel] == orig[~sel]).all()
    # No padding anywhere in the batch: no mask tensor.
    full = np.flatnonzero(m.spans[:, 1] - m.spans[:, 0] == SEQ - 1)
    g = np.flatnonzero(np.isin(m._permutation(0), full))[:8]
    assert m.samples(g)["attention_mask"] is None


def test_masking_statistics(corpus):
    m = MLMBatches(corpus, SEQ, seed=1, vocab_size=VOCAB)
    b = m.samples(np.arange(3000))
    ids, labels = b["input_ids"].numpy(), b["labels"].numpy()
    orig = np.where(labels != tokens.IGNORE_INDEX, labels, ids)
    sel = labels != tokens.IGNORE_INDEX
    cand = orig >= len(tokens.SPECIAL_IDS)
    assert not (sel & ~cand).any()  # never specials nor padding
    assert (ids[~cand] == orig[~cand]).all()
    assert (sel.sum(axis=1) >= 1).all()
    rate = sel.sum() / cand.sum()
    assert abs(rate - 0.15) < 0.01, rate
    n = sel.sum()
    masked = (ids[sel] == tokens.MASK).sum() / n
    kept = (ids[sel] == orig[sel]).sum() / n
    rand = ((ids[sel] != tokens.MASK) & (ids[sel] != orig[sel])).sum() / n
    assert abs(masked - 0.8) < 0.02 and abs(kept - 0.1) < 0.015 and abs(rand - 0.1) < 0.015, (masked, kept, rand)
    r = ids[sel][(ids[sel] != tokens.MASK) & (ids[sel] != orig[sel])]
    assert r.min() >= len(tokens.SPECIAL_IDS) and r.max() < VOCAB


def test_determinism(corpus):
    a = MLMBatches(corpus, SEQ, seed=7, vocab_size=VOCAB)
    b = MLMBatches(corpus, SEQ, seed=7, vocab_size=VOCAB)
    x, y = a.batch(5, 1, 0, 1, 8, 2), b.batch(5, 1, 0, 1, 8, 2)
    assert all(torch.equal(x[k], y[k]) for k in ("input_ids", "labels", "attention_mask"))
    assert torch.equal(x["input_ids"], a.batch(5, 1, 0, 1, 8, 2)["input_ids"])
    c = MLMBatches(corpus, SEQ, seed=8, vocab_size=VOCAB)
    assert not torch.equal(x["input_ids"], c.batch(5, 1, 0, 1, 8, 2)["input_ids"])
    # The same block drawn in another epoch gets fresh masks.
    n = a.num_blocks()
    g0 = np.flatnonzero(a._permutation(0) == 0)
    g1 = n + np.flatnonzero(a._permutation(1) == 0)
    assert a.blocks_of(g0) == a.blocks_of(g1)
    assert not torch.equal(a.samples(g0)["labels"], a.samples(g1)["labels"])


def test_ranks_and_world_sizes(corpus):
    m = MLMBatches(corpus, SEQ, seed=2, vocab_size=VOCAB)
    B, GB, step = 4, 16, 3
    per_rank = [np.concatenate([sample_ids(step, k, r, 4, B, 1)]) for r, k in
                [(r, 0) for r in range(4)]]
    assert len(set(np.concatenate(per_rank).tolist())) == GB  # disjoint
    layouts = {ws: np.concatenate([sample_ids(step, k, r, ws, B, GB // (B * ws))
                                   for k in range(GB // (B * ws)) for r in range(ws)]) for ws in (1, 2, 4)}
    for ws in (1, 2, 4):
        assert sorted(layouts[ws].tolist()) == list(range(step * GB, (step + 1) * GB))
    one = torch.cat([m.batch(step, k, 0, 1, B, 4)["input_ids"] for k in range(4)])
    two = torch.cat([m.batch(step, k, r, 2, B, 2)["input_ids"] for k in range(2) for r in range(2)])
    assert torch.equal(one, two)
    # Each epoch visits every block exactly once.
    n = m.num_blocks()
    assert sorted(m.blocks_of(np.arange(n)).tolist()) == list(range(n))
    assert sorted(m.blocks_of(np.arange(n, 2 * n)).tolist()) == list(range(n))


def test_bad_arguments(corpus):
    m = MLMBatches(corpus, SEQ, seed=0, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="grad_accum"):
        m.batch(0, 1, 0, 1, 4)
    with pytest.raises(ValueError, match="rank"):
        m.batch(0, 0, 2, 2, 4)
    with pytest.raises(ValueError, match="vocab_size"):
        MLMBatches(corpus, SEQ, seed=0, vocab_size=VOCAB - 1)
    with pytest.raises(ValueError, match="keep_prob"):
        MLMBatches(corpus, SEQ, seed=0, vocab_size=VOCAB, random_prob=0.6, keep_prob=0.6)


# ----------------------------------------------------------------------------------------------- the block cache

def test_writers_on_two_hosts_with_one_pid_never_share_a_file(corpus, monkeypatch, capsys):
    """Two writers of one cache on two hosts of a shared filesystem, with one pid (containers start their first
    process as the same pid): B runs while A is about to publish. Each writes its own temporary file and publishes a
    whole one; a temporary file its writer died with is removed once stale, a live writer's is left alone."""
    seq = 20
    path = blocks.cache_file(corpus, seq)
    dead, live = (path.with_name(f"{path.name}.{who}.77.0a0b0c0d.tmp") for who in ("dead-host", "live-host"))
    for f in (dead, live):
        f.write_bytes(b"half a file")
    old = time.time() - 2 * blocks.STALE_TMP_S
    os.utime(dead, (old, old))
    host = {"name": "node-a"}
    monkeypatch.setattr(socket, "gethostname", lambda: host["name"])
    monkeypatch.setattr(os, "getpid", lambda: 4242)
    replace, published = os.replace, []

    def publish(src, dst):
        published.append(os.path.basename(src))
        if len(published) == 1:  # A is about to publish: B, on the other host, runs start to finish
            host["name"] = "node-b"
            blocks.block_spans(TokenCorpus(corpus.dir), seq)
        replace(src, dst)
    monkeypatch.setattr(os, "replace", publish)
    blocks.block_spans(TokenCorpus(corpus.dir), seq)  # A
    a, b = published
    assert a != b and "node-a.4242." in a and "node-b.4242." in b, published
    assert "cannot cache" not in capsys.readouterr().err
    spans = np.load(path)
    assert spans[0, 0] == 0 and spans[-1, 1] == corpus.num_tokens and (spans[1:, 0] == spans[:-1, 1]).all()
    assert sorted(path.parent.glob(f"{path.name}.*.tmp")) == [live]
    live.unlink()


def rss_bytes() -> int:
    """This process's resident set (anonymous and file-backed pages)."""
    status = open("/proc/self/status").read()
    return int(status.split("VmRSS:")[1].split()[0]) * 1024


def big_corpus(root, n_blocks: int, width: int):
    """A corpus of one line of n_blocks x width tokens (a sparse shard: nothing read unless drawn) and its cache of
    blocks `width` tokens long, as `mm-ds prepare --seq-len width+1` would leave them; the cache file's path."""
    n = n_blocks * width
    with open(root / "shard_00000.bin", "wb") as f:
        f.truncate(2 * n)
    np.save(root / "shard_00000.idx.npy", np.array([0, n], dtype=np.int64))
    np.save(root / "shard_00000.docs.npy", np.array([0], dtype=np.int64))
    (root / "spm.model").write_bytes(b"")
    (root / "meta.json").write_text(json.dumps({
        "format_version": 1, "lang": "xx", "vocab_size": VOCAB, "dtype": "uint16", "num_lines": 1, "num_tokens": n,
        "spm_model": "spm.model", "shards": [{"name": "shard_00000", "num_lines": 1, "num_tokens": n,
                                              "num_documents": 1}]}))
    path = root / f"blocks_v{blocks.PACKING_VERSION}_s{width + 1}.npy"
    spans = np.lib.format.open_memmap(path, mode="w+", dtype=np.int64, shape=(n_blocks, 2))
    for lo in range(0, n_blocks, 1 << 18):
        start = np.arange(lo, min(lo + (1 << 18), n_blocks), dtype=np.int64) * width
        spans[lo:lo + len(start), 0], spans[lo:lo + len(start), 1] = start, start + width
    spans.flush()
    del spans
    return path


def test_the_cache_is_memory_mapped_not_read(tmp_path, corpus):
    """A rank maps the cache and reads only the blocks it draws: opening a 32 MiB cache and drawing a batch grows the
    process by far less than the file (reading it whole, with a shard index per block, grew it by ~1.5x its size)."""
    path = big_corpus(tmp_path, 1 << 21, SEQ - 1)
    size = path.stat().st_size
    MLMBatches(corpus, SEQ, seed=0, vocab_size=VOCAB).batch(0, 0, 0, 1, 4)  # what a first batch allocates once
    before = rss_bytes()
    m = MLMBatches(TokenCorpus(tmp_path), SEQ, seed=0, vocab_size=VOCAB)
    opened = rss_bytes() - before
    m.batch(5, 0, 1, 8, 4)
    drawn = rss_bytes() - before
    assert isinstance(m.spans, np.memmap) and os.path.samefile(m.spans.filename, path)
    assert opened < size / 8, f"opening the cache grew this process by {opened >> 20} MiB (file: {size >> 20} MiB)"
    # Drawing holds the epoch's permutation (4 bytes a block, a quarter of the file), no more.
    assert drawn < size / 2, f"a batch grew this process by {drawn >> 20} MiB (file: {size >> 20} MiB)"


def test_one_rank_packs_the_corpus_for_all(corpus, monkeypatch):
    """Two ranks start a stage at once (threads with a stand-in collective): rank 0 packs and writes the cache while
    rank 1 waits, then rank 1 maps it. A rank packs only once the other has entered the collective or started
    packing itself: ranks that do not wait for one writer are caught whatever the threads' timing."""
    cfg = config.load("tiny/minijoint", None, [
        "model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.ffn_size=64", "model.max_positions=32",
        "model.secondary_head_layer=1", "data.seq_len=28", f"data.corpus={corpus.dir}"])
    local, slot = threading.local(), {}
    decided, barrier = [threading.Event(), threading.Event()], threading.Barrier(2, timeout=60)

    def broadcast_object(obj, src=0):
        decided[local.rank].set()
        if local.rank == src:
            slot["value"] = obj
        barrier.wait()
        value = slot["value"]
        barrier.wait()
        return value
    monkeypatch.setattr(dist, "rank", lambda: local.rank)
    monkeypatch.setattr(dist, "broadcast_object", broadcast_object)
    packed, pack = collections.Counter(), blocks.pack_shard

    def counted(offsets, seq_len):
        decided[local.rank].set()
        assert decided[1 - local.rank].wait(60), f"rank {1 - local.rank} never reached the blocks"
        packed[local.rank] += 1
        return pack(offsets, seq_len)
    monkeypatch.setattr(blocks, "pack_shard", counted)

    def start(rank):
        local.rank = rank
        return pretrain.build(copy.deepcopy(cfg))
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(start, [0, 1]))
    assert packed == {0: corpus.num_shards}, f"shards packed per rank: {dict(packed)}"
    assert blocks.cache_file(corpus, 28).is_file()
