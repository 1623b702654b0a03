"""`mm-ds bench` (bench.py): every stage timed against a matmul peak and transformers, the paired measurements,
the host loop, the device, and the CPU speed targets."""
