"""The alignment check (mm_ds/eval/align.py) spread over a launch's ranks, like Step 4: each rank takes a target
language's Step-2 runs from the queue the ranks share (mm_ds/runtime/distributed/jobs.py) and scores their checkpoints
on its device with `align.align_run`, which keeps each checkpoint's row under OUT/align/. `mm-ds run`'s own
`align_recipe` then finds every row current and only writes the report: the checkpoints (2,888 in the paper recipe) are
no longer scored one after another in the driver process. A language's runs stay together: they share its held-out
corpus, which align.py encodes once, on the rank that has them.

The work item (`Alignment`, mm_ds/pipeline/jobs.py) holds the Step-2 runs to score by language, their held-out
texts and the settings; `mm-ds run` launches it alone (OUT/logs/align.json) or a one-job run's ranks reach it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..runtime.distributed import dist
from ..runtime.distributed.jobs import DONE, serve
from .align import Settings, align_run


@dataclass(frozen=True)
class Alignment:
    """The work item of the alignment check (mm_ds/pipeline/jobs.py): Step-2 runs by target language."""
    runs: tuple[tuple[str, ...], ...]
    texts: dict
    """lang -> held-out text (over the prepared corpus's slice or the world's)."""
    out: str
    sequences: int


def run_alignment(item: Alignment) -> int:
    """Every rank of a launch: score the Step-2 runs of the languages it takes from the queue."""
    rank = dist.rank()
    settings, device = Settings(sequences=item.sequences), dist.device()

    def do(i: int, halted) -> str:
        for run in item.runs[i]:
            align_run(Path(run), item.texts, Path(item.out), settings, device,
                      say=lambda m: print(f"{m} (rank {rank})", flush=True))
        return DONE

    serve("align", len(item.runs), do)
    return 0
