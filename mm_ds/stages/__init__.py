"""One short module per training stage (Steps 1, 1b, 2, 3); each exposes `build(cfg) -> engine.Stage` and
`preflight(cfg)` (the checks that read the stage's data and parent; it leaves `cfg` as `build` makes it,
architecture included). `runner.py` runs any of them as `mm-ds <stage>` does; `common.py` is what they share."""
