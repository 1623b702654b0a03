"""Every wait of the host for the device while the training loop's micro-steps run (tests/gpu/paper_update.py applies
it to `engine.train_step`; tests/test_gpu_checks.py shows on CPU that it records and judges what it should).

Two detectors, because neither sees everything:
- `torch.cuda.set_sync_debug_mode("error")`: a synchronizing call raises where it is made, with its traceback: a
  read of a device value (`.item()`, `bool(t)`, `float(t)`, `.cpu()`, `.tolist()`), an op whose output size
  depends on the data (`nonzero`, `masked_select`), a copy that must finish (to pageable host memory, or a host
  value copied to the device: `torch.tensor(x, device=...)`), `Stream.synchronize()`. It does not see
  `torch.cuda.synchronize()` (cudaDeviceSynchronize: DeepSpeed's `get_accelerator().synchronize()`, which its
  throughput timer calls at every forward and step when on) nor event waits;
- torch's GPU trace (`torch.cuda._gpu_trace`, the hooks of torch's CUDA sanitizer): a callback on every device,
  stream and event synchronization c10 makes, recorded here with the first Python frame outside torch.

Phases. Micro-steps are strict: sync-debug "error" and any traced wait fails. The optimizer step at the end of an
update (`engine.step()` at the gradient-accumulation boundary) is lenient in one named way: DeepSpeed's ZeRO and
bf16 optimizers read whether the gradient norm is finite, once per update (`ALLOWED_AT_STEP`; the non-finite skip
needs the answer on the host), so sync-debug is off there and every traced wait must be one of those.
"""

from __future__ import annotations

import contextlib
import threading
import traceback
from dataclasses import dataclass, field

import torch

# (owner, function) of the waits DeepSpeed 0.19.8's optimizers make once per update (deepspeed/runtime/utils.py)
ALLOWED_AT_STEP = {
    ("deepspeed", "is_invalid_grad_norm"): "the gradient norm's finiteness, read on the host (BF16_Optimizer, ZeRO)",
    ("deepspeed", "mask_nan_or_inf_with_val_inplace"): "torch.tensor(-1.0, device=...): a host value copied to the "
                                                        "device (ZeRO 1-3's norm)",
}
MICRO, STEP = "micro-step", "optimizer step"


@dataclass(frozen=True)
class Wait:
    kind: str
    """device | stream | event (traced), or sync-debug (raised by set_sync_debug_mode("error"))."""
    owner: str
    """mm_ds | deepspeed | other: the first frame outside torch and this module."""
    function: str
    where: str
    phase: str
    thread: str


PLUMBING = ("/torch/", "/deepspeed/accelerator/")  # frames that only pass a synchronization on: name their caller


def _first_frame_outside_torch(stack) -> tuple[str, str, str]:
    for frame in reversed(stack):
        f = frame.filename
        if any(p in f for p in PLUMBING) or f == __file__:
            continue
        owner = "deepspeed" if "/deepspeed/" in f else "mm_ds" if "/mm_ds/" in f else "other"
        return owner, frame.name, f"{'/'.join(f.rsplit('/', 3)[-3:])}:{frame.lineno}"
    return "other", "?", "?"


_ACTIVE: list[DeviceWaits] = []  # the recorder the trace callbacks report to (they cannot be unregistered)
_HOOKED = False


def _hook() -> None:
    global _HOOKED
    if _HOOKED:
        return
    from torch.cuda import _gpu_trace

    torch._C._activate_gpu_trace()
    _gpu_trace.register_callback_for_device_synchronization(lambda: _report("device"))
    _gpu_trace.register_callback_for_stream_synchronization(lambda stream: _report("stream"))
    _gpu_trace.register_callback_for_event_synchronization(lambda event: _report("event"))
    _HOOKED = True


def _report(kind: str) -> None:
    if _ACTIVE:
        _ACTIVE[-1].record(kind, traceback.extract_stack()[:-2])


def _set_sync_debug_mode(mode: str) -> None:
    torch.cuda.set_sync_debug_mode(mode)


def simulated_device_sync(*args, **kwargs) -> None:
    """What c10 does on `torch.cuda.synchronize()` for the trace: CPU tests put it where a GPU would synchronize
    (DeepSpeed's CPU accelerator's `synchronize`, a no-op)."""
    from torch.cuda import _gpu_trace

    _gpu_trace.DeviceSynchronizationCallbacks.fire_callbacks()


@dataclass
class DeviceWaits:
    """Records the host's waits for the device inside `with waits:`; `phase()` marks which part of an update runs.
    `set_mode`: sets torch's sync-debug mode (tests pass a stand-in: a CPU has none)."""
    set_mode: object = _set_sync_debug_mode
    waits: list[Wait] = field(default_factory=list)
    current: str = MICRO

    def __enter__(self) -> DeviceWaits:
        _hook()
        _ACTIVE.append(self)
        self.set_mode("error")
        return self

    def __exit__(self, *exc) -> None:
        self.set_mode("default")
        _ACTIVE.remove(self)

    @contextlib.contextmanager
    def phase(self, name: str):
        """Run the block as phase `name`: MICRO (strict) or STEP (DeepSpeed's allowed reads only)."""
        before = self.current
        self.current = name
        self.set_mode("error" if name == MICRO else "default")
        try:
            yield
        finally:
            self.current = before
            self.set_mode("error" if before == MICRO else "default")

    def record(self, kind: str, stack) -> None:
        owner, function, where = _first_frame_outside_torch(stack)
        self.waits.append(Wait(kind, owner, function, where, self.current, threading.current_thread().name))

    def raised(self, error: BaseException) -> None:
        """A sync-debug error that ended a micro-step: recorded as a wait where it was made."""
        self.record("sync-debug", traceback.extract_tb(error.__traceback__))

    def allowed(self, w: Wait) -> bool:
        return w.phase == STEP and (w.owner, w.function) in ALLOWED_AT_STEP

    def problems(self, main: str = "MainThread") -> list[str]:
        """The training thread's waits that are not allowed, each with where it was made."""
        return [f"{w.kind} synchronization in the {w.phase} at {w.where} ({w.owner}: {w.function})"
                for w in self.waits if w.thread == main and not self.allowed(w)]

    def per_update(self, updates: int, main: str = "MainThread") -> dict[str, float]:
        """The training thread's allowed waits per update, by function: what the summary reports."""
        counts: dict[str, float] = {}
        for w in self.waits:
            if w.thread == main and self.allowed(w):
                counts[w.function] = counts.get(w.function, 0) + 1 / updates
        return counts


@contextlib.contextmanager
def boundary_steps_lenient(engine, waits: DeviceWaits):
    """`engine.step()` at an update's last micro-step runs as the STEP phase: DeepSpeed's optimizer step. The loop's
    own code (`engine.train_step`) is untouched; only the engine object's method is wrapped, for the block."""
    real = engine.step

    def step(*a, **k):
        if not engine.is_gradient_accumulation_boundary():
            return real(*a, **k)
        with waits.phase(STEP):
            return real(*a, **k)

    engine.step = step
    try:
        yield
    finally:
        del engine.step  # the class's method again
