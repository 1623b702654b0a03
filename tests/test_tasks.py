"""The task table and loaders: real files from /work/shared/data, bad inputs, and hub-schema conversion."""

import json
from collections import Counter
from pathlib import Path

import pytest

from mm_ds.data.task_files import PairExample, QAExample, examples_from_hub, load_file, load_split, read_squad_json
from mm_ds.data.tasks import EXTRACTIVE_QA, PAIR_CLASSIFICATION, TASKS, TaskDataError, chance_level, find_local

XNLI, PAWSX, MLQA, XQUAD = (TASKS[n] for n in ("xnli", "pawsx", "mlqa", "xquad"))


# ------------------------------------------------------------------------------------------- table


def test_table_matches_paper():
    assert set(TASKS) == {"xnli", "pawsx", "mlqa", "xquad"}
    assert {n: t.lr for n, t in TASKS.items()} == {"xnli": 1e-5, "pawsx": 1e-5, "mlqa": 3e-5, "xquad": 3e-5}
    assert all(t.warmup_ratio == 0.06 and t.epochs == 3 for t in TASKS.values())
    assert XNLI.labels == ("entailment", "neutral", "contradiction") and PAWSX.labels == ("0", "1")
    assert len(XNLI.languages) == 15 and set(MLQA.languages) == {"en", "ar", "de", "es", "hi", "vi", "zh"}
    assert set(XQUAD.languages) == {"en", "ar", "de", "el", "es", "hi", "ru", "th", "tr", "vi", "zh"}
    assert {"de", "es", "fr", "zh", "ja", "ko"} < set(PAWSX.languages)
    for t in TASKS.values():
        assert t.task_type in (PAIR_CLASSIFICATION, EXTRACTIVE_QA) and "en" in t.languages
        if t.task_type == EXTRACTIVE_QA:
            assert (t.max_length, t.doc_stride, t.max_query_length, t.max_answer_length) == (384, 128, 64, 30)
        else:
            assert t.max_length == 128 and t.num_labels >= 2


def test_split_and_language_errors_name_the_value(tmp_path):
    with pytest.raises(TaskDataError, match="'dev'.*test"):
        find_local(XQUAD, "dev", "de", tmp_path)
    with pytest.raises(TaskDataError, match="English only.*'de'"):
        find_local(MLQA, "train", "de", tmp_path)
    with pytest.raises(TaskDataError, match="for 'de'.*xquad.de.json"):
        find_local(XQUAD, "test", "de", tmp_path)
    with pytest.raises(TaskDataError, match="hub=True"):
        load_split(XQUAD, "test", "de")
    # local files may be in any language (generated world's t1, XQuAD's ro); the hub only has the table's
    (tmp_path / "xquad").mkdir()
    (tmp_path / "xquad/xquad.t1.json").write_text("{}")
    assert find_local(XQUAD, "test", "t1", tmp_path) == tmp_path / "xquad/xquad.t1.json"
    with pytest.raises(TaskDataError, match="'t1' on the hub"):
        load_split(XQUAD, "test", "t1", hub=True)


# -------------------------------------------------------------------------------------- real files


@pytest.mark.parametrize("task, split, lang, count, labels", [
    ("xnli", "dev", "en", 2490, {0: 830, 1: 830, 2: 830}),
    ("xnli", "dev", "de", 2495, {0: 832, 1: 831, 2: 832}),
    ("xnli", "dev", "zh", 2490, {0: 830, 1: 830, 2: 830}),
    ("xnli", "test", "sw", 5010, {0: 1670, 1: 1670, 2: 1670}),
    ("xnli", "test", "ur", 5010, {0: 1670, 1: 1670, 2: 1670}),
    ("pawsx", "dev", "de", 2000, {0: 1169, 1: 831}),
    ("pawsx", "dev", "zh", 2000, {0: 1147, 1: 853}),
    ("pawsx", "test", "de", 2000, {0: 1105, 1: 895}),
    ("pawsx", "test", "zh", 2000, {0: 1106, 1: 894}),
    ("mlqa", "dev", "de", 512, None),
    *[("xquad", "test", lang, 1190, None) for lang in XQUAD.languages],
])
def test_real_files_load_clean(shared_data, task, split, lang, count, labels):
    examples, report = load_split(TASKS[task], split, lang, shared_data)
    assert report.loaded == len(examples) == count and not report.skipped, report.summary()
    if labels is not None:  # counts from SOURCES.md
        assert Counter(ex.label for ex in examples) == labels
    else:
        ex = examples[0]
        text, start = ex.answers[0]
        assert ex.context[start:start + len(text)] == text


@pytest.mark.parametrize("task,lang", [("xnli", "de"), ("xnli", "sw"), ("pawsx", "de"), ("pawsx", "zh")])
def test_the_tables_chance_level_is_a_constant_answer_on_the_official_test_files(shared_data, task, lang):
    examples, _ = load_split(TASKS[task], "test", lang, shared_data)
    top = Counter(ex.label for ex in examples).most_common(1)[0][1]
    assert TASKS[task].chance == pytest.approx(100 * top / len(examples), abs=0.1)
    assert chance_level(task) == TASKS[task].chance and chance_level("nerd") is None
    assert chance_level("mlqa") == chance_level("xquad", world=True) == 0.0  # QA's F1 floor


def test_squad_dev_and_pawsx_quotes(shared_data):
    examples, report = load_file(XQUAD, "test", shared_data / "squad/dev-v1.1.json")
    assert len(examples) == 10570 and not report.skipped
    assert max(len(ex.answers) for ex in examples) >= 3  # SQuAD dev has several gold answers
    # PAWS-X text has bare quotes; reading with CSV quoting would merge rows
    examples, _ = load_split(PAWSX, "test", "de", shared_data)
    assert any('"' in ex.text_a + ex.text_b for ex in examples)
    assert examples[0].id == "10"


# -------------------------------------------------------------------------------------- bad inputs


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_xnli_official_layout_filters_language(tmp_path):
    cols = ["language", "gold_label", "sentence1_binary_parse", "sentence1", "sentence2", "promptID", "pairID",
            "genre"]
    rows = [["en", "neutral", "(x)", "A man.", "A person.", "1", "p1", "fiction"],
            ["de", "entailment", "(x)", "Ein Mann.", "Eine Person.", "1", "p2", "fiction"],
            ["de", "contradiction", "(x)", "Ein Hund.", "Eine Katze.", "2", "p3", "fiction"]]
    path = _write(tmp_path / "xnli.dev.tsv", "\n".join("\t".join(r) for r in [cols, *rows]) + "\n")
    examples, report = load_file(XNLI, "dev", path, "de")
    assert examples == [PairExample("p2", "Ein Mann.", "Eine Person.", 0),
                        PairExample("p3", "Ein Hund.", "Eine Katze.", 2)]
    assert report.other_language == 1 and not report.skipped
    with pytest.raises(TaskDataError, match="no rows for language 'fr'.*de, en"):
        load_file(XNLI, "dev", path, "fr")


def test_tsv_bad_rows_are_counted(tmp_path):
    path = _write(tmp_path / "x.tsv", "language\tgold_label\tsentence1\tsentence2\n"
                  "en\tneutral\tA.\tB.\n"          # line 2 ok
                  "en\tmaybe\tA.\tB.\n"            # line 3 label outside the set
                  "en\tneutral\tA.\n"              # line 4 wrong field count
                  "en\tentailment\t \tB.\n"        # line 5 empty text
                  "\n"                              # line 6 empty line
                  "en\tcontradiction\tC.\tD.\n")   # line 7 ok
    examples, report = load_file(XNLI, "dev", path, "en")
    assert [ex.label for ex in examples] == [1, 2]
    assert report.skipped == {"label_not_in_set": 1, "malformed_row": 1, "empty_text": 1, "empty_line": 1}
    assert report.first_seen["malformed_row"] == "line 4"
    assert "label_not_in_set, first at line 3" in report.summary()


def test_pawsx_bad_labels_counted(tmp_path):
    path = _write(tmp_path / "dev.tsv", "id\tsentence1\tsentence2\tlabel\n1\tA\tB\t1\n2\tA\tB\t2\n3\tA\tB\t\n")
    examples, report = load_file(PAWSX, "dev", path, "de")
    assert examples == [PairExample("1", "A", "B", 1)] and report.skipped == {"label_not_in_set": 2}


@pytest.mark.parametrize("content, message", [
    ("", "empty file"),
    ("language\tlabel\tsentence1\tsentence2\nen\tneutral\tA\tB\n", "missing column.*gold_label"),
    ("language\tgold_label\tsentence1\tsentence2\nen\tmaybe\tA\tB\n", "nothing usable.*label_not_in_set"),
])
def test_unusable_tsv_is_an_error_naming_the_file(tmp_path, content, message):
    path = _write(tmp_path / "bad.tsv", content)
    with pytest.raises(TaskDataError, match=message) as err:
        load_file(XNLI, "dev", path, "en")
    assert "bad.tsv" in str(err.value)


def test_missing_and_non_utf8_files(tmp_path):
    with pytest.raises(TaskDataError, match="not found"):
        load_file(XNLI, "dev", tmp_path / "nope.tsv")
    path = tmp_path / "latin1.tsv"
    path.write_bytes("gold_label\tsentence1\tsentence2\nneutral\tcaf\xe9\tB\n".encode("latin-1"))
    with pytest.raises(TaskDataError, match="not UTF-8"):
        load_file(XNLI, "dev", path)


def test_mnli_jsonl(tmp_path):
    rows = [{"gold_label": "entailment", "sentence1": "A.", "sentence2": "B.", "pairID": "1e"},
            {"gold_label": "-", "sentence1": "A.", "sentence2": "C.", "pairID": "2n"},
            {"gold_label": "neutral", "sentence1": "A."}]
    path = _write(tmp_path / "multinli_1.0_train.jsonl",
                  "\n".join(json.dumps(r) for r in rows) + "\n{not json\n")
    examples, report = load_file(XNLI, "train", path)
    assert examples == [PairExample("1e", "A.", "B.", 0)]
    assert report.skipped == {"no_gold_label": 1, "malformed_row": 2}
    mnli_dir = tmp_path / "mnli"
    mnli_dir.mkdir()
    path.rename(mnli_dir / path.name)
    assert len(load_split(XNLI, "train", "en", tmp_path)[0]) == 1  # found under the table's file pattern


def _squad(qas, context="Denver won Super Bowl 50.", version="1.1"):
    return json.dumps({"version": version, "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": qas}]}]})


def test_squad_json_bad_answers(tmp_path):
    qas = [
        {"id": "ok", "question": "Who won?", "answers": [{"text": "Denver", "answer_start": 0}]},
        # one good, one misplaced answer: the question stays with the good one
        {"id": "half", "question": "Who?", "answers": [{"text": "Denver", "answer_start": 0},
                                                      {"text": "Denver", "answer_start": 3}]},
        {"id": "off", "question": "What?", "answers": [{"text": "Super", "answer_start": 0}]},
        {"id": "none", "question": "Why?", "answers": []},
        {"id": "ok", "question": "Again?", "answers": [{"text": "50", "answer_start": 22}]},
        {"id": "bad", "question": "How?", "answers": [{"text": "50"}]},
        {"question": "No id?", "answers": [{"text": "50", "answer_start": 22}]},
    ]
    path = _write(tmp_path / "d.json", _squad(qas))
    examples, report = read_squad_json(path)
    assert [ex.id for ex in examples] == ["ok", "half"]
    assert examples[1] == QAExample("half", "Who?", "Denver won Super Bowl 50.", (("Denver", 0),))
    assert report.skipped == {"answer_start_mismatch": 2, "no_valid_answer": 2, "no_answers": 1,
                              "duplicate_id": 1, "answer_malformed": 1, "malformed_question": 1}
    assert report.first_seen["answer_start_mismatch"] == "question half"
    # scoring compares texts only, as the official scripts: misplaced answers are kept
    examples, report = read_squad_json(path, check_offsets=False)
    assert [ex.id for ex in examples] == ["ok", "half", "off"] and len(examples[1].answers) == 2


@pytest.mark.parametrize("content, message", [
    ("", "not JSON"),
    ("[1, 2]", "'data' list"),
    ('{"data": []}', "nothing usable"),
    (_squad([{"id": "x", "question": "q", "answers": [{"text": "zz", "answer_start": 0}]}]),
     "nothing usable.*answer_start_mismatch"),
])
def test_unusable_squad_json_is_an_error(tmp_path, content, message):
    path = _write(tmp_path / "bad.json", content)
    with pytest.raises(TaskDataError, match=message) as err:
        read_squad_json(path)
    assert "bad.json" in str(err.value)


# ------------------------------------------------------------------------------------ hub schema


def test_hub_pairs_map_classlabel_names():
    datasets = pytest.importorskip("datasets")
    # A permuted ClassLabel order proves labels are mapped by name, not by position.
    features = datasets.Features({"premise": datasets.Value("string"), "hypothesis": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["contradiction", "entailment", "neutral"])})
    ds = datasets.Dataset.from_dict({"premise": ["A.", "B.", "C."], "hypothesis": ["a.", "b.", "c."],
                                     "label": [0, 2, -1]}, features=features)
    examples, report = examples_from_hub(XNLI, ds, "hub:test")
    assert [(ex.text_a, ex.label) for ex in examples] == [("A.", 2), ("B.", 1)]
    assert report.skipped == {"no_gold_label": 1}


def test_hub_pawsx_and_squad_rows():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"id": [7, 8], "sentence1": ["A", "B"], "sentence2": ["a", "b"],
                                     "label": [1, 0]})
    examples, _ = examples_from_hub(PAWSX, ds, "hub:paws-x")
    assert examples == [PairExample("7", "A", "a", 1), PairExample("8", "B", "b", 0)]
    ds = datasets.Dataset.from_dict({
        "id": ["q1", "q2"], "title": ["t", "t"], "context": ["Denver won.", "Denver won."],
        "question": ["Who?", "What?"],
        "answers": [{"text": ["Denver"], "answer_start": [0]}, {"text": ["won"], "answer_start": [0]}]})
    examples, report = examples_from_hub(MLQA, ds, "hub:mlqa")
    assert examples == [QAExample("q1", "Who?", "Denver won.", (("Denver", 0),))]
    assert report.skipped == {"answer_start_mismatch": 1, "no_valid_answer": 1}


def test_fitted_spec_keeps_windows_in_proportion():
    xquad = TASKS["xquad"]
    assert xquad.fitted(1000) is xquad
    small = xquad.fitted(128)
    assert (small.max_length, small.doc_stride, small.max_query_length) == (128, 64, 32)
    assert small.max_answer_length == xquad.max_answer_length and small.lr == xquad.lr


def test_mlqa_languages_are_the_ones_the_official_normalisation_knows():
    from mm_ds.eval.metrics import MLQA_LANGUAGES
    assert set(MLQA_LANGUAGES) == set(MLQA.languages)


# ----------------------------------------------------------------------------- data root "hub", offline

PREMISES = ("The cat sat on the mat.", "A dog ran far away.", "Birds sing in the morning.", "The river is cold.")


@pytest.fixture
def hub(monkeypatch):
    """`datasets.load_dataset` answered from memory (small splits in the hub's schemas); records what was asked."""
    datasets = pytest.importorskip("datasets")
    asked = []

    def load_dataset(name, config=None, split=None):
        asked.append((name, config, split))
        if TASKS["xquad"].eval.hub == name or TASKS["xquad"].train.hub == name:
            context = "Denver won the game in the rain."
            return datasets.Dataset.from_dict({
                "id": ["q1", "q2"], "context": [context, context], "question": ["Who won?", "Where?"],
                "answers": [{"text": ["Denver"], "answer_start": [0]}, {"text": ["the rain"], "answer_start": [23]}]})
        labels = datasets.ClassLabel(names=list(XNLI.labels))
        return datasets.Dataset.from_dict(
            {"premise": list(PREMISES), "hypothesis": [p.lower() for p in PREMISES], "label": [0, 1, 2, 0]},
            features=datasets.Features({"premise": datasets.Value("string"),
                                        "hypothesis": datasets.Value("string"), "label": labels}))

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return asked


def test_data_root_hub_reads_the_tables_hub_names(hub):
    examples, report = load_split(XNLI, "test", "de", "hub")
    assert [ex.label for ex in examples] == [0, 1, 2, 0] and report.source == "hub:facebook/xnli/de/test"
    assert len(load_split(XNLI, "train", "en", "hub")[0]) == 4
    examples, _ = load_split(XQUAD, "test", "de", "hub")
    assert examples[1].answers == (("the rain", 23),)
    assert hub == [("facebook/xnli", "de", "test"), ("nyu-mll/multi_nli", None, "train"),
                   ("google/xquad", "xquad.de", "validation")]
    with pytest.raises(TaskDataError, match="'t1' on the hub"):  # the table's languages only
        load_split(XNLI, "test", "t1", "hub")


def test_data_root_hub_offline_says_what_it_needs(monkeypatch):
    datasets = pytest.importorskip("datasets")

    def offline(name, config=None, split=None):
        raise ConnectionError(f"Couldn't reach {name!r} on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(TaskDataError, match=r"hub:facebook/xnli/de/validation: datasets.load_dataset failed "
                                            r"\(ConnectionError.*needs a network or a Hugging Face datasets cache"):
        load_split(XNLI, "dev", "de", "hub")


def test_finetuning_and_evaluation_read_the_hub(hub, tmp_path):
    """Step 3's training features and Step 4's evaluation (one unit scored, cached, collected) with
    finetune.data_root=hub / data root hub, as `task_root: hub` in a recipe makes them."""
    import sentencepiece as spm
    import torch

    from mm_ds.config import ModelConfig, to_dict
    from mm_ds.eval import transfer
    from mm_ds.model.heads import RobertaForTask
    from mm_ds.pipeline import evaluation
    from mm_ds.runtime.checkpointing import checkpoint
    from mm_ds.stages.finetune import _train_features

    spm.SentencePieceTrainer.train(sentence_iterator=iter(PREMISES * 20), model_prefix=str(tmp_path / "spm"),
                                   vocab_size=40, bos_id=0, pad_id=1, eos_id=2, unk_id=3,
                                   user_defined_symbols=["<mask>"], minloglevel=2, hard_vocab_limit=False)
    tok = str(tmp_path / "spm.model")
    features, _ = _train_features("xnli", "hub", tok, 32, None)
    assert len(features) == 4 and hub[-1] == ("nyu-mll/multi_nli", None, "train")

    cfg = ModelConfig(vocab_size=spm.SentencePieceProcessor(model_file=tok).get_piece_size(), hidden_size=16,
                      num_layers=1, num_heads=2, ffn_size=32, max_positions=40)
    torch.manual_seed(0)
    model = RobertaForTask(cfg, XNLI.task_type, XNLI.num_labels)
    checkpoint.write_final(tmp_path / "ft" / "final", model.state_dict(), {
        "stage": "finetune", "system": "bl_base", "task": "xnli", "kind": XNLI.task_type, "num_labels": XNLI.num_labels,
        "model": to_dict(cfg), "tokenizer": tok})
    units = transfer.units_for("xnli", "de", ["bl_base"], [str(tmp_path / "ft")], "test")
    evaluation.run_units(units, "hub", tmp_path / "eval", say=lambda m: None)
    rows = evaluation.collect(units, "hub", tmp_path / "eval")  # the cached result's fingerprint matches
    assert [(r["lang"], r["examples"], r["skipped"]) for r in rows] == [("de", 4, 0)]
    assert 0.0 <= rows[0]["score"] <= 100.0 and ("facebook/xnli", "de", "test") in hub
