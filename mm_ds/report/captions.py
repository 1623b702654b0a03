"""Captions: what a table's numbers are, said under its heading, and the levels a curve is read against.

Every score table says its metric, how many finetuning seeds each score is the mean of, what "ctrl" is, and the
task's chance level. The task table (mm_ds/data/tasks.py) owns metrics and chance levels (the generated world's
files have their own); the records say the seeds (`mm-ds run` writes them into every row).
"""
from __future__ import annotations

from typing import Iterable, Sequence

from ..data.tasks import EXTRACTIVE_QA, TASKS, chance_level

METRICS = {"accuracy": "accuracy (%)", "squad": "F1 (SQuAD v1.1 evaluation)", "mlqa": "F1 (MLQA evaluation)"}
CONTROL = ("ctrl = the same finetuned model with the untrained target embeddings Step 2 starts from (its score "
           "before Step 2 learns anything)")


def metric(task: str) -> str:
    spec = TASKS.get(task)
    return METRICS.get(spec.metric, spec.metric) if spec else "score"


def seeds(counts: Sequence[int]) -> str:
    """"mean over 2 finetuning seeds" from the seed counts a task's records carry (records.recorded)."""
    counts = sorted({int(c) for c in counts})
    if not counts:
        return "finetuning seeds not recorded"
    if len(counts) > 1:
        return f"mean over {counts[0]}-{counts[-1]} finetuning seeds (it differs between results)"
    return f"mean over {counts[0]} finetuning seed{'' if counts[0] == 1 else 's'}"


def seed_count(counts: Iterable[int]) -> str:
    """"2 seeds" ("1-2 seeds"; "seeds ?" when not recorded): a label beside a number."""
    counts = sorted({int(c) for c in counts})
    if not counts:
        return "seeds ?"
    n = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return f"{n} seed{'' if n == '1' else 's'}"


def chance(task: str, world: bool) -> str:
    level = chance_level(task, world)
    if level is None:
        return "chance level unknown (no task of mm_ds/data/tasks.py)"
    how = "F1 floor: no answer word right" if TASKS[task].task_type == EXTRACTIVE_QA else "always the most frequent label"
    files = "the generated world's" if world else "the official"
    return f"chance {level:.1f} ({how}, on {files} test files)"


def scores(task: str, seed_counts: Sequence[int], world: bool, control: bool = False) -> str:
    """The caption of a table of scores (Tables 2, A3, 5)."""
    parts = [f"{task}: {metric(task)}, {seeds(seed_counts)}; {chance(task, world)}"] + ([CONTROL] if control else [])
    return ". ".join(parts) + "."


def days(task: str, seed_counts: Sequence[int], world: bool, target: str) -> str:
    """The caption of a table of V100-days to near-maximal performance (Tables 3, 4)."""
    return (f"{task}: V100-days of Step 2 until the {metric(task)} ({seeds(seed_counts)}) first reaches {target}, "
            f"interpolated between the two checkpoints around it; {chance(task, world)}.")


def margins(task: str, seed_counts: Sequence[int], world: bool, reference: str, target: str) -> str:
    """The caption of the table of the reference's final score against its control (significance.margin_table)."""
    return (f"{task}: {metric(task)} of {reference}'s last checkpoint and its ctrl, {seeds(seed_counts)}; "
            f"{chance(task, world)}. {CONTROL}. needed: the difference the test calls significant for the n test "
            f"examples and the seeds; target: {target}, set only where the difference is larger.")
