"""`mm-ds verify PATH...`: checkpoints and final weights against their manifests (sizes and sha256)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..runtime.checkpointing import checkpoint


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mm-ds verify", description="Check a run directory (every checkpoint and "
                                "final/), a checkpoints/step_* or a final/ directory against its manifest. Exit 0 "
                                "with a summary; 1 naming the first bad file of each bad one.")
    p.add_argument("paths", nargs="+", metavar="PATH", help="run directory, checkpoints/step_* or final/")
    p.add_argument("--sizes-only", action="store_true", help="check sizes, not sha256 (fast on large files)")
    a = p.parse_args(argv)
    bad = 0
    for path in map(Path, a.paths):
        if not path.exists():
            print(f"BAD   {path}: does not exist")
            bad += 1
            continue
        if any((path / f).is_file() for f in (checkpoint.MANIFEST, checkpoint.WEIGHTS, checkpoint.META)):
            targets = [path]
        else:  # a run directory
            root = checkpoint.checkpoints_dir(path)
            targets = [c for c in sorted(root.glob("step_*")) if c.is_dir()] if root.is_dir() else []
            targets += [path / checkpoint.FINAL] if (path / checkpoint.FINAL).exists() else []
            if not targets:
                print(f"BAD   {path}: no checkpoints/step_* and no {checkpoint.FINAL}/ (not an mm-ds run directory?)")
                bad += 1
                continue
        for t in targets:
            if t.name.endswith(".tmp"):
                print(f"SKIP  {t}: half-written (an interrupted save); never resumed from, removed by the next save")
                continue
            try:
                manifest = checkpoint.verify(t, checksums=not a.sizes_only)
                meta = checkpoint.read_meta(t)
            except (checkpoint.CheckpointError, OSError, ValueError) as e:
                print(f"BAD   {e}")
                bad += 1
                continue
            n = sum(f["bytes"] for f in manifest["files"].values())
            print(f"OK    {t}: {len(manifest['files'])} files, {n:,} bytes match the manifest; "
                  f"{meta.get('system')}/{meta.get('stage')} step {meta.get('step')}")
        if len(targets) > 1 or targets[0] != path:
            tag = checkpoint.latest_tag(path)
            print(f"      latest: {tag or 'none'}; --resume would use: "
                  f"{(checkpoint.find_resume_point(path) or Path('none')).name}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
