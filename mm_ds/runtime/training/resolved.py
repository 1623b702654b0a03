"""A stage run as its launching side resolved it: what every rank reads from the run directory, and nothing else.

The launching side (mm_ds/stages/resolve.py) checks the stage once and writes into RUN:

    run_config.yaml     the effective config, as the stage's `build` makes it
    ds_config.json      the effective engine config at the launch's world size (none for a stage of zero updates)
    resolved.json       the record: the launch's world size and batch geometry, the resume point, the checkpoints
                        it verified (parent weights, resume point) by their manifests' sha256, the command that
                        resumes the run, each file's sha256, and its own

A rank starts from RUN alone (`python mm_ds/rank.py RUN`): `read` checks the record's and the files' sums and that
the verified checkpoints' manifests are unchanged, so no rank parses the stage's command line, builds its config a
second time, or hashes a checkpoint the launching side already hashed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from ...config import ConfigError, RunConfig, dump_yaml, from_dict
from ..checkpointing import sums
from ..checkpointing.rundir import (DS_CONFIG, MANIFEST, RESOLVED, RUN_CONFIG, write_json_atomic, write_text_atomic,
                                    writing)
from .ds_config import Geometry

FORMAT = "mm-ds-resolved/1"


@dataclass
class Resolved:
    """What a rank needs of its stage run, resolved once before the launch."""
    run_dir: Path
    cfg: RunConfig
    ds_cfg: dict | None
    """The effective engine config; None for a stage of zero updates (no engine)."""
    geo: Geometry | None
    world_size: int
    resume: bool = False
    """--resume was asked for (`resume_from` None: nothing verified to resume from; the run starts at step 0)."""
    resume_from: Path | None = None
    reshard: bool = False
    """--reshard: convert the resume point to DeepSpeed's universal format even at the same world size."""
    progress: bool = False
    """Rank 0 shows a progress bar."""
    resume_with: str = "the same command with --resume"
    """The command that resumes the run, for a stop's line (mm_ds/runtime/distributed/stop.py)."""
    inputs: tuple[Path, ...] = ()
    """Checkpoints the launching side verified (their sums): the parent's weights, the resume point."""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _manifest_sha(ckpt: Path) -> str | None:
    path = Path(ckpt) / MANIFEST
    return _sha(path.read_bytes()) if path.is_file() else None


def write(r: Resolved) -> Path:
    """RUN's run_config.yaml, ds_config.json and resolved.json (the launching side: once per launch)."""
    run_dir = r.run_dir
    texts = {RUN_CONFIG: dump_yaml(r.cfg)} | ({DS_CONFIG: json.dumps(r.ds_cfg, indent=2, sort_keys=True)}
                                              if r.ds_cfg is not None else {})
    record = {"format": FORMAT, "stage": r.cfg.stage, "world_size": r.world_size,
              "geometry": vars(r.geo) if r.geo is not None else None,
              "resume": r.resume, "resume_from": str(r.resume_from) if r.resume_from else None, "reshard": r.reshard,
              "progress": r.progress, "resume_with": r.resume_with,
              "inputs": {str(Path(c).resolve()): _manifest_sha(c) for c in r.inputs},
              "files": {name: _sha(text.encode()) for name, text in texts.items()}}
    record["sha256"] = _sha(json.dumps(record, sort_keys=True).encode())
    with writing(run_dir / RESOLVED, then="re-run the same command"):
        run_dir.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            write_text_atomic(run_dir / name, text)
        write_json_atomic(run_dir / RESOLVED, record)
    return run_dir / RESOLVED


def read(run_dir: str | Path) -> Resolved:
    """The stage run of RUN as its launching side resolved it. ConfigError when the record is missing, does not
    match its sums, or a checkpoint it verified has changed since: resolve it again (the stage command)."""
    run_dir = Path(run_dir)
    again = (f"run the stage command again (mm-ds STAGE ... --out {run_dir}, or the same `mm-ds run`): it resolves "
             f"the run before the ranks start")
    try:
        record = json.loads((run_dir / RESOLVED).read_text())
        texts = {name: (run_dir / name).read_text() for name in record["files"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{run_dir / RESOLVED} cannot be read ({type(e).__name__}: {e}); {again}") from None
    own = record.pop("sha256", None)
    if record.get("format") != FORMAT or own != _sha(json.dumps(record, sort_keys=True).encode()):
        raise ConfigError(f"{run_dir / RESOLVED} is not a record mm-ds wrote, or was changed since; {again}")
    changed = [name for name, text in texts.items() if _sha(text.encode()) != record["files"][name]]
    if changed:
        raise ConfigError(f"{', '.join(str(run_dir / n) for n in changed)} changed since the run was resolved; {again}")
    for ckpt, want in record["inputs"].items():
        if _manifest_sha(Path(ckpt)) != want:
            raise ConfigError(f"{ckpt} changed since the launching side verified it; {again}")
        sums.checked(ckpt)  # its files' sums were checked then: this rank reads sizes only
    cfg = from_dict(RunConfig, yaml.safe_load(texts[RUN_CONFIG]))
    geo = Geometry(**record["geometry"]) if record["geometry"] else None
    return Resolved(run_dir, cfg, json.loads(texts[DS_CONFIG]) if DS_CONFIG in texts else None, geo,
                    record["world_size"], record["resume"],
                    Path(record["resume_from"]) if record["resume_from"] else None, record["reshard"],
                    record["progress"], record["resume_with"], tuple(Path(c) for c in record["inputs"]))
