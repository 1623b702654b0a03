"""The GPU path's install, tested where a CPU can: the FusedAdam decision (tests/gpu/fused_adam.py) per torch build
and nvcc, the script finding a fake nvcc as torch would, the Makefile's install building DeepSpeed with what it
decides (a fake python standing in for pip), and `make test-gpu` stopping here, where torch is a CPU build; the path
of a GPU machine without network (tests/gpu/wheels.py: `PYTHON=... make test-gpu WHEELS=DIR`, `make wheels`): the
commands the Makefile runs, its stop before installing anything over a CPU torch, the requirement list against
setup.py, and (MM_DS_TEST_WHEELS=1, once: network and minutes) a real folder of wheels installed into a fresh
Python that has only torch."""

import json
import os
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "gpu" / "fused_adam.py"
sys.path.insert(0, str(SCRIPT.parent))
import fused_adam  # noqa: E402
import wheels  # noqa: E402


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
    text = make.stdout
    assert -1 < text.index("fused_adam.py --gpu &&") < text.index("-m pytest -q tests/gpu")


def make_n(*args) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    proc = subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_make_test_gpu_with_python_runs_that_python_and_installs_from_wheels():
    """`PYTHON=python3 make test-gpu WHEELS=DIR`: that interpreter everywhere (no .venv built), the folder's wheels
    first, then the FusedAdam check, then the suite with this checkout on PYTHONPATH and the summary file."""
    text = make_n("test-gpu", "PYTHON=/opt/gpu/bin/python3", "WHEELS=/data/wheels")
    assert ".venv" not in text and "pip install" not in text  # the Makefile's own install is not run
    lines = text.splitlines()
    assert lines[0] == "/opt/gpu/bin/python3 tests/gpu/wheels.py install /data/wheels"
    assert 'env $build /opt/gpu/bin/python3 tests/gpu/fused_adam.py --gpu' in lines[1]
    assert f"PYTHONPATH={ROOT}" in text and f"MM_DS_GPU_SUMMARY={ROOT}/gpu-summary.txt" in text
    assert text.rstrip().endswith('/opt/gpu/bin/python3 -m pytest -q tests/gpu -m "gpu and not gpu_long"')
    assert make_n("test-gpu", "PYTHON=/p", "LONG=1").rstrip().endswith('-m pytest -q tests/gpu -m "gpu"')
    build = make_n("wheels", "PYTHON=/p", "WHEELS=/w", "GPU_PYTHON_VERSION=3.12")
    assert " ".join(build.replace("\\\n", " ").split()) == "/p tests/gpu/wheels.py build /w --python-version 3.12"


@pytest.mark.skipif(torch.version.cuda is not None, reason="checks the stop of a CPU build of torch")
def test_make_test_gpu_with_python_stops_on_a_cpu_torch_before_installing(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    # VENV: a Makefile that built .venv here after all would build a throwaway one, never the checkout's
    proc = subprocess.run(["make", "test-gpu", f"PYTHON={sys.executable}", f"WHEELS={tmp_path}",
                           f"VENV={tmp_path / 'no-venv'}"], cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode != 0
    assert f"{sys.executable} has torch {torch.__version__}, a CPU build" in proc.stderr, proc.stderr
    assert "nothing was installed" in proc.stderr and "-m pytest" not in proc.stdout  # the suite never started
    nothing = subprocess.run([sys.executable, str(SCRIPT.parent / "wheels.py"), "install"], capture_output=True,
                             text=True)
    assert nothing.returncode == 2 and "a CPU build" in nothing.stderr


def test_the_wheel_folder_holds_what_setup_py_requires_but_torch():
    """Every requirement of mm-ds is installed from the folder or left out with a reason; DeepSpeed at the tested
    version; DeepSpeed's own requirements read from its wheel, torch and extras left out."""
    reqs = wheels.requirements()
    names = {wheels._name(r) for r in reqs}
    for req in wheels.install_requires():
        name = wheels._name(req)
        assert name in names or len(wheels.LEFT_OUT.get(name, "")) > 20, f"{req}: neither installed nor explained"
        assert not (name in names and name in wheels.LEFT_OUT), name
    assert "torch" not in names and "pytest" in names
    tested = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
                  if "==" in line and not line.startswith("#"))
    assert wheels.DEEPSPEED == f"deepspeed=={tested['deepspeed']}" and wheels.DEEPSPEED in wheels.install_requires()


def test_deepspeeds_requirements_are_read_from_its_wheel(tmp_path):
    whl = tmp_path / "deepspeed-0.19.8-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("deepspeed-0.19.8.dist-info/METADATA", "Name: deepspeed\nRequires-Dist: hjson\nRequires-Dist: "
                   "torch>=2.0.0\nRequires-Dist: pydantic>=2.0.0\nRequires-Dist: wandb; extra == \"dev\"\n")
    assert wheels.deepspeed_requires(whl) == ["hjson", "pydantic>=2.0.0"]


def test_install_without_a_folder_names_what_is_missing_and_the_two_commands(monkeypatch):
    monkeypatch.setattr(wheels, "requirements", lambda: ["pytest>=1", "no-such-package-here>=1"])
    with pytest.raises(wheels.Stop) as stop:
        wheels.install(None, any_torch=True)
    message = str(stop.value)
    assert "lacks no-such-package-here:" in message and "pytest" not in message.split(":")[1]
    assert "`make wheels WHEELS=DIR`" in message and "make test-gpu WHEELS=DIR" in message
    monkeypatch.setattr(wheels, "requirements", lambda: ["pytest>=1"])
    wheels.install(None, any_torch=True)  # nothing missing: nothing to do
    with pytest.raises(wheels.Stop, match="WHEELS=/no/such/dir: no such folder"):
        wheels.install("/no/such/dir", any_torch=True)


@pytest.mark.skipif(not os.environ.get("MM_DS_TEST_WHEELS"),
                    reason="builds a folder of wheels (PyPI: network) and a fresh Python with only torch, minutes: "
                           "MM_DS_TEST_WHEELS=1 pytest tests/test_gpu_install.py -k folder")
def test_a_wheel_folder_made_here_completes_a_python_that_has_only_torch(tmp_path):
    """`make wheels` here, then a fresh venv given only torch (and its dependencies) from this machine's local wheels
    and index (MM_DS_LOCAL_PIP: pip's source arguments; no download) as the GPU machine's Python stands:
    `PYTHON=... make test-gpu WHEELS=DIR` stops on its CPU torch before installing; the folder installed into it
    (over the CPU torch, as a test may) leaves it able to import DeepSpeed and mm-ds, run `mm-ds --help`, collect
    the GPU suite, and reach fused_adam.py's GPU check."""
    timings, folder, gpu_python = {}, tmp_path / "wheels", tmp_path / "gpu-python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS", "PYTHONPATH"))}
    t0 = time.perf_counter()
    no_venv = f"VENV={tmp_path / 'no-venv'}"  # as above: never the checkout's .venv
    made = subprocess.run(["make", "wheels", f"PYTHON={sys.executable}", f"WHEELS={folder}", no_venv], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=1800)
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    timings["make wheels"] = time.perf_counter() - t0
    assert not list(folder.glob("torch-*")) and len(list(folder.glob("deepspeed-0.19.8-py3-none-any.whl"))) == 1
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(gpu_python)], check=True)
    py = str(gpu_python / "bin" / "python")
    local = os.environ.get("MM_DS_LOCAL_PIP", "--index-url file:///opt/pypi/simple --find-links /opt/wheels").split()
    subprocess.run([py, "-m", "pip", "install", "-q", *local, f"torch=={torch.__version__}"], check=True, env=env)
    timings["venv with torch"] = time.perf_counter() - t0
    stop = subprocess.run(["make", "test-gpu", f"PYTHON={py}", f"WHEELS={folder}", no_venv], cwd=ROOT,
                          capture_output=True, text=True, env=env)
    assert stop.returncode != 0 and "a CPU build" in stop.stderr and "nothing was installed" in stop.stderr
    t0 = time.perf_counter()
    subprocess.run([py, str(SCRIPT.parent / "wheels.py"), "install", str(folder), "--any-torch"], check=True,
                   env=env | {"PIP_NO_INDEX": "1"})
    timings["install from the folder"] = time.perf_counter() - t0
    fresh = env | {"PYTHONPATH": str(ROOT)}
    probe = subprocess.run([py, "-c", "import deepspeed, mm_ds.cli, yaml, sentencepiece, safetensors, pytest, json; "
                                      "print(json.dumps([deepspeed.__version__]))"], capture_output=True, text=True,
                           env=fresh, cwd=tmp_path)
    assert probe.returncode == 0 and json.loads(probe.stdout.splitlines()[-1]) == ["0.19.8"], probe.stderr[-2000:]
    assert subprocess.run([str(gpu_python / "bin" / "mm-ds"), "--help"], capture_output=True, env=fresh).returncode == 0
    suite = subprocess.run([py, "-m", "pytest", "-q", str(ROOT / "tests" / "gpu")], capture_output=True, text=True,
                           env=fresh, cwd=ROOT)
    assert suite.returncode == 0 and "11 skipped" in suite.stdout, suite.stdout[-2000:]
    check = subprocess.run([py, str(SCRIPT), "--gpu"], capture_output=True, text=True, env=fresh)
    assert check.returncode == 2 and "a CPU build" in check.stderr  # got as far as the GPU check: deepspeed imports
    print(f"wheel folder: {sum(f.stat().st_size for f in folder.iterdir()) / 2**20:.0f} MiB, "
          f"{len(list(folder.iterdir()))} files; " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
