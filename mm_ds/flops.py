"""The paper's analytic training FLOPs (appendix A.1), V100-days and MFU.

Symbols follow the paper: h hidden size, V vocabulary size, l layers, s sequence length, p mask probability,
B global batch (sequences), U updates, l_t trainable layers. Everything is plain numbers, so the training loop,
`mm-ds flops` and the report can use it without building a model.

Like the paper (after Narayanan et al. 2021) we count matrix multiplies only: no biases, activations, softmax,
layer norms, optimizer step or embedding lookups, and no activation recomputation.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field, replace

EXA = 1e18
V100_FLOPS_PER_S = 30e12  # the paper's assumed sustained V100 throughput (§3)
V100_DAY_FLOPS = V100_FLOPS_PER_S * 86_400  # = 2.592 EFLOPs, the paper's "1 V100 day"


# --- Building blocks of the derivation (per sequence, forward pass) -----------------------------------------

def flop_layer(s: float, h: float) -> float:
    """One transformer layer: Q,K,V,O projections 8sh², QKᵀ and ·V 4hs², FFN h→4h→h 16sh²."""
    return 24 * s * h**2 + 4 * h * s**2


def flop_outproj(s: float, h: float, V: float) -> float:
    """The MLM head's output projection h→V over all s positions (tied to the input embeddings)."""
    return 2 * s * h * V


def flop_lm(s: float, h: float, V: float, p: float) -> float:
    """The MLM head (dense h→h + output projection), applied to the masked fraction p of positions only."""
    return p * (2 * s * h**2 + flop_outproj(s, h, V))


def forward_flops(s: float, h: float, V: float, l: float, p: float) -> float:
    """(A2) One forward pass of an l-layer RoBERTa MLM on one sequence."""
    return l * flop_layer(s, h) + flop_lm(s, h, V, p)


# --- Whole-stage costs: U updates of B sequences ----------------------------------------------------------------

def pretrain_flops(h, V, l, s, p, B, U) -> float:
    """(A1) Full pretraining: backward = 2× forward, so 3·UB·(l·FLOP_layer + FLOP_lm)
    = 72UBslh²(1 + s/6h + p/12l + pV/12hl)."""
    return 3 * U * B * forward_flops(s, h, V, l, p)


def pretrain_dual_flops(h, V, l, s, p, B, U) -> float:
    """MINIJOINT Step 1: A1 plus the second MLM head (at layer N) forward and backward, 3·UB·FLOP_lm.
    Its cost does not depend on N: the head's input is always (s, h)."""
    return pretrain_flops(h, V, l, s, p, B, U) + 3 * U * B * flop_lm(s, h, V, p)


def adapt_flops(h, V, l, s, p, B, U) -> float:
    """(A3) Step 2, new embeddings over a frozen body: forward + ∂/∂activations through everything (2×),
    plus ∂/∂weights of the trainable tied output projection on masked positions (p·FLOP_outproj)
    = 48UBslh²(1 + s/6h + p/12l + pV/8hl)."""
    return U * B * (2 * l * flop_layer(s, h) + 2 * flop_lm(s, h, V, p) + p * flop_outproj(s, h, V))


def build_mini_flops(h, V, l, s, p, B, U, l_t) -> float:
    """(A4) MINIPOST Step 1b: l = all layers of the mini-model (N frozen + l_t new). Forward through l layers,
    ∂/∂activations of the frozen head (2·FLOP_lm), and both gradients of the trainable layers except the lowest
    one, which passes no error down: (2·l_t − 1)·FLOP_layer."""
    if not 0 < l_t <= l:
        raise ValueError(f"build_mini needs 0 < trainable_layers <= layers, got trainable_layers={l_t}, layers={l}")
    return U * B * ((l + 2 * l_t - 1) * flop_layer(s, h) + 2 * flop_lm(s, h, V, p))


def finetune_flops(h, l, s, B, U) -> float:
    """Step 3, full finetuning: 3× the forward of l layers, no MLM head (the task head is negligible).
    An extension: the paper counts Step 2 only and gives no formula for this."""
    return 3 * U * B * l * flop_layer(s, h)


STAGE_KINDS = ("pretrain", "pretrain_dual", "build_mini", "adapt", "finetune")


def stage_flops_per_step(kind: str, *, hidden: int, vocab: int, layers: int, seq_len: int, mask_prob: float,
                         global_batch: int, trainable_layers: int | None = None) -> float:
    """FLOPs of one optimizer update of a stage; the training loop divides by step time for achieved FLOP/s."""
    h, V, l, s, p, B = hidden, vocab, layers, seq_len, mask_prob, global_batch
    if kind == "pretrain":
        return pretrain_flops(h, V, l, s, p, B, 1)
    if kind == "pretrain_dual":
        return pretrain_dual_flops(h, V, l, s, p, B, 1)
    if kind == "adapt":
        return adapt_flops(h, V, l, s, p, B, 1)
    if kind == "build_mini":
        if trainable_layers is None:
            raise ValueError("stage kind 'build_mini' needs trainable_layers (the new layers on top of the frozen N)")
        return build_mini_flops(h, V, l, s, p, B, 1, trainable_layers)
    if kind == "finetune":
        return finetune_flops(h, l, s, B, 1)
    raise ValueError(f"unknown stage kind {kind!r}; expected one of {', '.join(STAGE_KINDS)}")


def to_v100_days(flops: float) -> float:
    return flops / V100_DAY_FLOPS


def mfu(achieved_flops_per_s: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation: achieved analytic FLOP/s over the hardware peak (e.g. 312e12 for A100 bf16)."""
    if peak_flops_per_s <= 0:
        raise ValueError(f"peak FLOP/s must be positive, got {peak_flops_per_s}")
    return achieved_flops_per_s / peak_flops_per_s


# --- Recipes: which stages each system runs --------------------------------------------------------------------

@dataclass(frozen=True)
class Geometry:
    """Recipe-wide shape and schedule; a stage may override steps, global_batch or seq_len."""
    hidden: int = 768
    vocab: int = 50_000
    seq_len: int = 512
    mask_prob: float = 0.15
    global_batch: int = 2048
    steps: int = 125_000


@dataclass(frozen=True)
class Stage:
    name: str  # the paper's step: "step1", "step1b", "step2", "step3"
    kind: str  # one of STAGE_KINDS
    layers: int  # layers the stage runs through (for build_mini: the whole mini-model, N + trainable)
    trainable_layers: int | None = None  # build_mini only
    steps: int | None = None  # None: the recipe's
    global_batch: int | None = None
    seq_len: int | None = None


@dataclass(frozen=True)
class Recipe:
    geometry: Geometry = field(default_factory=Geometry)
    systems: dict[str, tuple[Stage, ...]] = field(default_factory=dict)


# §3: N = 4; MINIPOST's mini-model is the bottom 4 layers + 2 new ones. Only Step 2 enters Table 2.
PAPER_RECIPE = Recipe(systems={
    "BL_BASE": (Stage("step1", "pretrain", 12), Stage("step2", "adapt", 12)),
    "BL_SMALL": (Stage("step1", "pretrain", 4), Stage("step2", "adapt", 4)),
    "MINIJOINT": (Stage("step1", "pretrain_dual", 12), Stage("step2", "adapt", 4)),
    "MINIPOST": (Stage("step1", "pretrain", 12), Stage("step1b", "build_mini", 6, trainable_layers=2),
                 Stage("step2", "adapt", 6)),
})


def recipe_from_dict(d: dict) -> Recipe:
    """{"geometry": {...Geometry fields}, "systems": {name: [{...Stage fields}, ...]}} -> Recipe."""
    unknown = set(d) - {"geometry", "systems"}
    if unknown:
        raise ValueError(f"recipe has unknown keys {sorted(unknown)}; expected 'geometry' and 'systems'")
    systems = {}
    for name, stages in d.get("systems", {}).items():
        try:
            systems[name] = tuple(Stage(**st) for st in stages)
        except TypeError as e:
            raise ValueError(f"recipe system {name!r}: bad stage fields ({e})") from None
        for st in systems[name]:
            if st.kind not in STAGE_KINDS:
                raise ValueError(f"recipe system {name!r} stage {st.name!r}: unknown kind {st.kind!r}; "
                                 f"expected one of {', '.join(STAGE_KINDS)}")
    try:
        geometry = Geometry(**d.get("geometry", {}))
    except TypeError as e:
        raise ValueError(f"recipe geometry: {e}") from None
    return Recipe(geometry, systems)


@dataclass(frozen=True)
class StageCost:
    system: str
    stage: str
    kind: str
    layers: int
    trainable_layers: int | None
    steps: int
    global_batch: int
    seq_len: int
    flops_per_step: float
    flops: float
    v100_days: float


def recipe_costs(recipe: Recipe) -> list[StageCost]:
    g = recipe.geometry
    rows = []
    for system, stages in recipe.systems.items():
        for st in stages:
            steps = st.steps if st.steps is not None else g.steps
            batch = st.global_batch if st.global_batch is not None else g.global_batch
            seq = st.seq_len if st.seq_len is not None else g.seq_len
            per_step = stage_flops_per_step(st.kind, hidden=g.hidden, vocab=g.vocab, layers=st.layers, seq_len=seq,
                                            mask_prob=g.mask_prob, global_batch=batch,
                                            trainable_layers=st.trainable_layers)
            rows.append(StageCost(system, st.name, st.kind, st.layers, st.trainable_layers, steps, batch, seq,
                                  per_step, per_step * steps, to_v100_days(per_step * steps)))
    return rows


def format_costs(rows: list[StageCost]) -> str:
    head = "| system | stage | kind | layers | trainable | steps | batch | seq | EFLOPs | V100-days |"
    lines = [head, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.system} | {r.stage} | {r.kind} | {r.layers} | {r.trainable_layers or ''} | "
                     f"{r.steps:,} | {r.global_batch} | {r.seq_len} | {r.flops / EXA:.3g} | {r.v100_days:.3g} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mm-ds flops", description="Analytic training cost of every stage of a recipe "
                                 "(paper appendix A.1; 1 V100-day = 2.592 EFLOPs). Table 2 counts step2 only.")
    ap.add_argument("--recipe", help="an `mm-ds run` recipe (tiny, quick, paper, or a YAML file), or a JSON "
                    "{geometry: {...}, systems: {name: [stage, ...]}}; default: the paper's four systems")
    ap.add_argument("--system", action="append", help="only this system (repeatable)")
    ap.add_argument("--steps", type=int, help="updates per stage (paper: 125000)")
    ap.add_argument("--batch", type=int, help="global batch in sequences (paper: 2048)")
    ap.add_argument("--seq", type=int, help="sequence length (paper: 512)")
    ap.add_argument("--hidden", type=int, help="hidden size (paper: 768)")
    ap.add_argument("--vocab", type=int, help="vocabulary size (paper: 50000)")
    ap.add_argument("--mask-prob", type=float, help="MLM mask probability (paper: 0.15)")
    ap.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    args = ap.parse_args(argv)

    try:
        if args.recipe and args.recipe.endswith(".json"):
            with open(args.recipe) as f:
                recipe = recipe_from_dict(json.load(f))
        elif args.recipe:  # an `mm-ds run` recipe: packaged name or YAML file
            from .pipeline import flops_recipe, load_recipe
            recipe = flops_recipe(load_recipe(args.recipe))
        else:
            recipe = PAPER_RECIPE
        overrides = {k: v for k, v in dict(steps=args.steps, global_batch=args.batch, seq_len=args.seq,
                                           hidden=args.hidden, vocab=args.vocab, mask_prob=args.mask_prob).items()
                     if v is not None}
        recipe = replace(recipe, geometry=replace(recipe.geometry, **overrides))
        if args.system:
            missing = [s for s in args.system if s not in recipe.systems]
            if missing:
                raise ValueError(f"--system {', '.join(missing)} not in the recipe "
                                 f"(it has {', '.join(recipe.systems)})")
            recipe = replace(recipe, systems={s: recipe.systems[s] for s in args.system})
        rows = recipe_costs(recipe)
    except (OSError, ValueError) as e:  # ConfigError is a ValueError
        print(f"mm-ds flops: {e}", file=sys.stderr)
        return 2

    if args.json:
        print(json.dumps({"geometry": asdict(recipe.geometry), "stages": [asdict(r) for r in rows]}, indent=2))
    else:
        g = recipe.geometry
        print(f"h={g.hidden} V={g.vocab} p={g.mask_prob}; per stage: U steps, B sequences of s tokens")
        print(format_costs(rows))
        print("Table 2 and the speedups count step2 only (paid per new language); step1/step1b are paid once.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
