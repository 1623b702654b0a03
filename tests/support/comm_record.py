"""Run `mm-ds ARGV` as one rank and record what DeepSpeed hands to its collectives (test-only; the product never
imports this file): `python tests/support/comm_record.py OUT.jsonl ARGV...` under a launcher's environment.

Every collective DeepSpeed makes goes through its backend object (deepspeed.comm.torch.TorchBackend); each
method is wrapped to append {"op", "dtype", "numel"} (numel: the elements this rank contributes) to a list, and
the engine's forward and optimizer step append {"mark": "forward" | "step"} so that a test can cut the record
into updates. mm-ds's own collectives (mm_ds/runtime/distributed/dist.py: loss sums, flags) call torch.distributed
directly and are not recorded. The list is written to OUT.jsonl when the rank leaves.
"""

import json
import sys

RECORD: list[dict] = []


def _numel(op: str, args: tuple, kwargs: dict) -> tuple[object, int]:
    """(dtype, elements this rank puts in) of a TorchBackend call."""
    if op in ("reduce_scatter",):  # (output, input_list)
        tensors = kwargs.get("input_list", args[1] if len(args) > 1 else None)
        return tensors[0].dtype, sum(t.numel() for t in tensors)
    if op in ("reduce_scatter_tensor", "all_gather_into_tensor", "all_gather_base"):  # (output, input)
        t = kwargs.get("input_tensor", args[1] if len(args) > 1 else None)
        return t.dtype, t.numel()
    if op == "all_gather":  # (tensor_list, tensor)
        t = kwargs.get("tensor", args[1] if len(args) > 1 else None)
        return t.dtype, t.numel()
    if op in ("all_reduce_coalesced", "all_gather_coalesced"):
        tensors = args[0] if op == "all_reduce_coalesced" else args[1]
        return tensors[0].dtype, sum(t.numel() for t in tensors)
    t = kwargs.get("tensor", args[0] if args else None)  # all_reduce, reduce, broadcast
    return t.dtype, t.numel()


def install() -> None:
    import functools

    from deepspeed.comm.torch import TorchBackend
    from deepspeed.runtime.engine import DeepSpeedEngine

    ops = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor",
           "all_gather_base", "all_reduce_coalesced", "all_gather_coalesced", "broadcast")
    for op in ops:
        def wrap(fn, op=op):
            @functools.wraps(fn)
            def recorded(self, *args, **kwargs):
                dtype, numel = _numel(op, args, kwargs)
                RECORD.append({"op": op, "dtype": str(dtype).removeprefix("torch."), "numel": numel})
                return fn(self, *args, **kwargs)
            return recorded
        setattr(TorchBackend, op, wrap(getattr(TorchBackend, op)))

    def mark(fn, name):
        @functools.wraps(fn)
        def marked(self, *args, **kwargs):
            if name == "forward" or self.is_gradient_accumulation_boundary():
                RECORD.append({"mark": name})
            return fn(self, *args, **kwargs)
        return marked
    DeepSpeedEngine.forward = mark(DeepSpeedEngine.forward, "forward")
    DeepSpeedEngine.step = mark(DeepSpeedEngine.step, "step")


def save(path: str) -> None:
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in RECORD)


if __name__ == "__main__":
    out, argv = sys.argv[1], sys.argv[2:]
    install()
    from mm_ds import cli
    from mm_ds.runtime.distributed import dist

    # dist.finish leaves through os._exit once every rank is done: write the record before that.
    finish = dist.finish

    def finish_and_save(rc):
        save(out)
        return finish(rc)
    dist.finish = finish_and_save
    rc = cli.main(argv)
    save(out)
    sys.exit(rc)
