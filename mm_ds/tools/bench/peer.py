"""`mm-ds bench`'s measuring instruments beside the engine: peak resident memory, and the peer, Hugging
Face `transformers`' RobertaForMaskedLM (attn_implementation="sdpa") with the same shape, batches and
dropout, in a plain loop with torch.optim.AdamW (all parameters, its CPU defaults); Step 2 freezes all but
the word embeddings (tied to the decoder) and the LM-head bias. HF computes the LM head over every
position; mm-ds over the masked ones only: that difference is part of what the comparison measures."""

from __future__ import annotations

import gc
import os
import resource
import threading
import time

import torch

from ...config import ModelConfig
from ...runtime.training.ds_config import Geometry
from ...tokens import PAD


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class RssPeak:
    """Peak resident memory while the block runs, sampled every 10 ms from /proc (Linux); elsewhere only
    the process-wide high-water mark of getrusage is available."""

    def __init__(self, interval: float = 0.01):
        self.interval, self.peak, self.start = interval, 0, 0
        self._stop = threading.Event()
        self._ok = os.path.exists("/proc/self/statm")

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, _rss_bytes())

    def __enter__(self):
        if self._ok:
            self.start = self.peak = _rss_bytes()
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._ok:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, _rss_bytes())


def release_free_memory() -> None:
    """Between stages: hand the heap's free pages back (dist.keep_freed_memory keeps them during
    training), so each stage's peak RSS is its own and not its predecessors' high-water mark."""
    import ctypes
    import ctypes.util

    gc.collect()
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def hf_model(mcfg: ModelConfig, layers: int):
    from transformers import RobertaConfig, RobertaForMaskedLM

    hcfg = RobertaConfig(vocab_size=mcfg.vocab_size, hidden_size=mcfg.hidden_size, num_hidden_layers=layers,
                         num_attention_heads=mcfg.num_heads, intermediate_size=mcfg.ffn_size,
                         max_position_embeddings=mcfg.max_positions + PAD + 1, type_vocab_size=1,
                         pad_token_id=PAD, bos_token_id=0, eos_token_id=2, layer_norm_eps=mcfg.layer_norm_eps,
                         hidden_dropout_prob=mcfg.dropout, attention_probs_dropout_prob=mcfg.dropout,
                         initializer_range=mcfg.init_std)
    torch.manual_seed(0)
    return RobertaForMaskedLM._from_config(hcfg, attn_implementation="sdpa")


class PeerSteps:
    """The peer of bench stage `name` over `layers` layers on `batches`; a call runs one update (batch, forward,
    backward, AdamW step) and times it."""

    def __init__(self, name: str, mcfg: ModelConfig, layers: int, batches, micro_batch: int):
        self.model = hf_model(mcfg, layers)
        if name.startswith("adapt"):
            keep = {"roberta.embeddings.word_embeddings.weight", "lm_head.bias"}  # decoder weight/bias are tied
            for n, p in self.model.named_parameters():
                p.requires_grad_(n in keep)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
        self.model.train()
        self.batches, self.geo = batches, Geometry(micro_batch, micro_batch, 1, 1)
        self.trainable_params = sum(p.numel() for p in params)
        self.total_params = sum(p.numel() for p in self.model.parameters())

    def __call__(self, step: int) -> tuple[float, float, float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        b = self.batches(step, 0, 0, self.geo)
        data = time.perf_counter() - t0
        out = self.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"])
        out.loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        loss = float(out.loss.detach())
        return time.perf_counter() - t0, data, time.process_time() - c0, loss

    def close(self) -> None:
        self.model = self.opt = None
