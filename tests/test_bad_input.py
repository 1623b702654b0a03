"""Bad input, in one place: each case names what is wrong (key, file or value) or counts and skips it, and
leaves nothing behind that a later run could mistake for a complete output. Mostly in-process and fast."""

import json
import lzma
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mm_ds import config
from mm_ds.config import ConfigError, LaunchConfig
from mm_ds.data import task_files, tasks
from mm_ds.data.corpus import prepare
from mm_ds.data.shards import TokenCorpus
from mm_ds.pipeline import recipe as recipe_mod
from mm_ds.pipeline import run as pipeline
from mm_ds.runtime.checkpointing import checkpoint
from mm_ds.runtime.distributed import launch
from mm_ds.runtime.training import ds_config
from mm_ds.tools import verify
from support.textgen import write_corpus

# ---------------------------------------------------------------- configs

@pytest.mark.parametrize("overrides, message", [
    (["train.lrr=1"], "unknown config key(s) train.lrr"),
    (["train.steps=abc"], "train.steps: expected an integer, got 'abc'"),
    (["model.dropout=[1]"], "model.dropout: expected a number"),
    (["train.lr"], "override 'train.lr' must look like key=value"),
    (["model.hidden_size=30", "model.num_heads=4"], "model.hidden_size=30 is not divisible by model.num_heads=4"),
    (["data.seq_len=1024"], "data.seq_len=1024 exceeds model.max_positions=512"),
    (["train.warmup_steps=20", "train.steps=10"], "train.warmup_steps=20 must lie in [0, train.steps=10]"),
    (["train.max_nonfinite_steps=-1"], "train.max_nonfinite_steps=-1 must be >= 0"),
    (["system=bl_huge"], "system='bl_huge' is not one of"),
    (["stage=adapt"], "stage adapt starts from a parent checkpoint: set parent=RUN_DIR"),
    (["data.mask_prob=1.5"], "data.mask_prob=1.5 must be in (0, 1)"),
    (["launch.launcher=slurmish"], "launch.launcher='slurmish'"),
    (["model.secondary_head_layer=9", "model.num_layers=4"], "model.secondary_head_layer=9 must be between 1 and"),
])
def test_config_values(overrides, message):
    with pytest.raises(ConfigError) as e:
        config.load(None, None, overrides)
    assert message in str(e.value)


def test_config_files(tmp_path):
    with pytest.raises(ConfigError, match="unknown preset 'tiny/nope'"):
        config.load("tiny/nope")
    with pytest.raises(ConfigError, match=r"config file .*missing.yaml does not exist"):
        config.load(None, str(tmp_path / "missing.yaml"))
    (tmp_path / "bad.yaml").write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad.yaml is not valid YAML"):
        config.load(None, str(tmp_path / "bad.yaml"))
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match=r"list.yaml must hold a mapping of keys, got list"):
        config.load(None, str(tmp_path / "list.yaml"))


def test_deepspeed_configs(tmp_path):
    with pytest.raises(ConfigError, match="DeepSpeed config 'nope.json' not found"):
        ds_config.resolve(config.load(None, None, ["ds_config=nope.json"]), 1)
    (tmp_path / "ds.json").write_text("{ not json")
    with pytest.raises(ConfigError, match=r"ds.json is not valid JSON"):
        ds_config.resolve(config.load(None, None, [f"ds_config={tmp_path / 'ds.json'}"]), 1)
    cfg = config.load(None, None, ["train.global_batch=10", "train.micro_batch=4"])
    with pytest.raises(ConfigError, match="global batch 10 is not divisible by micro batch 4 x world size 2"):
        ds_config.resolve(cfg, 2)


# ---------------------------------------------------------------- recipes

def _recipe(tmp_path, **kw):
    base = {"systems": ["bl_small"], "langs": ["t1"], "tasks": ["xnli"], "world": {"seed": 0},
            "presets": {"pretrain": "tiny/{system}", "adapt": "tiny/adapt", "finetune": "tiny/finetune"}}
    path = tmp_path / "recipe.yaml"
    path.write_text(json.dumps(base | kw))
    return str(path)


@pytest.mark.parametrize("change, message", [
    ({"systems": ["bl_huge"]}, "systems: system='bl_huge' is not one of"),
    ({"tasks": ["squad2"]}, "unknown task(s) ['squad2']"),
    ({"langs": ["xx"]}, "language(s) ['xx'] are not generated-world languages"),
    ({"world": None}, "no text inputs for language(s) ['en', 't1']"),
    ({"langs": []}, "a recipe needs at least one target language"),
    ({"presets": {"pretrain": "tiny/{system}"}}, "presets.adapt is unset"),
    ({"sytems": ["bl_small"]}, "unknown config key(s) sytems"),
])
def test_recipes(tmp_path, change, message):
    with pytest.raises(ConfigError) as e:
        recipe_mod.load_recipe(_recipe(tmp_path, **change))
    assert message in str(e.value)


def test_unknown_recipe_name():
    with pytest.raises(ConfigError, match="recipe 'tinyy' is neither a file nor a packaged recipe"):
        recipe_mod.load_recipe("tinyy")


def test_incomplete_world_is_not_trusted(tmp_path):
    """world.json is written last; a world whose manifest is missing, torn, or lists absent files is redone."""
    from mm_ds.data.world import generate_world

    w = tmp_path / "world"
    generate_world(w, languages=("t1",), sentences=50, target_sentences=50,
                   task_sizes=dict(nli_train=5, paws_train=5, qa_train=5, dev=5, test=5))
    assert pipeline.world_complete(w)
    (w / "xnli" / "xnli.test.t1.tsv").unlink()
    assert not pipeline.world_complete(w)
    (w / "world.json").write_text('{"files": [')  # torn write
    assert not pipeline.world_complete(w)


# ---------------------------------------------------------------- corpora and tokenizer files

@pytest.fixture(scope="module")
def text(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("text") / "en.txt"
    write_corpus(p, n_docs=20, per_doc=5)
    return p


def _no_outputs(out: Path) -> None:
    assert not out.exists() and not out.with_name(out.name + ".partial").exists()


@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(inputs=["{d}/nothing-*.txt"]), FileNotFoundError, "matches no file; check --input"),
    (dict(inputs=["{d}/empty.txt"]), ValueError, "empty.txt is empty; remove it from --input"),
    (dict(inputs=["{d}/broken.txt.xz"]), ValueError, "broken.txt.xz cannot be read/decompressed"),
    (dict(lang="a/b"), ValueError, "--lang 'a/b' must be a language code"),
    (dict(vocab_size=5), ValueError, "--vocab-size 5 leaves no room beyond the 5 special tokens"),
    (dict(character_coverage=0.0), ValueError, "--character-coverage must be in (0, 1]"),
    (dict(spm_model="{d}/missing.model"), FileNotFoundError, "missing.model does not exist: prepare reuses this file "
                                                              "(spm_model) instead of training one"),
    (dict(spm_model="{d}/garbage.model"), ValueError, "garbage.model is unreadable"),
    (dict(inputs=["{d}/blank.txt"]), ValueError, "contain no non-blank UTF-8 line"),
])
def test_prepare(tmp_path, text, kwargs, exc, message):
    d = tmp_path
    (d / "empty.txt").write_text("")
    (d / "blank.txt").write_text("\n\n  \n")
    (d / "broken.txt.xz").write_bytes(lzma.compress(b"ok line\n" * 50)[:40])
    (d / "garbage.model").write_bytes(b"not a sentencepiece model")
    args = dict(lang="en", inputs=[str(text)], vocab_size=60, workers=1, progress=False) | kwargs
    args["inputs"] = [i.format(d=d) for i in args["inputs"]]
    if "spm_model" in args:
        args["spm_model"] = args["spm_model"].format(d=d)
    out = d / "out"
    with pytest.raises(exc) as e:
        prepare(args.pop("lang"), args.pop("inputs"), str(out), **args)
    assert message in str(e.value)
    _no_outputs(out)


def test_a_missing_tokenizer_is_named_without_a_flag_the_caller_may_not_have(tmp_path, text):
    """`mm-ds extend` hands prepare its imported tokenizer; `mm-ds prepare` the --spm-model it was given: the message
    names the file, and no command's flag."""
    missing = tmp_path / "import" / "spm.model"
    with pytest.raises(FileNotFoundError) as e:
        prepare("en", [str(text)], str(tmp_path / "out"), spm_model=str(missing), workers=1, progress=False)
    assert str(e.value).startswith(f"tokenizer {missing} does not exist") and not re.search(r"(^|\s)--\w", str(e.value))
    _no_outputs(tmp_path / "out")


def test_prepare_refuses_a_foreign_nonempty_out(tmp_path, text):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="exists and is not empty but holds no prepared corpus"):
        prepare("en", [str(text)], str(out), vocab_size=60, workers=1, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_corpus_without_meta_is_not_a_corpus(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "shard_00000.bin").write_bytes(b"\0" * 8)  # a half-copied corpus: meta.json comes last
    with pytest.raises(FileNotFoundError, match="is not a prepared corpus: .*meta.json is missing"):
        TokenCorpus(tmp_path / "c")


# ---------------------------------------------------------------- task files

def test_task_files(tmp_path):
    spec = tasks.get_task("xnli")
    with pytest.raises(tasks.TaskDataError, match=r"nope.tsv: file not found"):
        task_files.load_file(spec, "test", tmp_path / "nope.tsv")
    (tmp_path / "cols.tsv").write_text("label\tpremise\n1\tx\n")
    with pytest.raises(tasks.TaskDataError, match=r"cols.tsv: missing column\(s\) gold_label"):
        task_files.load_file(spec, "test", tmp_path / "cols.tsv")
    (tmp_path / "bin.tsv").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(tasks.TaskDataError, match="bin.tsv: not UTF-8 text"):
        task_files.load_file(spec, "test", tmp_path / "bin.tsv")
    # Bad rows are counted and skipped, never trained on or scored.
    (tmp_path / "mixed.tsv").write_text("gold_label\tsentence1\tsentence2\n"
                                        "entailment\ta cat\ta pet\nmaybe\tx\ty\nneutral\t\t\ncontradiction\tu\tv\n")
    examples, report = task_files.load_file(spec, "test", tmp_path / "mixed.tsv")
    assert len(examples) == 2
    assert report.skipped["label_not_in_set"] == 1 and report.skipped["empty_text"] == 1
    assert "2 skipped" not in report.summary() and "label_not_in_set" in report.summary()
    (tmp_path / "all_bad.tsv").write_text("gold_label\tsentence1\tsentence2\nmaybe\tx\ty\n")
    with pytest.raises(tasks.TaskDataError, match="all_bad.tsv: nothing usable in it"):
        task_files.load_file(spec, "test", tmp_path / "all_bad.tsv")
    with pytest.raises(tasks.TaskDataError, match="unknown task 'xnlii'"):
        tasks.get_task("xnlii")


# ---------------------------------------------------------------- checkpoints

def _fake_ckpt(tmp_path) -> Path:
    ck = tmp_path / "checkpoints" / "step_00000004"
    ck.mkdir(parents=True)
    (ck / "mp_rank_00_model_states.pt").write_bytes(b"x" * 64)
    checkpoint.write_json_atomic(ck / checkpoint.META, {"format": checkpoint.FORMAT, "stage": "pretrain"})
    checkpoint.write_manifest(ck)
    return ck


def test_checkpoints(tmp_path, capsys):
    ck = _fake_ckpt(tmp_path)
    assert verify.main([str(ck)]) == 0
    f = ck / "mp_rank_00_model_states.pt"
    f.write_bytes(b"y" + b"x" * 63)
    with pytest.raises(checkpoint.CheckpointError, match=r"mp_rank_00_model_states.pt: sha256 differs"):
        checkpoint.verify(ck)
    f.write_bytes(b"x" * 10)
    with pytest.raises(checkpoint.CheckpointError, match=r"mp_rank_00_model_states.pt: 10 bytes, manifest says 64"):
        checkpoint.verify(ck)
    assert verify.main([str(ck)]) == 1
    assert "BAD" in capsys.readouterr().out
    (ck / checkpoint.MANIFEST).write_text("{torn")
    with pytest.raises(checkpoint.CheckpointError, match=r"manifest.json is unreadable"):
        checkpoint.verify(ck)
    (ck / checkpoint.MANIFEST).unlink()
    with pytest.raises(checkpoint.CheckpointError, match="no manifest.json; it is incomplete"):
        checkpoint.load_into_engine(None, ck)
    assert checkpoint.list_checkpoints(tmp_path) == [] and checkpoint.find_resume_point(tmp_path) is None
    with pytest.raises(checkpoint.CheckpointError, match="holds neither final/model.safetensors nor"):
        checkpoint.load_final(tmp_path / "checkpoints")
    assert verify.main([str(tmp_path / "nowhere")]) == 1


def test_half_written_checkpoint_is_reported_not_used(tmp_path, capsys):
    _fake_ckpt(tmp_path)
    tmp = tmp_path / "checkpoints" / "step_00000008.tmp"
    tmp.mkdir()
    (tmp / "mp_rank_00_model_states.pt").write_bytes(b"partial")
    (tmp_path / "checkpoints" / "latest").write_text("step_00000004")
    assert checkpoint.find_resume_point(tmp_path).name == "step_00000004"
    assert "ignoring half-written checkpoint" in capsys.readouterr().out
    assert verify.main([str(tmp_path)]) == 0
    assert "SKIP  " in capsys.readouterr().out


def test_meta_of_another_format_is_refused(tmp_path):
    ck = _fake_ckpt(tmp_path)
    (ck / checkpoint.META).write_text(json.dumps({"format": "someone-else/3"}))
    with pytest.raises(checkpoint.CheckpointError, match=r"format 'someone-else/3', expected 'mm-ds-checkpoint/1'"):
        checkpoint.read_meta(ck)


def test_unwritable_checkpoint_dir_fails_the_save_and_says_so(tmp_path, monkeypatch):
    """Without a real full disk (tests/test_faults.py mounts one when root): the engine's writer fails."""
    run = tmp_path / "run"
    _fake_ckpt(run)
    (run / "checkpoints" / "latest").write_text("step_00000004")

    class Engine:
        def save_checkpoint(self, *a, **k):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.save(Engine(), run, 8, {}, {"stage": "pretrain"})
    msg = str(e.value)
    assert "step_00000008 failed" in msg and "disk full?" in msg and "bytes free" in msg
    assert "previous checkpoint (step_00000004) is intact" in msg
    assert not (run / "checkpoints" / "step_00000008.tmp").exists()
    assert checkpoint.latest_tag(run) == "step_00000004"


# ---------------------------------------------------------------- launcher inputs

def test_launcher_inputs():
    with pytest.raises(ConfigError, match="launch.launcher='ssh'"):
        launch.command(LaunchConfig(launcher="ssh", ranks=2), ["pretrain"])
    with pytest.raises(ConfigError, match="launcher executable 'no-such-launcher' not found"):
        launch._bin("no-such-launcher")
    with pytest.raises(ConfigError, match="does not resolve"):
        launch.check_master("no-such-host.invalid", 29999, must_be_local=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(ConfigError, match=f"master port {s.getsockname()[1]} on 127.0.0.1 is already in use"):
            launch.check_master("127.0.0.1", s.getsockname()[1], must_be_local=True)


@pytest.mark.ranks
def test_stage_command_with_bad_input_exits_2_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "mm_ds.cli", "pretrain", "--preset", "tiny/bl_small", "--out",
                           str(out), "data.corpus=" + str(tmp_path / "no-corpus"), "launch.ranks=3",
                           "train.global_batch=32", "train.micro_batch=16"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 2
    assert "no-corpus is not a prepared corpus" in proc.stderr
    assert not out.exists()
