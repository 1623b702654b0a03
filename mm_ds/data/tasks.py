"""Downstream tasks (paper §3 Evaluation): THE task table.

Every task is fine-tuned on English data (Step 3) and evaluated zero-shot in each language (Step 4). All
per-task differences (files, hub names, labels, lengths, learning rate, metric, languages) live in `TASKS`;
mm_ds.data.task_files reads the four file formats it names into records.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

PAIR_CLASSIFICATION = "pair_classification"
EXTRACTIVE_QA = "extractive_qa"


class TaskDataError(ValueError):
    """A task file (or hub split) that cannot be used at all; the message names the file and the fix."""


HUB = "hub"
"""A data root (recipe `task_root`, `finetune.data_root`, `mm-ds transfer --data-root`) that means: load each
split from the Hugging Face hub through `datasets` (the table's `hub` names), not from files. A local
directory called hub is `./hub`."""


def is_hub(data_root) -> bool:
    return str(data_root) == HUB


# ------------------------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Source:
    """Where one side (English training, or evaluation) of a task comes from."""

    format: str
    """One of `task_files.READERS`: xnli_tsv, mnli_jsonl, pawsx_tsv, squad_json."""
    files: tuple[str, ...]
    """Paths under a data root, `{split}`/`{lang}` filled in; the first that exists is used. The first
    pattern is the layout of ../shared/data (the rehearsal's data), the others the official distributions'."""
    hub: str
    """`datasets.load_dataset` name, used only when asked to (data root `hub`, or `load_split(..., hub=True)`)."""
    hub_config: str | None
    """Config-name template (`{lang}`), None for single-config datasets."""
    hub_splits: Mapping[str, str]
    """Our split name -> the hub's split name."""


@dataclass(frozen=True)
class TaskSpec:
    name: str
    task_type: str
    """PAIR_CLASSIFICATION or EXTRACTIVE_QA: picks the features, head and decoding (a finetuned model's meta
    records it as `task_type`; `task_type_of` reads older ones too)."""
    metric: str
    """accuracy | squad (evaluate-v1.1.py) | mlqa (mlqa_evaluation_v1.py, per-language normalisation)."""
    labels: tuple[str, ...]
    """Label strings in index order (as in the files and the hub's ClassLabel); empty for QA."""
    languages: tuple[str, ...]
    """Evaluation languages: the paper's target languages the dataset covers, plus English (§5.3)."""
    train: Source
    """English training data (paper Step 3)."""
    train_size: int
    """Examples in the official English training set (`mm-ds plan`'s Step-3 estimate)."""
    eval: Source
    eval_splits: tuple[str, ...]
    max_length: int
    """Tokens per sequence, specials included."""
    doc_stride: int = 0
    """QA: tokens between the starts of consecutive context windows (BERT / XTREME run_squad convention)."""
    max_query_length: int = 0
    """QA: questions are cut to this many tokens so that a window always keeps most of the context."""
    max_answer_length: int = 0
    """QA: longest decoded answer, in tokens."""
    lr: float = 1e-5
    warmup_ratio: float = 0.06
    epochs: int = 3
    eval_sizes: Mapping[str, int] = field(default_factory=dict)
    """split -> examples per language in the official files (for `mm-ds plan`'s evaluation estimate)."""
    chance: float = 0.0
    """What a model that learned nothing scores on the official test files, in the metric's units (%): the share
    of the most frequent label (a constant answer), or for QA the F1 floor, 0 (no answer word right). Table
    captions and curves show it."""
    world_chance: float = 0.0
    """The same on the generated world's test files (mm_ds/data/world/tasks.py draws their labels)."""

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    def fitted(self, max_length: int) -> "TaskSpec":
        """This task cut to `max_length` tokens (a model's position table, or a user's override): QA keeps
        its window stride and question budget in proportion, so windows still overlap and hold context."""
        if max_length >= self.max_length:
            return self
        return replace(self, max_length=max_length, doc_stride=min(self.doc_stride, max_length // 2),
                       max_query_length=min(self.max_query_length, max_length // 4))


XNLI_LANGS = ("en", "ar", "bg", "de", "el", "es", "fr", "hi", "ru", "sw", "th", "tr", "ur", "vi", "zh")

# Lengths: 128 tokens for sentence pairs and 384/128/64/30 for QA are the values of XTREME's XLM-R
# baselines and of BERT/RoBERTa's SQuAD recipes; almost no XNLI/PAWS-X pair exceeds 128 pieces, and a
# 384-token window fits most SQuAD paragraphs whole. Learning rates, warmup and epochs: paper §3.
TASKS: dict[str, TaskSpec] = {t.name: t for t in (
    TaskSpec(
        name="xnli", task_type=PAIR_CLASSIFICATION, metric="accuracy",
        labels=("entailment", "neutral", "contradiction"), languages=XNLI_LANGS,
        train=Source("mnli_jsonl", ("mnli/multinli_1.0_train.jsonl", "multinli_1.0/multinli_1.0_train.jsonl"),
                     "nyu-mll/multi_nli", None, {"train": "train"}),
        train_size=392_702,
        eval=Source("xnli_tsv", ("xnli/xnli.{split}.{lang}.tsv", "XNLI-1.0/xnli.{split}.tsv"),
                    "facebook/xnli", "{lang}", {"dev": "validation", "test": "test"}),
        eval_splits=("dev", "test"), max_length=128, lr=1e-5, eval_sizes={"dev": 2490, "test": 5010},
        chance=100 / 3, world_chance=50.0),  # balanced; the world's: the doer is singular in half the pairs
    TaskSpec(
        name="pawsx", task_type=PAIR_CLASSIFICATION, metric="accuracy",
        labels=("0", "1"),  # 1 = paraphrase, as in the files and the hub
        languages=("en", "de", "es", "fr", "ja", "ko", "zh"),
        train=Source("pawsx_tsv", ("paws-x/train.en.tsv", "x-final/en/train.tsv"),
                     "google-research-datasets/paws-x", "en", {"train": "train"}),
        train_size=49_401,
        eval=Source("pawsx_tsv", ("paws-x/{split}.{lang}.tsv", "x-final/{lang}/{split}_2k.tsv"),
                    "google-research-datasets/paws-x", "{lang}", {"dev": "validation", "test": "test"}),
        eval_splits=("dev", "test"), max_length=128, lr=1e-5, eval_sizes={"dev": 2000, "test": 2000},
        chance=55.3, world_chance=50.0),  # 1105 of 2000 test pairs are no paraphrases; the world's: balanced
    TaskSpec(
        name="mlqa", task_type=EXTRACTIVE_QA, metric="mlqa", labels=(),
        languages=("en", "ar", "de", "es", "hi", "vi", "zh"),  # context and question in the same language
        train=Source("squad_json", ("squad/train-v1.1.json",), "rajpurkar/squad", None, {"train": "train"}),
        train_size=87_599,  # SQuAD v1.1 questions; windows of long contexts add a few percent
        eval=Source("squad_json", ("mlqa/{split}-context-{lang}-question-{lang}.json",
                                   "MLQA_V1/{split}/{split}-context-{lang}-question-{lang}.json"),
                    "facebook/mlqa", "mlqa.{lang}.{lang}", {"dev": "validation", "test": "test"}),
        eval_splits=("dev", "test"), max_length=384, doc_stride=128, max_query_length=64,
        max_answer_length=30, lr=3e-5, eval_sizes={"dev": 500, "test": 5000}),  # typical; English: 1148 / 11590
    TaskSpec(
        name="xquad", task_type=EXTRACTIVE_QA, metric="squad", labels=(),
        # The paper's Table A2 languages + English. xquad.ro.json exists but no paper model covers ro.
        languages=("en", "ar", "de", "el", "es", "hi", "ru", "th", "tr", "vi", "zh"),
        train=Source("squad_json", ("squad/train-v1.1.json",), "rajpurkar/squad", None, {"train": "train"}),
        train_size=87_599,  # SQuAD v1.1 questions; windows of long contexts add a few percent
        # XQuAD is a test set only (the hub calls its one split "validation").
        eval=Source("squad_json", ("xquad/xquad.{lang}.json",), "google/xquad", "xquad.{lang}",
                    {"test": "validation"}),
        eval_splits=("test",), max_length=384, doc_stride=128, max_query_length=64,
        max_answer_length=30, lr=3e-5, eval_sizes={"test": 1190}),
)}


def chance_level(task: str, world: bool = False) -> float | None:
    """The chance level of `task` (TaskSpec.chance, or .world_chance for the generated world's files); None for a
    task the table does not know."""
    spec = TASKS.get(task)
    return None if spec is None else spec.world_chance if world else spec.chance


def get_task(name: str) -> TaskSpec:
    if name not in TASKS:
        raise TaskDataError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    return TASKS[name]


def task_type_of(meta: dict) -> str | None:
    """A finetuned model's task type, from its meta (`kind` in models finetuned before it was called task_type);
    None for a model without a task head."""
    return meta.get("task_type", meta.get("kind"))


def check_split(spec: TaskSpec, split: str, lang: str) -> Source:
    """The source for (split, lang), or an error naming the bad value and the allowed ones.

    Local files may be in any language (the generated world's t1, t2, ... or XQuAD's ro); only the hub
    is limited to `spec.languages`, see `load_hub`.
    """
    if split == "train":
        if lang != "en":
            raise TaskDataError(f"{spec.name} trains on English only (paper Step 3); got lang={lang!r}")
        return spec.train
    if split not in spec.eval_splits:
        raise TaskDataError(f"{spec.name} has no split {split!r}; evaluation splits: {', '.join(spec.eval_splits)}")
    return spec.eval


def hub_source(spec: TaskSpec, split: str, lang: str) -> tuple[str, str | None, str]:
    """(dataset, config, hub split) that `datasets.load_dataset` reads for (split, lang)."""
    source = check_split(spec, split, lang)
    if lang not in spec.languages:
        raise TaskDataError(f"{spec.name} is not evaluated in {lang!r} on the hub; languages: "
                            f"{' '.join(spec.languages)}")
    return source.hub, source.hub_config.format(lang=lang) if source.hub_config else None, source.hub_splits[split]


def find_local(spec: TaskSpec, split: str, lang: str, data_dir: str | Path) -> Path:
    """The first existing file for (split, lang) under `data_dir`, or an error listing what was tried."""
    source = check_split(spec, split, lang)
    tried = [Path(data_dir) / pattern.format(split=split, lang=lang) for pattern in source.files]
    for path in tried:
        if path.is_file():
            return path
    raise TaskDataError(f"no {spec.name} {split} file for {lang!r} under {data_dir}; tried "
                        f"{', '.join(map(str, tried))}. Put the official file there, pass its path, or "
                        f"load it from the hub ({source.hub}) with the data root {HUB!r}")
