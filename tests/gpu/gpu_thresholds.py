"""The paper-shape update's throughput floor and memory ceiling (tests/gpu/test_gpu.py, `test_paper_shape_update`):
arithmetic only, checked on CPU with known numbers (tests/test_gpu_checks.py).

The update is Step 1 of BL_BASE or MINIJOINT as `mm-ds run paper` runs it on a 4 x 8 cluster, on one GPU: the paper
presets (12 layers, h 768, V 50k, 512 tokens, bf16 under ZeRO 1: BF16_Optimizer, gradients accumulated in fp32),
32 sequences per micro-step and 2 micro-steps per update (2048 sequences over 32 GPUs).

Throughput floor. `mm-ds plan`'s model (mm_ds/tools/plan/model.py `plan_stages`) gives the update's step time on one
GPU: the paper's FLOPs (A1; A1 + the secondary head for MINIJOINT) over the GPU's dense bf16 peak
(mm_ds/runtime/training/peaks.py) at the plan's MFU assumption (0.45; one GPU: no communication). The floor is half the
planned tokens/s (`FLOOR`), i.e. MFU 0.225:
- the defects this test exists for cost about 2x or more: a host wait per micro-step (DeepSpeed's throughput timer
  drains the queue at every forward and step), attention served by the math fallback, fp32 where bf16 was meant,
  batches built on the training thread; `0 < mfu < 1` caught none of them;
- below half the plan's rate the plan's hours, GPU-hours and USD are off by 2x or more: a budget must not
  miss that, even if no code is at fault (then `mm-ds plan --mfu` must change, and the summary says so);
- a floor nearer the plan would fail a correct GPU that runs somewhat under 0.45 (a 125M-parameter model keeps
  an H100 less busy than the large models MFU figures are usually quoted for); the measured MFU is printed, so
  a run between the floor and the plan is visible without failing.
A GPU missing from peaks.py has no plan: its floor is skipped with the reason (its memory is still checked).

Memory ceiling. `torch.cuda.max_memory_allocated` over the update (warm-up included: Adam's moments appear at the
first step) against an estimate from the model's own shapes:
- states: per trainable parameter 20 bytes (bf16 weight and gradient, fp32 gradient accumulator, fp32 master
  weight, Adam's two fp32 moments; ZeRO 1 on one GPU keeps them all), 2 per frozen one;
- activations: 34 s b h bytes per layer (Korthikanti et al. 2022, 16-bit activations, without the 5 a s^2 b of
  the attention scores and their dropout mask, which a fused SDPA kernel does not keep) and ~5 s b h for the
  embeddings;
- heads: each MLM head's logits at the masked positions (b x max_masked of `MLMBatches`, x V): bf16 logits, the
  fp32 log-softmax cross-entropy keeps, and its fp32 gradient (10 bytes each).
The ceiling is 1.5x that (`MEMORY_MARGIN`): room for what the estimate leaves out (allocator rounding, cuBLAS
workspaces, the loss's and the optimizer step's temporaries), while keeping (B, heads, T, T) scores per layer (the
math fallback: +5 a s^2 b, +6 GB at BL_BASE's shape, ~70%) or activations in fp32 (~2x) lands above it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from mm_ds.tools.plan.model import Cluster

PLAN_MFU = Cluster().mfu  # `mm-ds plan`'s default assumption
FLOOR = 0.5
MEMORY_MARGIN = 1.5
MICRO_BATCH, GRAD_ACCUM = 32, 2
SYSTEMS = ("bl_base", "minijoint")  # their paper presets: paper/bl_base, paper/minijoint


@dataclass(frozen=True)
class PaperUpdate:
    system: str
    """The paper's name (BL_BASE, MINIJOINT)."""
    config: str
    """Its Step-1 preset (paper/bl_base, paper/minijoint)."""
    micro_batch: int
    grad_accum: int
    seq_len: int
    flops: float
    """Of one update: the paper's formula for the stage (mm_ds/model/flops.py)."""
    peak_tflops: float
    """The GPU's dense bf16 peak; NaN for a GPU not in mm_ds/runtime/training/peaks.py."""
    planned_step_s: float
    """`mm-ds plan`'s step time for the update on that GPU (NaN without a peak)."""
    memory: dict

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.grad_accum * self.seq_len

    @property
    def planned_tokens_per_s(self) -> float:
        return self.tokens / self.planned_step_s

    @property
    def floor_tokens_per_s(self) -> float:
        return FLOOR * self.planned_tokens_per_s

    def mfu(self, step_s: float) -> float:
        return self.flops / step_s / (self.peak_tflops * 1e12)


def max_masked(seq_len: int, mask_prob: float) -> int:
    """Masked positions per sequence the model's heads run on (as `MLMBatches.max_masked`)."""
    return min(int(mask_prob * (seq_len - 1)) + 1, seq_len - 1)


def memory_estimate(formula: str, hidden: int, vocab: int, layers: int, seq_len: int, mask_prob: float,
                    micro_batch: int, secondary_heads: int = 0) -> dict:
    """Bytes one GPU holds for the update (module docstring): states, activations, heads; their sum and the
    ceiling."""
    from mm_ds.tools.plan.model import stage_params

    pc = stage_params(formula, hidden, vocab, layers, seq_len, secondary_heads=max(1, secondary_heads))
    states = 20 * pc.trainable + 2 * (pc.total - pc.trainable)
    sbh = seq_len * micro_batch * hidden
    activations = 34 * sbh * layers + 5 * sbh
    heads = (1 + secondary_heads) * micro_batch * max_masked(seq_len, mask_prob) * vocab * 10
    estimate = states + activations + heads
    return {"states": states, "activations": activations, "heads": heads, "estimate": estimate,
            "ceiling": MEMORY_MARGIN * estimate}


def paper_update(system: str, gpu_name: str, micro_batch: int = MICRO_BATCH, grad_accum: int = GRAD_ACCUM
                 ) -> PaperUpdate:
    """The update of `system` (bl_base or minijoint) at the paper's shape on the GPU torch calls `gpu_name`."""
    from mm_ds.pipeline.costs import recipe_costs
    from mm_ds.pipeline.recipe import load_recipe
    from mm_ds.runtime.training.peaks import gpu_peak_tflops
    from mm_ds.tools.plan.model import plan_stages

    cost = next(c for c in recipe_costs(load_recipe("paper"), systems=[system]) if c.step == "step1")
    cost = replace(cost, global_batch=micro_batch * grad_accum)
    peak = gpu_peak_tflops(gpu_name, half=True)
    step_s = math.nan
    if peak == peak:
        one_gpu = Cluster(nodes=1, gpus_per_node=1, peak_tflops=peak, micro_batch=micro_batch)
        step_s = plan_stages([cost], one_gpu)[0].step_s
    secondary = cost.secondary_heads if cost.formula == "pretrain_secondary" else 0
    memory = memory_estimate(cost.formula, cost.hidden, cost.vocab, cost.layers, cost.seq_len, cost.mask_prob,
                             micro_batch, secondary)
    return PaperUpdate(cost.system, f"paper/{system}", micro_batch, grad_accum, cost.seq_len,
                       cost.flops_per_step, peak, step_s, memory)
