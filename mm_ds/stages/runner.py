"""What every rank of a stage run does: read RUN as the launching side resolved it (mm_ds/runtime/training/resolved.py),
build the stage from that config, train it. Nothing here parses a command line or checks the run again: the
stage command (mm_ds/stages/command.py), `mm-ds run` and `mm-ds extend` resolved it before the ranks started.

    mm_ds/rank.py RUN  ->  train_run  ->  stages/<stage>.build  ->  runtime/training/engine.train
"""

from __future__ import annotations

from pathlib import Path

from ..config import ConfigError
from ..runtime.distributed import dist, stop
from ..runtime.training import engine, resolved
from .resolve import stage_module


def train_run(run_dir: str | Path, got: resolved.Resolved | None = None) -> int:
    """Every rank of a stage run: RUN as its launching side resolved it (mm_ds/runtime/training/resolved.py; `got`: this
    process resolved it), the stage built from that config, trained. Nothing here parses a command line or checks
    the run again."""
    run_dir, error = Path(run_dir), None
    try:
        got = got or resolved.read(run_dir)
    except ConfigError as e:  # raised below, once every rank knows: none waits for a rank that left
        error = e
    dist.init(got.cfg.launch if got is not None else None)  # its timeouts: the resolved config's
    dist.on_every_rank(lambda: _raise(error), f"reading {run_dir}")
    stop.resume_with(got.resume_with)
    # A file one node cannot read fails there: every rank stops with that rank's reason, none waits for it.
    stage = dist.on_every_rank(lambda: stage_module(got.cfg.stage).build(got.cfg), f"building the stage {run_dir}")
    engine.train(stage, run_dir, given=got)
    return 0


def _raise(error: Exception | None) -> None:
    if error is not None:
        raise error
