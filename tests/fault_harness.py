"""The fault harness: kill tiny runs of each stage kind at seeded random points (mm_ds/runtime/faults.py's fault
points), check the run directory after each crash (`latest` names a checkpoint that verifies, the newest
complete checkpoint loads, half-written ones are never published, no orphan rank or held port is left),
resume with the same command, and require final weights bitwise equal to an uninterrupted run with the
same seed (CPU, fp32):

    python tests/fault_harness.py --full     # every stage kind x every fault kind, 2 ranks (~15 min, 2 cores)
    python tests/fault_harness.py            # the CI subset (also run by tests/test_faults.py)
    python tests/fault_harness.py --stops 10 # 10 seeded graceful stops of a 2-rank run: the updates each lost
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

from mm_ds.data.corpus import prepare
from mm_ds.data.world import generate_world
from mm_ds.runtime.checkpointing import checkpoint as ck
from mm_ds.runtime.distributed import dist
from mm_ds.runtime.distributed.dist import free_port
from mm_ds.runtime.faults import SAVE_PHASES

STAGE_KINDS = ("pretrain", "build_mini", "adapt", "finetune")
FAULT_KINDS = ("rank", "launcher", "save")


@dataclass(frozen=True)
class Fault:
    kind: str
    """rank | launcher | save"""
    step: int
    rank: int = 0
    phase: str = ""

    def env(self) -> dict[str, str]:
        if self.kind == "rank":
            return {"MM_DS_KILL_AT": f"{self.step}:{self.rank}"}
        if self.kind == "launcher":
            return {"MM_DS_KILL_AT": f"{self.step}:launcher"}
        return {"MM_DS_KILL_IN_SAVE": f"{self.step}:{self.rank}:{self.phase}"}

    def __str__(self) -> str:
        if self.kind == "save":
            return f"kill rank {self.rank} in save of step {self.step} ({self.phase})"
        return f"kill {'the launcher' if self.kind == 'launcher' else f'rank {self.rank}'} after step {self.step}"


STEPS = 12
CHECKPOINT_EVERY = 4
TINY_MODEL = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.ffn_size=64",
              "data.seq_len=32", "model.max_positions=32", "model.secondary_head_layer=null"]
TINY_TRAIN = ["train.global_batch=16", "train.micro_batch=4", "train.warmup_steps=4", "train.log_every=5",
              "train.checkpoint_steps=[]", f"train.checkpoint_every={CHECKPOINT_EVERY}", "peak_tflops=1"]


def random_faults(rng: random.Random, ranks: int, kinds=FAULT_KINDS, n: int = 2) -> list[Fault]:
    """`n` faults at increasing steps (each fires in the run resumed after the one before)."""
    ckpt_steps = list(range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY))
    faults, lo = [], 1
    for _ in range(n):
        kind = rng.choice(kinds)
        if kind == "launcher" and ranks == 1:
            kind = "rank"
        if kind == "save":
            cand = [s for s in ckpt_steps if s >= lo]
            if not cand:
                break
            phase = rng.choice(SAVE_PHASES)
            rank = rng.randrange(ranks) if phase == SAVE_PHASES[0] else 0
            f = Fault("save", rng.choice(cand[:2]), rank, phase)
        else:
            if lo > STEPS:
                break
            f = Fault(kind, rng.randint(lo, min(STEPS, lo + 6)), rng.randrange(ranks) if kind == "rank" else 0)
        faults.append(f)
        lo = f.step + 1
    return faults


@dataclass
class Workspace:
    """Tiny data and a pretrained parent, shared by every scenario of one sweep."""

    root: Path
    ranks: int = 2
    port: int = 0
    """The master port of the last launch (a free one is picked for each)."""
    log: list[str] = field(default_factory=list)
    extra: tuple[str, ...] = ()
    """Overrides every run of the sweep gets (e.g. train.compile=true: tests/test_compile.py)."""

    def _say(self, msg: str) -> None:
        self.log.append(msg)
        print(f"[faults] {msg}", flush=True)

    def next_port(self) -> int:
        """A port no other process holds now (the suite may run tests side by side)."""
        self.port = free_port()
        return self.port

    def setup(self) -> None:
        w = self.root / "world"
        if not (w / "world.json").is_file():
            generate_world(w, languages=("t1",), sentences=3000, target_sentences=1500,
                           task_sizes=dict(nli_train=200, paws_train=10, qa_train=10, dev=10, test=10))
        for lang in ("en", "t1"):
            prepare(lang, [str(w / "text" / f"{lang}.txt")], str(self.root / "data" / lang), vocab_size=200,
                    model_type="bpe", workers=1, progress=False)
        # The uninterrupted pretraining run is both the reference of the pretraining cases and the parent
        # of the later stages. References are rebuilt on every sweep: code may have changed since.
        shutil.rmtree(self.root / "reference", ignore_errors=True)
        shutil.rmtree(self.root / "cases", ignore_errors=True)
        self.run(self.argv("pretrain"), self.reference("pretrain"))

    def reference(self, kind: str) -> Path:
        return self.root / "reference" / f"{kind}_r{self.ranks}"

    def launch(self, ranks: int) -> list[str]:
        if ranks == 1:
            return ["launch.launcher=none", "launch.ranks=1"]
        return [f"launch.ranks={ranks}", f"launch.master_port={self.next_port()}"]

    def argv(self, kind: str) -> list[str]:
        data, parent = self.root / "data", self.root / "reference" / "pretrain_r2"
        common = [*TINY_TRAIN, f"train.steps={STEPS}", *self.extra]
        if kind == "pretrain":
            return ["pretrain", "--preset", "tiny/bl_base", f"data.corpus={data / 'en'}", *TINY_MODEL, *common,
                    "train.lr=3e-3"]
        if kind == "build_mini":
            return ["build-mini", "--preset", "tiny/build_mini", "system=minipost", f"parent={parent}",
                    f"data.corpus={data / 'en'}", "data.seq_len=32", "mini.layers=1", "mini.new_layers=1", *common]
        if kind == "adapt":
            return ["adapt", "--preset", "tiny/adapt", "system=bl_base", "lang=t1", f"parent={parent}",
                    f"data.corpus={data / 't1'}", "data.seq_len=32", *common]
        if kind == "finetune":  # 96 examples x 2 epochs / 16 per update = STEPS updates
            return ["finetune", "--preset", "tiny/finetune", "system=bl_base", f"parent={parent}",
                    "finetune.task=xnli", f"finetune.data_root={self.root / 'world'}", "finetune.max_length=32",
                    "finetune.max_train_examples=96", "finetune.epochs=2", *common]
        raise ValueError(f"unknown stage kind {kind!r}; choose from {', '.join(STAGE_KINDS)}")

    def run(self, argv: list[str], out: Path, *, ranks: int | None = None, env: dict | None = None,
            resume: bool = False, check: bool = True) -> subprocess.CompletedProcess:
        ranks = ranks or self.ranks
        cmd = [sys.executable, "-m", "mm_ds.cli", *argv[:1], "--out", str(out), "--no-progress", *argv[1:],
               *self.launch(ranks), *(["--resume"] if resume else [])]
        t0 = time.perf_counter()
        self.last_port = self.port
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)}\nexit {proc.returncode}\n{proc.stdout[-3000:]}\n"
                                 f"{proc.stderr[-3000:]}")
        self._say(f"{argv[0]} -> {out.name}{' --resume' if resume else ''}{' ' + str(env) if env else ''}: "
                  f"exit {proc.returncode} in {time.perf_counter() - t0:.1f} s")
        return proc


# ---------------------------------------------------------------- invariants

def check_crashed_run(run: Path) -> list[str]:
    """What must hold in a run directory after any crash. Returns the problems found (empty: fine)."""
    problems = []
    root = ck.checkpoints_dir(run)
    tag = ck.latest_tag(run)
    if (root / ck.LATEST).is_file():
        named = (root / ck.LATEST).read_text().strip()
        if named.endswith(".tmp"):
            problems.append(f"latest names a temporary checkpoint {named}")
        elif tag is None:
            problems.append(f"latest names {named}, which has no manifest")
        else:
            try:
                ck.verify(root / tag)
            except ck.CheckpointError as e:
                problems.append(f"latest names a checkpoint that fails verification: {e}")
    published = [p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp")] if root.is_dir() else []
    complete = ck.list_checkpoints(run)
    for p in published:
        if p not in complete:
            problems.append(f"{p} was published without a manifest")
    newest = ck.find_resume_point(run)
    if complete and newest != complete[-1]:
        problems.append(f"newest complete checkpoint {complete[-1]} does not verify")
    if newest is not None:
        try:
            ck.consolidate(newest)
        except Exception as e:  # noqa: BLE001  any failure to load is the finding
            problems.append(f"newest complete checkpoint {newest} does not load: {type(e).__name__}: {e}")
    return problems


def leftovers(run: Path, port: int | None, wait_s: float = 10.0) -> list[str]:
    """Processes still working on `run` (orphan ranks), and whether `port` is still held, after a kill."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = []
        for d in os.listdir("/proc") if os.path.isdir("/proc") else []:
            if d.isdigit() and int(d) != os.getpid():
                try:
                    with open(f"/proc/{d}/cmdline", "rb") as f:
                        cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                    with open(f"/proc/{d}/stat") as f:
                        zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
                except OSError:
                    continue
                if str(run) in cmd and not zombie:
                    alive.append(f"pid {d}: {cmd[:100]}")
        held = False
        if port:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    held = True
        if not alive and not held or time.monotonic() > deadline:
            return alive + ([f"port {port} is still held"] if held else [])
        time.sleep(0.5)


def same_weights(a: Path, b: Path) -> list[str]:
    """Keys whose final weights differ (bitwise) between two finished runs."""
    x, y = load_file(str(a / "final" / "model.safetensors")), load_file(str(b / "final" / "model.safetensors"))
    if x.keys() != y.keys():
        return sorted(set(x) ^ set(y))
    return [k for k in x if not torch.equal(x[k], y[k])]


def run_case(ws: Workspace, kind: str, faults: list[Fault], reference: Path, name: str) -> dict:
    """Apply `faults` one after another to one run (resuming between them), then finish and compare."""
    out = ws.root / "cases" / name
    argv = ws.argv(kind)
    report = {"case": name, "stage": kind, "faults": [str(f) for f in faults], "problems": []}
    for f in faults:
        resume = bool(out.exists())
        proc = ws.run(argv, out, env=f.env(), resume=resume, check=False)
        if proc.returncode == 0:
            report["problems"].append(f"{f}: the run finished instead of dying")
        left = leftovers(out, ws.last_port if ws.ranks > 1 else None)
        report["problems"] += [f"after '{f}': orphan {p}" for p in left]
        report["problems"] += [f"after '{f}': {p}" for p in check_crashed_run(out)]
        if f.kind == "save" and (out / "checkpoints" / f"step_{f.step:08d}.tmp").exists():
            report["half_written_left"] = True  # reported by resume, removed by the next save
    proc = ws.run(argv, out, resume=True, check=False)
    if proc.returncode != 0:
        report["problems"].append(f"resume failed (exit {proc.returncode}): {proc.stderr[-1500:]}")
    else:
        diff = same_weights(reference, out)
        if diff:
            report["problems"].append(f"resumed weights differ from the uninterrupted run: {diff[:5]}")
        if (out / "checkpoints").is_dir() and list((out / "checkpoints").glob("*.tmp")):
            report["problems"].append("a half-written checkpoint was left after the run finished")
    report["ok"] = not report["problems"]
    return report


def sweep(root: Path, full: bool, seed: int = 0, ranks: int | None = None,
          kinds: tuple[str, ...] = STAGE_KINDS, extra: tuple[str, ...] = ()) -> list[dict]:
    """Full: every stage kind x every fault kind (plus each save phase once), 2 ranks. Subset: one seeded
    chain of two faults per stage kind; pretraining on 2 ranks, the other stages on 1. `extra`: overrides of
    every run."""
    rng = random.Random(seed)
    ws = Workspace(root, ranks=2, extra=extra)
    ws.setup()
    reports = []
    for kind in kinds:
        k_ranks = ranks or (2 if full or kind == "pretrain" else 1)
        ws.ranks = k_ranks
        ref = ws.reference(kind)
        if not (ref / "final").is_dir():
            ws.run(ws.argv(kind), ref)
        if full:
            chains = [[Fault("rank", rng.randint(1, STEPS), rng.randrange(k_ranks))],
                      [Fault("launcher", rng.randint(1, STEPS))]]
            chains += [[Fault("save", rng.choice(range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY)),
                              rng.randrange(k_ranks) if p == SAVE_PHASES[0] else 0, p)] for p in SAVE_PHASES]
            chains.append(random_faults(rng, k_ranks, n=3))
        elif kind == "pretrain" and k_ranks > 1:  # a save interrupted, then the launcher, at random points
            save = random_faults(rng, k_ranks, kinds=("save",), n=1)[0]
            chains = [[save, Fault("launcher", rng.randint(save.step + 1, STEPS))]]
        else:
            chains = [random_faults(rng, k_ranks, n=1)]
        for i, chain in enumerate(chains):
            r = run_case(ws, kind, chain, ref, f"{kind}_r{k_ranks}_{i}")
            print(f"[faults] {'ok  ' if r['ok'] else 'FAIL'} {kind}: {'; '.join(r['faults'])}"
                  + ("" if r["ok"] else "\n    " + "\n    ".join(r["problems"])), flush=True)
            reports.append(r)
    return reports


# ---------------------------------------------------------------- stops at random times

def _newest_update(run: Path) -> int:
    path = run / "logs" / "train.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return max((json.loads(line)["step"] for line in lines if line.strip()), default=0)


def stop_once(ws: Workspace, out: Path, rng: random.Random, slow: float = 0.2) -> dict:
    """One 2-rank pretraining run, SIGTERM to `mm-ds` (which passes it to the launcher) at a random time of its
    updates (each held `slow` s), then resumed to the end and compared bitwise with the uninterrupted run."""
    argv = ws.argv("pretrain") + ["train.log_every=1"]
    cmd = [sys.executable, "-m", "mm_ds.cli", argv[0], "--out", str(out), "--no-progress", *argv[1:],
           *ws.launch(2)]
    log = out.with_suffix(".log")
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=os.environ | {"MM_DS_SLOW": str(slow)})
    target = rng.randint(1, STEPS - 3)
    while _newest_update(out) < target and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(rng.uniform(0, slow))
    newest, sent = _newest_update(out), time.monotonic()
    proc.send_signal(15)
    rc, took = proc.wait(), time.monotonic() - sent
    line = next((x for x in log.read_text().splitlines() if x.startswith("[mm-ds] stopped by")), "")
    at = int(line.split(" at update ")[1].split(" ")[0]) if line else None
    seen = int(line.split("(seen in update ")[1].split(")")[0]) if "(seen in update " in line else None
    resumed_at = int(ck.find_resume_point(out).name.split("_")[1]) if ck.find_resume_point(out) else 0
    report = {"signal_after_update": newest, "seen_in_update": seen, "stopped_at": at, "resume_point": resumed_at,
              "lost_updates": max(0, newest - resumed_at), "exit": rc, "seconds_to_exit": round(took, 1)}
    finished = ws.run(ws.argv("pretrain"), out, resume=True, check=False)
    report["resumed_bitwise"] = finished.returncode == 0 and not same_weights(ws.reference("pretrain"), out)
    report["ok"] = (rc == 75 and at == resumed_at and seen is not None and at - seen in (0, 1)
                    and report["resumed_bitwise"])
    return report


def stop_sweep(root: Path, n: int, seed: int = 0) -> list[dict]:
    """`n` seeded stops (`stop_once`), printed one a line: the updates each lost (the ones done before the signal
    that its resume point lacks)."""
    ws = Workspace(root, ranks=2)
    ws.setup()
    reports = []
    for i in range(n):
        (root / "stops").mkdir(exist_ok=True)
        r = stop_once(ws, root / "stops" / f"stop{i}", random.Random(seed * 1000 + i))
        print(f"[stops] {'ok  ' if r['ok'] else 'FAIL'} {i}: signal after update {r['signal_after_update']}, seen in "
              f"{r['seen_in_update']}, stopped and saved at {r['stopped_at']} (resume point {r['resume_point']}), "
              f"lost {r['lost_updates']} update(s), exit {r['exit']} {r['seconds_to_exit']} s after the signal, "
              f"resumed bitwise: {r['resumed_bitwise']}", flush=True)
        reports.append(r)
    return reports


# ---------------------------------------------------------------- rank-0 work that fails

def _tiny_stage(corpus: Path, steps: int):
    from mm_ds import config
    from mm_ds.stages import pretrain

    cfg = config.load("tiny/bl_base", overrides=[f"data.corpus={corpus}", *TINY_MODEL, "train.global_batch=8",
                                                 "train.micro_batch=4", "train.warmup_steps=0", "train.steps=1",
                                                 "train.checkpoint_steps=[]", "train.log_every=1", "peak_tflops=1",
                                                 "ds_config=fp32_zero1.json"])  # ZeRO 1: a universal checkpoint
    stage = pretrain.build(cfg)
    stage.cfg.train.steps = steps  # 0: a stage of no updates (MINIJOINT's extraction)
    return stage


def _rank0_points(root: Path, corpus: Path) -> dict:
    """point -> (what rank 0 finds in its way, the collective call that meets it). Each point's run directory
    is root/<point>; the universal conversion reads the checkpoint the final weights' run left."""
    from mm_ds.pipeline import evaluation as step4
    from mm_ds.pipeline import items, jobs
    from mm_ds.runtime.checkpointing import resharding as universal
    from mm_ds.runtime.training import engine
    from mm_ds.stages.resolve import StageRun

    def build(run: Path, frozen: bool = False):
        stage = _tiny_stage(corpus, 1)
        if frozen:
            stage.trainable = lambda name: not name.startswith("layers.0.")
        return engine.build_engine(stage, 2, run)

    def job(run: Path):  # `mm-ds run`'s one job asks rank 0 whether a stage is complete; its read fails
        def unreadable(run_dir):
            raise OSError(5, "Input/output error", str(run_dir / "final"))
        jobs.complete = unreadable
        jobs.write(run / "job.json", [jobs.Training(StageRun("pretrain", run / "stage"))])
        return jobs.execute(run / "job.json")

    def resume(run: Path):  # rank 0 looks for the checkpoint to resume from; its read fails
        def unreadable(run_dir):
            raise OSError(5, "Input/output error", str(ck.checkpoints_dir(run_dir)))
        found, ck.find_resume_point = ck.find_resume_point, unreadable
        try:
            return engine.build_engine(_tiny_stage(corpus, 1), 2, run, resume=True)
        finally:
            ck.find_resume_point = found

    def evaluation(run: Path):  # rank 0 lists the units (into OUT/logs/, here a file)
        from mm_ds.pipeline.recipe import load_recipe
        return step4.run_evaluation(items.evaluation(load_recipe("tiny", ["curve=false"]), run))

    final_run = root / "final weights"
    step1 = ck.checkpoints_dir(final_run) / ck.tag_for(1)
    return {
        "run files": (lambda run: (run / "ds_config.json").mkdir(parents=True), build),
        "frozen weights": (lambda run: (run / "frozen.tmp").touch(), lambda run: build(run, frozen=True)),
        "resume point": (lambda run: None, resume),
        "checkpoint directory": (lambda run: (run / "checkpoints").touch(),
                                 lambda run: engine.train(_tiny_stage(corpus, 1), run, progress=False)),
        # rank 0's writer thread meets it at update 1's row, which no rank waits for; every rank stops at the next
        # checkpoint (update 2's), where rank 0 raises the writer's error
        "training log": (lambda run: (run / "logs" / "train.jsonl").mkdir(parents=True),
                         lambda run: engine.train(_tiny_stage(corpus, 2), run, progress=False)),
        "final weights": (lambda run: (run / "final.tmp").touch(),
                          lambda run: engine.train(_tiny_stage(corpus, 1), run, progress=False)),
        "universal conversion": (lambda run: step1.with_name(step1.name + universal.SUFFIX + ".tmp").touch(),
                                 lambda run: universal.prepare(step1, 2, {}, dist.rank(), force=True)),
        "model as built": (lambda run: (run / "final.tmp").touch(),
                           lambda run: engine.train(_tiny_stage(corpus, 0), run, progress=False)),
        "evaluation units": (lambda run: (run / "logs").touch(), evaluation),
        "one job's stage state": (lambda run: None, job),
        "one job's stage list": (lambda run: (run / "job.json").mkdir(),
                                 lambda run: jobs.execute(run / "job.json")),
    }


def rank0_failures(root: Path, corpus: Path) -> None:
    """Run by every rank of a 2-rank world: at each point where rank 0 works alone while the others wait, rank
    0 meets a real obstacle (a file where a directory must go, or the reverse; an injected read error for the
    resume point and the one-job state). Writes root/rank<R>.json after each point: {point: [exception type, message, seconds]}.
    A rank left waiting for rank 0 (a plain barrier after its work) never writes that point."""
    rank, _, _ = dist.init()
    seen = {}
    for name, (obstacle, call) in _rank0_points(root, corpus).items():
        run = root / name
        if rank == 0:
            run.mkdir(parents=True, exist_ok=True)
            obstacle(run)
        dist.barrier()  # the harness's own: the obstacle is in place before either rank starts
        t0 = time.perf_counter()
        try:
            call(run)
            seen[name] = ["none", "", 0.0]
        except Exception as e:  # noqa: BLE001  what each rank raised is the finding
            seen[name] = [type(e).__name__, str(e), 0.0]
        seen[name][2] = round(time.perf_counter() - t0, 1)
        (root / f"rank{rank}.json").write_text(json.dumps(seen, indent=1))
    dist.finish(0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tests/fault_harness.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--full", action="store_true", help="the full sweep (default: the CI subset)")
    p.add_argument("--rank0-failures", metavar="CORPUS", help="(each rank of a 2-rank world) fail rank 0's "
                   "own work at each point, recording what every rank raised under --out")
    p.add_argument("--out", default="fault-sweep", help="working directory (reused: data and references)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random fault points")
    p.add_argument("--ranks", type=int, help="ranks for every stage (default: 2; the subset runs 1 after Step 1)")
    p.add_argument("--stages", default=",".join(STAGE_KINDS), help="comma-separated stage kinds")
    p.add_argument("--stops", type=int, metavar="N", help="instead: N seeded stops (SIGTERM at a random time) of a "
                   "2-rank pretraining run, each resumed and compared bitwise; prints the updates each lost")
    a = p.parse_args(argv)
    if a.rank0_failures:
        rank0_failures(Path(a.out).resolve(), Path(a.rank0_failures))
        return 0
    if a.stops:
        reports = stop_sweep(Path(a.out).resolve(), a.stops, a.seed)
        (Path(a.out) / "stops.json").write_text(json.dumps(reports, indent=1))
        return 0 if all(r["ok"] for r in reports) else 1
    t0 = time.perf_counter()
    reports = sweep(Path(a.out).resolve(), a.full, a.seed, a.ranks, tuple(a.stages.split(",")))
    (Path(a.out) / "report.json").write_text(json.dumps(reports, indent=1))
    bad = [r for r in reports if not r["ok"]]
    print(f"[faults] {len(reports) - len(bad)}/{len(reports)} cases ok in {time.perf_counter() - t0:.0f} s; "
          f"report in {Path(a.out) / 'report.json'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
