"""A stage run is resolved once, where its launch starts, and every rank starts from its run directory alone
(mm_ds/stages/resolve.py, mm_ds/runtime/training/resolved.py, mm_ds/rank.py): the record's sums, a rank given only RUN
that trains the stage, and nothing on a rank's path that parses a command line or reads a validation variable."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mm_ds.config import ConfigError
from mm_ds.runtime.checkpointing import checkpoint
from mm_ds.runtime.distributed import launch
from mm_ds.runtime.distributed.dist import free_port
from mm_ds.runtime.training import resolved
from mm_ds.stages.resolve import StageRun, resolve
from support import call_walk
from support.import_walk import graph, layout, rank_starts, walk
from test_launchers import TINY

ROOT = Path(__file__).resolve().parents[1]


def _run(corpus: Path, out: Path, *extra: str) -> StageRun:
    return StageRun("pretrain", out, "tiny/minijoint", (f"data.corpus={corpus}", *TINY, "train.steps=6",
                                                        "launch.ranks=2", f"launch.master_port={free_port()}", *extra))


def test_the_record_holds_the_resolution_and_refuses_a_changed_file(corpus, tmp_path):
    out = tmp_path / "run"
    got = resolve(_run(corpus, out), resume_with="mm-ds pretrain ... --resume")
    back = resolved.read(out)
    assert back.cfg == got.cfg and back.ds_cfg == got.ds_cfg and back.geo == got.geo and back.world_size == 2
    assert back.resume_with == "mm-ds pretrain ... --resume" and back.resume_from is None
    assert (out / checkpoint.RUN_CONFIG).is_file() and json.loads((out / checkpoint.DS_CONFIG).read_text()) == got.ds_cfg
    (out / checkpoint.RUN_CONFIG).write_text((out / checkpoint.RUN_CONFIG).read_text().replace("lr: 0.003", "lr: 1"))
    with pytest.raises(ConfigError, match=r"run_config.yaml changed since the run was resolved; run the stage command"):
        resolved.read(out)
    record = json.loads((out / checkpoint.RESOLVED).read_text()) | {"world_size": 4}
    (out / checkpoint.RESOLVED).write_text(json.dumps(record))
    with pytest.raises(ConfigError, match="not a record mm-ds wrote, or was changed since"):
        resolved.read(out)
    with pytest.raises(ConfigError, match="cannot be read"):
        resolved.read(tmp_path / "never")


@pytest.mark.ranks
def test_a_rank_given_only_the_run_directory_trains_the_stage(corpus, tmp_path):
    """Resolved here; then the launcher's command on RUN alone, in an environment with no mm-ds variable: both
    ranks read the record and train the stage to final/."""
    out = tmp_path / "run"
    got = resolve(_run(corpus, out))
    cmd = launch.rank_command(got.cfg.launch, got.run_dir)
    assert cmd[-2:] == [launch.ENTRY, str(out.resolve())], cmd
    env = {k: v for k, v in os.environ.items() if not k.startswith("MM_DS_")} | {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    meta = checkpoint.read_meta(out / checkpoint.FINAL)
    assert meta["step"] == 6 and meta["world_size"] == 2 and "world=2" in proc.stdout


def test_nothing_on_a_stage_rank_parses_a_command_line_or_reads_a_validation_variable():
    """Every module a stage's rank enters (tests/support/import_walk.py: mm_ds/rank.py's stage_rank and what it
    imports): no argparse and no sys.argv outside a `main` run as a script, and no environment read of a variable that
    says what the launching side checked."""
    L = layout(ROOT)
    g = graph(L)
    g["mm_ds.rank"] = set()
    seen, _ = walk(g, rank_starts(L, graph(L), "stage"))
    found = []
    for module in sorted(seen):
        path = L.PACKAGE.parent / (module.replace(".", "/") + ".py")
        path = path if path.is_file() else path.with_suffix("") / "__init__.py"
        for fn in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)):
            text = ast.unparse(fn)
            if fn.name != "main" and ("sys.argv" in text or "argparse" in text or "parse_args" in text):
                found.append(f"{module}.{fn.name} parses a command line")
            if "VALIDATED" in text or "validated_here" in text:
                found.append(f"{module}.{fn.name} reads a validation variable")
    assert not found, found
    assert "mm_ds.stages.runner" in seen and "mm_ds.stages.command" not in seen and "mm_ds.cli" not in seen


@pytest.mark.ranks
def test_a_recipes_walk_to_a_rank_is_a_handful_of_files_and_the_rank_reenters_no_orchestration():
    """tests/support/call_walk.py on `mm-ds run tiny`: the stacks where the launching side starts the ranks, where a
    rank builds its stage and where it first runs the model. A rank enters no module of the launching side's but
    the exit-code wrapper every process shares (before, a rank went through the CLI and `mm-ds run`'s module)."""
    stacks = call_walk.record(ROOT)
    rank_files = {f for point in ("stage", "forward") for f, _ in stacks[point]}
    assert call_walk.shared(stacks) == ["mm_ds/runtime/exits.py"], stacks
    assert {"mm_ds/rank.py", "mm_ds/stages/runner.py", "mm_ds/runtime/training/engine.py"} <= rank_files, stacks
    assert not {"mm_ds/cli.py", "mm_ds/pipeline/run.py", "mm_ds/pipeline/recipe.py"} & rank_files, stacks
    assert len(call_walk.walk(stacks)) <= 12, call_walk.walk(stacks)


def test_what_a_stage_inherits_is_checked_by_one_function_from_a_checkpoint_and_from_configs(tmp_path):
    """build_mini.inherit: the stage's preflight asks it of the parent's checkpoint (common.load_parent), `mm-ds run
    --check` of the parent stage's config (check._inherited): one message either way."""
    from mm_ds.config import ModelConfig, to_dict
    from mm_ds.model.model import RobertaMLM
    from mm_ds.pipeline.check import check
    from mm_ds.pipeline.recipe import load_recipe
    from mm_ds.stages import build_mini

    why = "has no secondary head; MINIJOINT's mini-model is cut from a model pretrained with model.secondary_head_layer"
    recipe = load_recipe("tiny", ["systems=[bl_base,minijoint]", "seeds=[1]", "tasks=[xnli]", "langs=[t1]",
                                  "overrides.pretrain/minijoint=['model.secondary_head_layer=null']"])
    found = check(recipe, tmp_path / "plan", strict=False)
    assert any(why in str(p) for p in found.problems), found.format()
    model = ModelConfig(vocab_size=40, hidden_size=8, num_layers=2, num_heads=2, ffn_size=16, max_positions=32)
    parent = tmp_path / "pretrain"
    checkpoint.write_final(parent / "final", RobertaMLM(model).state_dict(),
                           {"stage": "pretrain", "system": "minijoint", "model": to_dict(model)})
    run = StageRun("build_mini", tmp_path / "mini", "tiny/build_mini", ("system=minijoint", f"parent={parent}",
                                                                          "launch.launcher=none"))
    with pytest.raises(ConfigError, match=f"parent={parent} {why}"):
        resolve(run)
    calls = []
    real = build_mini.inherit
    build_mini.inherit = lambda cfg, p: calls.append(p) or real(cfg, p)
    try:
        with pytest.raises(ConfigError):
            resolve(run)
    finally:
        build_mini.inherit = real
    assert [(p.stage, p.model.num_layers) for p in calls] == [("pretrain", 2)]
