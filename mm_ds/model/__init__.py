"""The network (paper §2, §3): the RoBERTa MLM with its secondary heads, downstream heads, surgery as pure functions
on state dicts, and the paper's analytic FLOPs. Imports config, systems and data only."""
