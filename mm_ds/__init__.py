"""mm-ds: mini-model adaptation of pretrained masked language models to new languages, on DeepSpeed."""

import logging

__version__ = "0.1.0"


class _AcceleratorNoteInRanksOnly(logging.Filter):
    """DeepSpeed warns "Setting accelerator to CPU ..." in every process that imports it where no GPU is found
    (deepspeed/accelerator/real_accelerator.py, through its "DeepSpeed" logger): every mm-ds command on a laptop
    or a login node would print it. It stays where it informs, in the ranks' output (a stage's or `mm-ds run`'s
    log: on a GPU node it says CUDA was not found), and leaves the command a user types. Every other record
    passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Setting accelerator to CPU"):
            return True
        from .runtime.distributed.launch import under_launcher  # only when DeepSpeed logs it: `import mm_ds` stays light
        return under_launcher()


# Before DeepSpeed's first import makes the logger (it keeps the filters of a logger that exists).
logging.getLogger("DeepSpeed").addFilter(_AcceleratorNoteInRanksOnly())
