"""`mm-ds bench` per device: what it times and against which peak, on a CPU or on a CUDA GPU.

    mm-ds bench --preset base --json bench-gpu.json      # on the target GPU: then `mm-ds plan --bench bench-gpu.json`

cpu   the CPU figures of docs/bench.md: the engine JSON of `--ds-config` (fp32 by default), the preset's micro batch,
      MFU against the fastest fp32 matmul measured in the run, the transformers peer, prepare's encoding, the host
      side against an H100's modelled device time, and the CPU speed targets.
cuda  the paper presets' engine JSON (bf16, ZeRO 1: `ds_config` of presets/paper/pretrain.yaml) on the first
      visible GPU, 32 sequences per micro-step (Step 1's per-GPU micro batch in `mm-ds run paper`), batches built
      ahead and pinned as `engine.train` does, MFU against the GPU's datasheet peak in the training dtype
      (mm_ds/runtime/training/peaks.py, or `--peak-tflops`), the GPU's peak allocated memory per stage. The timing is
      the CPU's: `engine.train_step` through `engine.build_engine`, each update timed to its end (its loss read
      back), the median after warm-up updates. Not run there: the transformers peer (a CPU fp32 comparison),
      prepare's encoding (a CPU job in every recipe) and the host side (the CPU's estimate of what a GPU's stage
      table measures). Its targets: Step 2's mini-model speed-up against A3, the loader's share of a step, and
      Step 1 at the MFU `mm-ds plan` assumes (the plan's hours hold at this GPU's measured rate).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...config import read_preset
from ...runtime.training.peaks import gpu_peak_tflops
from ..plan.model import Cluster


@dataclass(frozen=True)
class Device:
    kind: str
    micro_batch: int | None
    """Default sequences per step; None: the bench preset's."""
    steps: int | None
    """Default timed updates per stage; None: the preset's. A GPU update takes milliseconds: more of them."""
    warmup: int | None
    paper_config: bool
    """Default engine JSON: the paper presets' (True) or `--ds-config`'s default, RunConfig's (False)."""
    peer: bool
    encode: bool
    host: bool
    targets: tuple[str, ...]


DEVICES = {
    "cpu": Device("cpu", None, None, None, False, peer=True, encode=True, host=True,
                  targets=("a3_speedup", "peer_pretrain", "peer_adapt_mini", "mfu_pretrain", "prepare_encode",
                           "loader_share", "host_side", "compile_pretrain", "host_side_compiled")),
    "cuda": Device("cuda", 32, 10, 2, True, peer=False, encode=False, host=False,
                   targets=("a3_speedup", "mfu_plan", "loader_share")),
}
PLAN_MFU = Cluster().mfu  # `mm-ds plan`'s default assumption: the cuda target


def choose(name: str) -> Device:
    """`--device`: auto is cuda where torch sees a GPU, else cpu."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device cuda: torch {torch.__version__} sees no CUDA GPU here "
                         f"(torch.version.cuda={torch.version.cuda}); run it on the GPU machine, or --device cpu")
    return DEVICES[name]


def paper_ds_config() -> str:
    """The engine JSON the paper presets train with (presets/paper/pretrain.yaml)."""
    return read_preset("paper/pretrain")["ds_config"]


def gpu_peak(precision: str, peak_tflops: float | None) -> dict:
    """The peak MFU is against on this process's GPU: `--peak-tflops`, else the datasheet's dense rate in the
    training dtype; NaN (MFU unknown) for a GPU not in mm_ds/runtime/training/peaks.py."""
    name = torch.cuda.get_device_name()
    if peak_tflops:
        return {"used_flops": peak_tflops * 1e12, "source": "--peak-tflops", "gpu": name}
    tflops = gpu_peak_tflops(name, half=precision != "fp32")
    source = f"datasheet, dense {precision}" if tflops == tflops else \
        "unknown GPU: not in mm_ds/runtime/training/peaks.py; give --peak-tflops"
    return {"used_flops": tflops * 1e12, "source": source, "gpu": name}


def memory_peak_reset() -> None:
    torch.cuda.reset_peak_memory_stats()


def memory_now() -> int:
    return torch.cuda.memory_allocated()


def memory_peak() -> int:
    """Bytes of tensors the GPU's allocator held at most since the last reset (`torch.cuda.max_memory_allocated`)."""
    return torch.cuda.max_memory_allocated()
