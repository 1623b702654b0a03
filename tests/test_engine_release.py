"""`mm-ds run`'s one job trains every stage in one process: a stage's engine, optimizer and model must not outlive
it (under ZeRO 3, DeepSpeed 0.19.8 keeps the model, and through its hooks the engine, in a module list it never
empties; `engine.release` lets them go)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from fault_harness import TINY_MODEL
from mm_ds.pipeline import jobs
from mm_ds.runtime.distributed.dist import free_port
from mm_ds.stages.resolve import StageRun

ONE_JOB = textwrap.dedent("""
    import gc, json, sys, weakref
    from mm_ds.pipeline import jobs
    from mm_ds.runtime.training import engine

    made, seen, build, train = [], [], engine.build_engine, engine.train

    def recorded(*a, **k):
        built = build(*a, **k)
        made.append([weakref.ref(x) for x in (built.engine, built.engine.optimizer, built.engine.module)])
        return built

    def traced(*a, **k):  # what of the earlier stages is alive when the next one starts
        gc.collect()
        seen.append([[r() is not None for r in refs] for refs in made])
        return train(*a, **k)

    engine.build_engine, engine.train = recorded, traced
    jobs.execute(sys.argv[1])
    gc.collect()
    print("alive", json.dumps(seen + [[[r() is not None for r in refs] for refs in made]]))
""")


@pytest.mark.ranks
def test_a_stage_of_one_job_leaves_nothing_of_its_engine_to_the_next(corpus, tmp_path):
    stages = [jobs.Training(StageRun("pretrain", tmp_path / name, "tiny/bl_base", (
        f"data.corpus={corpus}", *TINY_MODEL, "train.global_batch=8", "train.micro_batch=4", "train.steps=1",
        "train.warmup_steps=0", "train.checkpoint_steps=[]", "ds_config=fp32_zero3.json"))) for name in "ab"]
    jobs.write(tmp_path / "job.json", stages)
    env = os.environ | {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    proc = subprocess.run([sys.executable, "-c", ONE_JOB, str(tmp_path / "job.json")], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    alive = json.loads(proc.stdout.split("alive ", 1)[1].splitlines()[0])
    # [before stage a: nothing] [before stage b: stage a's engine, optimizer, model] [after both]
    assert alive == [[], [[False] * 3], [[False] * 3, [False] * 3]], alive
