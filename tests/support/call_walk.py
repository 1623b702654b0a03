"""The walk a reader follows from `mm-ds run` to a rank's training, measured on a real run: the call stacks, in
mm_ds's own files, at the three places the work changes hands.

    python tests/support/call_walk.py                  # this checkout
    python tests/support/call_walk.py --root DIR       # another checkout of mm-ds (e.g. an older commit's)

It runs `mm-ds run tiny` into a temporary directory with a sitecustomize on PYTHONPATH (this file's SITE; nothing in
mm_ds knows of it) that records
    launch    in the launching process: the stack where it starts a launcher or a rank (`subprocess.Popen`)
    stage     in a rank: the stack where the stage module's `build` is entered (model surgery, what trains)
    forward   in a rank: the stack where the model's first `forward` is entered (the training loop)
and stops the whole run once a rank has recorded both. The walk is the union of the mm_ds files on those stacks:
what a newcomer reads, call by call, to follow a recipe to a rank. tests/support/import_walk.py counts the other
measure, every module each process imports.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mm_ds.runtime.distributed.dist import free_port

if not __package__:  # run as a script: the tests folder on the path, as pytest puts it there
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.lanes import LAUNCHERS  # noqa: E402 (after the line above)

HERE = Path(__file__).resolve().parent
POINTS = ("launch", "stage", "forward")
SITE = '''
import os, sys, json
_OUT, _PKG = os.environ["CALL_WALK_OUT"], os.environ["CALL_WALK_PACKAGE"]
_STARTS = set(os.environ["CALL_WALK_STARTS"].split(","))
_seen = set()


def _record(point, frame):
    stack = []
    while frame is not None:
        f = frame.f_code.co_filename
        if f.startswith(_PKG + os.sep):
            stack.append([os.path.relpath(f, os.path.dirname(_PKG)), frame.f_code.co_name])
        frame = frame.f_back
    if stack and point not in _seen:
        _seen.add(point)
        with open(os.path.join(_OUT, f"{point}-{os.getpid()}.json"), "w") as fh:
            json.dump({"point": point, "argv": sys.argv, "stack": stack[::-1]}, fh)


import subprocess
_init = subprocess.Popen.__init__


def _popen(self, args, *rest, **kwargs):
    words = args.split() if isinstance(args, str) else [str(a) for a in args]
    if any(os.path.basename(w) in _STARTS for w in words):
        _record("launch", sys._getframe(1))
    _init(self, args, *rest, **kwargs)


subprocess.Popen.__init__ = _popen


def _profile(frame, event, arg):
    if event != "call" or not frame.f_code.co_filename.startswith(_PKG + os.sep):
        return
    rel = os.path.relpath(frame.f_code.co_filename, _PKG)
    name = frame.f_code.co_name
    if rel.startswith("stages" + os.sep) and name == "build":
        _record("stage", frame)
    if rel == os.path.join("model", "model.py") and name == "forward":
        _record("forward", frame)
    if {"stage", "forward"} <= _seen:
        sys.setprofile(None)


if sys.argv and sys.argv[0].endswith("rank.py"):
    sys.setprofile(_profile)
'''


def record(root: Path, timeout_s: float = 900) -> dict[str, list]:
    """point -> its first stack, [[file, function], ...] outermost first, from `mm-ds run tiny` in checkout `root`."""
    with tempfile.TemporaryDirectory(prefix="call-walk-") as tmp:
        tmp = Path(tmp)
        (tmp / "site").mkdir()
        (tmp / "site" / "sitecustomize.py").write_text(SITE)
        (tmp / "points").mkdir()
        env = os.environ | {"PYTHONPATH": f"{tmp / 'site'}:{root}", "CALL_WALK_OUT": str(tmp / "points"),
                            "CALL_WALK_PACKAGE": str(root / "mm_ds"), "CALL_WALK_STARTS": ",".join(sorted(LAUNCHERS)),
                            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        with open(tmp / "run.log", "w") as log:
            cmd = [sys.executable, "-m", "mm_ds.cli", "run", "tiny", "--out", str(tmp / "out"),
                   "--launch", f"master_port={free_port()}"]  # not DeepSpeed's 29500: another run may hold it
            proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        found: dict[str, list] = {}
        deadline = time.monotonic() + timeout_s
        try:
            while set(found) != set(POINTS) and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(1)
                for p in sorted((tmp / "points").glob("*.json")):
                    got = json.loads(p.read_text())
                    found.setdefault(got["point"], got["stack"])
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if set(found) != set(POINTS):
            tail = (tmp / "run.log").read_text()[-3000:]
            raise RuntimeError(f"`mm-ds run tiny` in {root} reached {sorted(found)} of {list(POINTS)}:\n{tail}")
        return found


def walk(stacks: dict[str, list]) -> list[str]:
    """The files on the stacks, in the order a reader meets them."""
    files: list[str] = []
    for point in POINTS:
        for f, _ in stacks[point]:
            if f not in files:
                files.append(f)
    return files


def shared(stacks: dict[str, list]) -> list[str]:
    """Files a rank enters that the launching side's stack holds too: orchestration the rank walks through again
    (before the run directory was the rank's input, a rank re-entered the CLI and `mm-ds run`'s module)."""
    on_a_rank = {f for point in ("stage", "forward") for f, _ in stacks[point]}
    return list(dict.fromkeys(f for f, _ in stacks["launch"] if f in on_a_rank))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=HERE.parents[1], help="a checkout of mm-ds (default: this one)")
    args = parser.parse_args(argv)
    stacks = record(args.root.resolve())
    for point in POINTS:
        print(f"{point:8} " + " > ".join(f"{f}:{fn}" for f, fn in stacks[point]))
    files = walk(stacks)
    folders = sorted({Path(f).parts[1] if len(Path(f).parts) > 2 else "." for f in files})
    print(f"shared   {' '.join(shared(stacks)) or 'none'} (on the launching side's stack and a rank's)")
    print(f"walk     {len(files)} files in {len(folders)} folders ({' '.join(folders)}): {' '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
