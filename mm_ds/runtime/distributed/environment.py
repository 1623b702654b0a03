"""Every environment variable mm-ds reads, who sets it, and whether it reaches every rank; what mm-ds forwards.

A launcher hands a remote node's ranks only part of the launching shell's environment: DeepSpeed's runners the
variables with a few prefixes (NCCL, PYTHON, UCX, MV2, MLFLOW) and the lines of its environment file
(`.deepspeed_env`), mpirun the names given with `-x`, srun all of the submitting shell's. mm-ds adds FORWARDED on
every path (mpirun's `-x`, the environment file it writes for DeepSpeed's runners; srun needs nothing). A variable
set by the launcher on each rank reaches every rank; one set by the `mm-ds` process that starts the launcher, or by
the user, may be missing (or different) on another node.

The rule: none that may differ between ranks decides which collectives a rank calls. Such a decision is
taken on rank 0 and broadcast (`dist.broadcast_object`), or read from the run directory the launching side
resolved (mm_ds/runtime/training/resolved.py), which every rank reads alike.
tests/test_environment.py keeps this table complete and the rule kept.
"""

from __future__ import annotations

from dataclasses import dataclass

LAUNCHER, MM_DS, USER = "launcher", "mm-ds", "user"


@dataclass(frozen=True)
class Variable:
    set_by: str
    """launcher (on every rank, by the launcher or the scheduler) | mm-ds (by the process that starts the
    launcher: only ranks that inherit its environment see it) | user (the user's shell: a remote rank sees it
    only where the launcher forwards it)."""
    what: str

    @property
    def reaches_every_rank(self) -> bool:
        return self.set_by == LAUNCHER


_SLURM = "SLURM, in every task of the job step"
VARIABLES = {
    # the rank's place: what the launchers set on every rank (runtime/distributed/rendezvous.py adopts srun's and mpirun's)
    "RANK": Variable(LAUNCHER, "global rank (deepspeed, torchrun; from SLURM_PROCID / mpi4py otherwise)"),
    "WORLD_SIZE": Variable(LAUNCHER, "number of ranks"),
    "LOCAL_RANK": Variable(LAUNCHER, "rank on its node; made the device index when a task sees fewer devices"),
    "LOCAL_WORLD_SIZE": Variable(LAUNCHER, "ranks on this node (torchrun; mm-ds sets it under srun and mpirun)"),
    "LOCAL_SIZE": Variable(LAUNCHER, "ranks on this node (DeepSpeed's launcher)"),
    "MASTER_ADDR": Variable(LAUNCHER, "rank 0's rendezvous address (deepspeed, `-x` under mpirun; under srun used "
                                      "only when it is the step's first node or mm-ds marked it: MM_DS_MASTER_ADDR)"),
    "MASTER_PORT": Variable(LAUNCHER, "rank 0's rendezvous port"),
    "OMPI_COMM_WORLD_RANK": Variable(LAUNCHER, "OpenMPI: global rank"),
    "OMPI_COMM_WORLD_SIZE": Variable(LAUNCHER, "OpenMPI: number of ranks"),
    "OMPI_COMM_WORLD_LOCAL_RANK": Variable(LAUNCHER, "OpenMPI: rank on its node"),
    "OMPI_COMM_WORLD_LOCAL_SIZE": Variable(LAUNCHER, "OpenMPI: ranks on this node"),
    "MV2_COMM_WORLD_RANK": Variable(LAUNCHER, "MVAPICH: global rank"),
    "MV2_COMM_WORLD_SIZE": Variable(LAUNCHER, "MVAPICH: number of ranks"),
    "MV2_COMM_WORLD_LOCAL_RANK": Variable(LAUNCHER, "MVAPICH: rank on its node"),
    "MV2_COMM_WORLD_LOCAL_SIZE": Variable(LAUNCHER, "MVAPICH: ranks on this node"),
    "PMI_RANK": Variable(LAUNCHER, "MPICH / Intel MPI (hydra), srun under MpiDefault=pmi2, Cray PMI: global rank"),
    "PMI_SIZE": Variable(LAUNCHER, "the same launchers: number of ranks"),
    "MPI_LOCALRANKID": Variable(LAUNCHER, "MPICH / Intel MPI (hydra): rank on its node"),
    "MPI_LOCALNRANKS": Variable(LAUNCHER, "MPICH: ranks on this node"),
    "SLURM_PROCID": Variable(LAUNCHER, f"global rank ({_SLURM})"),
    "SLURM_STEP_NUM_TASKS": Variable(LAUNCHER, f"number of tasks ({_SLURM}; not in the batch script itself)"),
    "SLURM_LOCALID": Variable(LAUNCHER, f"task on its node ({_SLURM})"),
    "SLURM_NODEID": Variable(LAUNCHER, f"this node's index in the step ({_SLURM}): its entry of SLURM_STEP_TASKS_PER_NODE"),
    "SLURM_STEP_TASKS_PER_NODE": Variable(LAUNCHER, f"tasks per node, e.g. 8(x4) ({_SLURM})"),
    "SLURM_NTASKS_PER_NODE": Variable(LAUNCHER, "tasks per node as the job asked"),
    "SLURM_STEP_NODELIST": Variable(LAUNCHER, f"the step's nodes; the first is rank 0's ({_SLURM})"),
    "SLURM_JOB_NODELIST": Variable(LAUNCHER, "the job's nodes"),
    "SLURM_STEP_NUM_NODES": Variable(LAUNCHER, f"the step's node count ({_SLURM})"),
    "SLURM_NNODES": Variable(LAUNCHER, "the job's node count"),
    "SLURM_CPUS_PER_TASK": Variable(LAUNCHER, "CPUs of each task (srun -c): an srun task's thread pool; the batch "
                                              "job's: srun's --cpus-per-task"),
    "SLURM_CPUS_ON_NODE": Variable(LAUNCHER, "the allocation's CPUs on this node: srun's --cpus-per-task"),
    "CUDA_VISIBLE_DEVICES": Variable(LAUNCHER, "the GPUs a rank sees (deepspeed: the node's; srun --gpus-per-task: "
                                               "its one); a packed single-device run gets its rank's (mm_ds/pipeline/pack.py)"),
    # set by the mm-ds process that starts the launcher
    "MM_DS_LAUNCH_ROOT": Variable(MM_DS, "pid of that process: the watchdog ends a rank when it dies"),
    "MM_DS_MASTER_ADDR": Variable(MM_DS, "the MASTER_ADDR that process chose (launch.master_addr, the hostfile's first "
                                         "host): an srun task keeps a MASTER_ADDR equal to it, else uses the step's "
                                         "first node (mm_ds/runtime/distributed/srun.py srun_master)"),
    "OMPI_ALLOW_RUN_AS_ROOT": Variable(MM_DS, "lets mpirun run as root (containers); the user's value wins"),
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": Variable(MM_DS, "the same, confirmed"),
    # the user's
    "OMP_NUM_THREADS": Variable(USER, "a rank's thread pool size, over mm-ds's share of the node"),
    "GLOO_SOCKET_IFNAME": Variable(USER, "gloo's network interface (forwarded by mpirun's -x); chosen by mm-ds "
                                         "when unset and the host name resolves to loopback"),
    "PATH": Variable(USER, "where the launchers' executables are found; DeepSpeed's runners get this Python's "
                           "folder first, so they start the same pdsh, mpirun and srun mm-ds checked"),
    "DS_ENV_FILE": Variable(USER, "DeepSpeed's environment file (default .deepspeed_env in ~ and .): its lines go into "
                                  "the one mm-ds writes for a launch, which then replaces it"),
    "MM_DS_MALLOC": Variable(USER, "`system`: give freed memory back to the kernel (CPU ranks)"),
    "WANDB_DIR": Variable(USER, "where W&B writes; defaults to RUN/logs"),
    "TORCHDYNAMO_DISABLE": Variable(USER, "1 while no engine compiles (train.compile off: a faster start); the "
                                          "user's 1 makes train.compile train eager (mm_ds/runtime/training/compiled.py)"),
}
FAULT_POINTS = Variable(USER, "a test's fault point: read in mm_ds/runtime/faults.py, the one module that names them")
"""What the variables mm_ds/runtime/faults.py reads are (tests/test_fault_points.py keeps them out of other modules)."""


FORWARDED = ("LD_LIBRARY_PATH", "NCCL_", "TORCH_NCCL_", "FI_", "CUDA_", "OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME",
             "PYTHON", "UCX_", "MV2_", "MLFLOW_")
"""Prefixes of what every rank must see as the launching shell has it: the library path (NCCL's network plugin
and CUDA's libraries; a remote shell's is a login's, and without its plugin NCCL falls back to TCP sockets
silently), NCCL's, torch's NCCL (error handling, timeouts: the same on every rank) and libfabric's settings (EFA
and other OFI networks), CUDA's (e.g. CUDA_DEVICE_MAX_CONNECTIONS), the user's thread count, gloo's interface, and
DeepSpeed's own prefixes. Never a variable the launcher sets on each rank (`forwarded`): CUDA_VISIBLE_DEVICES is a
node's own, RANK and its kind are each rank's."""


def forwarded(name: str) -> bool:
    """`name` goes to every rank from the launching shell: it has a FORWARDED prefix and no launcher sets it."""
    row = VARIABLES.get(name)
    return name.startswith(FORWARDED) and not (row is not None and row.set_by == LAUNCHER)
