"""Typed run configuration: dataclasses with field docs, YAML/JSON presets, and `key=value` overrides.

Precedence: dataclass defaults, then the preset or `--config` file, then command-line overrides. The
DeepSpeed JSON (engine settings only) stays separate; both effective configs are written into every run
directory. Unknown keys and wrong types fail here, before any process group or engine exists.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from . import systems
from .coerce import ConfigError, check_numbers, did_you_mean, from_dict, numbers, to_dict  # noqa: F401  (re-exported)
from .config_files import (  # noqa: F401
    apply_overrides,
    deep_merge,
    dump_yaml,
    parse_override,
    preset_names,
    read_file,
    read_preset,
    recipe_names,
)
from .data.tasks import TASKS
from .systems import STAGES


@dataclass
class ModelConfig:
    """RoBERTa encoder with one or two MLM heads (paper §2, §3)."""

    vocab_size: int | None = None
    """Rows of the token embedding. None: taken from the stage's SentencePiece model."""
    hidden_size: int = 768
    """Width of every layer (d): embeddings, attention and residual stream."""
    num_layers: int = 12
    """Transformer layers (L): 12 for the paper's primary models, 4 for BL_SMALL."""
    num_heads: int = 12
    """Attention heads per layer; must divide hidden_size."""
    ffn_size: int = 3072
    """Inner width of each layer's feed-forward block (4 x hidden_size in RoBERTa)."""
    max_positions: int = 512
    """Longest sequence. The position table has 2 more rows: RoBERTa offsets positions past the pad id."""
    dropout: float = 0.1
    """Dropout on embeddings, attention probabilities and residual branches."""
    layer_norm_eps: float = 1e-5
    """Epsilon of every LayerNorm."""
    init_std: float = 0.02
    """Standard deviation of the normal initialisation of fresh weights."""
    secondary_head_layer: int | list[int] | None = None
    """MINIJOINT: attach a secondary MLM head after this many layers (paper N=4); an ascending list attaches one
    after each (multi-depth, §7: [1, 2, 4]; a 1-item list is the int). None: one head."""
    main_head_weight: float = 0.5
    """MINIJOINT's Step-1 loss: the main head's share; the secondary heads share the rest equally. 0.5 is the
    paper's mean of two heads, and keeps the main head at half with several secondary heads ([1, 2, 4]: 1/2, then
    1/6 each). The mean over all heads, which multi-depth runs used before this key (1/4 each), is 0.25 there."""

    def __post_init__(self):
        if isinstance(self.secondary_head_layer, (list, tuple)) and len(self.secondary_head_layer) <= 1:
            self.secondary_head_layer = self.secondary_head_layer[0] if self.secondary_head_layer else None

    @property
    def secondary_depths(self) -> tuple[int, ...]:
        """The layers after which a secondary head sits, ascending (empty: one head)."""
        n = self.secondary_head_layer
        return () if n is None else (n,) if isinstance(n, int) else tuple(n)

    def check(self) -> None:
        check_numbers(self, RANGES, "model")
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"model.hidden_size={self.hidden_size} is not divisible by "
                              f"model.num_heads={self.num_heads}; pick a head count that divides it")
        d = self.secondary_depths
        if d and not 1 <= min(d) <= max(d) <= self.num_layers:
            raise ConfigError(f"model.secondary_head_layer={self.secondary_head_layer} must be between 1 and "
                              f"model.num_layers={self.num_layers} (or null for a single head)")
        if list(d) != sorted(set(d)):
            raise ConfigError(f"model.secondary_head_layer={self.secondary_head_layer}: list the layers in "
                              f"ascending order, each once, e.g. [1, 2, 4]")


@dataclass
class DataConfig:
    """Where a stage's training text comes from and how it is cut into MLM samples."""

    corpus: str = ""
    """Directory written by `mm-ds prepare` (SentencePiece model + token shards)."""
    seq_len: int = 512
    """Tokens per MLM sample (at most model.max_positions)."""
    mask_prob: float = 0.15
    """Share of tokens selected for prediction (80% <mask>, 10% random, 10% unchanged)."""
    random_prob: float = 0.1
    """Share of the selected tokens replaced by a random piece."""
    keep_prob: float = 0.1
    """Share of the selected tokens left unchanged (the rest become <mask>)."""
    prefetch: int = 4
    """Micro-batches built ahead of training by a background thread (pinned on GPUs), so the device never waits
    for packing and masking; 0 builds each one when the loop needs it. The batches are the same either way."""


@dataclass
class TrainConfig:
    """The stage's schedule. Optimizer type and hyper-parameters (betas, eps, weight decay), ZeRO, precision
    and clipping live in the DeepSpeed JSON; the schedule is written into it so there is one source of truth."""

    steps: int = 125_000
    """Optimizer updates (global steps)."""
    lr: float = 7e-4
    """Peak learning rate."""
    warmup_steps: int = 10_000
    """Linear warm-up to `lr`, then linear decay to 0 at `steps`."""
    global_batch: int | None = None
    """Sequences per update (micro_batch x gradient accumulation x world size). None: the DeepSpeed JSON's."""
    micro_batch: int | None = None
    """Sequences per rank per forward pass, at most: where a rank's share of the global batch is smaller, that share
    in one micro-step (ds_config.split). None: the DeepSpeed JSON's."""
    seed: int = 0
    """Seed of initialisation, MLM masking and example order (the finetuning seed in Step 3)."""
    checkpoint_steps: list[int] = field(default_factory=lambda: [1000, 2000, 3000, 4000])
    """Explicit checkpoint steps, in addition to every `checkpoint_every` steps and the last step."""
    checkpoint_every: int = 5000
    """Checkpoint every this many updates (and at `checkpoint_steps` and the last)."""
    log_every: int = 10
    """Updates between lines of logs/train.jsonl (and the monitors)."""
    max_nonfinite_steps: int = 10
    """Updates with a non-finite loss or gradients that are skipped (not applied, counted, resumed with the
    run) before training stops with a diagnostic. 0: stop at the first. fp16 loss-scale skips do not count."""
    tf32: bool = True
    """fp32 engine configs on NVIDIA GPUs (fp32_zero1_gpu): matmuls in TF32 (10-bit mantissa, fp32 range; Ampere
    and newer, ~8x the fp32 rate), the rate mm_ds/runtime/training/peaks.py's fp32 MFU column assumes. false: full fp32.
    No effect in bf16/fp16 or on CPU."""
    resume_every_minutes: float = 0.0
    """Minutes between `resume` checkpoints, apart from the curve ones above (rank 0's clock decides; 0: off)."""
    resume_every: int = 0
    """Updates between `resume` checkpoints (0: off). Of these and stops' checkpoints the newest `keep_resume` stay."""
    keep_resume: int = 1
    """Resume checkpoints kept; an older one is removed once a newer one verified. Curve checkpoints always stay."""
    stop_signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGINT", "SIGUSR1"])
    """Signals that stop training after a checkpoint, exit code 75 (docs/reliability.md)."""
    stop_grace_s: float = 20.0
    """Seconds from a stop signal to exit (below DeepSpeed's and SLURM's 30 s): the save is skipped if the last one
    took longer than what is left."""
    compile: bool = False
    """torch.compile the model after deepspeed.initialize (mm_ds/runtime/training/compiled.py): one graph per shape,
    compiled at the first updates (its time reported, left out of tokens_per_s). ZeRO 0-2 only. Off until a GPU has
    measured it (`make test-gpu` records compiled against eager)."""
    compile_backend: str = "inductor"
    """With train.compile: inductor (generated kernels), or aot_eager (the same graphs run by eager kernels:
    compiles in seconds; tests, and telling a compiler fault from a model's)."""

    def is_checkpoint_step(self, step: int) -> bool:
        """The checkpoint schedule: `checkpoint_steps`, every `checkpoint_every` updates, and the last one."""
        return step == self.steps or step in self.checkpoint_steps or bool(
            self.checkpoint_every and step % self.checkpoint_every == 0)

    def checkpoints(self) -> int:
        """How many engine checkpoints a run of `steps` updates writes (`is_checkpoint_step`, counted without
        walking the steps: plans count hundreds of 125k-update runs)."""
        every = max(self.checkpoint_every, 0)
        others = {s for s in (*self.checkpoint_steps, self.steps)
                  if 1 <= s <= self.steps and not (every and s % every == 0)}
        return (self.steps // every if every else 0) + len(others) if self.steps >= 1 else 0


@dataclass
class MiniConfig:
    """How a mini-model is cut from its primary model (paper §2.2)."""

    layers: int = 4
    """N: bottom layers shared with the primary model (MINIJOINT's secondary head sits after layer N)."""
    new_layers: int = 2
    """MINIPOST: freshly initialised layers trained on top of the frozen N (Step 1b)."""
    depth_shares: list[float] = field(default_factory=list)
    """Multi-depth Step 2 (§7): relative share of the updates at each depth, shallowest first (e.g. [1, 1, 2]);
    0 skips a depth. Empty: equal shares."""
    plateau_window: int = 0
    """Multi-depth Step 2: > 0 moves to the next depth when the target MLM loss has not improved by
    `plateau_delta` over the last this many updates (instead of fixed shares). 0: fixed shares."""
    plateau_delta: float = 0.0
    """The improvement of the target MLM loss that counts, for `plateau_window`."""

    def check(self) -> None:
        check_numbers(self, RANGES, "mini")
        if self.depth_shares and not sum(self.depth_shares) > 0:
            raise ConfigError(f"mini.depth_shares={self.depth_shares}: shares must be >= 0 with a positive sum")
        if self.plateau_window and self.depth_shares:
            raise ConfigError("mini.depth_shares and mini.plateau_window both set: Step 2 switches depth by fixed "
                              "shares or on a plateau, not both; drop one")


@dataclass
class FinetuneConfig:
    """Step 3 on an English task. Unset values come from the task table (mm_ds.data.tasks.TASKS)."""

    task: str = ""
    """xnli | pawsx | mlqa | xquad"""
    data_root: str = ""
    """Directory holding the task files in their official layout (the generated world, or real data), or `hub`:
    the Hugging Face hub through `datasets` (needs a network or a populated datasets cache)."""
    epochs: float | None = None
    """Passes over the English training set; they set train.steps."""
    lr: float | None = None
    """Peak learning rate (replaces train.lr)."""
    warmup_ratio: float | None = None
    """Share of the updates spent warming up (sets train.warmup_steps)."""
    max_length: int | None = None
    """Tokens per example (capped at the parent's max_positions)."""
    max_train_examples: int | None = None
    """Use only the first N English training examples (quick runs)."""


@dataclass
class LaunchConfig:
    """How `mm-ds <stage>` starts its ranks when it is not already running under a launcher."""

    ranks: int = 1
    """Processes per node (CPU ranks or GPUs on each node). World size = nodes x ranks."""
    launcher: str = "deepspeed"
    """deepspeed | mpirun | srun (inside a SLURM allocation) | none (run in this process; needs ranks=1)."""
    master_port: int = 29500
    """Rank 0's rendezvous port; `--check` does not check that it is free."""
    master_addr: str = ""
    """Rank 0's address, which every node can reach (never loopback on several nodes: refused). Empty: 127.0.0.1
    on one node; on several, the hostfile's first host under `deepspeed` (every node resolves it itself), else
    found at start (mpirun: rank 0's `hostname -I`; srun: the allocation's first node)."""
    nodes: int | None = None
    """Nodes to run on: the first N hosts of `hostfile` (deepspeed, mpirun) or of the allocation (srun). None: every
    host of the hostfile, else 1 (resolved once, before launch: mm_ds/runtime/distributed/launch.py `resolve`)."""
    hostfile: str = ""
    """`HOST slots=N` per line (mm_ds/runtime/distributed/hostfile.py), for several nodes under deepspeed or mpirun.
    Read on the machine that starts the launch only."""
    ds_launcher: str = "pdsh"
    """How `deepspeed` reaches the other nodes, one of DeepSpeed's runners: pdsh | openmpi | mvapich | slurm | mpich |
    impi (what each needs: mm_ds/runtime/distributed/runners.py)."""
    node_rank: int | None = None
    """deepspeed without ssh: start only this node's ranks (`--no_ssh --node_rank`); run the same
    command on every node with its own node_rank."""
    spread: int = 1
    """`mm-ds run` only: split the hostfile's nodes into this many groups, each running one of a step's independent
    stage runs at a time (Step 2's languages and systems), side by side (mm_ds/pipeline/spread.py). 1: every run on
    every node, one after another. Stage commands ignore it."""
    run_here: bool = False
    """deepspeed with a hostfile on one node runs the ranks on the machine it is started on, not on the hostfile's
    host: refused unless this machine is that host, or this is true."""
    force_multi: bool = False
    """deepspeed starts even one node through its runner (pdsh, ...; DeepSpeed's --force_multi), on the hostfile's
    host: what `mm-ds run` gives a side-by-side group of one node that is not this machine (launch.spread)."""
    rendezvous_timeout_s: int = 300
    """Seconds the ranks wait for one another at start (rank 0's store, then every rank in it): when a node's
    ranks never start (its environment missing, an import error), the others stop then, naming them."""
    collective_timeout_s: int = 1800
    """Seconds a collective may wait for the other ranks before the process group gives up (torch's default)."""

    @property
    def world_size(self) -> int:
        if self.launcher == "none":
            return 1
        if self.nodes is None and self.hostfile:  # a defect of the caller, not of the input
            raise ValueError("launch.nodes is unresolved: mm_ds.runtime.distributed.launch.resolve sets it from the hostfile")
        return (self.nodes or 1) * self.ranks

    def check(self) -> None:
        if self.launcher not in ("deepspeed", "mpirun", "srun", "none"):
            raise ConfigError(f"launch.launcher={self.launcher!r}: use deepspeed, mpirun, srun or none")
        check_numbers(self, RANGES, "launch")
        nodes = self.nodes if self.nodes is not None or self.hostfile else 1  # None: the hostfile's, not read here
        if self.node_rank is not None and nodes is not None and not 0 <= self.node_rank < nodes:
            raise ConfigError(f"launch.node_rank={self.node_rank} must lie in [0, launch.nodes={self.nodes})")


@dataclass
class MonitorConfig:
    """Training metrics to DeepSpeed's monitors, besides logs/train.jsonl, without editing the engine JSON.
    Each writes under RUN/logs. A monitor block of the engine JSON wins over these (its keys are kept). Rank 0
    writes log rows to them from a thread of its own, never from the training loop (mm_ds/runtime/training/train_log.py)."""

    csv: bool = False
    """CSV files, one per metric, under RUN/logs/STAGE (DeepSpeed's csv_monitor). Off by default: logs/train.jsonl
    holds the same rows in one file."""
    tensorboard: bool = False
    """TensorBoard event files under RUN/logs/STAGE (needs the `tensorboard` package: the [monitor] extra)."""
    wandb: bool = False
    """Weights & Biases (needs `wandb`: the [monitor] extra); its files under RUN/logs. WANDB_MODE=offline
    logs without an account."""
    wandb_project: str = "mm-ds"
    """W&B project the runs go to."""
    wandb_group: str = ""
    """W&B group, e.g. one per experiment, so its stages' runs show together. Empty: none."""


@dataclass
class RunConfig:
    """One stage of one system: what trains, on which data, starting from which parent checkpoint."""

    stage: str = "pretrain"
    """pretrain | build_mini | adapt | finetune"""
    system: str = "bl_base"
    """bl_base | bl_small | minijoint | minipost"""
    lang: str = "en"
    """Language of the stage's corpus: the source language, or Step 2's target language."""
    parent: str = ""
    """Run directory (or its final/) this stage starts from: build_mini, adapt and finetune need one."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    mini: MiniConfig = field(default_factory=MiniConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    ds_config: str = "fp32_zero1.json"
    """DeepSpeed engine JSON: a file path, or a name in the packaged ds_configs/."""
    peak_tflops: float | None = None
    """Peak of one rank's device for MFU in logs (MFU = achieved FLOP/s over peak x world size). None: the
    device's known bf16 peak on GPU, the measured matmul peak of a rank's threads on CPU."""

    def check(self) -> None:
        if self.stage not in STAGES:
            raise ConfigError(f"stage={self.stage!r} is not one of {', '.join(STAGES)}"
                              f"{did_you_mean(self.stage, STAGES)}")
        try:
            row = systems.system_of(self.system)
        except systems.SystemNameError as e:
            raise ConfigError(str(e)) from None
        if problem := row.depth_mismatch(self):
            raise ConfigError(problem)
        if self.finetune.task and self.finetune.task not in TASKS:
            raise ConfigError(f"finetune.task={self.finetune.task!r} is not a task"
                              f"{did_you_mean(self.finetune.task, TASKS)}; choose one of {', '.join(TASKS)}")
        if self.stage != "pretrain" and not self.parent:
            raise ConfigError(f"stage {self.stage} starts from a parent checkpoint: set parent=RUN_DIR")
        check_numbers(self, RANGES)  # every section's, before the checks that combine them
        self.model.check()
        self.mini.check()
        t, d = self.train, self.data
        if not 0 <= t.warmup_steps <= t.steps:
            raise ConfigError(f"train.warmup_steps={t.warmup_steps} must lie in [0, train.steps={t.steps}]")
        if bad := [n for n in t.stop_signals if not str(n).startswith("SIG") or n in ("SIGKILL", "SIGSTOP")
                   or not isinstance(getattr(signal, n, None), signal.Signals)]:
            raise ConfigError(f"train.stop_signals: {bad} are not signals a process can handle; e.g. [SIGTERM, SIGUSR1]")
        if d.seq_len > self.model.max_positions:
            raise ConfigError(f"data.seq_len={d.seq_len} exceeds model.max_positions="
                              f"{self.model.max_positions}; lower data.seq_len or raise model.max_positions")
        if d.random_prob + d.keep_prob > 1:
            raise ConfigError(f"data.random_prob={d.random_prob} and data.keep_prob={d.keep_prob} are shares of "
                              f"the selected tokens: their sum must be at most 1")
        self.launch.check()


RANGES = {
    # key: the interval its values lie in (each item, for a list). Every number of a config is also finite. A
    # new numeric key needs a row (tests/test_config.py); checks that combine keys stay in the check() methods.
    "model.vocab_size": "[8, inf)", "model.hidden_size": "[1, inf)", "model.num_layers": "[1, inf)",
    "model.num_heads": "[1, inf)", "model.ffn_size": "[1, inf)", "model.max_positions": "[1, inf)",
    "model.dropout": "[0, 1)", "model.layer_norm_eps": "(0, 1)", "model.init_std": "(0, inf)",
    "model.secondary_head_layer": "[1, inf)", "model.main_head_weight": "(0, 1)",
    "data.seq_len": "[1, inf)", "data.mask_prob": "(0, 1)", "data.random_prob": "[0, 1]", "data.keep_prob": "[0, 1]",
    "data.prefetch": "[0, inf)",
    "train.steps": "[1, inf)", "train.lr": "(0, inf)", "train.warmup_steps": "[0, inf)",
    "train.global_batch": "[1, inf)", "train.micro_batch": "[1, inf)", "train.seed": "[0, inf)",
    "train.checkpoint_steps": "[1, inf)", "train.checkpoint_every": "[1, inf)", "train.log_every": "[1, inf)",
    "train.max_nonfinite_steps": "[0, inf)", "train.resume_every_minutes": "[0, inf)", "train.resume_every": "[0, inf)",
    "train.keep_resume": "[1, inf)", "train.stop_grace_s": "(0, inf)",
    "mini.layers": "[1, inf)", "mini.new_layers": "[0, inf)", "mini.depth_shares": "[0, inf)",
    "mini.plateau_window": "[0, inf)", "mini.plateau_delta": "[0, inf)",
    "finetune.epochs": "(0, inf)", "finetune.lr": "(0, inf)", "finetune.warmup_ratio": "[0, 1]",
    "finetune.max_length": "[1, inf)", "finetune.max_train_examples": "[1, inf)",
    "launch.ranks": "[1, inf)", "launch.master_port": "[1, 65535]", "launch.nodes": "[1, inf)",
    "launch.node_rank": "[0, inf)", "launch.spread": "[1, inf)", "launch.rendezvous_timeout_s": "[1, inf)",
    "launch.collective_timeout_s": "[1, inf)",
    "peak_tflops": "(0, inf)",
}


def load(preset: str | None = None, file: str | None = None, overrides: list[str] = (), check: bool = True
         ) -> RunConfig:
    """Build the effective RunConfig: defaults < preset < file < overrides. Raises ConfigError. `check=False`:
    keys and types only (`mm-ds config` shows a stage's keys before its parent is known)."""
    data: dict = {}
    if preset:
        data = deep_merge(data, read_preset(preset))
    if file:
        data = deep_merge(data, read_file(file))
    data = apply_overrides(data, list(overrides))
    cfg = from_dict(RunConfig, data)
    if check:
        cfg.check()
    return cfg


def model_config_from_dict(d: dict) -> ModelConfig:
    cfg = from_dict(ModelConfig, d, prefix="model.")
    cfg.check()
    return cfg
