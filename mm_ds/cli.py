"""`mm-ds <command>`: dispatch from one table. Training stages share one argument set and one runner
(mm_ds/stages/command.py); this module is only the entry point: nothing in the package imports it.

    mm-ds prepare  --lang en --input 'corpus/en/*.txt.xz' --out data/en
    mm-ds pretrain --preset tiny/minijoint --out runs/tiny-mj [key=value ...] [--resume] [--check]
    deepspeed --num_gpus 8 --module mm_ds.cli pretrain --preset paper/minijoint --ds-config bf16_zero1.json --out runs/mj
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from .config import DataConfig, did_you_mean
from .runtime.exits import outcome
from .stages.command import STAGES, run_stage

# command -> (module with build()/preflight(), help): the stage commands' table (mm_ds/stages/resolve.py)
STAGE_COMMANDS = STAGES
# command -> (module:function taking argv, help)
TOOL_COMMANDS = {
    "prepare": ("mm_ds.cli:prepare_main", "train SentencePiece and encode a corpus into token shards"),
    "run": ("mm_ds.pipeline.run:main", "a whole experiment from a recipe ({recipes}; or your YAML file), one "
            "results table"),
    "transfer": ("mm_ds.eval.transfer:main", "Step 4: zero-shot transfer by swapping target embeddings in"),
    "extend": ("mm_ds.pipeline.extend:main", "an English HF model (or mm-ds run) + target text -> a Hugging Face "
               "model for the new language: import, Step 1b, prepare, Step 2, export, with resume and --check"),
    "world": ("mm_ds.data.world:main", "generate the synthetic multilingual world (the embedded default data)"),
    "score": ("mm_ds.eval.score:main", "score a predictions file as the official evaluation scripts would"),
    "flops": ("mm_ds.pipeline.costs:main", "analytic training FLOPs and V100-days of a recipe's stages"),
    "plan": ("mm_ds.tools.plan.plan:main", "time, GPU-hours, communication and disk of a recipe's stages on a GPU cluster"),
    "report": ("mm_ds.report.command:main", "tables, curves and speedups from evaluated checkpoints"),
    "align": ("mm_ds.pipeline.alignment:main", "alignment check: held-out target MLM of each Step-2 mini-model and "
              "of its primary model with those embeddings (no task data)"),
    "import": ("mm_ds.interop:import_main", "an HF/XLM-R, fairseq or DeepSpeed checkpoint as an mm-ds Step-1 run"),
    "export": ("mm_ds.interop:export_main", "a checkpoint of any stage as a Hugging Face model directory"),
    "config": ("mm_ds.tools.discover:config_main", "every config key of a stage: type, default (or a preset's "
               "value) and documentation"),
    "presets": ("mm_ds.tools.discover:presets_main", "list the packaged presets, recipes and engine configs; "
                "--show NAME prints one"),
    "verify": ("mm_ds.tools.verify:main", "check checkpoints or final weights against their manifests"),
    "bench": ("mm_ds.tools.bench.bench:main", "time every stage vs. a matmul peak and transformers; CPU speed targets"),
    "probe": ("mm_ds.runtime.distributed.probe:main", "start the ranks as a stage would (launch.KEY=VALUE): each names its "
              "host, local rank, device and threads; one all-reduce"),
}

def prepare_main(argv: list[str]) -> int:
    from .data.corpus import prepare  # a command imports what it runs: `mm-ds --help` stays quick

    p = argparse.ArgumentParser(prog="mm-ds prepare", description=TOOL_COMMANDS["prepare"][1])
    p.add_argument("--lang", required=True, help="language code of the text, e.g. en or de (recorded in meta.json)")
    p.add_argument("--input", required=True, action="append",
                   help="text files/globs (.txt, .gz, .xz; CC-100 layout) or hf:NAME[:CONFIG][:SPLIT][:COLUMN]; repeatable")
    p.add_argument("--out", required=True, help="directory to write: SentencePiece model, token shards, meta.json "
                   "(a stage's data.corpus)")
    p.add_argument("--vocab-size", type=int, default=50000, help="SentencePiece pieces, specials included "
                   "(fewer, with a warning, when the text cannot support that many) (default: %(default)s)")
    p.add_argument("--character-coverage", type=float, default=0.9998,
                   help="share of characters SentencePiece covers; the rest map to <unk> (default: %(default)s)")
    p.add_argument("--sample-sentences", type=int, default=2_000_000,
                   help="sentences sampled for SentencePiece training (bounded, so CC-100-sized inputs work) "
                        "(default: %(default)s)")
    p.add_argument("--workers", type=int, default=None, help="encoding threads (default: all cores)")
    p.add_argument("--spm-model", help="reuse this SentencePiece model instead of training one (its size wins "
                   "over --vocab-size)")
    p.add_argument("--model-type", default="unigram", choices=["unigram", "bpe"],
                   help="SentencePiece algorithm: unigram (XLM-R) or bpe (small lexicons) (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sentence sample (default: %(default)s)")
    p.add_argument("--heldout", type=float, default=0.0, metavar="FRACTION",
                   help="hold this fraction of the lines out of training (chosen by a hash of each line's text) "
                        "into heldout.txt, for the alignment check (default: %(default)s, none)")
    p.add_argument("--seq-len", type=int, nargs="*", default=[DataConfig.seq_len], metavar="N",
                   help="pack MLM blocks of these lengths (the stages' data.seq_len) and cache them in --out, so "
                        "that no training run packs them at its start; also for a corpus prepared before; none "
                        "after the flag: skip (default: %(default)s)")
    a = p.parse_args(argv)
    meta = prepare(a.lang, a.input, a.out, vocab_size=a.vocab_size, character_coverage=a.character_coverage,
                   sample_sentences=a.sample_sentences, workers=a.workers, seed=a.seed, spm_model=a.spm_model,
                   model_type=a.model_type, heldout=a.heldout, seq_lens=tuple(a.seq_len))
    print(json.dumps(meta, indent=2, default=str))
    return 0


def _usage() -> str:
    from .config import recipe_names  # the packaged ones, as they ship

    lines = ["usage: mm-ds <command> [options]    (mm-ds <command> --help: its options; mm-ds --version)", "",
             "commands:"]
    for name, (_, h) in {**STAGE_COMMANDS, **TOOL_COMMANDS}.items():
        lines.append(f"  {name:<12}{h.format(recipes=', '.join(recipe_names()))}")
    return "\n".join(lines)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("mm-ds")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed: pip install -e .)"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The deepspeed launcher appends --local_rank=N; the rank is also in the environment.
    argv = [a for a in argv if not a.startswith("--local_rank")]
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"mm-ds {version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name in STAGE_COMMANDS:
        return outcome(name, lambda: run_stage(name, rest))
    if name in TOOL_COMMANDS:
        module_name, func = TOOL_COMMANDS[name][0].split(":")
        return outcome(name, lambda: getattr(importlib.import_module(module_name), func)(rest))
    hint = did_you_mean(name, [*STAGE_COMMANDS, *TOOL_COMMANDS])
    print(f"mm-ds: unknown command {name!r}{hint}\n\n{_usage()}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
