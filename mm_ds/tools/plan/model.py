"""`mm-ds plan`'s model of a cluster (its module docstring says what it counts): parameter counts by the model's
own layout, the data-parallel collectives of each ZeRO stage and their bytes, and each stage's step time, hours,
GPU-hours and checkpoint sizes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...config import ModelConfig
from ...model.model import LANGUAGE_PARAMS, param_count, param_shapes
from ...model.surgery import minipost_trainable
from ...pipeline.costs import StageCost
from ...runtime.training.ds_config import reduction_dtype, split

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


# ---------------------------------------------------------------- parameter counts (mm_ds.model.model's layout)

PERSISTENCE = 100_000  # ZeRO-3 keeps smaller parameters whole (DeepSpeed's stage3_param_persistence_threshold)


@dataclass(frozen=True)
class ParamCount:
    total: int
    trainable: int
    persistent: int = 0  # of `total`, in parameters of at most PERSISTENCE elements


def stage_params(formula: str, h: int, V: int, layers: int, seq_len: int, trainable_layers: int | None = None,
                 ffn: int | None = None, secondary_heads: int = 1) -> ParamCount:
    """Parameters of a stage's model and those it trains, counted by the model's own layout (no model built)."""
    depths = list(range(1, secondary_heads + 1)) if formula == "pretrain_secondary" else None  # a head's size is N-free
    cfg = ModelConfig(vocab_size=V, hidden_size=h, num_layers=layers, ffn_size=ffn or 4 * h, max_positions=seq_len,
                      secondary_head_layer=depths)
    shapes = param_shapes(cfg)
    kept = (lambda k: not k.startswith("head.")) if formula == "finetune" else (lambda k: True)  # task head: negligible
    small = sum(math.prod(s) for k, s in shapes.items() if kept(k) and math.prod(s) <= PERSISTENCE)
    if formula in ("pretrain", "pretrain_secondary"):
        return ParamCount(param_count(cfg), param_count(cfg), small)
    if formula == "adapt":  # the language group: token embeddings + the output bias of the (one) head
        return ParamCount(param_count(cfg), param_count(cfg, lambda k: k in LANGUAGE_PARAMS), small)
    if formula == "build_mini":
        trainable = minipost_trainable(cfg, layers - (trainable_layers or 0))
        return ParamCount(param_count(cfg), param_count(cfg, trainable), small)
    if formula == "finetune":  # the body without the MLM head; token embeddings frozen
        body = param_count(cfg, kept)
        return ParamCount(body, body - param_count(cfg, lambda k: k == "embed.tokens.weight"), small)
    raise ValueError(f"unknown FLOPs formula {formula!r}")


# ---------------------------------------------------------------- the cluster and the plan

@dataclass(frozen=True)
class Cluster:
    nodes: int = 4
    gpus_per_node: int = 8
    peak_tflops: float = 989.0
    """Per GPU, in the training dtype (H100 SXM bf16 dense: 989)."""
    mfu: float = 0.45
    intra_gbps: float = 360.0
    """All-reduce bus bandwidth inside a node, GB/s per GPU (NVLink; nccl-tests busbw)."""
    inter_gbps: float = 45.0
    """All-reduce bus bandwidth across nodes, GB/s per GPU (e.g. one 400 Gb/s NIC per GPU)."""
    zero: int = 1
    dtype: str = "bf16"
    """Training dtype: weights in checkpoints and weights on the wire."""
    comm_dtype: str = ""
    """Gradients on the wire (communication_data_type); empty: as mm-ds resolves a config of `dtype`."""
    micro_batch: int | None = None
    """Sequences per GPU per forward pass, at most (ds_config.split); None: each stage's own (its config's)."""
    overlap: float = 0.0
    """Share of communication hidden behind compute (0..1)."""
    usd_per_gpu_hour: float | None = None

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def reduction_dtype(self) -> str:
        return self.comm_dtype or reduction_dtype({self.dtype: {"enabled": True}})

    @property
    def busbw(self) -> float:
        return (self.intra_gbps if self.nodes == 1 else self.inter_gbps) * 1e9

    def check(self) -> None:
        for name in ("nodes", "gpus_per_node", "micro_batch"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        for name in ("peak_tflops", "intra_gbps", "inter_gbps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if not 0 < self.mfu <= 1:
            raise ValueError(f"--mfu must lie in (0, 1], got {self.mfu}")
        if not 0 <= self.overlap <= 1:
            raise ValueError(f"--overlap must lie in [0, 1], got {self.overlap}")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"--zero must be 0, 1, 2 or 3, got {self.zero}")
        for name in ("dtype", "reduction_dtype"):
            if getattr(self, name) not in BYTES:
                flag = "--dtype" if name == "dtype" else "--comm-dtype"
                raise ValueError(f"{flag} must be one of {', '.join(BYTES)}, got {getattr(self, name)}")


RING = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
        "all_gather": lambda n: (n - 1) / n}
"""Bytes a GPU sends per byte of the whole tensor (all-gather: its output; reduce-scatter: its input) in NCCL's
ring algorithms: nccl-tests' busbw factors."""


def collectives_per_step(zero: int, trainable: int, total: int, grad_accum: int, persistent: int = 0
                         ) -> list[tuple[str, str, int]]:
    """(collective, "grad" or "param", elements of the whole tensors) of one update on every rank: see the
    module docstring. ZeRO-1 sends the same under BF16_Optimizer (bf16) and the ZeRO optimizer (fp32, fp16)."""
    grads = trainable * (grad_accum if zero >= 2 else 1)
    if zero < 3:
        return [("all_reduce", "grad", grads)] + ([("all_gather", "param", trainable)] if zero else [])
    return [("reduce_scatter", "grad", grads), ("all_gather", "param", grad_accum * (total - persistent) + persistent)]


def comm_bytes_per_step(zero: int, n: int, trainable: int, total: int, grad_accum: int, dtype: str,
                        comm_dtype: str | None = None, persistent: int = 0) -> float:
    """Bytes each GPU sends per optimizer step for data parallelism (what it receives is the same): gradients in
    `comm_dtype` (default: as mm-ds resolves a `dtype` config), weights in `dtype`."""
    if n == 1:
        return 0.0
    size = {"grad": BYTES[comm_dtype or reduction_dtype({dtype: {"enabled": True}})], "param": BYTES[dtype]}
    return sum(RING[op](n) * elements * size[kind]
               for op, kind, elements in collectives_per_step(zero, trainable, total, grad_accum, persistent))


@dataclass(frozen=True)
class StagePlan:
    system: str
    step: str
    formula: str
    layers: int
    steps: int
    global_batch: int
    micro_batch: int
    grad_accum: int
    params: int
    trainable: int
    flops_per_step: float
    compute_s: float
    comm_bytes: float
    comm_s: float
    step_s: float
    hours: float
    gpu_hours: float
    usd: float | None
    ckpt_bytes: float
    final_bytes: float
    checkpoints: int


def plan_stages(costs: list[StageCost], cluster: Cluster) -> list[StagePlan]:
    cluster.check()
    rows = []
    for cost in costs:
        B, s = cost.global_batch, cost.seq_len
        n = cluster.gpus
        micro = cluster.micro_batch or cost.micro_batch
        if not micro:
            raise ValueError(f"{cost.system} {cost.step}: its config sets no micro batch; give --micro-batch")
        geo = split(B, micro, n)
        if geo is None:
            raise ValueError(f"{cost.system} {cost.step}: global batch {B} is not divisible by micro batch "
                             f"{micro} x {n} GPUs; change --micro-batch or the cluster size")
        pc = stage_params(cost.formula, cost.hidden, cost.vocab, cost.layers, s, cost.trainable_layers,
                          secondary_heads=cost.secondary_heads)
        compute = cost.flops_per_step / (n * cluster.peak_tflops * 1e12 * cluster.mfu)
        vol = comm_bytes_per_step(cluster.zero, n, pc.trainable, pc.total, geo.grad_accum, cluster.dtype,
                                  cluster.reduction_dtype, pc.persistent)
        comm = vol / cluster.busbw
        step = compute + (1 - cluster.overlap) * comm
        hours = step * cost.steps / 3600
        gpu_hours = hours * n
        w = BYTES[cluster.dtype]
        rows.append(StagePlan(
            cost.system, cost.step, cost.formula, cost.layers, cost.steps, B, geo.micro_batch, geo.grad_accum,
            pc.total, pc.trainable,
            cost.flops_per_step, compute, vol, comm, step, hours, gpu_hours,
            gpu_hours * cluster.usd_per_gpu_hour if cluster.usd_per_gpu_hour else None,
            pc.total * w + pc.trainable * 12, pc.total * 4, cost.checkpoints))
    return rows
