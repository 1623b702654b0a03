"""`mm-ds plan`'s budget: the recipe's wall time, GPU-hours and USD with start-ups, the jobs it takes under a time
limit, how those move with MFU and with side-by-side runs, and the data preparation before the allocation.

Submissions (`--time-limit`): `mm-ds run` is submitted again until the recipe is done; each submission skips what
finished and resumes the stage run it was in from that run's newest checkpoint. A job pays `JOB_START_S` (`mm-ds
run`'s own start and check), then every launch `--startup-s`; when the limit stops a launch, the work since its last
resumable checkpoint is lost (plan_totals.resume_interval; a job that cannot hold one interval after its start-ups
is refused). Side by side (`--spread`), the groups share each job's limit. The jobs are counted by walking the
launches of plan_totals.recipe_phases in order; the wall time is the sum of the jobs' (queue waits not included),
the GPU-hours that of an allocation of every GPU for it.

Start-up per launch (`STARTUP_S`): what a stage launch costs before its first update and after its last (the
runner, imports, rendezvous, engine build, the final consolidation). Measured 2026-11-27 on this repository's
2-core CPU machine (load 6-7): a 2-update BL_BASE-shaped tiny pretraining on 2 ranks under the deepspeed launcher,
bf16 ZeRO-1 as the paper presets, took 15.8, 22.8 and 31.0 s from `mm-ds pretrain` to exit (docs/results.md: 18.4
s on a quieter day, its parts named). A GPU cluster adds CUDA and NCCL initialisation and reading the parent from
a shared filesystem, not measured: the default is the CPU figure's upper end; time a first launch and pass
`--startup-s`.

Data preparation (`mm-ds run RECIPE --only prepare`, mm_ds/pipeline/prepare.py): per language one pass that samples
lines for SentencePiece (one thread decompresses, splits and hashes each line for the held-out slice), SentencePiece
training on the sample, then a pass that encodes (one thread reads, splits and writes shards while the others
encode: that thread bounds it from 2 workers on). `PREPARE` holds the rates, CPU time measured 2026-11-27 on
../shared/data/text/en.txt.xz (21 MB of CC-100-like English, 52 bytes a line; CC-100's longer lines cost less per
byte), one EPYC vCPU. Sizes: the recipe's text files when they are here (compressed ones x `COMPRESSION`), else
CC-100's (the paper's Table 1). Not counted: packing the MLM blocks where prepare does it (`--seq-len`; a pass over
the token shards, minutes for English by mm_ds/data/blocks.py's account, not measured here).
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, replace

from ...pipeline.recipe import text_inputs
from .totals import plan_evaluation, recipe_phases

STARTUP_S = 30.0
JOB_START_S = 10.0
"""`mm-ds run`'s start and check per submission (`mm-ds run paper --check`: 6.9 s on this machine, shared)."""

PREPARE = {"sample_mb_s": 26.0, "serial_mb_s": 30.0, "encode_mb_s": 16.0, "spm_s": 60.0}
"""Measured (module docstring): the sampling pass 0.80 CPU s per 21 MB; the encoding pass's reading thread 0.70 s
(decompress 0.31, split and held-out hash 0.38, arrays 0.02), its encoding 1.32 s per worker; SentencePiece (50k
pieces, one thread) 8 s on 20 MB of sample, and a 2M-line sample of such lines is ~100 MB: a minute, rounded up."""
COMPRESSION = 3.7
"""Text bytes per compressed byte: ../shared/data/text/en.txt.xz, 5.65 MB -> 20.97 MB."""
CC100_GB = {"ar": 28.0, "bg": 58.0, "de": 67.0, "el": 47.0, "en": 301.0, "es": 54.0, "fr": 57.0, "hi": 21.0,
            "ru": 279.0, "sw": 1.7, "th": 72.0, "tr": 21.0, "ur": 5.7, "vi": 138.0, "zh": 47.0}
"""GB of CC-100 text per language: the paper's Table 1."""


# ---------------------------------------------------------------- data preparation

@dataclass(frozen=True)
class PrepareTime:
    lang: str
    text_bytes: float | None
    source: str
    seconds: float | None


def prepare_seconds(text_bytes: float, workers: int = 16) -> float:
    mb = text_bytes / 1e6
    encode = min(PREPARE["serial_mb_s"], PREPARE["encode_mb_s"] * max(1, workers))
    return mb / PREPARE["sample_mb_s"] + PREPARE["spm_s"] + mb / encode


def prepare_times(recipe) -> list[PrepareTime]:
    """Each language's text and preparation time (None: unknown, or a generated world's, seconds)."""
    out = []
    for lang in [recipe.source_lang, *recipe.langs]:
        if recipe.world is not None:
            out.append(PrepareTime(lang, None, "generated world", None))
            continue
        files = [f for p in text_inputs(recipe, lang) if not p.startswith("hf:") for f in glob.glob(p)]
        if files:
            size = sum(os.path.getsize(f) * (COMPRESSION if f.endswith((".xz", ".gz", ".bz2")) else 1) for f in files)
            out.append(PrepareTime(lang, size, "its files", prepare_seconds(size)))
        elif lang in CC100_GB:
            size = CC100_GB[lang] * 1e9
            out.append(PrepareTime(lang, size, "CC-100 sizes, the paper's Table 1", prepare_seconds(size)))
        else:
            out.append(PrepareTime(lang, None, "unknown: no file here", None))
    return out


def format_prepare(times: list[PrepareTime], recipe_name: str) -> list[str]:
    known = [t for t in times if t.seconds is not None]
    head = f"data preparation (`mm-ds run {recipe_name} --only prepare`, a CPU job before the GPU allocation):"
    if not known:
        return [head, f"  not estimated ({times[0].source if times else 'no languages'})"]
    longest = max(known, key=lambda t: t.seconds)
    sources = ", ".join(dict.fromkeys(t.source for t in known))
    lines = [head, f"  {len(known)} language(s), {_size(sum(t.text_bytes for t in known))} of text ({sources}): one "
             f"job {_hours(sum(t.seconds for t in known))}; a job per language (`--lang L`) {_hours(longest.seconds)} "
             f"({longest.lang}, {_size(longest.text_bytes)})",
             f"  at {PREPARE['sample_mb_s']:g} MB/s to sample, SentencePiece ~{PREPARE['spm_s'] / 60:.0f} min, "
             f"{PREPARE['serial_mb_s']:g} MB/s to encode (one reading thread bounds it; {PREPARE['encode_mb_s']:g} "
             f"MB/s per encoding thread): measured on one CPU core, mm_ds/tools/plan/budget.py"]
    unknown = [t.lang for t in times if t.seconds is None]
    return lines + ([f"  not estimated: {', '.join(unknown)} (no file here, not a CC-100 language)"] if unknown else [])


def _size(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


# ---------------------------------------------------------------- jobs under a time limit

UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds of `48h`, `90m`, `2d`, `1.5h`, or SLURM's `D-HH:MM:SS`, `HH:MM:SS`."""
    t = text.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|m|min|h|d)", t)
    if m:
        return float(m.group(1)) * UNITS[m.group(2)]
    m = re.fullmatch(r"(?:(\d+)-)?(\d+):(\d{2})(?::(\d{2}))?", t)
    if m:
        d, h, mi, s = (int(x or 0) for x in m.groups())
        return ((d * 24 + h) * 60 + mi) * 60 + s
    raise ValueError(f"--time-limit {text!r}: give a duration such as 48h, 90m, 2d or SLURM's 2-00:00:00")


def _lane(pos: tuple[int, float], lane, limit: float | None, startup: float, job: float) -> tuple[int, float]:
    jobs, t = pos
    for launch in lane:
        left = launch.seconds
        while True:
            t += startup
            if limit is None or t + left <= limit:
                t += left
                break
            done = max(0.0, limit - t)
            kept = (done // launch.resume_s) * launch.resume_s if launch.resume_s > 0 else done
            if kept <= 0 and t <= job + startup:  # a fresh job that cannot keep any of it: never ends
                raise ValueError(f"--time-limit of {limit / 3600:.2f} h cannot hold {launch.name}'s start-up "
                                 f"({startup:g} s) and one interval between its checkpoints "
                                 f"({launch.resume_s / 3600:.2f} h): raise the limit")
            left, jobs, t = left - kept, jobs + 1, job
    return jobs, t


def submissions(phases, limit_s: float | None, startup_s: float = STARTUP_S,
                job_s: float = JOB_START_S) -> tuple[int, float]:
    """(jobs, wall seconds of all of them) that run `phases` (plan_totals.recipe_phases) in order, each job at
    most `limit_s` (None: one job)."""
    pos = (1, job_s)
    for phase in phases:
        pos = max(_lane(pos, lane, limit_s, startup_s, job_s) for lane in phase.lanes)
    jobs, t = pos
    return jobs, (jobs - 1) * limit_s + t if limit_s else t


# ---------------------------------------------------------------- the budget table

@dataclass(frozen=True)
class Budget:
    mfu: float
    spread: int
    hours: float
    gpu_hours: float
    usd: float | None
    jobs: int
    launches: int
    refused: str = ""


def budget(recipe, cfgs: dict, cluster, mfu: float, spread: int, limit_s: float | None, startup_s: float,
           runs: list | None = None) -> Budget:
    c = replace(cluster, mfu=mfu)
    try:
        phases = recipe_phases(recipe, cfgs, c, plan_evaluation(recipe, c, cfgs), spread, runs)
        jobs, wall = submissions(phases, limit_s, startup_s)
    except ValueError as e:
        return Budget(mfu, spread, 0.0, 0.0, None, 0, 0, str(e))
    gpu_h = wall / 3600 * c.gpus
    return Budget(mfu, spread, wall / 3600, gpu_h, gpu_h * c.usd_per_gpu_hour if c.usd_per_gpu_hour else None, jobs,
                  sum(len(lane) for p in phases for lane in p.lanes))


def mfu_range(mfu: float, given: str | None) -> list[float]:
    """`--mfu-range` (comma-separated), else 0.5x, 1x and 1.5x the assumed MFU (at most 1)."""
    if given:
        try:
            values = [float(x) for x in given.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"--mfu-range {given!r}: give MFUs separated by commas, e.g. 0.3,0.45,0.6") from None
        if not values or not all(0 < v <= 1 for v in values):
            raise ValueError(f"--mfu-range {given!r}: each MFU must lie in (0, 1]")
        return values
    return sorted({round(mfu * f, 3) for f in (0.5, 1.0, 1.5) if mfu * f <= 1} | {mfu})


def format_budget(rows: list[Budget], cluster, limit_s: float | None, startup_s: float) -> list[str]:
    usd = cluster.usd_per_gpu_hour
    lines = [f"budget: the whole recipe with start-ups ({startup_s:g} s per launch, {JOB_START_S:g} s per job), "
             + (f"in jobs of at most {limit_s / 3600:g} h" if limit_s else "in one job (--time-limit: jobs)")
             + (f", at {usd:g} USD per GPU-hour" if usd else ""),
             "| MFU | Steps 1-2 | hours | GPU-h | " + ("USD | " if usd else "") + "jobs | launches |",
             "|---:|---|---:|---:|" + ("---:|" if usd else "") + "---:|---:|"]
    for r in rows:
        how = "one after another" if r.spread == 1 else f"side by side, launch.spread={r.spread}"
        if r.refused:
            lines.append(f"| {r.mfu:g} | {how} | refused: {r.refused} |")
            continue
        lines.append(f"| {r.mfu:g} | {how} | {r.hours:.{1 if r.hours >= 1 else 2}f} | {r.gpu_hours:,.0f} | "
                     + (f"{r.usd:,.0f} | " if usd else "") + f"{r.jobs} | {r.launches} |")
    first = next((r for r in rows if not r.refused and r.mfu == cluster.mfu), None)  # the assumed MFU's, one after another
    if first is not None:
        spent = (first.launches * startup_s + first.jobs * JOB_START_S) / 3600
        source = (" (the upper end of 15.8-31.0 s measured for a 2-rank CPU launch, bf16 ZeRO-1, 2026-11-27: "
                  "docs/results.md; a GPU adds CUDA and NCCL start-up, not measured)" if startup_s == STARTUP_S else "")
        lines.append(f"start-up per launch {startup_s:g} s{source}: at MFU {first.mfu:g} {first.launches} launches and "
                     f"{first.jobs} job(s) spend {spent:.2f} h of it (--startup-s)")
    return lines
