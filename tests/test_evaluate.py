"""Evaluation batches examples by length (less padding); predictions must come back in file order and
not depend on the batch they were computed in."""

import json

import pytest
import torch

from mm_ds.config import ConfigError, ModelConfig, to_dict
from mm_ds.data.task_files import load_split
from mm_ds.data.tasks import TASKS
from mm_ds.data.world import generate_world
from mm_ds.eval import transfer
from mm_ds.eval.evaluate import evaluate, length_batches, predict
from mm_ds.model.heads import RobertaForTask
from mm_ds.pipeline import evaluation
from mm_ds.runtime.checkpointing import checkpoint
from test_features import train_spm


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("world")
    generate_world(root, languages=("t1",), sentences=400, target_sentences=50,
                   task_sizes=dict(nli_train=5, paws_train=5, qa_train=5, dev=5, test=60))
    lines = [line for line in (root / "text" / "en.txt").read_text().splitlines() if line]
    return root, train_spm(lines, vocab_size=600)


def test_length_batches_cover_every_index_once():
    class F:
        def __init__(self, n):
            self.input_ids = [0] * n

    feats = [F(n) for n in (5, 1, 9, 3, 3, 7, 2)]
    batches = length_batches(feats, 3)
    assert sorted(i for b in batches for i in b) == list(range(7))
    assert [len(feats[i].input_ids) for b in batches for i in b] == [1, 2, 3, 3, 5, 7, 9]


@pytest.mark.parametrize("task", ["xnli", "xquad"])
def test_predictions_do_not_depend_on_batching(world, task):
    root, sp = world
    spec = TASKS[task]
    examples, _ = load_split(spec, "test", "en", root)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=sp.get_piece_size(), hidden_size=32, num_layers=2, num_heads=2, ffn_size=64,
                      max_positions=128, init_std=0.5)  # at 0.02 a random model predicts one class for all
    model = RobertaForTask(cfg, spec.task_type, spec.num_labels)
    one_by_one, _ = predict(model, spec, examples, sp, batch_size=1)  # no padding at all
    batched, _ = predict(model, spec, examples, sp, batch_size=16)
    assert batched == one_by_one
    if task == "xnli":  # a random model's labels vary, so a scrambled order would not match by chance
        assert len(set(batched)) > 1
        assert evaluate(model, spec, examples, sp, "en", batch_size=16).score == pytest.approx(
            100 * sum(p == ex.label for p, ex in zip(one_by_one, examples)) / len(examples))


def test_a_result_scored_on_another_kind_of_device_is_scored_again(world, tmp_path):
    """OUT/eval/ records how each unit was scored (cuda/bf16 on GPUs, cpu/fp32 here) in its fingerprint: a GPU's
    result (faked) is not reused on CPU but scored again, and results that mix the two are refused."""
    root, sp = world
    tok = tmp_path / "spm.model"
    tok.write_bytes(sp.serialized_model_proto())
    spec = TASKS["xnli"]
    cfg = ModelConfig(vocab_size=sp.get_piece_size(), hidden_size=16, num_layers=1, num_heads=2, ffn_size=32,
                      max_positions=64, init_std=0.5)
    torch.manual_seed(0)
    checkpoint.write_final(tmp_path / "ft" / "final", RobertaForTask(cfg, spec.task_type, spec.num_labels).state_dict(),
                           {"stage": "finetune", "system": "bl_base", "task": "xnli", "kind": spec.task_type,
                            "num_labels": spec.num_labels, "model": to_dict(cfg), "tokenizer": str(tok)})
    units = [u for s in ("bl_base", "minipost")
             for u in transfer.units_for("xnli", "en", [s], [str(tmp_path / "ft")], "test", limit=20)]
    results, here, gpu = tmp_path / "eval", transfer.scored_with("cpu"), transfer.scored_with("cuda")
    assert (here, gpu) == ("cpu/fp32", "cuda/bf16")
    evaluation.run_units(units, str(root), results, device="cpu", say=lambda m: None)
    rows = evaluation.collect(units, str(root), results)

    path = results / f"{units[0].name}.json"
    saved = json.loads(path.read_text())
    assert saved["scored_with"] == here
    path.write_text(json.dumps({"fingerprint": evaluation.unit_fingerprint(units[0], str(root), tmp_path, gpu),
                                "scored_with": gpu, "rows": [r | {"score": -1.0} for r in saved["rows"]]}))
    with pytest.raises(ConfigError, match=r"different kinds of device and precision \(cuda/bf16: 1 .*cpu/fp32: 1"):
        evaluation.collect(units, str(root), results)
    assert evaluation.cached(results, units[0], str(root), gpu) is not None  # current, for a GPU
    assert evaluation.cached(results, units[0], str(root), here) is None  # but not scored here
    evaluation.run_units(units, str(root), results, device="cpu", say=lambda m: None)
    assert evaluation.collect(units, str(root), results) == rows and json.loads(path.read_text())["scored_with"] == here
