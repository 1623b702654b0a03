"""What every launched rank runs, as a script path (not every launcher can start a module: DeepSpeed's slurm runner
drops `--module` and would run `python -u mm_ds.cli`, which is no file).

    python .../mm_ds/rank.py RUN          a stage run's directory, resolved by the launching side: train it
    python .../mm_ds/rank.py JOB.json     a job of `mm-ds run` (work items: mm_ds/pipeline/jobs.py): run them
    python .../mm_ds/rank.py ARGV...      anything else is `python -m mm_ds.cli ARGV`: a user's own stage command
                                          under their launcher (launchers/*.sh), whose rank 0 resolves the run

Never imported.
"""

import os
import sys
from pathlib import Path


def stage_rank(run_dir: str) -> int:
    """A rank of a stage run: its run directory (mm_ds/runtime/training/resolved.py), built and trained."""
    from mm_ds.runtime.exits import outcome  # after main() has put the package on sys.path
    from mm_ds.stages.runner import train_run  # the same

    return outcome("rank", lambda: train_run(run_dir))


def job_rank(job: str) -> int:
    """A rank of a job: its work items in order."""
    from mm_ds.pipeline.jobs import execute  # after main() has put the package on sys.path
    from mm_ds.runtime.exits import outcome  # the same

    return outcome("rank", lambda: execute(job))


def command_rank(argv: list[str]) -> int:
    """A rank that was given a command line: the CLI's."""
    from mm_ds.cli import main  # after main() has put the package on sys.path

    return main(argv)


def main() -> int:
    # Run as a script, Python puts this directory first on sys.path, where mm_ds's own modules (config, data,
    # tools, ...) would shadow top-level ones: put the package's parent there instead.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    from mm_ds.runtime.checkpointing.rundir import RESOLVED  # now that the line above has put the package on sys.path

    # The deepspeed launcher adds --local_rank=N; the rank is also in the environment.
    argv = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
    if len(argv) == 1 and (Path(argv[0]) / RESOLVED).is_file():
        return stage_rank(argv[0])
    if len(argv) == 1 and argv[0].endswith(".json") and Path(argv[0]).is_file():
        return job_rank(argv[0])
    return command_rank(argv)


if __name__ == "__main__":
    sys.exit(main())
