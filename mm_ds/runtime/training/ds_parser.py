"""DeepSpeed's own parser on a stage's engine config, before any rank starts (mm_ds/runtime/training/ds_config.py
`resolve` completes the config, then calls `validate`): every block's fields and types and the batch arithmetic, as
DeepSpeedConfig checks them, plus what it leaves unchecked: top-level keys it would ignore silently, top-level scalars
of the wrong type, and optimizer and scheduler parameters their constructors would refuse on every rank.
"""

from __future__ import annotations

import collections.abc
import copy
import difflib
from pathlib import Path
from typing import TYPE_CHECKING

from ...config import ConfigError
from ..distributed import dist

if TYPE_CHECKING:
    from .ds_config import Geometry


class _Reads(dict):
    """A config dict that records which keys DeepSpeed's parser asks for: any other key is one it ignores."""

    def __init__(self, *args, read: set | None = None, defaults: dict | None = None):
        super().__init__(*args)
        self.read = set() if read is None else read
        self.defaults = {} if defaults is None else defaults

    def get(self, key, *default):
        self.read.add(key)
        if default and default[0] is not None:
            self.defaults.setdefault(key, default[0])
        return super().get(key, *default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)

    def keys(self):
        return _ReadKeys(self)

    def __copy__(self):  # DeepSpeedConfig parses a shallow copy: keep recording into the same set
        return _Reads(self, read=self.read, defaults=self.defaults)


class _ReadKeys(collections.abc.KeysView):
    def __contains__(self, key):
        return self._mapping.__contains__(key)


def validate(ds: dict, geo: Geometry, path: Path | str) -> None:
    """DeepSpeed's own parser on `ds`: every block's fields and types, the batch arithmetic, plus what it
    silently ignores (unknown top-level keys) and the optimizer's and scheduler's parameter names."""
    import pydantic
    from deepspeed.runtime.config import DeepSpeedConfig

    # The parser takes the world size from the process group, or 1 before any rank starts: hand it the
    # geometry for that world size (resolve() has checked it against the real one).
    probe = _Reads(copy.deepcopy(ds) | {"train_batch_size": geo.micro_batch * geo.grad_accum * dist.world_size()})
    try:
        DeepSpeedConfig(probe)
    except pydantic.ValidationError as e:
        raise ConfigError(f"{path}: DeepSpeed rejects it: {_pydantic_message(e, ds)}") from None
    except (AssertionError, ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"{path}: DeepSpeed rejects it: {type(e).__name__}: {e}") from None
    unknown = sorted(set(ds) - probe.read)
    if unknown:
        hints = [f"{k!r}" + (f" (did you mean {m[0]!r}?)" if (m := difflib.get_close_matches(k, probe.read, 1)) else "")
                 for k in unknown]
        raise ConfigError(f"{path}: unknown top-level key(s) {', '.join(hints)}: DeepSpeed would ignore them "
                          f"silently. Fix the name or remove the key")
    _check_scalars(ds, probe.defaults, path)
    _check_params(ds, path)


def _check_scalars(ds: dict, defaults: dict, path) -> None:
    """DeepSpeed reads top-level scalars (gradient_clipping, steps_per_print, ...) without checking their
    type; a string there fails on every rank later. Check each against the type of DeepSpeed's default."""
    for key, default in defaults.items():
        if key not in ds or isinstance(default, (dict, list)):
            continue
        value, want = ds[key], type(default)
        ok = (isinstance(value, bool) if want is bool else
              isinstance(value, (int, float)) and not isinstance(value, bool) if want is float else
              isinstance(value, want) and not (want is int and isinstance(value, bool)))
        if not ok:
            raise ConfigError(f"{path}: {key}={value!r} should be {want.__name__} (DeepSpeed's default is "
                              f"{default!r})")


def _pydantic_message(e, ds: dict) -> str:
    """Each error with the JSON key it is about (pydantic knows only the block's model name)."""
    parts = []
    for err in e.errors():
        loc = [str(x) for x in err.get("loc", ())]
        where = [f"{block}.{'.'.join(loc)}" for block, value in ds.items()
                 if isinstance(value, dict) and _lookup(value, loc) == (True, err.get("input"))]
        parts.append(f"{where[0] if len(where) == 1 else e.title + '.' + '.'.join(loc)}: {err.get('msg')} "
                     f"(got {err.get('input')!r})")
    return "; ".join(parts)


def _lookup(d: dict, loc: list[str]):
    for key in loc:
        if not isinstance(d, dict) or key not in d:
            return False, None
        d = d[key]
    return True, d


def _accepted(fn) -> set[str]:
    import inspect

    return {p for p in inspect.signature(fn).parameters if p not in ("self", "params")}


def _check_params(ds: dict, path) -> None:
    """Optimizer and scheduler parameters are passed to constructors on every rank: a misspelt one is a
    TypeError there. Check the names against the constructors DeepSpeed would call."""
    import torch
    from deepspeed.runtime.lr_schedules import WarmupDecayLR

    opt = ds.get("optimizer", {})
    kind = str(opt.get("type", "")).lower()
    if kind in ("adam", "adamw"):
        from deepspeed.ops.adam import FusedAdam
        allowed = _accepted(torch.optim.AdamW) | _accepted(FusedAdam) | {"torch_adam", "adam_w_mode",
                                                                        "fp32_optimizer_states"}
        _unknown_params(opt.get("params", {}), allowed, "optimizer.params", path)
    allowed = _accepted(WarmupDecayLR) - {"optimizer", "last_batch_iteration"}
    _unknown_params(ds.get("scheduler", {}).get("params", {}), allowed, "scheduler.params", path)


def _unknown_params(params: dict, allowed: set[str], where: str, path) -> None:
    for k in params:
        if k not in allowed:
            m = difflib.get_close_matches(k, allowed, 1)
            raise ConfigError(f"{path}: {where}.{k} is not a parameter DeepSpeed passes on"
                              f"{f' (did you mean {m[0]!r}?)' if m else ''}; accepted: {', '.join(sorted(allowed))}")
