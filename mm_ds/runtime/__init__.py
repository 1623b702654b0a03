"""One stage run on many ranks: the training loop, the only collectives, DeepSpeed's engine config and checkpoint
layout, launching and watching ranks. Imports config, systems, data and model only: never stages, eval, report,
pipeline, tools or the CLI."""
