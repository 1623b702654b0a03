"""The one training loop (engine.py) and what it needs per update: the engine config, the log window, prefetch,
depth phases, the device's peak, train.compile, the update boundary, the stage-to-stage hand-off and the resolved
record every rank starts from."""
