"""How `make` gets DeepSpeed's FusedAdam (the bf16 engine configs' optimizer) on this machine, decided before
DeepSpeed is installed, from torch's build and the CUDA compiler:

    python tests/gpu/fused_adam.py          prints the variables for DeepSpeed's build (the Makefile's install)
    python tests/gpu/fused_adam.py --gpu    also: a CUDA torch sees a GPU and FusedAdam loads (`make test-gpu`)

FusedAdam is compiled from source, at install (DS_BUILD_FUSED_ADAM=1) or by the first process that needs it;
either way a GPU build needs nvcc. So:
- a CPU build of torch: DeepSpeed's CPU FusedAdam, compiled at install with the C++ compiler;
- a CUDA build of torch and nvcc of the same major CUDA release: the CUDA op, compiled at install for
  DeepSpeed's default GPU architectures (or TORCH_CUDA_ARCH_LIST), also on a machine that shows no GPU
  (DS_ACCELERATOR=cuda); DeepSpeed's own check refuses a minor release mismatch that torch accepts, so that
  check is skipped then (DS_SKIP_CUDA_CHECK=1);
- a CUDA build of torch and no nvcc, or nvcc of another major release: no way to build it. Stop, saying what
  to install, instead of failing inside DeepSpeed's build (CUDA_HOME not set) or at the first bf16 update.
nvcc is found as torch finds it: $CUDA_HOME or $CUDA_PATH, else `nvcc` on PATH, else /usr/local/cuda.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys


class Stop(Exception):
    """The install cannot give this machine a FusedAdam: the message says what to install."""


def decide(torch_cuda: str | None, nvcc: str | None) -> dict[str, str]:
    """The variables for DeepSpeed's build given torch's CUDA release (None: a CPU build) and nvcc's (None: none)."""
    if torch_cuda is None:
        return {"DS_BUILD_FUSED_ADAM": "1"}
    toolkit = (f"the CUDA {torch_cuda} toolkit (nvcc and headers: e.g. NVIDIA's cuda-toolkit-{torch_cuda.replace('.', '-')} "
               f"package, or `conda install -c nvidia cuda-toolkit={torch_cuda}`), then point CUDA_HOME at it or put its "
               f"bin/ first on PATH, and run make again")
    if nvcc is None:
        raise Stop(f"torch was built with CUDA {torch_cuda} and there is no nvcc here ($CUDA_HOME, $CUDA_PATH, PATH, "
                   f"/usr/local/cuda): DeepSpeed's FusedAdam, the optimizer of the bf16 engine configs, is compiled from "
                   f"CUDA source, at install or at first use, and cannot be built. Install {toolkit}")
    if nvcc.split(".")[0] != torch_cuda.split(".")[0]:
        raise Stop(f"nvcc is CUDA {nvcc} but torch was built with CUDA {torch_cuda}: FusedAdam compiled by this nvcc "
                   f"would not load in this torch. Install {toolkit}")
    env = {"DS_BUILD_FUSED_ADAM": "1", "DS_ACCELERATOR": "cuda"}
    if nvcc.split(".")[:2] != torch_cuda.split(".")[:2]:
        env["DS_SKIP_CUDA_CHECK"] = "1"
    return env


def find_nvcc(env=os.environ) -> str | None:
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if home:
        return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc", path=env.get("PATH")) or (
        "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda") else None)


def nvcc_release(nvcc: str | None) -> str | None:
    """"12.4" from `nvcc -V` ("Cuda compilation tools, release 12.4, V12.4.131"); None if it does not run."""
    if nvcc is None:
        return None
    try:
        out = subprocess.run([nvcc, "-V"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else None


def check_gpu() -> None:
    """`make test-gpu`: a CUDA torch, a GPU it can see, and a FusedAdam that loads for it."""
    import torch

    if torch.version.cuda is None:
        raise Stop(f"make test-gpu needs a CUDA build of torch; {sys.executable} has torch {torch.__version__}, a CPU "
                   f"build. Install the CUDA build of the pinned version (pip's default wheels on Linux), e.g. remove "
                   f".venv and run `make test-gpu` on the GPU machine, or name a Python whose torch is a CUDA build: "
                   f"`PYTHON=python3 make test-gpu`")
    if not torch.cuda.is_available():
        raise Stop(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU here "
                   f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); run `make test-gpu` where "
                   f"nvidia-smi lists the GPUs")
    from deepspeed.ops.op_builder import FusedAdamBuilder

    try:
        FusedAdamBuilder().load(verbose=False)
    except Exception as e:  # a prebuilt op for another accelerator, then a just-in-time build that failed
        raise Stop(f"DeepSpeed's FusedAdam does not load on this GPU ({type(e).__name__}: {e}); with .venv, "
                   f"reinstall DeepSpeed here: rm .venv/.mm-ds-installed && make test-gpu; with PYTHON= (DeepSpeed "
                   f"from a wheel without ops), FusedAdam is compiled here at first use: it needs nvcc of torch's "
                   f"CUDA release ($CUDA_HOME) and ninja") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="store_true", help="check the GPU path instead (make test-gpu)")
    ap.add_argument("--torch-cuda", help="torch's CUDA release, 'none' for a CPU build (default: the installed "
                                         "torch's; tests set it)")
    a = ap.parse_args(argv)
    try:
        if a.gpu:
            check_gpu()
            return 0
        if a.torch_cuda is None:
            import torch
            torch_cuda = torch.version.cuda
        else:
            torch_cuda = None if a.torch_cuda == "none" else a.torch_cuda
        print(" ".join(f"{k}={v}" for k, v in decide(torch_cuda, nvcc_release(find_nvcc())).items()))
        return 0
    except Stop as e:
        print(f"mm-ds install: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
