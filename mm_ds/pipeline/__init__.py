"""`mm-ds run` and `mm-ds extend`: a recipe, its check, its stage runs in order, what the user sees while they run,
Step 3's packing. The top of the package: only the CLI and tools import it."""
