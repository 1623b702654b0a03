"""`mm-ds score`: gold round trips on the real files, hand-computed scores, and bad prediction files."""

import json
from pathlib import Path

import pytest

from mm_ds.data.task_files import load_split, read_squad_json
from mm_ds.data.tasks import TASKS, TaskDataError
from mm_ds.eval.score import main, score


def _gold_predictions(dataset: Path, which: int) -> dict[str, str]:
    doc = json.loads(dataset.read_text(encoding="utf-8"))
    return {qa["id"]: qa["answers"][which]["text"]
            for article in doc["data"] for para in article["paragraphs"] for qa in para["qas"]}


@pytest.mark.parametrize("task, lang, rel", [
    ("xquad", "de", "xquad/xquad.de.json"),
    ("xquad", "zh", "xquad/xquad.zh.json"),
    ("mlqa", "de", "mlqa/dev-context-de-question-de.json"),
])
def test_gold_answers_score_100(shared_data, tmp_path, task, lang, rel):
    preds = tmp_path / "preds.json"
    preds.write_text(json.dumps(_gold_predictions(shared_data / rel, 0), ensure_ascii=False), encoding="utf-8")
    out = score(task, lang, shared_data / rel, preds)
    assert out == {"exact_match": 100.0, "f1": 100.0, "count": out["count"], "missing": 0, "unknown": 0,
                   "skipped": {}}
    assert out["count"] == (512 if task == "mlqa" else 1190)


def test_squad_dev_official_quirk(shared_data, tmp_path):
    # SQuAD dev, predicting each question's last gold answer: EM 100, but a gold answer that normalises to
    # nothing gives F1 0 for its question (official v1.1 behaviour), so F1 stays just below 100.
    preds = tmp_path / "preds.json"
    preds.write_text(json.dumps(_gold_predictions(shared_data / "squad/dev-v1.1.json", -1)), encoding="utf-8")
    out = score("xquad", "en", shared_data / "squad/dev-v1.1.json", preds)
    assert out["exact_match"] == 100.0 and out["count"] == 10570
    assert out["f1"] == pytest.approx(100.0 * 10569 / 10570)


def _tiny_dataset(tmp_path: Path) -> Path:
    context = "苹果公司的iPhone 12手机于2020年发布。«Apple» lanzó el teléfono."
    qas = [
        {"id": "q1", "question": "什么？", "answers": [{"text": "苹果公司的iPhone 12手机", "answer_start": 0}]},
        {"id": "q2", "question": "何时？", "answers": [{"text": "2020年", "answer_start": 17},
                                                      {"text": "2020", "answer_start": 17}]},
        {"id": "q3", "question": "谁？", "answers": [{"text": "«Apple»", "answer_start": 25}]},
    ]
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({"version": "1.0", "data": [{"title": "", "paragraphs": [
        {"context": context, "qas": qas}]}]}, ensure_ascii=False), encoding="utf-8")
    return path


def test_hand_built_predictions(tmp_path):
    dataset = _tiny_dataset(tmp_path)
    assert not read_squad_json(dataset)[1].skipped  # offsets in the hand-built file are right
    preds = tmp_path / "preds.json"
    preds.write_text(json.dumps({"q1": "iPhone 12手机", "q3": "Apple", "q9": "stray"}, ensure_ascii=False),
                     encoding="utf-8")
    # MLQA zh: q1 [iphone,12,手,机] vs 9 tokens -> EM 0, F1 8/13 (see test_metrics); q2 missing -> 0;
    # q3 "apple" == "«apple»" with « » removed -> EM 1, F1 1.  EM = 100/3, F1 = 100*(8/13+1)/3
    out = score("mlqa", "zh", dataset, preds)
    assert out["exact_match"] == pytest.approx(100 / 3)
    assert out["f1"] == pytest.approx(100 * (8 / 13 + 1) / 3)
    assert (out["count"], out["missing"], out["unknown"]) == (3, 1, 1)
    # SQuAD (XQuAD) zh: q1 [iphone, 12手机] vs [苹果公司的iphone, 12手机]: same 1, P=1/2, R=1/2 -> F1 1/2;
    # q3 "apple" vs "«apple»": « » are kept -> 0.  EM 0, F1 = 100*(1/2)/3
    out = score("xquad", "zh", dataset, preds)
    assert out["exact_match"] == 0.0
    assert out["f1"] == pytest.approx(100 * 0.5 / 3)
    # a language MLQA has no rules for (a generated world language) is scored by the rules it names
    assert score("mlqa", "t1", dataset, preds, metric_lang="zh") == score("mlqa", "zh", dataset, preds)


def test_bad_qa_prediction_files(tmp_path):
    dataset = _tiny_dataset(tmp_path)
    preds = tmp_path / "preds.json"
    for content, message in [("[1]", "JSON object"), ("{", "not a JSON"), ('{"q1": 3}', "'q1' has int")]:
        preds.write_text(content, encoding="utf-8")
        with pytest.raises(TaskDataError, match=message):
            score("xquad", "zh", dataset, preds)
    with pytest.raises(TaskDataError, match="not found"):
        score("xquad", "zh", dataset, tmp_path / "none.json")
    with pytest.raises(TaskDataError, match="'t1'.*--metric-lang"):
        score("mlqa", "t1", dataset, preds)
    with pytest.raises(TaskDataError, match="unknown task 'squad2'"):
        score("squad2", "en", dataset, preds)


def _xnli_file(tmp_path: Path) -> Path:
    path = tmp_path / "xnli.dev.en.tsv"
    path.write_text("language\tgold_label\tsentence1\tsentence2\tgenre\n"
                    "en\tentailment\tA.\tB.\t\n"
                    "en\tneutral\tA.\tC.\t\n"
                    "en\t-\tA.\tD.\t\n"  # no gold label: skipped, gets no prediction line
                    "en\tcontradiction\tA.\tE.\t\n", encoding="utf-8")
    return path


def test_classification_labels_as_strings_or_indices(tmp_path):
    dataset, preds = _xnli_file(tmp_path), tmp_path / "preds.txt"
    preds.write_text("entailment\n2\ncontradiction\n", encoding="utf-8")  # 2 = contradiction: wrong for row 2
    out = score("xnli", "en", dataset, preds)
    assert out == {"accuracy": pytest.approx(200 / 3), "correct": 2, "count": 3,
                   "skipped": {"label_not_in_set": 1}}
    preds.write_text("entailment\nneutral\n", encoding="utf-8")
    with pytest.raises(TaskDataError, match="2 prediction lines for 3 examples"):
        score("xnli", "en", dataset, preds)
    preds.write_text("entailment\nmaybe\n3\n", encoding="utf-8")
    with pytest.raises(TaskDataError, match="line 2: 'maybe'.*entailment, neutral, contradiction"):
        score("xnli", "en", dataset, preds)


def test_pawsx_real_file_and_cli(shared_data, tmp_path, capsys):
    examples, _ = load_split(TASKS["pawsx"], "dev", "de", shared_data)
    preds = tmp_path / "preds.txt"
    preds.write_text("".join(f"{1 - ex.label if i < 500 else ex.label}\n" for i, ex in enumerate(examples)))
    assert main(["--task", "pawsx", "--lang", "de", str(shared_data / "paws-x/dev.de.tsv"), str(preds)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["accuracy"] == 75.0 and out["count"] == 2000  # 500 of 2000 flipped
    assert main(["--task", "pawsx", "--lang", "de", str(shared_data / "paws-x/dev.zh.tsv"), str(tmp_path / "x")]) == 2
    assert "prediction file not found" in capsys.readouterr().err
