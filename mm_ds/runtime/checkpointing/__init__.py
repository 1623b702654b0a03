"""What a stage run leaves on disk: DeepSpeed's checkpoint layout (checkpoint.py, the only module that knows it),
the run directory (rundir.py, the only module that names its parts), sums and resharding. Imports distributed/
(rank 0 writes, the others wait), never training/."""
