"""The alignment check (mm_ds/eval/align.py) spread over a launch's ranks, like Step 4: each rank takes a target
language's Step-2 runs from the queue the ranks share (mm_ds/runtime/jobs.py) and scores their checkpoints on its device
with `align.align_run`, which keeps each checkpoint's row under OUT/align/. `mm-ds run`'s own `align_recipe` then
finds every row current and only writes the report: the checkpoints (2,888 in the paper recipe) are no longer
scored one after another in the driver process. A language's runs stay together: they share its held-out
corpus, which align.py encodes once, on the rank that has them.

    OUT/logs/align.json   the Step-2 runs to score by language, their held-out texts, the settings (`write_spec`)
"""

from __future__ import annotations

import json
from pathlib import Path

from ..runtime import checkpoint

SPEC = "align.json"


def runs_to_align(recipe, out: Path) -> tuple[list[list[Path]], dict[str, str]]:
    """(the Step-2 runs `align.align_recipe` scores, by target language: those of `align.aligned_runs`, the rule it
    follows; the held-out texts it is given)."""
    from ..recipe import data_path
    from .align import aligned_runs

    by_lang: dict[str, list[Path]] = {}
    for s, lang in aligned_runs(recipe, out):
        by_lang.setdefault(lang, []).append(out / "adapt" / s / lang)
    return list(by_lang.values()), {lang: str(data_path(recipe, f)) for lang, f in recipe.heldout.items()}


def write_spec(recipe, out: Path) -> Path | None:
    """OUT/logs/align.json for `mm-ds run-align` on every rank; None when there is nothing to score."""
    jobs, texts = runs_to_align(recipe, out)
    if not recipe.align_sequences or not jobs:
        return None
    path = out / "logs" / SPEC
    with checkpoint.writing(path, then="re-run the same command"):
        path.parent.mkdir(parents=True, exist_ok=True)
        checkpoint.write_json_atomic(path, {"jobs": [[str(r) for r in runs] for runs in jobs], "texts": texts,
                                            "out": str(out), "sequences": recipe.align_sequences})
    return path


def run_align_main(argv: list[str]) -> int:
    """`mm-ds run-align OUT/logs/align.json` (internal): every rank of a launch scores the runs it takes."""
    from ..runtime import dist
    from .align import Settings, align_run
    from ..config import ConfigError
    from ..runtime.jobs import Queue

    rank, _, _ = dist.init()
    spec = dist.on_rank0(lambda: json.loads(Path(argv[0]).read_text()), f"reading {argv[0]}")
    queue, error = Queue("align", len(spec["jobs"])), None
    try:
        settings, device = Settings(sequences=spec["sequences"]), dist.device()
        while (i := queue.claim()) is not None:
            for run in spec["jobs"][i]:
                align_run(Path(run), spec["texts"], Path(spec["out"]), settings, device,
                          say=lambda m: print(f"{m} (rank {rank})", flush=True))
    except Exception as e:  # noqa: BLE001  reported below, once every rank has stopped
        queue.stop()
        error = f"rank {rank}: {type(e).__name__}: {e}"
    queue.drain()
    if dist.any_rank(error is not None):
        if error:
            raise ConfigError(error)
        raise dist.OtherRankFailed(f"rank {rank} stopped: another rank failed in the alignment check")
    return 0
