import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import lanes
from support.lanes import pytest_runtest_protocol  # noqa: F401 (a hook: the test that starts a process)
from support.paths import SHARED_DATA
from support.textgen import write_corpus

os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests build every HF model locally: never download


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs CUDA GPUs (tests/gpu; `make test-gpu`)")
    config.addinivalue_line("markers", "rehearsal: the real-data rehearsal (`make rehearsal`), minutes of per-stage runs")
    config.addinivalue_line("markers", "ranks: starts ranks or a pipeline (seconds to minutes each); `make test-fast` "
                                       "runs the rest")
    config.addinivalue_line("markers", "engine: builds a DeepSpeed engine or compiles a model (torch.compile) in the "
                                       "test's own process (seconds each); `make test-fast` leaves it out")
    config.addinivalue_line("markers", "compile_full: train.compile's full matrix, every stage kind x engine config "
                                       "with inductor (`make test-compile`, ~20 minutes)")
    lanes.guard()


@pytest.fixture(scope="session")  # module fixtures (the rehearsal) use it
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data not found at {SHARED_DATA} (../shared/data beside the checkout); "
                    f"set MM_DS_SHARED_DATA to run these tests")
    return SHARED_DATA


def python() -> str:
    return sys.executable


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A small prepared English corpus (generated text) for multi-rank training tests."""
    root = tmp_path_factory.mktemp("corpus")
    write_corpus(root / "en.txt", n_docs=100, per_doc=10)
    subprocess.run([sys.executable, "-m", "mm_ds.cli", "prepare", "--lang", "en", "--input", str(root / "en.txt"),
                    "--out", str(root / "en"), "--vocab-size", "60", "--workers", "2"], check=True,
                   capture_output=True)
    return root / "en"
