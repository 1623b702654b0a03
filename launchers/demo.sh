#!/usr/bin/env bash
# The main job on the embedded default: generate the synthetic world, then run all four systems
# (BL_BASE, BL_SMALL, MINIJOINT, MINIPOST) through Steps 1-4 on 2 CPU ranks under the deepspeed launcher,
# and print the results table. Re-running skips finished stage runs and resumes interrupted ones.
# Knobs: RECIPE (tiny | quick), OUT (runs/$RECIPE).
set -euo pipefail
RECIPE=${RECIPE:-tiny}
OUT=${OUT:-runs/$RECIPE}
mm-ds run "$RECIPE" --out "$OUT"
