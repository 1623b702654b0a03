"""The paths a checkpoint's meta points at (parent, primary, tokenizer) survive moving the run tree."""

import shutil

import pytest
import torch

from mm_ds.runtime.checkpointing import checkpoint

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


@pytest.mark.parametrize("manifest", [b"\xff\xfe not text", b"[1, 2]", b'{"files": [1]}', b'{"files": {"a": 3}}',
                                      b'{"files": {"a": {"bytes": 1}}}'])
def test_a_manifest_of_any_wrong_shape_is_a_checkpoint_error(tmp_path, manifest):
    """A manifest that is not UTF-8 JSON of the written shape marks its checkpoint as untrusted, so that resume
    skips it (find_resume_point catches CheckpointError), instead of ending the run with a raw error."""
    final = checkpoint.write_final(tmp_path / "run" / "final", WEIGHTS, {"stage": "pretrain"})
    (final / checkpoint.MANIFEST).write_bytes(manifest)
    with pytest.raises(checkpoint.CheckpointError, match="is unreadable"):
        checkpoint.verify(final)
