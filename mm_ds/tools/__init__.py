"""Tools around the pipeline, not part of a training run: cost estimates (`mm-ds flops`, `mm-ds plan`) and the
benchmark (`mm-ds bench`). They build on the recipe, the systems table and the stages; nothing in the
pipeline imports them."""
