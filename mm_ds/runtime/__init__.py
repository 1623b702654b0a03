"""One stage run on many ranks, in three rooms, each importing only the rooms below it (tests/test_layout.py ROOMS):

    distributed/    collectives (the only caller), bring-up, launch, hostfiles, the launch environment, the
                    watchdog, stop signals, the shared work queue: knows nothing of checkpoints or training
    checkpointing/  DeepSpeed's checkpoint layout (the only module that knows it), run directories, sums, resharding
    training/       the one training loop, its engine and engine config, log window, prefetch, depth phases, peaks,
                    the update boundary, the stage-to-stage hand-off, the resolved record a rank starts from

Beside them, what every room uses or ends in: faults.py (test fault points) and exits.py (what a process exits with).
Imports config, systems, data and model only: never stages, eval, report, pipeline, tools or the CLI."""
