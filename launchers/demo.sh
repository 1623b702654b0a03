#!/usr/bin/env bash
# The main job on the embedded default: generate the synthetic world, prepare the English corpus, and
# pretrain the tiny MINIJOINT model on 2 CPU ranks under the deepspeed launcher.
# Knobs: OUT (default runs/demo), RANKS (2), STEPS (preset's).
set -euo pipefail
OUT=${OUT:-runs/demo}
RANKS=${RANKS:-2}
mm-ds world --out "$OUT/world" --langs t1,t2 >/dev/null
[ -f "$OUT/data/en/meta.json" ] || mm-ds prepare --lang en --input "$OUT/world/text/en.txt" --out "$OUT/data/en" \
    --vocab-size 2000 --model-type bpe >/dev/null
mm-ds pretrain --preset tiny/minijoint --out "$OUT/pretrain/minijoint" --ranks "$RANKS" \
    data.corpus="$OUT/data/en" ${STEPS:+train.steps=$STEPS} $( [ -d "$OUT/pretrain/minijoint/checkpoints" ] && echo --resume )
