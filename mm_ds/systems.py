"""The four systems of the paper (§2, §3) as one table, and the pipeline's stages.

Every per-system difference lives in a row here, the way `data/tasks.py` holds every per-task one: the
pipeline, the stages, the recipe check, FLOPs, `mm-ds plan`, the report and the benchmark read it.

    system      primary    Step 1 (formula)         Step 1b (mini-model)               Step 2 adapts over
    BL_BASE     itself     pretrain (A1)            -                                  the 12-layer model
    BL_SMALL    itself     pretrain (A1)            -                                  the 4-layer model
    MINIJOINT   itself     pretrain_dual (A1+head)  extract: bottom N + secondary head  the N-layer mini-model
    MINIPOST    BL_BASE    shares BL_BASE's         build: bottom N + 2 new (A4)       the N+2-layer mini-model
"""

from __future__ import annotations

from dataclasses import dataclass

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
    secondary head of a dual-head model, no training), `build` (the bottom N layers + new bridge layers,
    trained: formula A4), or None (Step 2 runs over the primary model itself)."""
    step1: str
    """Step 1's FLOPs formula: `pretrain` (A1) or `pretrain_dual` (A1 + the secondary MLM head)."""
    order: int
    """Row order in the paper's tables (BL_BASE, BL_SMALL, MINIPOST, MINIJOINT)."""

    @property
    def adapts_over(self) -> str:
        """The stage whose final/ Step 2 starts from."""
        return "build_mini" if self.mini else "pretrain"

    def adapted_layers(self, model, mini) -> int:
        """Layers of the model Step 2 runs through, from the primary model's config (`model`) and Step 1b's
        `mini` config: the secondary head's layer N, N + the new layers, or the whole primary model."""
        if self.mini == "extract":
            return model.secondary_head_layer
        if self.mini == "build":
            return mini.layers + mini.new_layers
        return model.num_layers


SYSTEMS: dict[str, System] = {s.name: s for s in (
    System("bl_base", "BL_BASE", primary="bl_base", mini=None, step1="pretrain", order=0),
    System("bl_small", "BL_SMALL", primary="bl_small", mini=None, step1="pretrain", order=1),
    System("minijoint", "MINIJOINT", primary="minijoint", mini="extract", step1="pretrain_dual", order=3),
    System("minipost", "MINIPOST", primary="bl_base", mini="build", step1="pretrain", order=2),
)}

REFERENCE = "bl_base"
"""The system that defines near-maximal performance (§4.2)."""

MINI_SYSTEMS = tuple(s.name for s in SYSTEMS.values() if s.mini)
