"""The plain-dict layer under the typed configs (mm_ds/config.py): YAML/JSON config files, the packaged presets
(a preset may start from others: `base: [...]`), and `key=value` overrides, merged in that order; and a config
written back as YAML.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import yaml

from .coerce import ConfigError, did_you_mean, to_dict


def deep_merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in top.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def read_file(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"config file {path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {e}") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys, got {type(data).__name__}")
    return _resolve_bases(data, path.parent)


def _resolve_bases(data: dict, here: Path) -> dict:
    """A preset may start from others: `base: [tiny/model]` merges those first, its own keys win."""
    bases = data.pop("base", [])
    bases = [bases] if isinstance(bases, str) else bases
    merged: dict = {}
    for b in bases:
        merged = deep_merge(merged, read_preset(b))
    return deep_merge(merged, data)


def preset_names() -> list[str]:
    root = resources.files("mm_ds") / "presets"
    out = []
    for d in root.iterdir():
        if d.is_dir() and d.name != "recipes":  # recipes are `mm-ds run` inputs, not stage presets
            out += [f"{d.name}/{f.name[:-5]}" for f in d.iterdir() if f.name.endswith(".yaml")]
    return sorted(out)


def recipe_names() -> list[str]:
    """The packaged recipes (`mm-ds run NAME`), as they ship: presets/recipes/NAME.yaml."""
    root = resources.files("mm_ds") / "presets" / "recipes"
    return sorted(f.name[:-5] for f in root.iterdir() if f.name.endswith(".yaml"))


def read_preset(name: str) -> dict:
    path = resources.files("mm_ds") / "presets" / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown preset {name!r}{did_you_mean(name, preset_names())}; available: "
                          f"{', '.join(preset_names())}")
    data = yaml.safe_load(path.read_text()) or {}
    return _resolve_bases(data, Path(str(path)).parent)


def parse_override(item: str) -> tuple[list[str], object]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value, e.g. train.lr=3e-4")
    key, raw = item.split("=", 1)
    value = yaml.safe_load(raw) if raw else ""
    return key.strip().split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    data = json.loads(json.dumps(data))
    for item in overrides:
        path, value = parse_override(item)
        node = data
        for p in path[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {p} is not a section")
        node[path[-1]] = value
    return data


def dump_yaml(cfg) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
