"""`mm-ds bench`'s compiled against eager (train.compile, mm_ds/runtime/training/compiled.py), per stage kind.

Each stage is built twice by its stage module, one with train.compile (`--compile`: inductor by default), and both
engines are built as `engine.train` builds them and stepped in turn (pairs.py `alternate`, A B B A ...), so that
the machine's drift hits both sides alike; the ratio is of their median update times. The compiled side compiles in
its first updates (the warm-up, one more than the stage table's); an update that compiles later (a batch with
padding after unpadded ones: its second graph) has its compile seconds taken out of its time, as the training
log's rows do (pairs.py `EngineSteps`). Reported per stage: both sides' median update and tokens/s, the ratio,
the compile seconds, graphs, graph breaks and recompiles, and both sides' losses (equal at the first update: the
same weights and batch; dropout then draws different masks, mm_ds/runtime/training/compiled.py).
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from .pairs import EXTRA_WARMUP, EngineSteps, alternate
from .peer import release_free_memory


def measure(builder, stages: list[str], warmup: int, steps: int, rank: int, world: int, backend: str,
            log) -> dict:
    """stage -> its compiled and eager sides stepped in turn (module docstring)."""
    out, warmup = {}, warmup + EXTRA_WARMUP
    for name in stages:
        release_free_memory()
        log(f"{name}: compiled ({backend}) and eager in alternating updates ...")
        eager, comp = builder.timed(name, warmup + steps), builder.timed(name, warmup + steps)
        comp.cfg.train = replace(comp.cfg.train, compile=True, compile_backend=backend)
        steppers = {}
        try:
            steppers["compiled"] = EngineSteps(comp, world, rank)
            steppers["eager"] = EngineSteps(eager, world, rank)
            raw = alternate(steppers, warmup, steps)
            stats = steppers["compiled"].built.compiled.stats()
        finally:
            for s in steppers.values():
                s.close()
        tokens = builder.micro_batch * builder.seq
        sides = {side: {"step_time_s": statistics.median(r["step_times"]), "step_times": r["step_times"],
                        "losses": r["losses"]} for side, r in raw.items()}
        for s in sides.values():
            s["tokens_per_s"] = tokens / s["step_time_s"]
        out[name] = {"sides": sides, "ratio": sides["eager"]["step_time_s"] / sides["compiled"]["step_time_s"],
                     "backend": backend, **stats}
        log(f"{name}: compiled {sides['compiled']['step_time_s']:.3f} s vs eager {sides['eager']['step_time_s']:.3f} s "
            f"per update ({out[name]['ratio']:.2f}x); compiled in {stats['compile_s']:.1f} s, {stats['graphs']:.0f} "
            f"graph(s), {stats['graph_breaks']:.0f} break(s), {stats['recompiles']:.0f} recompile(s)")
    return out


def table(compiled: dict) -> str:
    backend = next(iter(compiled.values()))["backend"]
    lines = [f"train.compile ({backend}) against eager, both sides stepped in turn (bench_compile.py):",
             "| stage | eager s (med) | compiled s (med) | compiled/eager tokens/s | compile s | graphs | graph breaks "
             "| recompiles |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, c in compiled.items():
        e, k = c["sides"]["eager"], c["sides"]["compiled"]
        lines.append(f"| {name} | {e['step_time_s']:.3f} | {k['step_time_s']:.3f} | {c['ratio']:.2f}x | "
                     f"{c['compile_s']:.1f} | {c['graphs']:.0f} | {c['graph_breaks']:.0f} | {c['recompiles']:.0f} |")
    return "\n".join(lines)
