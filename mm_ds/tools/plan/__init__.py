"""`mm-ds plan` (plan.py): a recipe's time, GPU-hours, communication and disk on a cluster, before any of it runs:
the cost model, the totals, the budget and the resume interval."""
