"""`mm-ds config` and `mm-ds presets`: what a stage can be told, and what ships with mm-ds.

    mm-ds config adapt
    mm-ds config finetune --preset tiny/finetune train.seed=2
    mm-ds presets
    mm-ds presets --show tiny/adapt

The documentation of a config key is the docstring under its field in mm_ds/config.py (read from the source:
Python keeps attribute docstrings nowhere at run time), so `mm-ds config` and the code cannot drift apart.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import textwrap
import typing
from importlib import resources
from pathlib import Path

from .. import config
from ..config import ConfigError, did_you_mean, recipe_names
from ..runtime.training import ds_config
from ..systems import STAGES


def field_docs(cls) -> dict[str, str]:
    """Each field's documentation: the string literal right under its annotation in the class source."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    return {a.target.id: inspect.cleandoc(b.value.value) for a, b in zip(body, body[1:])
            if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)
            and isinstance(b.value.value, str)}


def _type_name(tp) -> str:
    return tp.__name__ if isinstance(tp, type) else str(tp).replace("typing.", "")


def key_lines(cfg, default, prefix: str = "") -> list[str]:
    """`key: type = value` and its documentation for every field of `cfg`, sections with their class doc;
    a value that differs from `default`'s says the default too."""
    cls = type(cfg)
    types, docs, lines = typing.get_type_hints(cls), field_docs(cls), []
    plain, plain_default = config.to_dict(cfg), config.to_dict(default)
    for f in sorted(dataclasses.fields(cls), key=lambda f: dataclasses.is_dataclass(types[f.name])):  # sections last
        value, dflt = getattr(cfg, f.name), getattr(default, f.name)
        if dataclasses.is_dataclass(value):
            head = " ".join(inspect.cleandoc(type(value).__doc__).split())
            lines += ["", *textwrap.wrap(f"{prefix}{f.name}: {head}", 110, subsequent_indent="    "),
                      *key_lines(value, dflt, f"{prefix}{f.name}.")]
            continue
        shown = json.dumps(plain[f.name])
        if value != dflt:
            shown += f"  (default {json.dumps(plain_default[f.name])})"
        lines.append(f"{'  ' if prefix else ''}{prefix}{f.name}: {_type_name(types[f.name])} = {shown}")
        lines += [("      " if prefix else "    ") + line for line in docs.get(f.name, "").splitlines()]
    return lines


def config_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="mm-ds config", description="every config key of a stage: its type, "
                                "default (or the preset's value) and documentation")
    p.add_argument("stage", help="pretrain | build-mini | adapt | finetune")
    p.add_argument("--preset", help="show this preset's values, e.g. tiny/adapt (see `mm-ds presets`)")
    p.add_argument("--config", help="and your own YAML/JSON config file's (applied after the preset)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="and these overrides'")
    a = p.parse_intermixed_args(argv)
    stage = a.stage.replace("-", "_")
    if stage not in STAGES:
        raise ConfigError(f"unknown stage {a.stage!r}{did_you_mean(stage, STAGES)}; choose one of "
                          f"{', '.join(s.replace('_', '-') for s in STAGES)}")
    cfg = config.load(a.preset, a.config, a.overrides, check=False)  # the parent need not be known yet
    if a.preset and cfg.stage != stage:
        raise ConfigError(f"preset {a.preset} is for stage {cfg.stage}, not {stage}; choose a preset for {stage} "
                          f"(`mm-ds presets`)")
    cfg.stage = stage
    source = f"values of --preset {a.preset}" if a.preset else "defaults"
    print(f"# mm-ds {a.stage}: every config key as `key: type = value` ({source}), then what it means.\n"
          f"# Set one with key=value on the command line, or in a --config file; sections are YAML mappings.")
    print("\n".join(key_lines(cfg, config.RunConfig(stage=stage))))
    return 0


# ---------------------------------------------------------------- presets, recipes, engine configs

PRESETS = resources.files("mm_ds") / "presets"


def _about(text: str, width: int = 90) -> str:
    """The first sentence of a YAML file's leading comment, cut to `width`."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").strip())
    first = " ".join(lines).split(". ")[0].rstrip(".")
    return first if len(first) <= width else first[:width - 3].rsplit(" ", 1)[0] + " ..."


def _engine_about(ds: dict) -> str:
    adam = "torch's fused AdamW" if ds.get("optimizer", {}).get("params", {}).get("torch_adam") else "FusedAdam"
    return (f"{ds_config.precision(ds)}, ZeRO stage {ds_config.zero_stage(ds)}, {adam}, micro batch "
            f"{ds.get('train_micro_batch_size_per_gpu')}")


def catalogue() -> dict[str, dict[str, tuple[Path, str]]]:
    """heading -> name -> (file, one-line description) of everything that ships."""
    engine = {}
    for name in ds_config.shipped():
        path = ds_config.find(name)
        ds = json.loads(path.read_text())
        engine[name] = (path, _engine_about(ds))
    found = {
        "stage presets (mm-ds STAGE --preset NAME)": {
            n: (Path(str(PRESETS / f"{n}.yaml")), "") for n in config.preset_names()},
        "recipes (mm-ds run NAME)": {n: (Path(str(PRESETS / "recipes" / f"{n}.yaml")), "") for n in recipe_names()},
        "engine configs (--ds-config NAME, ds_config=NAME)": engine,
    }
    for entries in list(found.values())[:2]:
        for n, (path, _) in entries.items():
            entries[n] = (path, _about(path.read_text()))
    return found


def presets_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="mm-ds presets", description="list the packaged stage presets, recipes "
                                "and DeepSpeed engine configs; --show NAME prints one")
    p.add_argument("--show", metavar="NAME", help="print this preset, recipe or engine config as it ships, "
                   "e.g. tiny/adapt, quick, fp32_zero1.json")
    a = p.parse_args(argv)
    found = catalogue()
    if a.show:
        every = {n: path for entries in found.values() for n, (path, _) in entries.items()}
        path = every.get(a.show) or every.get(f"{a.show}.json")
        if path is None:
            raise ConfigError(f"nothing ships as {a.show!r}{did_you_mean(a.show, every)}; `mm-ds presets` "
                              f"lists the names")
        print(path.read_text(), end="")
        return 0
    for heading, entries in found.items():
        print(f"{heading}:")
        width = max(map(len, entries), default=0)
        for n, (_, about) in entries.items():
            print(f"  {n:<{width}}  {about}".rstrip())
        print()
    print("`mm-ds presets --show NAME` prints one; `mm-ds config STAGE --preset NAME` shows a preset's every key.")
    return 0
