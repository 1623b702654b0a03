"""What an mm-ds process exits with: the CLI's commands and every rank (mm_ds/rank.py) end through `outcome`.

    0    done
    2    bad input, an unusable checkpoint, another rank's failure: one line naming it, no traceback
    3    some of the work failed and its own logs say why (`WorkFailed`: a Step-3 run); the rest was done
    75   stopped by a signal after saving (mm_ds/runtime/distributed/stop.py): re-run to resume
    1    a bug: its traceback; in a launched rank, the same prompt exit as any failed rank

A rank that started a process group tears it down on the way out (`dist.finish`, or `dist.leave` after a failure:
the other ranks learn of it at once instead of in a collective's timeout).
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Callable

from ..config import ConfigError
from .checkpointing.checkpoint import CheckpointError
from .distributed.dist import OtherRankFailed
from .distributed.stop import EXIT_CODE, Stopped


class WorkFailed(RuntimeError):
    """Some pieces of the work failed, each saying why in its own log; the others finished."""


BAD_INPUT = (ConfigError, CheckpointError, FileNotFoundError, ValueError, FloatingPointError, OtherRankFailed)


def _finish(rc: int, failed: bool = False) -> int:
    dist = sys.modules.get("mm_ds.runtime.distributed.dist")  # only a process that started ranks has anything to tear down
    if dist is None:
        return rc
    return dist.leave(rc) if failed else dist.finish(rc)


def outcome(name: str, work: Callable[[], int | None]) -> int:
    """Run `work` (a command's, or a rank's) and return the process's exit code; errors are said as `mm-ds NAME`'s."""
    try:
        return _finish(int(work() or 0))
    except Stopped as e:  # a stop signal: every rank saved (or had nothing to save); rank 0 says how to resume
        dist = sys.modules.get("mm_ds.runtime.distributed.dist")
        if dist is None or dist.rank() == 0:
            print(e, flush=True)
        return _finish(EXIT_CODE)
    except WorkFailed as e:
        print(f"mm-ds {name}: {e}", file=sys.stderr, flush=True)
        return _finish(3, failed=True)
    except BAD_INPUT as e:
        # The rank that failed says why; of the ranks it stopped (OtherRankFailed), one per node says so.
        if not isinstance(e, OtherRankFailed) or os.environ.get("LOCAL_RANK", "0") == "0":
            print(f"mm-ds {name}: error: {e}", file=sys.stderr)
        return _finish(2, failed=True)
    except Exception:  # a bug: in a launched rank, its traceback and the same prompt exit as any failed rank
        dist = sys.modules.get("mm_ds.runtime.distributed.dist")
        if dist is None or not dist.launched():
            raise
        traceback.print_exc()
        return dist.leave(1)
