"""`train.compile`: a stage's model compiled by `torch.compile` after `deepspeed.initialize` (ZeRO 0-2).

What is compiled. The model's `forward`, set on the engine's module (`compile_forward`), not DeepSpeed's
`engine.compile()`. In DeepSpeed 0.19.8 that call, without its DeepCompile (CUDA only, ZeRO 1-3 passes of its own),
is `module.compile()`: it compiles the module's `__call__`, with the forward hooks the engine put on the module (its
timers and, under ZeRO 3, the flags it sets on every submodule), so the engine JSON decides what dynamo traces
(`wall_clock_breakdown`: 4 graph breaks per forward, measured). A compiled `forward` leaves those hooks eager around
one graph. The backward of each graph is one autograd node
(AOTAutograd): every parameter's gradient lands after it, and DeepSpeed's hooks on the gradients (ZeRO 1-2's
reduction buckets, BF16_Optimizer's fp32 accumulation) run as they do after an eager backward, only with less
overlap of reduction and backward. ZeRO 3 is refused (`check`): its hooks gather and release each submodule's
parameters around the submodule's forward and are `torch.compiler.disable`d, a graph break at every Linear and
LayerNorm; DeepSpeed compiles ZeRO 3 with DeepCompile only.

Static shapes (`dynamic=False`). Each tensor a micro-step gives the model has one shape per stage: the masked
positions are padded to a fixed count (mm_ds/data/mlm.py), finetuning pads its pairs to its sequence length when
compiling (mm_ds/stages/finetune.py). The graphs are then one without and one with an attention mask (a batch of full
blocks passes none, so that SDPA keeps its unmasked kernels), per depth a multi-depth Step 2 runs: `max_graphs`, the
compiled region's own recompile limit (`isolate_recompiles`: a stage compiled after another in the same process,
`mm-ds run`'s one job or `mm-ds bench`, starts its own count).

Dropout. Compiled, mm_ds/model/model.py's `dropout` is `F.dropout`: inductor draws its masks from its own generator,
seeded from torch's, which the loop seeds per micro-step (a resumed compiled run retraces the uninterrupted one), but
they are not the masks of eager CPU dropout: compiled and eager runs agree within rounding only at dropout 0.

Exact resume. A compiled run retraces itself bitwise only if its kernels are deterministic. Inductor's C++ kernels
add into a tensor at repeated indices with atomic adds from every OpenMP thread (the backward of the token and
position embeddings: `index_put` with accumulate), in whatever order the threads meet: with more than one thread per
rank, two runs from the same seed differ in the last bits of the embeddings' gradients, and a resumed run is not the
uninterrupted one. `compile_forward` therefore turns on torch's deterministic algorithms (warn only, uninitialized
memory left unfilled) while an inductor-compiled module lives on a CPU (`Compiled.deterministic`): inductor then calls
ATen's `index_put_` (serial on a CPU) for those adds. Dynamo guards on the setting, so it holds for every call, not
only the compile; eager CPU kernels are deterministic already. On a GPU it is left as it is (Triton's atomic adds are
faster; the exact-resume tests run on CPUs).

Compile time. Graphs compile at their first call (the backward at its first backward), inside updates; torch's
compile callbacks count the seconds (`seconds()`; per compiled module, `Compiled`), which the log rows take out of
the throughput (mm_ds/runtime/training/train_log.py) and `engine.train_step` reports on rank 0 as they happen (`news`).

Importing this module imports nothing of torch's compiler stack: with train.compile off, the ranks keep
TORCHDYNAMO_DISABLE=1 (`dynamo_switch`), which saves DeepSpeed's optimizer set-up ~1.3-2.5 s of every rank's start.
"""

from __future__ import annotations

import gc
import os
import time
import weakref
from dataclasses import dataclass, field

import torch

from ...config import ConfigError

BACKENDS = ("inductor", "aot_eager")
"""train.compile_backend: inductor (generated C++ or Triton kernels), or aot_eager (the same graphs, forward and
backward, run by eager kernels: compiles in seconds; for tests and for telling a compiler fault from a model's)."""
DISABLE = "TORCHDYNAMO_DISABLE"

_clock = {"seconds": 0.0, "started": None, "hooked": False, "current": None, "counters": (0, 0)}
_state = {"disabled_by_us": False, "deterministic_was": None}
_live: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> its Compiled


def check(compile_on: bool, backend: str, ds: dict, zero: int, path) -> None:
    """The run config's compile keys against the engine JSON `ds` (at `path`, ZeRO stage `zero`): a ConfigError
    naming what to change."""
    if "compile" in ds:
        raise ConfigError(f"{path}: a \"compile\" block (DeepSpeed's engine.compile() and DeepCompile): mm-ds never "
                          f"calls engine.compile(), so it would do nothing; drop the block and set train.compile=true "
                          f"(mm_ds/runtime/training/compiled.py says what that compiles)")
    if backend not in BACKENDS:
        raise ConfigError(f"train.compile_backend={backend!r}: choose one of {', '.join(BACKENDS)}")
    if compile_on and zero == 3:
        raise ConfigError(f"train.compile=true with {path} (ZeRO 3): DeepSpeed 0.19.8 gathers each module's parameters "
                          f"in hooks torch.compile cannot trace, a graph break at every layer; use ZeRO 0-2 "
                          f"(e.g. ds_config=bf16_zero1.json) or train.compile=false")


def dynamo_switch(on: bool) -> bool:
    """Set TORCHDYNAMO_DISABLE for an engine about to be built: 1 when it compiles nothing (DeepSpeed's optimizer
    set-up then skips part of torch's compiler stack), removed again when a later engine of the process compiles.
    A 1 the user set is theirs: returns False (train eager) instead of compiling."""
    if not on:
        if DISABLE not in os.environ:
            os.environ[DISABLE], _state["disabled_by_us"] = "1", True
        return False
    if os.environ.get(DISABLE) == "1":
        if not _state["disabled_by_us"]:
            return False
        del os.environ[DISABLE]
        _state["disabled_by_us"] = False
    return True


# ---------------------------------------------------------------- compile time and counts

def seconds() -> float:
    """Seconds this process has spent compiling, so far (0 before anything compiled)."""
    started = _clock["started"]
    return _clock["seconds"] + (time.perf_counter() - started if started is not None else 0.0)


def _counters() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def graph_break_reasons() -> list[str]:
    """Why dynamo broke graphs in this process (the first line of each reason)."""
    from torch._dynamo.utils import counters

    return [reason.splitlines()[0] for reason in counters["graph_break"]]


def _hook_clock() -> None:
    """Count compiles from torch's callbacks (dynamo tracing a frame, a lazy backward compile), once per process:
    the seconds, and per `Compiled` (the one whose forward ran last: a backward compiles after its forward) its
    graphs, graph breaks and traced frames. Nothing runs per call of a compiled forward but the attribution."""
    if _clock["hooked"]:
        return
    from torch._dynamo.callback import CallbackTrigger, callback_handler

    def start(args) -> None:
        _clock["started"], _clock["counters"] = time.perf_counter(), _counters()
        made = _clock["current"]
        if made is not None and args.callback_trigger == CallbackTrigger.DYNAMO:  # a first compile or a recompile
            made.frames.append(str(args.compile_id))

    def end(_args) -> None:
        # A compile leaves a heap of long-lived objects: Python's next full collection would walk them all inside
        # some later update (~1 s on a rank, which every other rank waits for at its next collective). Walked
        # once here, as compile time, then kept out of later collections (`release` lets them go).
        gc.collect()
        gc.freeze()
        spent = time.perf_counter() - _clock["started"] if _clock["started"] is not None else 0.0
        _clock["seconds"] += spent
        _clock["started"] = None
        made = _clock["current"]
        if made is not None:
            (g0, b0), (g1, b1) = _clock["counters"], _counters()
            made.compile_s += spent
            made.graphs += g1 - g0
            made.graph_breaks += b1 - b0

    callback_handler.register_start_callback(start)
    callback_handler.register_end_callback(end)
    _clock["hooked"] = True


@dataclass
class Compiled:
    """How a module's forward is compiled, and what compiling it has cost so far."""
    backend: str
    max_graphs: int
    compile_s: float = 0.0
    graphs: int = 0
    graph_breaks: int = 0
    frames: list[str] = field(default_factory=list)
    """dynamo's "frame/compile" id of each trace: a frame traced again is a recompile (a new mask, depth, shape)."""
    said: float = 0.0
    """Compile seconds already reported by `news`."""
    deterministic: bool = False
    """Whether this module holds torch's deterministic algorithms on (`deterministic`): inductor on a CPU."""

    def stats(self) -> dict[str, float]:
        """Graphs, graph breaks, recompiles and compile seconds of this module so far."""
        return {"graphs": self.graphs, "graph_breaks": self.graph_breaks, "compile_s": self.compile_s,
                "recompiles": len(self.frames) - len({f.split("/")[0] for f in self.frames})}

    def news(self) -> str | None:
        """A line on compiles since the last call (None: nothing compiled since)."""
        if self.compile_s <= self.said:
            return None
        s, new, self.said = self.stats(), self.compile_s - self.said, self.compile_s
        return (f"[mm-ds] compiled in {new:.1f} s ({self.backend}; so far {s['graphs']:.0f} graph(s) of at most "
                f"{self.max_graphs}, {s['graph_breaks']:.0f} graph break(s), {s['recompiles']:.0f} recompile(s), "
                f"{s['compile_s']:.1f} s); compile time is left out of tokens_per_s")


def deterministic(on: bool) -> None:
    """Hold torch's deterministic algorithms on (warn only, uninitialized memory left unfilled) for a compiled module
    (module docstring: Exact resume), or give back what was set before once no live module holds them. A setting the
    user made (deterministic algorithms already on) is left as it is."""
    if on and _state["deterministic_was"] is None:
        if torch.are_deterministic_algorithms_enabled():
            return
        _state["deterministic_was"] = torch.utils.deterministic.fill_uninitialized_memory
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = False  # a fill of every torch.empty: time, no help
    elif not on and _state["deterministic_was"] is not None and not any(m.deterministic for m in _live.values()):
        torch.use_deterministic_algorithms(False)
        torch.utils.deterministic.fill_uninitialized_memory = _state["deterministic_was"]
        _state["deterministic_was"] = None


def compile_forward(module: torch.nn.Module, backend: str, max_graphs: int) -> Compiled:
    """Compile `module.forward` in place (the engine's module: state-dict keys unchanged); `release` undoes it."""
    _hook_clock()
    device = next(module.parameters(), torch.empty(0)).device
    made = _live[module] = Compiled(backend, max_graphs, deterministic=backend == "inductor" and device.type == "cpu")
    if made.deterministic:
        deterministic(True)
    fn = torch.compile(type(module).forward.__get__(module), backend=backend, dynamic=False,
                       recompile_limit=max_graphs, isolate_recompiles=True)

    def forward(*args, **kwargs):
        _clock["current"] = made  # whose compiles the callbacks count
        return fn(*args, **kwargs)

    module.forward = forward
    return made


def of(module: torch.nn.Module) -> Compiled | None:
    """`module`'s `Compiled`, if its forward is compiled."""
    return _live.get(module)


def release(module: torch.nn.Module) -> None:
    """The module's own forward again (its compiled one, and what it holds, can go)."""
    module.__dict__.pop("forward", None)
    if (made := _live.pop(module, None)) is not None:
        if _clock["current"] is made:
            _clock["current"] = None
        deterministic(False)
        gc.unfreeze()  # what was frozen after its compiles may be collected with the engine
