"""One short module per pipeline step; each exposes `build(cfg) -> engine.Stage` and `preflight(cfg)` (the
checks that read the stage's data and parent; it leaves `cfg` as `build` makes it, architecture included)."""
