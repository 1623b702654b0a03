"""The four systems of the paper (§2, §3) as one table, and the pipeline's stages.

Glossary, paper term -> name in code, config, CLI and logs:

    primary model                  a system's `primary` row: the model Steps 1, 3 and 4 use (`pretrain/<primary>`)
    mini-model                     `build_mini/<system>` (Step 1b's result); `System.mini` says how it is made
    secondary head (MINIJOINT)     `model.secondary_head_layer`; keys `secondary_head.*` (`secondary_heads.N.*`)
    bridge layers (MINIPOST)       `mini.new_layers`, trained in Step 1b (formula A4)
    depth N                        see "Depth N" below
    Step 1, 1b, 2, 3               the stages `pretrain`, `build_mini` (`mm-ds build-mini`), `adapt`, `finetune`
    Step 4 (zero-shot transfer)    evaluation, not a stage: mm_ds/eval/transfer.py
    target language                `lang` of Step 2 (`recipe.langs`); the source language is `source_lang` (en)

Depth N (the mini-model's shared bottom layers, paper N=4) is one config key per system, `System.depth_key`:
MINIJOINT's is `model.secondary_head_layer` of its `pretrain` config (its secondary head sits after layer N;
Step 1b extracts those N layers), MINIPOST's is `mini.layers` of its `build_mini` config (BL_BASE's bottom N
layers, plus `mini.new_layers` bridge layers). A variant `minijoint@N` / `minipost@N` sets exactly that key.

Every per-system difference lives in a row here, the way `data/tasks.py` holds every per-task one: the
pipeline, the stages, the recipe check, FLOPs, `mm-ds plan`, the report and the benchmark read it.

    system      primary    Step 1 (formula)         Step 1b (mini-model)               Step 2 adapts over
    BL_BASE     itself     pretrain (A1)            -                                  the 12-layer model
    BL_SMALL    itself     pretrain (A1)            -                                  the 4-layer model
    MINIJOINT   itself     pretrain_secondary (A1+head)  extract: bottom N + secondary head  the N-layer mini-model
    MINIPOST    BL_BASE    shares BL_BASE's         build: bottom N + 2 new (A4)       the N+2-layer mini-model

A *variant* names a mini-model system with its depth N (§5.2's sweep): `minijoint@2` is MINIJOINT pretrained
with its secondary head after layer 2 (its own Step 1), `minipost@3` is MINIPOST over BL_BASE's bottom 3
layers (BL_BASE's Step 1 shared). `minijoint@1+2+4` is the multi-depth MINIJOINT of §7: one model with a
secondary head after each of those layers, whose Step 2 runs over the shallowest mini-model first and the
deeper ones after. `system_of(name)` turns any of these names into a row; a recipe may hold any number of them.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace

STAGES = ("pretrain", "build_mini", "adapt", "finetune")
"""The pipeline's training stages in order (Steps 1, 1b, 2, 3); Step 4 (transfer) evaluates."""


@dataclass(frozen=True)
class System:
    name: str
    """The config value (`system=`) and the recipe's name."""
    label: str
    """The paper's name, used in tables."""
    primary: str
    """The system whose pretrained model is this one's primary model (Steps 1, 3 and 4). MINIPOST has none of
    its own: it is BL_BASE's model with a mini-model built afterwards (§2.2)."""
    mini: str | None
    """How Step 1b makes the mini-model that Step 2 trains over: `extract` (the bottom N layers and the
    secondary head of a MINIJOINT model, no training), `build` (the bottom N layers + new bridge layers,
    trained: formula A4), or None (Step 2 runs over the primary model itself)."""
    step1: str
    """Step 1's FLOPs formula: `pretrain` (A1) or `pretrain_secondary` (A1 + the secondary MLM head)."""
    order: int
    """Row order in the paper's tables (BL_BASE, BL_SMALL, MINIPOST, MINIJOINT)."""
    depth_key: tuple[str, str] | None = None
    """Where a variant's depth N goes: (stage, config key) of the stage whose config it sets."""
    depths: tuple[int, ...] = ()
    """A variant's depths (`minijoint@1+2` -> (1, 2)); empty: the stage presets' own depth."""

    @property
    def base(self) -> str:
        """The row a variant derives from (its presets and `<stage>/<system>` overrides are the row's)."""
        return self.name.partition("@")[0]

    def overrides(self, stage: str) -> list[str]:
        """The config changes that make `stage` this variant's: its depth(s) at `depth_key`."""
        if not self.depths or self.depth_key[0] != stage:
            return []
        value = self.depths[0] if len(self.depths) == 1 else "[" + ",".join(map(str, self.depths)) + "]"
        return [f"{self.depth_key[1]}={value}"]

    def depth_mismatch(self, cfg) -> str | None:
        """Why a stage's RunConfig does not have this variant's depth (None: it does). A variant's depth is
        its stage config's, or the stage refuses to run: a preset's depth must never pass for the variant's."""
        if not self.depths or self.depth_key[0] != cfg.stage:
            return None
        section, key = self.depth_key[1].split(".")
        have, (want,) = getattr(getattr(cfg, section), key), self.overrides(cfg.stage)
        if f"{self.depth_key[1]}={have}".replace(" ", "") == want:
            return None
        return (f"system={self.name} sets {want}, but this {cfg.stage} config has {self.depth_key[1]}={have}; "
                f"add {want} (mm-ds run adds it for you)")

    @property
    def adapts_over(self) -> str:
        """The stage whose final/ Step 2 starts from."""
        return "build_mini" if self.mini else "pretrain"

    def adapted_depths(self, model, mini) -> tuple[int, ...]:
        """Layers of the model(s) Step 2 runs through, one per phase, shallowest first, from the primary model's
        config (`model`) and Step 1b's `mini` config: (N,) for the secondary head's layer N (multi-depth:
        (N1, ..., Nk), one phase each), (N + the new layers,), or (the whole primary model's layers,)."""
        if self.mini == "extract":
            return model.secondary_depths
        if self.mini == "build":
            return (mini.layers + mini.new_layers,)
        return (model.num_layers,)


SYSTEMS: dict[str, System] = {s.name: s for s in (
    System("bl_base", "BL_BASE", primary="bl_base", mini=None, step1="pretrain", order=0),
    System("bl_small", "BL_SMALL", primary="bl_small", mini=None, step1="pretrain", order=1),
    System("minijoint", "MINIJOINT", primary="minijoint", mini="extract", step1="pretrain_secondary", order=3,
           depth_key=("pretrain", "model.secondary_head_layer")),
    System("minipost", "MINIPOST", primary="bl_base", mini="build", step1="pretrain", order=2,
           depth_key=("build_mini", "mini.layers")),
)}

REFERENCE = "bl_base"
"""The system that defines near-maximal performance (§4.2)."""

MINI_SYSTEMS = tuple(s.name for s in SYSTEMS.values() if s.mini)


class SystemNameError(ValueError):
    """A system name that is neither a row of SYSTEMS nor a variant of one; the message says why."""


def system_of(name: str) -> System:
    """The row of a system or of a variant (`minijoint@2`, `minipost@3`, `minijoint@1+2+4`); errors say why not."""
    base, at, spec = name.partition("@")
    if base not in SYSTEMS:
        close = difflib.get_close_matches(base, list(SYSTEMS), 1)
        raise SystemNameError(f"system={name!r} is not one of {', '.join(SYSTEMS)} (or a variant such as "
                              f"minijoint@2)" + (f" (did you mean {close[0]!r}?)" if close else ""))
    row = SYSTEMS[base]
    if not at:
        return row
    if row.depth_key is None:
        raise SystemNameError(f"system={name!r}: {base} has no mini-model depth; variants are "
                          f"{' or '.join(s + '@N' for s in MINI_SYSTEMS)}")
    try:
        depths = tuple(int(d) for d in spec.split("+"))
    except ValueError:
        raise SystemNameError(f"system={name!r}: the depth after @ must be a layer number, e.g. {base}@2, or "
                          f"ascending numbers joined by + (minijoint@1+2+4)") from None
    if min(depths) < 1 or list(depths) != sorted(set(depths)):
        raise SystemNameError(f"system={name!r}: depths must be distinct positive layer numbers in ascending order")
    if len(depths) > 1 and row.mini != "extract":
        raise SystemNameError(f"system={name!r}: only MINIJOINT has multi-depth mini-models (one secondary head per "
                          f"depth); {base} takes one depth, e.g. {base}@{depths[0]}")
    depth = "+".join(map(str, depths))
    return replace(row, name=f"{base}@{depth}", label=f"{row.label}@{depth}",
                   primary=f"{base}@{depth}" if row.primary == base else row.primary, depths=depths)


def sort_key(name: str) -> tuple:
    """Table order: the paper's rows, each followed by its variants by depth."""
    s = system_of(name)
    return s.order, len(s.depths) > 1, s.depths
