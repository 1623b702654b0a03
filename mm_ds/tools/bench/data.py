"""`mm-ds bench`'s inputs: a synthetic corpus prepared by `mm-ds prepare` (and its encoding speed), a
tokenizer of the model's vocabulary size, a small English pair-task file, and fixed-shape pair batches."""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from ...data.corpus import prepare
from ...data.inputs import chunks, resolve_inputs, split_lines
from ...data.tokenizer import encoder
from ...tokens import PAD, SPECIAL_IDS


def synthetic_text(path: Path, megabytes: float, seed: int = 0) -> int:
    """English-like text in the CC-100 layout (a sentence per line, blank line between documents): words
    drawn Zipf-like from a generated lexicon, so SentencePiece sees a realistic piece distribution."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    freq = 1.0 / np.arange(1, len(letters) + 1)
    words = ["".join(rng.choice(letters, size=rng.integers(2, 10), p=freq / freq.sum())) for _ in range(20000)]
    zipf = 1.0 / np.arange(1, len(words) + 1) ** 1.1
    zipf /= zipf.sum()
    target = int(megabytes * 2 ** 20)
    written = 0
    with open(path, "w") as f:
        while written < target:
            n_sent = int(rng.integers(4, 16))
            lens = rng.integers(6, 30, size=n_sent)
            idx = rng.choice(len(words), size=int(lens.sum()), p=zipf)
            parts, at = [], 0
            for n in lens:
                parts.append(" ".join(words[i] for i in idx[at:at + n]).capitalize() + " .")
                at += n
            doc = "\n".join(parts) + "\n\n"
            f.write(doc)
            written += len(doc)
    return written


def spread_tokenizer(model: Path, vocab: int, out: Path, seed: int = 0) -> Path:
    """`model` grown to `vocab` pieces: the special pieces keep their ids, the trained pieces move to ids
    spread over [5, vocab) by a fixed permutation, and the other ids are unused pieces (never produced by
    encoding). Synthetic text cannot train a 50k-piece tokenizer; a corpus encoded with this one has the
    model's vocabulary and ids over its whole embedding matrix, as a real one's would."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    proto.ParseFromString(model.read_bytes())
    pieces, n_special = list(proto.pieces), len(SPECIAL_IDS)
    if vocab < len(pieces):
        raise ValueError(f"the bench's tokenizer has {len(pieces)} pieces, more than the model's vocab {vocab}")
    slots: list = list(pieces[:n_special]) + [None] * (vocab - n_special)
    perm = np.random.default_rng(seed).permutation(vocab - n_special)[: len(pieces) - n_special] + n_special
    for piece, at in zip(pieces[n_special:], perm):
        slots[at] = piece
    unused = pb.ModelProto.SentencePiece.UNUSED
    slots = [p if p is not None else pb.ModelProto.SentencePiece(piece=f"<unused{i}>", score=-1e9, type=unused)
             for i, p in enumerate(slots)]
    del proto.pieces[:]
    proto.pieces.extend(slots)
    out.write_bytes(proto.SerializeToString())
    return out


def spread_corpus(work: Path, megabytes: float, vocab: int, workers: int, log) -> tuple[Path, Path, Path, dict]:
    """The synthetic corpus prepared with a `vocab`-piece tokenizer (`spread_tokenizer`): (corpus dir, text file,
    the tokenizer, the first prepare's figures). `mm-ds bench` on a GPU and the GPU suite's paper-shape update
    (tests/gpu) use it alone; on CPU `prepare_corpus` also times the encoding."""
    text = work / "corpus.txt"
    nbytes = synthetic_text(text, megabytes)
    trained = 2000 if megabytes < 4 else 8000
    log(f"synthetic corpus: {nbytes / 2**20:.1f} MiB; training a {trained}-piece SentencePiece model ...")
    t0 = time.perf_counter()
    meta = prepare("xx", [str(text)], str(work / "trained"), vocab_size=trained, sample_sentences=20000,
                   workers=workers, seed=0, progress=False)
    first = {"text_bytes": nbytes, "corpus_tokens": meta["num_tokens"], "corpus_vocab": meta["vocab_size"],
             "first_prepare_s": time.perf_counter() - t0}
    model = spread_tokenizer(work / "trained" / meta["spm_model"], vocab, work / "spread.model")
    prepare("xx", [str(text)], str(work / "corpus"), spm_model=str(model), workers=workers, progress=False)
    return work / "corpus", text, model, first


def prepare_corpus(work: Path, megabytes: float, encode_mb: float, vocab: int, workers: int,
                   log) -> tuple[Path, Path, dict]:
    """Prepare the synthetic corpus (`spread_corpus`); then measure `mm-ds prepare`'s encoding against
    single-process SentencePiece (target 4). Returns (corpus dir, text file, measurements).

    The encoding is timed on the text repeated to `encode_mb` (the same work per byte, enough of it that
    prepare's fixed start-up, ~0.05 s, does not decide the ratio). The reference is SentencePiece alone on one
    thread making the very calls prepare's workers make (`tokenizer.encoder`: its batch encode into int32
    buffers, ~1 MiB chunks of lines), over lines already split in memory: no reading, splitting, arrays or
    writing. The two are timed in turn, three times each (A B B A A B, as pairs.py does), and their medians
    compared, so that a drift of the machine hits both and one slow spell (a side 50% slower than its others,
    seen on these vCPUs) decides nothing; then prepare with one worker (its own overhead, apart from scaling)."""
    corpus, text, model, first = spread_corpus(work, megabytes, vocab, workers, log)
    nbytes = first["text_bytes"]
    timed = work / "encode.txt"
    repeat = max(1, round(encode_mb / megabytes))
    timed.write_bytes(text.read_bytes() * repeat)
    timed_bytes = nbytes * repeat
    chunk_lines = [split_lines(block)[0] for block, _, _ in chunks(resolve_inputs([str(timed)]))]
    encode = encoder(model)
    encode(chunk_lines[0])
    sides = {"prepare": lambda i: prepare("xx", [str(timed)], str(work / f"encoded_{i}"), spm_model=str(model),
                                          workers=workers, progress=False),
             "single": lambda i: [encode(lines) for lines in chunk_lines]}
    spent = {"prepare": [], "single": []}
    for i, side in enumerate(("prepare", "single", "single", "prepare", "prepare", "single")):
        t0 = time.perf_counter()
        sides[side](i)
        spent[side].append(time.perf_counter() - t0)
        if side == "prepare":
            shutil.rmtree(work / f"encoded_{i}")
    t_prep, t_single = statistics.median(spent["prepare"]), statistics.median(spent["single"])
    t0 = time.perf_counter()
    prepare("xx", [str(timed)], str(work / "encoded_1worker"), spm_model=str(model), workers=1, progress=False)
    t_prep1 = time.perf_counter() - t0
    shutil.rmtree(work / "encoded_1worker")
    timed.unlink()
    enc = {"text_bytes": timed_bytes, "text_repeats": repeat, "chunks": len(chunk_lines),
           "corpus_tokens": first["corpus_tokens"], "corpus_vocab": first["corpus_vocab"],
           "first_prepare_s": first["first_prepare_s"], "workers": workers, "prepare_encode_s": t_prep,
           "prepare_bytes_per_s": timed_bytes / t_prep, "prepare_1_worker_s": t_prep1,
           "prepare_1_worker_bytes_per_s": timed_bytes / t_prep1, "single_process_encode_s": t_single,
           "single_process_bytes_per_s": timed_bytes / t_single}
    enc["ratio"] = enc["prepare_bytes_per_s"] / (enc["single_process_bytes_per_s"] * workers)
    enc["in_turn_s"] = spent
    return corpus, text, enc


def host_corpus(work: Path, text: Path, vocab: int) -> Path:
    """The bench's text prepared with a `vocab`-piece tokenizer: the corpus of the host-side loop
    (host.py), whose model keeps the kernels of the vocabulary and sheds their size."""
    prepare("xx", [str(text)], str(work / "host_corpus"), vocab_size=vocab, sample_sentences=5000, seed=0,
            progress=False)
    return work / "host_corpus"


def write_pair_task(root: Path, text: Path, examples: int = 64) -> Path:
    """An English NLI training file in MultiNLI's layout (XNLI's training side) from the corpus's sentences:
    what Step 3's builder reads. The timed batches are `pair_batches`."""
    lines = [line for line in text.read_text(encoding="utf-8").splitlines()[: 4 * examples] if line]
    labels = ("entailment", "neutral", "contradiction")
    path = root / "mnli" / "multinli_1.0_train.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i in range(examples):
            f.write(json.dumps({"pairID": str(i), "gold_label": labels[i % 3], "sentence1": lines[2 * i % len(lines)],
                                "sentence2": lines[(2 * i + 1) % len(lines)]}) + "\n")
    return root


def pair_batches(vocab: int, seq: int, num_labels: int = 3):
    """Step 3's timed batches: padded sentence pairs (the last 10% of each row is padding) and class labels,
    so every step has the benchmark's shape."""

    def batch(step, micro, rank, geo) -> dict:
        g = torch.Generator().manual_seed(step * 1000 + micro * 10 + rank)
        B = geo.micro_batch
        ids = torch.randint(5, vocab, (B, seq), generator=g)
        ids[:, 0] = 0
        keep = seq - seq // 10
        ids[:, keep:] = PAD
        mask = ids.ne(PAD)
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.randint(0, num_labels, (B,), generator=g)}

    return batch
