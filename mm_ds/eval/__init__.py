"""Scoring models: Step 4's zero-shot transfer, per-task metrics, the official scorers, the alignment check. Below
the pipeline; never imported by runtime, model or stages."""
