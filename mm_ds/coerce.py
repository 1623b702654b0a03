"""Plain conversions behind mm_ds.config: YAML/JSON/CLI values to typed dataclasses and back, with errors that
name the key. Re-exported by mm_ds.config (`from mm_ds.config import from_dict, ConfigError` keeps working)."""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
import typing


class ConfigError(ValueError):
    """A configuration problem, reported with the offending key/file and how to fix it."""


def did_you_mean(word: str, choices) -> str:
    """" (did you mean 'X'?)" with the valid name closest to a mistyped `word`, or "" when none is close."""
    match = difflib.get_close_matches(str(word), [str(c) for c in choices], 1)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value, tp, key: str):
    """Convert a YAML/JSON/CLI value to the annotated type, or fail naming the key."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, getattr(types, "UnionType", None)):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _coerce(value, inner[0], key)
        for tp_ in inner:  # several types (int | list[int]): the first that takes the value
            try:
                return _coerce(value, tp_, key)
            except ConfigError:
                pass
        raise ConfigError(f"{key}: expected {' or '.join(_type_name(a) for a in inner)}, got {value!r}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of {_type_name(tp)} fields, got {value!r}")
        return from_dict(tp, value, prefix=f"{key}.")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            hint = "" if origin is tuple or isinstance(value, dict) else \
                f" (did you mean {key}=[{value if isinstance(value, str) else json.dumps(value)}]?)"
            raise ConfigError(f"{key}: expected a list, got {value!r}{hint}")
        item_t = args[0] if args else typing.Any
        items = [_coerce(v, item_t, f"{key}[{i}]") for i, v in enumerate(value)]
        if origin is tuple:
            if len(args) == 2 and args[1] is not Ellipsis and len(items) != 2:
                raise ConfigError(f"{key}: expected 2 values, got {len(items)}")
            return tuple(items)
        return items
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return int(value)
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "3e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    return value


RENAMED = {"aux_head_layer": "secondary_head_layer"}
"""Keys that had another name: configs written before the rename get told the new one."""


def from_dict(cls, data: dict, prefix: str = ""):
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        hints = "".join(f"; {prefix + k} is now {prefix + RENAMED[k]}" if RENAMED.get(k) in names else
                        "".join(f"; did you mean {prefix + m}?" for m in difflib.get_close_matches(k, names, 1))
                        for k in unknown)
        raise ConfigError(f"unknown config key(s) {', '.join(prefix + k for k in unknown)}{hints}; "
                          f"valid keys under {prefix or 'the top level'}: {', '.join(sorted(names))}")
    types = typing.get_type_hints(cls)
    kwargs = {k: _coerce(v, types[k], prefix + k) for k, v in data.items()}
    return cls(**kwargs)


def to_dict(cfg) -> dict:
    def plain(v):
        if isinstance(v, tuple):
            return list(v)
        return v
    return {k: (to_dict(v) if dataclasses.is_dataclass(v) else plain(v))
            for k, v in ((f.name, getattr(cfg, f.name)) for f in dataclasses.fields(cfg))}


def numbers(value, key: str = ""):
    """(key, number) of every number in a config value: fields and mapping entries as `a.b`, list items `a.b[i]`."""
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            yield from numbers(getattr(value, f.name), f"{key}.{f.name}" if key else f.name)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from numbers(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from numbers(v, f"{key}[{i}]")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield key, value


def check_numbers(value, ranges: dict[str, str], key: str = "") -> None:
    """Every number in `value` (under `key`) is finite and in its range: the row of its key, or else of the
    nearest section above it that has one (`world.task_sizes` for `world.task_sizes.dev`). Raises ConfigError."""
    for name, v in numbers(value, key):
        row, interval = name.split("[")[0], None
        while interval is None and row:
            interval, row = ranges.get(row), row.rpartition(".")[0]
        lo_open, lo, hi, hi_open = (interval[0] == "(", *map(float, interval[1:-1].split(",")), interval[-1] == ")"
                                    ) if interval else (False, -math.inf, math.inf, False)
        inside = (lo < v if lo_open else lo <= v) and (v < hi if hi_open else v <= hi)
        if not (math.isfinite(v) and inside):
            valid = (f">{'' if lo_open else '='} {lo:g}" if hi == math.inf else f"in {interval}") if interval else ""
            what = "is not a finite number" + (f"; it must be {valid}" if valid else "") if not math.isfinite(v) \
                else f"must be {valid}"
            raise ConfigError(f"{name}={v!r} {what}")
