"""Many small runs packed onto a launch's devices (mm_ds/pipeline/pack.py, mm_ds/runtime/distributed/jobs.py): each
single-device run gets one device under every launcher's environment, the ranks share one queue of jobs, and Step 4
builds one model per unit and reads each Step-2 checkpoint once for every task. The packed launch itself, with a killed
run resumed alone, is tests/test_pipeline_resume.py's; the one job's, tests/test_pipeline.py's."""

import json
from collections import Counter

import pytest
import torch

from mm_ds.config import ModelConfig, to_dict
from mm_ds.data.tasks import TASKS
from mm_ds.data.world import generate_world
from mm_ds.eval import transfer
from mm_ds.model.heads import RobertaForTask
from mm_ds.pipeline import evaluation, pack
from mm_ds.runtime.checkpointing import checkpoint, sums
from mm_ds.runtime.distributed.jobs import Queue
from test_features import train_spm

DEEPSPEED = {"RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "16", "LOCAL_SIZE": "8", "CROSS_RANK": "0",
             "MASTER_ADDR": "node1", "MASTER_PORT": "29500", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "PATH": "/bin"}
MPIRUN = {"OMPI_COMM_WORLD_RANK": "11", "OMPI_COMM_WORLD_LOCAL_RANK": "3", "OMPI_COMM_WORLD_SIZE": "16",
          "OMPI_COMM_WORLD_LOCAL_SIZE": "8", "PMIX_RANK": "11", "MASTER_PORT": "29500", "PATH": "/bin"}
SRUN = {"SLURM_PROCID": "11", "SLURM_LOCALID": "3", "SLURM_STEP_NUM_TASKS": "16", "SLURM_CPUS_PER_TASK": "12",
        "CUDA_VISIBLE_DEVICES": "5", "RANK": "11", "PATH": "/bin", "SLURM_JOB_ID": "7"}


@pytest.mark.parametrize("env,index,count,device", [
    (DEEPSPEED, 3, 8, "3"),        # deepspeed: the node's 8 GPUs visible, the rank's own is its local rank
    (MPIRUN, 3, 8, "3"),           # mpirun: nothing hidden, the device is the local rank's
    (SRUN, 0, 1, "5"),             # srun --gpus-per-task=1: the task sees its one GPU (physical 5) as index 0
    ({**DEEPSPEED, "CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}, 1, 2, "GPU-bb"),  # by UUID
])
def test_a_packed_run_sees_one_device_and_is_no_rank_of_the_launch(env, index, count, device):
    from mm_ds.runtime.distributed import launch

    child, where = pack.child_env(env, 4242, index, count)
    assert child["CUDA_VISIBLE_DEVICES"] == device and where == f"GPU {device}"
    assert child["MM_DS_LAUNCH_ROOT"] == "4242" and child["PATH"] == "/bin"  # it ends when its rank does
    assert not any(k in child for k in (*launch.RANK_VARS, "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                                        "OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_RANK", "SLURM_PROCID"))
    assert child.get("SLURM_CPUS_PER_TASK") == env.get("SLURM_CPUS_PER_TASK")  # its thread pool's size stays
    cpu, where = pack.child_env(env, 4242, None, 0)
    assert where == "cpu" and cpu.get("CUDA_VISIBLE_DEVICES") == env.get("CUDA_VISIBLE_DEVICES")


def test_cpu_ranks_split_the_node_unless_the_launcher_bound_them():
    cores = list(range(8))
    assert [pack.cpu_share(cores, r, 2, bound=False) for r in (0, 1)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [pack.cpu_share(cores, r, 3, bound=False) for r in (0, 1, 2)] == [[0, 1], [2, 3, 4], [5, 6, 7]]
    assert pack.cpu_share([0, 1], 3, 4, bound=False) == [1] and pack.cpu_share(cores, 1, 2, bound=True) == cores


def test_a_queue_hands_out_each_job_once_and_stops():
    q = Queue("t", 3)
    assert [q.claim() for _ in range(4)] == [0, 1, 2, None]
    q = Queue("t", 3)
    assert q.claim() == 0 and (q.stop() or q.claim()) is None
    q.drain()  # a world of one: nobody to wait for


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Finetuned models (2 tasks x 2 seeds) of one primary model and a Step-2 run of t1 for it, tiny."""
    root = tmp_path_factory.mktemp("step4")
    generate_world(root / "world", languages=("t1",), sentences=300, target_sentences=300,
                   task_sizes=dict(nli_train=5, paws_train=5, qa_train=5, dev=5, test=8))
    toks = {}
    for lang, vocab in (("en", 600), ("t1", 550)):
        lines = [line for line in (root / "world" / "text" / f"{lang}.txt").read_text().splitlines() if line]
        toks[lang] = root / f"{lang}.model"
        toks[lang].write_bytes(train_spm(lines, vocab).serialized_model_proto())
    sizes = {lang: transfer._tokenizer(str(t)).get_piece_size() for lang, t in toks.items()}
    cfg = ModelConfig(vocab_size=sizes["en"], hidden_size=16, num_layers=1, num_heads=2, ffn_size=32,
                      max_positions=64)
    runs = {}
    for task in ("xnli", "pawsx"):
        spec = TASKS[task]
        for seed in (1, 2):
            torch.manual_seed(seed)
            runs[task, seed] = root / "finetune" / task / f"seed{seed}"
            checkpoint.write_final(runs[task, seed] / "final", RobertaForTask(cfg, spec.task_type, spec.num_labels)
                                   .state_dict(), {"stage": "finetune", "system": "bl_base", "task": task,
                                                   "kind": spec.task_type, "num_labels": spec.num_labels,
                                                   "model": to_dict(cfg), "tokenizer": str(toks["en"])})
    group = {"embed.tokens.weight": torch.randn(sizes["t1"], 16), "head.bias": torch.zeros(sizes["t1"])}
    checkpoint.write_final(root / "adapt" / "final", group, {"stage": "adapt", "system": "bl_base", "lang": "t1",
                                                             "step": 7, "flops": 1e9, "tokenizer": str(toks["t1"])})
    return root, runs


def test_step4_builds_one_model_per_unit_and_reads_a_step2_checkpoint_once_for_every_task(models, monkeypatch):
    """Two tasks' units swap in one Step-2 checkpoint, each scored by 2 seeds: one job of the queue. The model is
    made once per unit (on the meta device: no random initialisation), each seed's weights loaded into it; the
    checkpoint is loaded and hashed once for both tasks."""
    root, runs = models
    built, loaded, hashed = [], Counter(), Counter()

    class Counted(RobertaForTask):
        def __init__(self, *args, **kwargs):
            built.append(torch.empty(0).device.type)  # where its parameters would be made
            super().__init__(*args, **kwargs)

    load_final, sha256 = checkpoint.load_final, sums.sha256
    monkeypatch.setattr(transfer, "RobertaForTask", Counted)
    monkeypatch.setattr(checkpoint, "load_final", lambda p: loaded.update([str(p)]) or load_final(p))
    monkeypatch.setattr(sums, "sha256", lambda p, rank=0: hashed.update([str(p)]) or sha256(p, rank))
    units = [u for task in ("xnli", "pawsx") for u in transfer.units_for(
        task, "t1", ["bl_base"], [str(runs[task, s]) for s in (1, 2)], "test", str(root / "adapt"), limit=6)]
    assert evaluation.eval_jobs(units) == [[0, 1]]
    evaluation.run_units(units, str(root / "world"), root / "eval", say=lambda m: None)
    assert built == ["meta", "meta"]  # one model per unit, not one per seed
    assert loaded[str(root / "adapt")] == 1 and hashed[str(root / "adapt" / "final" / "model.safetensors")] == 1
    rows = evaluation.collect(units, str(root / "world"), root / "eval")
    assert [(r["task"], r["step"], len(r["per_seed"])) for r in rows] == [("xnli", 7, 2), ("pawsx", 7, 2)]
    assert json.loads((root / "eval" / f"{units[0].name}.json").read_text())["rows"] == rows[:1]


def test_a_stage_start_hashes_its_parent_once(models, tmp_path, monkeypatch):
    """The launching side resolves a finetuning (`resolve.resolve`: its checks load the parent) and hashes the
    parent's weights; a rank started from the run directory (a new process: nothing checked yet) takes the record's
    verdict and builds (loading the parent again) without reading the sums; in one process (launcher none) the
    resolve and the build read them once."""
    from mm_ds.model.model import RobertaMLM
    from mm_ds.runtime.distributed.dist import free_port
    from mm_ds.runtime.training import resolved
    from mm_ds.stages import command, finetune
    from mm_ds.stages.resolve import resolve

    root, runs = models
    meta = checkpoint.read_meta(runs["xnli", 1] / "final")
    cfg = ModelConfig(**{**meta["model"], "secondary_head_layer": None})
    parent = tmp_path / "pretrain"
    checkpoint.write_final(parent / "final", RobertaMLM(cfg).state_dict(),
                           {"stage": "pretrain", "system": "bl_base", "model": to_dict(cfg),
                            "tokenizer": meta["tokenizer"]})
    hashed, sha256 = Counter(), sums.sha256
    monkeypatch.setattr(sums, "sha256", lambda p, rank=0: hashed.update([str(p)]) or sha256(p, rank))
    argv = ["--preset", "tiny/finetune", f"parent={parent}", "finetune.task=xnli",
            f"finetune.data_root={root / 'world'}", "launch.ranks=1"]
    weights = str(parent / "final" / "model.safetensors")
    launched = tmp_path / "ft"
    resolve(command.parse("finetune", [*argv, "--out", str(launched), "launch.launcher=deepspeed",
                                      f"launch.master_port={free_port()}"])[1])
    assert hashed[weights] == 1  # the launching side
    monkeypatch.setattr(sums, "_checked", {})  # a rank: a process of its own
    got = resolved.read(launched)
    finetune.build(got.cfg)
    assert hashed[weights] == 1 and got.inputs == ((parent / "final").resolve(),)
    monkeypatch.setattr(sums, "_checked", {})
    got = resolve(command.parse("finetune", [*argv, "--out", str(tmp_path / "here"), "launch.launcher=none"])[1])
    finetune.build(got.cfg)
    assert hashed[weights] == 2
