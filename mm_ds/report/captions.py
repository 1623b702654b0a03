"""Captions: what a table's numbers are, said under its heading, and the levels a curve is read against.

Every score table says its metric, what stands behind each score (how many finetuning seeds it is the mean of), what
"ctrl" is, and what the scores are read against (the task's chance level). One `Measure` row per kind of score
holds those words: the task table (mm_ds/data/tasks.py) gives a task's (metrics and chance levels; the generated
world's files have their own), `MEASURES` the MLM level's (records.mlm_results: no finetuning, no seeds, no chance
level); the records say the seeds (`mm-ds run` writes them into every row) and the test examples.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from ..data.tasks import EXTRACTIVE_QA, TASKS, chance_level
from .records import MLM

METRICS = {"accuracy": "accuracy (%)", "squad": "F1 (SQuAD v1.1 evaluation)", "mlqa": "F1 (MLQA evaluation)"}
CONTROL = ("the same finetuned model with the untrained target embeddings Step 2 starts from (its score before Step 2 "
           "learns anything)")


@dataclass(frozen=True)
class Measure:
    """What the scores of one task, or of the MLM level, are: every caption and axis label reads its row."""

    metric: str
    """The score in its units: axis labels and the first words of every caption."""
    of: str = ""
    """Which model a score is of, after the metric in Tables 2, 3, 4 and A3 ("": the systems' finetuned models)."""
    runs: str = ""
    """What stands behind each score, `{n}` the test examples per language; "": the mean over the finetuning seeds
    the records carry (`seeds`)."""
    runs_label: str = ""
    """The same beside a number (the speedups' "used"); "": the seed count (`seed_count`)."""
    runs_noun: str = "finetuning seeds"
    """What the speedups' "used" counts besides languages."""
    sample: str = "the n test examples and the seeds"
    """What the significance test's margin ("needed") comes from (significance.py)."""
    control: str = CONTROL
    """What ctrl, the control, is."""
    levels: str = ""
    """What a score is read against; "": the task's chance level (`levels`)."""


MEASURES = {MLM: Measure(
    metric="held-out target-language MLM accuracy (%)",
    of=" of the primary model with the Step-2 checkpoint's embeddings swapped in, read through its main head with "
       "the output bias refit on the target's training text (the same for every system)",
    runs="one Step-2 run per system and language, no finetuning, no seeds; the same masked held-out tokens at every "
         "checkpoint: {n}",
    runs_label="1 Step-2 run",
    runs_noun="Step-2 runs",
    sample="the n masked held-out tokens (one run: seeds 1, no between-seed variance)",
    control="the primary model with the untrained target embeddings Step 2 starts from (step 0: its score before "
            "Step 2 learns anything), read the same way",
    levels="no chance level: read a score against its control (ctrl) and against the unigram row (the target's "
           "training-shard piece frequencies on the same tokens: what frequencies alone give)")}
"""The levels that are no task of mm_ds/data/tasks.py: the MLM level (the alignment check's rows)."""


def measure(task: str) -> Measure:
    """The row of `task`: the MLM level's, or one from the task table ("score" for a task it does not know)."""
    spec = TASKS.get(task)
    return MEASURES.get(task) or Measure(METRICS.get(spec.metric, spec.metric) if spec else "score")


def metric(task: str) -> str:
    """The score of `task` in its units: an axis label."""
    return measure(task).metric


def _span(counts: Iterable[int]) -> str:
    """"2", or "1-3" when the counts differ (at least one count)."""
    c = sorted({int(x) for x in counts})
    return str(c[0]) if len(c) == 1 else f"{c[0]}-{c[-1]}"


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
    counts = list(counts)
    if not counts:
        return "seeds ?"
    n = _span(counts)
    return f"{n} seed{'' if n == '1' else 's'}"


def runs_label(tasks: Iterable[str], seed_counts: Mapping[str, Sequence[int]]) -> str:
    """What stands behind the scores of `tasks`, beside a number: "2 seeds" (seed_count of their seeds together),
    or a level's own ("1 Step-2 run")."""
    rows = {t: measure(t) for t in tasks}
    fixed = list(dict.fromkeys(m.runs_label for m in rows.values() if m.runs_label))
    tuned = [t for t, m in rows.items() if not m.runs_label]
    return ", ".join(fixed + ([seed_count(c for t in tuned for c in seed_counts.get(t, ()))] if tuned else []))


def runs_nouns(tasks: Iterable[str]) -> str:
    """"finetuning seeds" (or "Step-2 runs", or both): what the speedups' "used" counts besides languages."""
    return " or ".join(dict.fromkeys(measure(t).runs_noun for t in tasks))


def sizes(n: Mapping[str, Iterable[int]]) -> str:
    """"de 2029, sw 2031" from language -> the test-example counts of its records ("not recorded" without)."""
    return ", ".join(f"{l} {_span(c)}" for l, c in sorted(n.items()) if c) or "not recorded"


def behind(task: str, seed_counts: Sequence[int], n: Mapping[str, Iterable[int]] | None = None) -> str:
    """What stands behind each score of `task`: its finetuning seeds, or its level's runs with their examples."""
    m = measure(task)
    return m.runs.format(n=sizes(n or {})) if m.runs else seeds(seed_counts)


def levels(task: str, world: bool) -> str:
    """What the scores are read against: the task's chance level, or its level's own words."""
    if measure(task).levels:
        return measure(task).levels
    level = chance_level(task, world)
    if level is None:
        return "chance level unknown (no task of mm_ds/data/tasks.py)"
    how = "F1 floor: no answer word right" if TASKS[task].task_type == EXTRACTIVE_QA else "always the most frequent label"
    files = "the generated world's" if world else "the official"
    return f"chance {level:.1f} ({how}, on {files} test files)"


def scores(task: str, seed_counts: Sequence[int], world: bool, control: bool = False,
           n: Mapping[str, Iterable[int]] | None = None) -> str:
    """The caption of a table of scores (Tables 2, A3, 5); `n`: language -> its records' test-example counts."""
    m = measure(task)
    parts = [f"{task}: {m.metric}{m.of}, {behind(task, seed_counts, n)}; {levels(task, world)}"]
    return ". ".join(parts + ([f"ctrl = {m.control}"] if control else [])) + "."


def days(task: str, seed_counts: Sequence[int], world: bool, target: str,
         n: Mapping[str, Iterable[int]] | None = None, control: bool = False) -> str:
    """The caption of a table of V100-days to near-maximal performance (Tables 3, 4); `control`: the target is
    set from the control (the MLM level's, report.Report.over_control), so say what it is."""
    m = measure(task)
    return (f"{task}: V100-days of Step 2 until the {m.metric}{m.of} ({behind(task, seed_counts, n)}) first reaches "
            f"{target}, interpolated between the two checkpoints around it; {levels(task, world)}."
            + (f" Its control: {m.control}." if control else ""))


def margins(task: str, seed_counts: Sequence[int], world: bool, reference: str, target: str,
            n: Mapping[str, Iterable[int]] | None = None) -> str:
    """The caption of the table of the reference's final score against its control (significance.margin_table)."""
    m = measure(task)
    return (f"{task}: {m.metric} of {reference}'s last checkpoint and its ctrl, {behind(task, seed_counts, n)}; "
            f"{levels(task, world)}. ctrl = {m.control}. needed: the difference the test calls significant for "
            f"{m.sample}; target: {target}, set only where the difference is larger.")
