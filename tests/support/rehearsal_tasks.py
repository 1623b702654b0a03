"""Task files for the real-data rehearsal (tests/rehearsal.yaml, `make rehearsal`), from the public data in
../shared/data: test scaffolding, which the recipe then reads as any recipe reads its task_root.

That directory (see its SOURCES.md) holds the official evaluation files of XNLI, PAWS-X, MLQA and XQuAD for
some languages, but none of the paper's English training sets (MultiNLI, PAWS-X English train, SQuAD train).
The rehearsal proves that the paper's path runs on real text and real task files, not that a tiny model
transfers, so it makes small English training files from what is there, and says so:

    mnli/multinli_1.0_train.jsonl   XNLI's English dev set (2490 pairs), as MultiNLI JSONL
    squad/train-v1.1.json           SQuAD v1.1 dev without the 240 paragraphs XQuAD translated (9380 questions)
    paws-x/train.en.tsv             there is no English PAWS-X here: the German dev set stands in, so the
                                    rehearsal's PAWS-X score in German is not zero-shot
    xnli/ paws-x/ mlqa/ xquad/      the evaluation files, linked from the data directory as they are

`tasks.json` lists every file and what the English ones are made from; the directory is published whole.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from mm_ds.data.tasks import TaskDataError

SOURCES = {
    "mnli/multinli_1.0_train.jsonl": "xnli/xnli.dev.en.tsv",
    "squad/train-v1.1.json": "squad/dev-v1.1.json",
    "paws-x/train.en.tsv": "paws-x/dev.de.tsv",
}
EVAL_DIRS = ("xnli", "paws-x", "mlqa", "xquad")
MANIFEST = "tasks.json"


def missing_sources(data: str | Path) -> list[str]:
    data = Path(data)
    need = [*SOURCES.values(), "xquad/xquad.en.json", *EVAL_DIRS]
    return [str(data / rel) for rel in need if not (data / rel).exists()]


def build(data: str | Path, out: str | Path) -> dict:
    """Write the rehearsal's task directory `out` from the data directory `data`; returns its manifest."""
    data, out = Path(data).resolve(), Path(out)
    absent = missing_sources(data)
    if absent:
        raise TaskDataError(f"the rehearsal's task files are made from {data}, which lacks {', '.join(absent)}; "
                            f"give the shared data directory (see its SOURCES.md)")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for d in EVAL_DIRS:
        (tmp / d).mkdir()
        for f in sorted((data / d).iterdir()):
            if f.is_file():
                os.symlink(f, tmp / d / f.name)
    files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_symlink())
    files += [_nli(data, tmp), _squad(data, tmp), _pawsx(data, tmp)]
    manifest = {"made_from": str(data), "files": files,
                "english_training": {k: f"made from {v}" for k, v in SOURCES.items()}}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return manifest


def _nli(data: Path, out: Path) -> str:
    """XNLI TSV (language, gold_label, sentence1, sentence2, ...) -> MultiNLI JSONL."""
    rel = "mnli/multinli_1.0_train.jsonl"
    lines = (data / SOURCES[rel]).read_text(encoding="utf-8").split("\n")
    header = lines[0].split("\t")
    rows = []
    for i, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) != len(header):
            continue
        r = dict(zip(header, fields))
        rows.append(json.dumps({"gold_label": r["gold_label"], "sentence1": r["sentence1"],
                                "sentence2": r["sentence2"], "pairID": f"xnli-dev-en-{i}",
                                "genre": r.get("genre", "")}, ensure_ascii=False))
    (out / "mnli").mkdir(exist_ok=True)
    (out / rel).write_text("\n".join(rows) + "\n", encoding="utf-8")
    return rel


def _squad(data: Path, out: Path) -> str:
    """SQuAD dev without the paragraphs XQuAD translated: no XQuAD test question is trained on."""
    rel = "squad/train-v1.1.json"
    xquad = {p["context"] for a in json.loads((data / "xquad/xquad.en.json").read_text())["data"]
             for p in a["paragraphs"]}
    doc = json.loads((data / SOURCES[rel]).read_text())
    for article in doc["data"]:
        article["paragraphs"] = [p for p in article["paragraphs"] if p["context"] not in xquad]
    doc["data"] = [a for a in doc["data"] if a["paragraphs"]]
    (out / "squad").mkdir(exist_ok=True)
    (out / rel).write_text(json.dumps(doc, ensure_ascii=False))
    return rel


def _pawsx(data: Path, out: Path) -> str:
    rel = "paws-x/train.en.tsv"
    shutil.copyfile(data / SOURCES[rel], out / rel)
    return rel


if __name__ == "__main__":  # python tests/support/rehearsal_tasks.py DATA OUT
    import sys
    print(json.dumps(build(*sys.argv[1:3]), indent=1))
