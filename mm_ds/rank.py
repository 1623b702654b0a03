"""What every launched rank runs, as a script path: `python .../mm_ds/rank.py ARGS` is `python -m mm_ds.cli ARGS`.

Launchers start it by path because not every one can start a module: DeepSpeed's slurm runner drops
`--module` and would run `python -u mm_ds.cli`, which is no file.
"""

import os
import sys

if __name__ == "__main__":
    # Run as a script, Python puts this directory first on sys.path, where mm_ds's own modules (config, data,
    # tools, ...) would shadow top-level ones: put the package's parent there instead.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    from mm_ds.cli import main

    sys.exit(main())
