"""The device's peak FLOP/s, the denominator of MFU (`flops.mfu`, the training logs, `mm-ds bench`).

A GPU's peak is its datasheet's dense rate in the training dtype; a CPU has no datasheet number worth
trusting, so its peak is measured: the fp32 matmul rate of this process's threads.
"""

from __future__ import annotations

import statistics
import time

import torch

# Dense peak TFLOP/s per GPU: (bf16/fp16, fp32 as TF32). MFU in the logs is against the training dtype's peak.
GPU_PEAK_TFLOPS = {"H100": (989.0, 494.0), "H200": (989.0, 494.0), "A100": (312.0, 156.0),
                   "V100": (125.0, 15.7), "A10": (125.0, 62.5), "L4": (121.0, 60.0)}


def device_peak_flops(peak_tflops: float | None = None, half: bool = True) -> float:
    """Peak FLOP/s of one rank's device: `peak_tflops` if set (config key peak_tflops), the GPU's dense peak
    in bf16/fp16 (`half`) or fp32, or on CPU the measured fp32 matmul rate of this rank's threads. NaN for a
    GPU that is not in the table."""
    if peak_tflops:
        return peak_tflops * 1e12
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        for k, (low, fp32) in GPU_PEAK_TFLOPS.items():
            if k in name:
                return (low if half else fp32) * 1e12
        return float("nan")
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
