"""The GPU suite on a machine without network whose Python already has a CUDA torch (e.g. torch 2.11 + CUDA 13, nvcc,
ninja; no DeepSpeed): that Python and its torch instead of a .venv, the rest from a folder of wheels made on a machine
with network.

    python tests/gpu/wheels.py build DIR [--python-version 3.12] [--platform TAG ...]    # make wheels
    python tests/gpu/wheels.py install [DIR]                                   # PYTHON=python3 make test-gpu WHEELS=DIR

build    into DIR, with this Python (it needs torch, any build: DeepSpeed's build imports it):
         - DeepSpeed 0.19.8 as a pure wheel: `pip wheel` without build isolation and without compiling any op
           (DS_BUILD_OPS=0); FusedAdam is then compiled on the GPU machine at first use, by its nvcc and ninja, for
           its own GPU (tests/gpu/fused_adam.py --gpu does it before the tests, and says what is missing);
         - mm-ds itself (a pure wheel of this checkout);
         - binary wheels of what those need beside torch, for the GPU machine's Python (`--python-version`, default
           this one's; `--platform`, default `PLATFORMS`), at constraints.txt's tested versions: DeepSpeed's
           requirements (read from the wheel just built), mm-ds's (setup.py) but those in `LEFT_OUT`, and pytest;
           `pip download` resolves their own dependencies.
install  into this Python's environment (the one `PYTHON=` names): first refuses a Python without torch or with a
         CPU build of it (nothing is installed then); then `pip install --no-index --find-links DIR` of whatever of
         `requirements()` is missing or older than required, and mm-ds's wheel without dependencies (its setup.py
         pins the torch the CPU suite ran with; this machine keeps its own). Without DIR it only checks that nothing
         is missing, and names what is and the two commands otherwise. The tests then run this checkout
         (PYTHONPATH), not the installed copy.
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata as md
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEEPSPEED = "deepspeed==0.19.8"
# x86-64 Linux wheels a glibc-2.28 machine takes (torch's own wheels need it): pip expands manylinux2014 to the older
# manylinux tags but not manylinux_2_28 to 2_27 or 2_17, so each is named
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
LEFT_OUT = {  # of mm-ds's install_requires: not for the GPU suite here, and why
    "torch": "the machine's own CUDA build",
    "datasets": "Hugging Face inputs only (`mm-ds prepare` from a hub dataset), never the GPU suite",
    "mpi4py": "the mpirun/srun launch paths only; a binding of the machine's own MPI (pip install mpi4py there)",
}


class Stop(Exception):
    """This Python cannot run the GPU suite yet: the message says what to do."""


def _name(req: str) -> str:
    return re.split(r"[<>=!~ ;\[]", req, maxsplit=1)[0].strip().lower().replace("_", "-")


def setup_arg(name: str):
    """A keyword argument of setup.py's `setup()` call, read without running it."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "setup")
    return ast.literal_eval(next(k.value for k in call.keywords if k.arg == name))


def install_requires() -> list[str]:
    return setup_arg("install_requires")


def deepspeed_requires(wheel: Path) -> list[str]:
    """DeepSpeed's own requirements (no extras) from its wheel's metadata, torch left out."""
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    reqs = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    return [r for r in reqs if "extra ==" not in r and _name(r) != "torch"]


def requirements() -> list[str]:
    """What `install` makes sure of beside torch: DeepSpeed, mm-ds's requirements but `LEFT_OUT`, pytest (setup.py's
    test extra)."""
    pytest_req = [r for r in setup_arg("extras_require")["test"] if _name(r) == "pytest"]
    return [DEEPSPEED] + [r for r in install_requires() if _name(r) not in {*LEFT_OUT, "deepspeed"}] + pytest_req


def check_torch() -> str:
    """This Python's torch must be a CUDA build: its version, or Stop."""
    try:
        import torch
    except ImportError:
        raise Stop(f"{sys.executable} has no torch: PYTHON= must name a Python whose torch is a CUDA build (the GPU "
                   f"machine's own), or leave PYTHON unset to build .venv with pip's torch") from None
    if torch.version.cuda is None:
        raise Stop(f"{sys.executable} has torch {torch.__version__}, a CPU build: the GPU suite needs a CUDA build of "
                   f"torch. Name the GPU machine's Python whose torch was built with CUDA (python -c 'import torch; "
                   f"print(torch.version.cuda)' prints a release there); nothing was installed")
    return torch.__version__


def missing(reqs: list[str]) -> list[str]:
    """Requirements whose distribution is not installed at all (pip judges versions when it installs)."""
    out = []
    for req in reqs:
        try:
            md.version(_name(req))
        except md.PackageNotFoundError:
            out.append(req)
    return out


def pip(*args: str, env: dict | None = None) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", *args], env=env)
    if proc.returncode != 0:
        raise Stop(f"pip {' '.join(args[:6])} ... failed (exit {proc.returncode}), see above; a Python whose "
                   f"environment pip may not change (\"externally managed\") takes a venv made from it with "
                   f"--system-site-packages, or PIP_BREAK_SYSTEM_PACKAGES=1")


def install(folder: str | None, any_torch: bool = False) -> None:
    if not any_torch:
        check_torch()
    reqs = requirements()
    absent = missing(reqs)
    if not folder:
        if absent:
            raise Stop(f"{sys.executable} lacks {', '.join(_name(r) for r in absent)}: on a machine with network run "
                       f"`make wheels WHEELS=DIR` (DIR for this machine's Python: add GPU_PYTHON_VERSION="
                       f"{sys.version_info[0]}.{sys.version_info[1]}), copy DIR here, then `PYTHON={sys.executable} "
                       f"make test-gpu WHEELS=DIR`")
        return
    if not Path(folder).is_dir():
        raise Stop(f"WHEELS={folder}: no such folder (make it with `make wheels WHEELS={folder}` where there is "
                   f"network)")
    pip("install", "--no-index", "--find-links", folder, "--disable-pip-version-check", *reqs)
    if list(Path(folder).glob("mm_ds-*.whl")):
        pip("install", "--no-index", "--find-links", folder, "--disable-pip-version-check", "--no-deps", "mm-ds")


def build(folder: str, python_version: str | None, platforms: list[str] | None) -> None:
    import torch  # noqa: F401 (DeepSpeed's build imports it: say so here rather than inside pip)

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DS_BUILD_")} | {"DS_BUILD_OPS": "0"}
    env.pop("DS_ACCELERATOR", None)
    pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(out), DEEPSPEED, env=env)
    pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT))
    ds = next(out.glob("deepspeed-0.19.8-*.whl"))
    target = []
    if python_version or platforms:  # binary wheels for another Python: pip matches platform tags literally
        target = ["--only-binary=:all:", "--python-version", python_version or f"{sys.version_info[0]}."
                  f"{sys.version_info[1]}"] + [a for p in platforms or PLATFORMS for a in ("--platform", p)]
    reqs = deepspeed_requires(ds) + [r for r in requirements() if _name(r) != "deepspeed"]
    pip("download", "-d", str(out), "-c", str(ROOT / "constraints.txt"), *target, *reqs)
    print(f"wheels for the GPU machine in {out}: copy it there, then run `PYTHON=python3 make test-gpu WHEELS={out}`")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="fill a folder of wheels (network; `make wheels WHEELS=DIR`)")
    b.add_argument("folder")
    b.add_argument("--python-version", help="the GPU machine's Python, e.g. 3.12 (default: this one's)")
    b.add_argument("--platform", action="append", help=f"its platform tags, repeated (default with --python-version: "
                                                       f"{' '.join(PLATFORMS)})")
    i = sub.add_parser("install", help="into this Python, from a folder of wheels (no network)")
    i.add_argument("folder", nargs="?")
    i.add_argument("--any-torch", action="store_true", help="install over a CPU torch too (tests of the folder)")
    sub.add_parser("requirements", help="print what install makes sure of")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "build":
            build(a.folder, a.python_version, a.platform)
        elif a.cmd == "install":
            install(a.folder, a.any_torch)
        else:
            print("\n".join(requirements()))
        return 0
    except Stop as e:
        print(f"mm-ds GPU suite: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
