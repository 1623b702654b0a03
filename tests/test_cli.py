"""Finding one's way in the CLI: --version, `mm-ds config`, `mm-ds presets [--show]`, did-you-mean for every
name a user types, help texts, `mm-ds run`'s errors without a traceback, and --dry-run before the parent and
corpus exist. In-process `cli.main` calls: fast."""

import dataclasses
import importlib
import json
import re
import socket
import sys
import typing
from importlib import resources
from pathlib import Path

import pytest

from mm_ds import cli, config
from mm_ds.config import ConfigError, recipe_names
from mm_ds.pipeline import run as pipeline
from mm_ds.pipeline.recipe import load_recipe
from mm_ds.runtime.training import ds_config

ROOT = Path(__file__).resolve().parents[1]


def run(capsys, *argv):
    """(exit code, stdout, stderr) of `mm-ds ARGV`; argparse's --help exits, which counts as its code."""
    try:
        rc = cli.main(list(argv))
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def test_version_is_the_installed_packages(capsys):
    rc, out, _ = run(capsys, "--version")
    setup_version = re.search(r'version="([^"]+)"', (ROOT / "setup.py").read_text()).group(1)
    assert rc == 0 and out.strip() == f"mm-ds {setup_version}"


def test_help_lists_user_commands_only_and_every_one_dispatches(capsys):
    """The CLI's table is the user's: what `mm-ds run` starts on its ranks is `mm_ds/rank.py` with a run directory or
    a job file (mm_ds/pipeline/jobs.py), no internal command."""
    rc, out, _ = run(capsys, "--help")
    assert rc == 0 and "config" in out and "presets" in out and "--version" in out
    assert not hasattr(cli, "INTERNAL_COMMANDS") and "run-" not in out
    for name, (target, _) in cli.TOOL_COMMANDS.items():
        module, func = target.split(":")
        assert name in out and callable(getattr(importlib.import_module(module), func))


def test_help_lists_every_packaged_recipe(capsys):
    _, out, _ = run(capsys, "--help")
    (line,) = [line for line in out.splitlines() if line.startswith("  run ")]
    assert f"({', '.join(recipe_names())}; or your YAML file)" in line
    assert {"depths", "tiny", "quick", "paper"} <= set(recipe_names())
    _, out, _ = run(capsys, "run", "--help")
    assert all(name in out for name in recipe_names())


@pytest.mark.ranks
def test_deepspeeds_cpu_accelerator_note_stays_in_the_ranks_output(tmp_path, monkeypatch):
    """DeepSpeed warns "Setting accelerator to CPU" wherever it finds no GPU: not on every command a user types,
    but in a rank's output (a log); its other warnings pass everywhere."""
    import logging
    import subprocess

    from mm_ds.runtime.distributed import launch

    for var in (*launch.RANK_VARS, *launch.SRUN_STEP_VARS):
        monkeypatch.delenv(var, raising=False)
    (shown,) = [f for f in logging.getLogger("DeepSpeed").filters if type(f).__module__ == "mm_ds"]

    def passes(message):
        return shown.filter(logging.LogRecord("DeepSpeed", logging.WARNING, "real_accelerator.py", 213, message,
                                              None, None))

    note = "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it."
    assert not passes(note) and passes("a real warning")
    monkeypatch.setenv("RANK", "0")
    assert passes(note) and passes("a real warning")
    monkeypatch.delenv("RANK")
    check = subprocess.run([sys.executable, "-m", "mm_ds.cli", "run", "tiny", "--check", "--out", str(tmp_path)],
                           capture_output=True, text=True)  # the filter is there before DeepSpeed's logger
    assert check.returncode == 0 and check.stdout.startswith("mm-ds run tiny --check: ok"), check.stdout
    assert "Setting accelerator" not in check.stdout + check.stderr


@pytest.mark.parametrize("command", ["bench", "prepare", "config", "presets", "run"])
def test_help_texts_cite_no_tracker(capsys, command):
    rc, out, _ = run(capsys, command, "--help")
    assert rc == 0 and out.startswith("usage: mm-ds")
    assert not re.search(r"\bissue\b|#\d+|tracker", out, re.I), out


def test_prepare_options_have_help_and_defaults(capsys):
    _, out, _ = run(capsys, "prepare", "--help")
    options = re.findall(r"^  (--[\w-]+)[^\n]*(?:\n {6,}[^\n]*)*", out, re.M)
    assert {"--lang", "--input", "--out", "--vocab-size", "--model-type", "--seed"} <= set(options)
    blocks = re.split(r"\n(?=  --)", out.split("options:")[1])[1:]
    for block in blocks:
        option, rest = block.strip().split(maxsplit=1) if " " in block.strip() else (block.strip(), "")
        assert len(rest.split()) > 2, f"{option} has no help: {block!r}"
    for default in ("(default: 50000)", "(default: 0.9998)", "(default: unigram)", "(default: 0)"):
        assert default in " ".join(out.split())


def keys(cls, prefix=""):
    """Every config key (dotted) of `cls`."""
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        yield from keys(tp, f"{prefix}{f.name}.") if dataclasses.is_dataclass(tp) else [prefix + f.name]


def test_config_shows_every_key_with_type_value_and_documentation(capsys):
    rc, out, _ = run(capsys, "config", "adapt", "--preset", "tiny/adapt", "train.seed=3")
    assert rc == 0
    lines = out.splitlines()
    for key in keys(config.RunConfig):
        at = [i for i, line in enumerate(lines) if line.strip().startswith(f"{key}: ")]
        assert len(at) == 1, key
        doc = lines[at[0] + 1]
        assert doc.startswith(" " * 4) and not doc.strip().startswith(key), f"{key} has no documentation"
    cfg = config.load("tiny/adapt", overrides=["train.seed=3"], check=False)
    assert f"  train.steps: int = {cfg.train.steps}  (default 125000)" in lines
    assert "  train.seed: int = 3  (default 0)" in lines
    assert "  monitor.tensorboard: bool = false" in lines
    assert "  model.vocab_size: int | None = null" in lines
    assert "      Peak learning rate." in lines  # the field's docstring in mm_ds/config.py
    assert 'stage: str = "adapt"' in lines

    rc, out, _ = run(capsys, "config", "build-mini")  # defaults; the stage needs no parent to be shown
    assert rc == 0 and 'stage: str = "build_mini"' in out and "  train.steps: int = 125000\n" in out


def test_config_names_a_wrong_stage_or_preset(capsys):
    rc, _, err = run(capsys, "config", "adpt")
    assert rc == 2 and "unknown stage 'adpt' (did you mean 'adapt'?)" in err
    rc, _, err = run(capsys, "config", "adapt", "--preset", "tiny/minijoint")
    assert rc == 2 and "preset tiny/minijoint is for stage pretrain, not adapt" in err
    rc, _, err = run(capsys, "config", "adapt", "--preset", "tiny/adpt")
    assert rc == 2 and "unknown preset 'tiny/adpt' (did you mean 'tiny/adapt'?)" in err


def test_presets_lists_presets_recipes_and_engine_configs(capsys):
    rc, out, _ = run(capsys, "presets")
    assert rc == 0
    names = {line.split()[0] for line in out.splitlines() if line.startswith("  ")}
    assert set(config.preset_names()) | set(recipe_names()) | set(ds_config.shipped()) <= names
    assert re.search(r"^  tiny/adapt +Step 2 on the generated world", out, re.M)
    assert re.search(r"^  fp32_zero1\.json +fp32, ZeRO stage 1", out, re.M)


@pytest.mark.parametrize("name, path", [
    ("tiny/adapt", "presets/tiny/adapt.yaml"), ("quick", "presets/recipes/quick.yaml"),
    ("fp32_zero1.json", None), ("bf16_zero2", None)])
def test_presets_show_prints_one_verbatim(capsys, name, path):
    rc, out, _ = run(capsys, "presets", "--show", name)
    file = (resources.files("mm_ds") / path) if path else ds_config.find(name.removesuffix(".json") + ".json")
    assert rc == 0 and out == file.read_text()
    if path is None:
        json.loads(out)


def test_did_you_mean_for_every_name_a_user_types(capsys, tmp_path):
    rc, _, err = run(capsys, "pretrian", "--out", "x")
    assert rc == 2 and "unknown command 'pretrian' (did you mean 'pretrain'?)" in err
    rc, _, err = run(capsys, "presets", "--show", "tiny/adpt")
    assert rc == 2 and "(did you mean 'tiny/adapt'?)" in err
    cases = [
        (lambda: config.load("tiny/adpt"), "unknown preset 'tiny/adpt' (did you mean 'tiny/adapt'?); available: "),
        (lambda: config.load("tiny/bl_base", overrides=["system=bl_bse"]),
         "system='bl_bse' is not one of bl_base, bl_small, minijoint, minipost (or a variant such as minijoint@2) "
         "(did you mean 'bl_base'?)"),
        (lambda: config.load("tiny/finetune", overrides=["finetune.task=xnl", "parent=p"]),
         "finetune.task='xnl' is not a task (did you mean 'xnli'?); choose one of xnli, "),
        (lambda: load_recipe("tinyy"), "recipe 'tinyy' is neither a file nor a packaged recipe"),
        (lambda: load_recipe("tinyy"), "(did you mean 'tiny'?)"),
        (lambda: load_recipe("tiny", ["tasks=[xnli, pawx]"]), "unknown task(s) ['pawx'] (did you mean 'pawsx'?)"),
        (lambda: load_recipe("tiny", ["systems=[minijiont]"]),
         "systems: system='minijiont' is not one of bl_base, bl_small, minijoint, minipost (or a variant such as "
         "minijoint@2) (did you mean 'minijoint'?)"),
        (lambda: config.load(None, overrides=["train.stpes=3"]), "did you mean train.steps?"),
        (lambda: load_recipe("tiny", ["seeds=1"]), "seeds: expected a list, got 1 (did you mean seeds=[1]?)"),
        (lambda: load_recipe("tiny", ["tasks=xnli"]), "tasks: expected a list, got 'xnli' (did you mean tasks=[xnli]?)"),
        (lambda: config.load("tiny/adapt", overrides=["train.checkpoint_steps=5"]),
         "train.checkpoint_steps: expected a list, got 5 (did you mean train.checkpoint_steps=[5]?)"),
    ]
    for call, message in cases:
        with pytest.raises(ConfigError) as e:
            call()
        assert message in str(e.value)


def test_a_failed_stage_in_mm_ds_run_is_a_message_not_a_traceback(capsys, tmp_path, monkeypatch):
    def failing_run(recipe, out, list_only=False):
        pipeline._run_logged([sys.executable, "-c", "import sys; print('the stage said why'); sys.exit(3)"],
                             out / "logs" / "stage.log")

    monkeypatch.setattr(pipeline, "run", failing_run)
    rc, _, err = run(capsys, "run", "quick", "--out", str(tmp_path))
    assert rc == 1 and "Traceback" not in err
    assert err.startswith("mm-ds run: error: ") and "failed with exit code 3" in err
    assert "the stage said why" in err and str(tmp_path / "logs" / "stage.log") in err
    rc, _, err = run(capsys, "run", "tinyy", "--out", str(tmp_path))
    assert rc == 2 and "Traceback" not in err and "did you mean 'tiny'?" in err


def test_check_needs_no_free_port_nor_the_parent_and_corpus_yet(capsys, tmp_path):  # --dry-run: the same
    """A Step-2 config checked before Step 1 ends: the checks that read the parent and corpus are skipped and
    named, the engine config is still resolved through DeepSpeed's parser, and the port may be taken."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = ["adapt", "--preset", "tiny/adapt", "--out", str(tmp_path / "adapt"), "system=minijoint",
                f"parent={tmp_path / 'build_mini'}", f"data.corpus={tmp_path / 'data' / 'de'}",
                f"launch.master_port={port}", "monitor.tensorboard=true"]
        rc, out, err = run(capsys, *argv, "--dry-run")
        assert rc == 0, err
        assert f"# --check skipped: (parent={tmp_path / 'build_mini'} and data.corpus={tmp_path / 'data' / 'de'} " \
               f"not there yet) Checks the parent" in out
        assert f"# --check skipped: whether launch.master_port={port} is free" in out
        engine = json.loads(out[out.index("\n{") + 1:out.index("\n}\n") + 2])
        assert engine["tensorboard"] == {"enabled": True, "output_path": str(tmp_path / "adapt" / "logs"),
                                         "job_name": "adapt"}
        rc, _, err = run(capsys, *argv)  # the real start needs the parent
        assert rc == 2 and "does not exist; run the parent stage first" in err
        assert not (tmp_path / "adapt").exists()


def test_check_with_the_inputs_there_runs_every_check(capsys, tmp_path, corpus):
    rc, out, err = run(capsys, "pretrain", "--preset", "tiny/bl_base", "--out", str(tmp_path / "run"),
                       f"data.corpus={corpus}", "--check")
    assert rc == 0, err
    from mm_ds.data.shards import TokenCorpus
    assert "not there yet" not in out
    assert f"  vocab_size: {TokenCorpus(corpus).vocab_size}\n" in out  # preflight ran: the corpus's vocabulary
    rc, _, err = run(capsys, "pretrain", "--preset", "tiny/bl_base", "--out", str(tmp_path / "run"),
                     f"data.corpus={corpus}", "model.vocab_size=99", "--dry-run")
    assert rc == 2 and "model.vocab_size=99 but the tokenizer" in err


def test_an_unwritable_out_stops_a_stage_before_it_reads_any_data(capsys):
    rc, _, err = run(capsys, "pretrain", "--preset", "tiny/bl_base", "--out", "/proc/mm-ds-out",
                     "data.corpus=/nonexistent")  # the corpus check would fail too: the run directory comes first
    assert rc != 0 and "/proc/mm-ds-out cannot be written" in err and "prepared corpus" not in err
