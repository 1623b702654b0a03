"""The paths a checkpoint's meta points at (parent, primary, tokenizer) survive moving the run tree."""

import shutil

import torch

from mm_ds.runtime import checkpoint

WEIGHTS = {"w": torch.zeros(2)}


def _tree(root):
    (root / "data").mkdir(parents=True)
    (root / "data" / "spm.model").write_bytes(b"x")
    checkpoint.write_final(root / "pretrain" / "final", WEIGHTS, {"stage": "pretrain"})
    return checkpoint.write_final(root / "adapt" / "final", WEIGHTS, {
        "stage": "adapt", "parent": str(root / "pretrain"), "tokenizer": str(root / "data" / "spm.model")})


def test_a_moved_tree_reads_its_own_paths(tmp_path):
    _tree(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "a")
    meta = checkpoint.read_meta(tmp_path / "b" / "adapt" / "final")
    assert meta["parent"] == str((tmp_path / "b" / "pretrain").resolve())
    assert meta["tokenizer"] == str((tmp_path / "b" / "data" / "spm.model").resolve())
    checkpoint.verify(tmp_path / "b" / "adapt" / "final")


def test_a_path_outside_the_moved_tree_stays_absolute(tmp_path):
    final = _tree(tmp_path / "a")
    shutil.copytree(final, tmp_path / "elsewhere" / "final")  # the checkpoint alone, its relatives left behind
    meta = checkpoint.read_meta(tmp_path / "elsewhere" / "final")
    assert meta["tokenizer"] == str((tmp_path / "a" / "data" / "spm.model").resolve())


def test_rewriting_meta_elsewhere_recomputes_relative_paths(tmp_path):
    final = _tree(tmp_path / "a")
    meta = checkpoint.read_meta(final)
    other = tmp_path / "deeper" / "still" / "final"
    other.mkdir(parents=True)
    checkpoint.write_meta(other, meta)
    assert checkpoint.read_meta(other)["tokenizer"] == str((tmp_path / "a" / "data" / "spm.model").resolve())
    assert checkpoint.read_meta(other)["relative_paths"]["tokenizer"] == "../../../a/data/spm.model"
