"""MFU's denominator: each GPU by the name torch reports for it (torch.cuda.get_device_name()), H100 SXM, PCIe and
NVL told apart, and a variant the table does not know gets NaN (MFU not logged as a number) rather than a
sibling's peak."""

import math

import pytest

from mm_ds.runtime.training.peaks import gpu_peak_tflops


@pytest.mark.parametrize("name, half, fp32", [
    ("NVIDIA H100 80GB HBM3", 989.4, 494.7),  # SXM5
    ("NVIDIA H100 SXM5 80GB", 989.4, 494.7),
    ("NVIDIA H100 PCIe", 756.0, 378.0),
    ("NVIDIA H100 NVL", 835.5, 417.5),
    ("NVIDIA H200", 989.4, 494.7),
    ("NVIDIA H200 NVL", 835.5, 417.5),
    ("NVIDIA A100-SXM4-80GB", 312.0, 156.0),
    ("NVIDIA A100 80GB PCIe", 312.0, 156.0),
    ("NVIDIA A100-PCIE-40GB", 312.0, 156.0),
    ("Tesla V100-SXM2-16GB", 125.0, 15.7),
    ("NVIDIA A10", 125.0, 62.5),
    ("NVIDIA L4", 121.0, 60.0),
])
def test_known_gpus_by_the_name_torch_reports(name, half, fp32):
    assert gpu_peak_tflops(name, half=True) == half and gpu_peak_tflops(name, half=False) == fp32


@pytest.mark.parametrize("name", ["NVIDIA H100", "NVIDIA H100 96GB HBM3", "NVIDIA H100 PCIe MIG 1g.10gb",
                                  "NVIDIA H100 NVL 2", "NVIDIA H800", "NVIDIA GH200 480GB", "NVIDIA A10G",
                                  "Tesla V100S-PCIE-32GB", "NVIDIA L40S", "NVIDIA GeForce RTX 4090"])
def test_an_unknown_variant_gets_no_siblings_peak(name):
    assert math.isnan(gpu_peak_tflops(name)) and math.isnan(gpu_peak_tflops(name, half=False))
