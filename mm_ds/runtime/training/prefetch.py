"""Batches built ahead of the training loop, so that the device never waits on the host's packing and masking.

A stage's batches are a pure function of (step, micro-step, rank) (`engine.Stage.batches`), so a background
thread can build the next ones while the loop runs the current one: the batches, and hence training and
resume, are bit for bit what the loop would have built itself. On a GPU the thread also pins each tensor, so
the loop's `non_blocking` copy overlaps with compute instead of staging through pageable memory.

A thread, not DataLoader worker processes: a worker forked after the process group exists would inherit
gloo/NCCL threads, and the heavy parts of building (numpy hashing, sorting, memmap reads) release the GIL.
The batch functions must not draw from torch's global generator (dropout masks are seeded on the loop's
thread): every mm-ds batch function is counter-based (mm_ds/data/mlm.py) or fixed by the seed.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable

import torch

_DONE = object()


class Prefetcher:
    """The batches of updates [start, end) for `rank`, `ahead` micro-batches ahead, in loop order.
    `ahead=0` builds each batch when it is asked for (on the caller's thread)."""

    def __init__(self, batches: Callable[..., dict], rank: int, geo, start: int, end: int, ahead: int = 2,
                 pin: bool = False):
        self.batches, self.rank, self.geo, self.ahead, self.pin = batches, rank, geo, ahead, pin
        self.order = ((s, m) for s in range(start, end) for m in range(geo.grad_accum))
        self.build_time = 0.0
        """Seconds spent building batches (on the thread, or inline): what the loop no longer waits for."""
        self._stop = threading.Event()
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, ahead))
        self._thread = None
        if ahead > 0:
            self._thread = threading.Thread(target=self._work, name="mm-ds-batches", daemon=True)
            self._thread.start()

    def _build(self, step: int, micro: int) -> dict:
        t0 = time.perf_counter()
        batch = self.batches(step, micro, self.rank, self.geo)
        if self.pin:
            batch = {k: v.pin_memory() if torch.is_tensor(v) else v for k, v in batch.items()}
        self.build_time += time.perf_counter() - t0
        return batch

    def _work(self) -> None:
        try:
            for key in self.order:
                item = (key, self._build(*key))
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
        except BaseException as e:  # noqa: BLE001  handed to the loop, which raises it with its own traceback
            self._queue.put((None, e))
            return
        self._queue.put((None, _DONE))

    def get(self, step: int, micro: int) -> dict:
        """The batch of micro-step `micro` of update `step`; the loop asks in order."""
        if self._thread is None:
            key = next(self.order, None)
            if key != (step, micro):
                raise RuntimeError(f"batch ({step}, {micro}) asked for out of order (expected {key})")
            return self._build(step, micro)
        key, batch = self._queue.get()
        if key is None:
            if batch is _DONE:
                raise RuntimeError(f"batch ({step}, {micro}) asked for after the last one")
            raise batch
        if key != (step, micro):
            raise RuntimeError(f"batch ({step}, {micro}) asked for out of order (next built: {key})")
        return batch

    def close(self) -> None:
        """Stop the thread (the loop ended, or raised)."""
        self._stop.set()
        if self._thread is not None:
            while self._thread.is_alive():
                try:
                    self._queue.get(timeout=0.1)
                except queue.Empty:
                    pass
            self._thread.join()

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
