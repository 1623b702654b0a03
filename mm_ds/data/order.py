"""The global sample order every training stage draws from: MLM blocks (Steps 1-2, mm_ds.data.mlm) and
task features (Step 3, mm_ds.stages.finetune).

In optimizer step `step`, micro step `m` of rank `r`, a micro batch holds the global sample ids
    g = step * global_batch + (m * world_size + r) * micro_batch + j,   j < micro_batch,
with global_batch = micro_batch * grad_accum * world_size. The samples of one step are therefore
[step * global_batch, (step + 1) * global_batch) whatever the world size: a run resumed on another number
of ranks with the same global batch sees exactly the same data. Which example a sample id names (a
permutation per epoch) is the data's own business.
"""

from __future__ import annotations

import numpy as np


def sample_ids(step: int, micro_step: int, rank: int, world_size: int, micro_batch: int,
               grad_accum: int = 1) -> np.ndarray:
    """Global sample ids (micro_batch,) of micro batch `micro_step` of optimizer step `step` on `rank`."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    if not 0 <= micro_step < grad_accum:
        raise ValueError(f"micro_step={micro_step} must be in [0, grad_accum={grad_accum}); pass the "
                         "run's gradient accumulation steps as grad_accum")
    if step < 0 or micro_batch < 1:
        raise ValueError(f"need step >= 0 and micro_batch >= 1, got step={step} micro_batch={micro_batch}")
    global_batch = micro_batch * grad_accum * world_size
    first = step * global_batch + (micro_step * world_size + rank) * micro_batch
    return np.arange(first, first + micro_batch, dtype=np.int64)
