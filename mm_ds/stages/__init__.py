"""One short module per pipeline step; each exposes `build(cfg) -> engine.Stage` and `preflight(cfg)`."""
