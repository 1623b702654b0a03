"""The device's peak FLOP/s, the denominator of MFU (`flops.mfu`, the training logs, `mm-ds bench`).

A GPU's peak is its datasheet's dense rate in the training dtype; a CPU has no datasheet number worth
trusting, so its peak is measured: the fp32 matmul rate of this process's threads.
"""

from __future__ import annotations

import re
import statistics
import time

import torch

# Dense peak TFLOP/s per GPU: (bf16/fp16, fp32 as TF32), against the name torch reports without "NVIDIA "/"Tesla "
# (whole-name patterns: a variant not listed gets NaN, never a sibling's number). MFU in the logs is against the
# training dtype's peak. From NVIDIA's datasheets, whose Tensor Core figures are "with sparsity": halved here.
# H100: SXM5 ("H100 80GB HBM3") 989.4 / 494.7, PCIe 756 / 378 (datasheet 1,513 / 756), NVL 835.5 / 417.5
# (1,671 / 835); H200 as H100 SXM, H200 NVL as H100 NVL; A100 SXM and PCIe 312 / 156; V100 125 fp16 / 15.7 fp32
# (no TF32); A10 125 / 62.5; L4 121 / 60.
GPU_PEAK_TFLOPS = {r"H100 PCIe( \d+GB)?": (756.0, 378.0), r"H100 NVL": (835.5, 417.5),
                   r"H100 80GB HBM3|H100 SXM5?( \d+GB)?( HBM3)?": (989.4, 494.7),
                   r"H200 NVL": (835.5, 417.5), r"H200( SXM5?)?( \d+GB)?": (989.4, 494.7),
                   r"A100([- ].*)?": (312.0, 156.0), r"V100[- ].*": (125.0, 15.7), r"A10": (125.0, 62.5),
                   r"L4": (121.0, 60.0)}


def gpu_peak_tflops(name: str, half: bool = True) -> float:
    """Dense peak TFLOP/s of the GPU torch calls `name` (torch.cuda.get_device_name()) in bf16/fp16 (`half`) or
    fp32; NaN for a GPU not in GPU_PEAK_TFLOPS (set peak_tflops=... in the run config)."""
    model = re.sub(r"^(NVIDIA |Tesla )+", "", name.strip())
    for pattern, (low, fp32) in GPU_PEAK_TFLOPS.items():
        if re.fullmatch(pattern, model):
            return low if half else fp32
    return float("nan")


def device_peak_flops(peak_tflops: float | None = None, half: bool = True) -> float:
    """Peak FLOP/s of one rank's device: `peak_tflops` if set (config key peak_tflops), the GPU's dense peak
    in bf16/fp16 (`half`) or fp32, or on CPU the measured fp32 matmul rate of this rank's threads. NaN for a
    GPU that is not in the table."""
    if peak_tflops:
        return peak_tflops * 1e12
    if torch.cuda.is_available():
        return gpu_peak_tflops(torch.cuda.get_device_name(), half) * 1e12
    return measure_matmul_peak()["median_flops"]


def measure_matmul_peak(n: int = 1024, reps: int = 8) -> dict:
    """fp32 FLOP/s of an n^3 matmul with this process's threads: median and best of `reps` (CPU MFU's peak)."""
    a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    torch.mm(a, b, out=c)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b, out=c)
        times.append(time.perf_counter() - t0)
    flop = 2 * n ** 3
    return {"n": n, "median_flops": flop / statistics.median(times), "best_flops": flop / min(times)}
