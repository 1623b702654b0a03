"""The GPU path's install decision (tests/gpu/fused_adam.py), tested where a CPU can: the decision per torch build
and nvcc, the script finding a fake nvcc as torch would, the Makefile's install building DeepSpeed with what it
decides (a fake python standing in for pip), and `make test-gpu` stopping here, where torch is a CPU build."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "gpu" / "fused_adam.py"
sys.path.insert(0, str(SCRIPT.parent))
import fused_adam  # noqa: E402


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def fake_cuda(root: Path, release: str) -> Path:
    """A CUDA_HOME whose bin/nvcc prints what nvcc -V prints."""
    executable(root / "bin" / "nvcc", f"#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                                      f"echo 'Cuda compilation tools, release {release}, V{release}.131'\n")
    return root


def test_the_decision_per_torch_build_and_nvcc():
    assert fused_adam.decide(None, None) == {"DS_BUILD_FUSED_ADAM": "1"}  # CPU torch: the CPU op, no nvcc needed
    assert fused_adam.decide("12.4", "12.4") == {"DS_BUILD_FUSED_ADAM": "1", "DS_ACCELERATOR": "cuda"}
    assert fused_adam.decide("12.8", "12.4")["DS_SKIP_CUDA_CHECK"] == "1"  # torch accepts a minor mismatch
    with pytest.raises(fused_adam.Stop, match=r"no nvcc.*Install the CUDA 12\.4 toolkit"):
        fused_adam.decide("12.4", None)
    with pytest.raises(fused_adam.Stop, match=r"nvcc is CUDA 11\.8 but torch was built with CUDA 12\.4"):
        fused_adam.decide("12.4", "11.8")


def run_script(*args, env):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env)


def test_the_script_finds_nvcc_as_torch_does(tmp_path):
    base = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    cuda = fake_cuda(tmp_path / "cuda", "12.4")
    on_path = run_script("--torch-cuda", "12.4", env=base | {"PATH": f"{cuda / 'bin'}:{base['PATH']}"})
    assert on_path.returncode == 0 and on_path.stdout.split() == ["DS_BUILD_FUSED_ADAM=1", "DS_ACCELERATOR=cuda"]
    home = run_script("--torch-cuda", "12.6", env=base | {"CUDA_HOME": str(cuda)})
    assert home.stdout.split() == ["DS_BUILD_FUSED_ADAM=1", "DS_ACCELERATOR=cuda", "DS_SKIP_CUDA_CHECK=1"]
    runtime_only = run_script("--torch-cuda", "12.4", env=base | {"CUDA_HOME": str(tmp_path / "runtime")})
    assert runtime_only.returncode == 2 and "no nvcc" in runtime_only.stderr and not runtime_only.stdout
    if fused_adam.find_nvcc(base) is None:  # this machine has none: the common GPU image
        absent = run_script("--torch-cuda", "12.4", env=base)
        assert absent.returncode == 2 and "Install the CUDA 12.4 toolkit" in absent.stderr
    if torch.version.cuda is None:  # the installed torch, a CPU build here: the CPU op
        assert run_script(env=base).stdout.split() == ["DS_BUILD_FUSED_ADAM=1"]


@pytest.mark.parametrize("torch_cuda, nvcc, built", [("12.4", "12.4", ["DS_ACCELERATOR=cuda", "DS_BUILD_FUSED_ADAM=1"]),
                                                     ("none", None, ["DS_BUILD_FUSED_ADAM=1"]),
                                                     ("12.4", None, None)])
def test_the_makefile_install_builds_deepspeed_as_decided(tmp_path, torch_cuda, nvcc, built):
    """`make`'s install recipe run for real, with a python that runs the decision script and logs the DS_* build
    variables pip would see for DeepSpeed instead of installing anything."""
    log = tmp_path / "deepspeed-build.env"
    py = executable(tmp_path / "python", f"""#!/bin/bash
if [ "$1" = tests/gpu/fused_adam.py ]; then exec {sys.executable} "$@" --torch-cuda {torch_cuda}; fi
if [[ " $* " == *" deepspeed "* ]]; then env | grep '^DS_' | sort > {log}; fi
""")
    cuda = fake_cuda(tmp_path / "cuda", nvcc) if nvcc else tmp_path / "no-cuda"
    venv = tmp_path / "venv"
    venv.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))} | {"CUDA_HOME": str(cuda)}
    proc = subprocess.run(["make", "-B", f"VENV={venv}", f"PY={py}", str(venv / ".mm-ds-installed")], cwd=ROOT,
                          capture_output=True, text=True, env=env)
    if built is None:
        assert proc.returncode != 0 and "no nvcc" in proc.stderr and "cuda-toolkit" in proc.stderr
        assert not log.exists() and not (venv / ".mm-ds-installed").exists()  # stopped before DeepSpeed's build
    else:
        assert proc.returncode == 0, proc.stderr
        assert log.read_text().split() == sorted(built + ["DS_BUILD_OPS=0", "DS_ENABLE_NINJA=1"])


@pytest.mark.skipif(torch.version.cuda is not None, reason="checks the stop of a CPU build of torch")
def test_make_test_gpu_stops_here_saying_why():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--gpu"], capture_output=True, text=True)
    assert proc.returncode == 2 and "a CPU build" in proc.stderr and "CUDA build of torch" in proc.stderr
    make = subprocess.run(["make", "-n", "test-gpu"], cwd=ROOT, capture_output=True, text=True)
    lines = make.stdout.splitlines()
    check = next(i for i, line in enumerate(lines) if "fused_adam.py --gpu" in line)
    assert check < next(i for i, line in enumerate(lines) if "pytest" in line and "tests/gpu" in line)
