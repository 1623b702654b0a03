"""The GPU suite's summary: after `make test-gpu`, a few lines a person can paste into an issue (the machine, then per
test its outcome, time and what it measured: tokens/s, MFU, peak memory, step time, the SDPA kernel, NCCL's transports;
the tests record them with pytest's `record_property`). Printed at the end of the run and, with MM_DS_GPU_SUMMARY=FILE
(the Makefile sets it), written there. The formatting is tests/support/gpu_checks.py's `summary`, checked on CPU."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

from support.gpu_checks import summary

ROWS: dict[str, dict] = {}


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu_long: GPU cases beyond `make test-gpu`'s 8 minutes on one GPU "
                                       "(`make test-gpu LONG=1`)")


def pytest_runtest_logreport(report):
    row = ROWS.setdefault(report.nodeid, {"name": report.nodeid.split("::", 1)[-1], "outcome": "passed",
                                          "seconds": 0.0, "numbers": {}, "reason": None})
    row["seconds"] += report.duration
    row["numbers"].update({k: v for k, v in report.user_properties})
    if report.skipped:
        row["outcome"] = "skipped"
        row["reason"] = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    elif report.failed:
        row["outcome"] = "failed" if report.when == "call" else "error"
        row["reason"] = report.longrepr.reprcrash.message.splitlines()[0][:300] if hasattr(
            report.longrepr, "reprcrash") and report.longrepr.reprcrash else f"failed in {report.when}"


def _run(*argv) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def machine() -> dict:
    import torch

    try:
        import deepspeed
        ds = deepspeed.__version__
    except ImportError:
        ds = "not installed"
    cuda = torch.cuda.is_available()
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if cuda else "?"
    root = Path(__file__).resolve().parents[2]
    return {"gpu": torch.cuda.get_device_name() if cuda else "none", "gpus": torch.cuda.device_count() if cuda else 0,
            "driver": _run("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader").splitlines()[0],
            "torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl, "deepspeed": ds,
            "python": platform.python_version(), "commit": _run("git", "-C", str(root), "rev-parse", "--short", "HEAD")}


def pytest_terminal_summary(terminalreporter):
    import torch

    if not ROWS or not torch.cuda.is_available():
        return  # no GPU: the suite skipped as a whole, nothing to paste
    text = summary(machine(), list(ROWS.values()))
    terminalreporter.write_line("")
    for line in text.splitlines():
        terminalreporter.write_line(line)
    if os.environ.get("MM_DS_GPU_SUMMARY"):
        Path(os.environ["MM_DS_GPU_SUMMARY"]).write_text(text + "\n")
