"""The collective guard. NCCL takes device tensors only and gloo also takes host ones, so a collective on a
tensor made on the host passes every CPU test and stops a GPU run at its first update. Every collective goes
through mm_ds/runtime/distributed/dist.py, which puts its tensors on the accelerator's device: these tests make that so."""

import ast
from pathlib import Path

import pytest
import torch

from mm_ds.runtime.distributed import dist

PACKAGE = Path(dist.__file__).resolve().parents[2]  # mm_ds/
DISTRIBUTED = ("torch.distributed", "deepspeed.comm")
# What other modules may still ask torch.distributed: nothing that moves tensors.
HARMLESS = {"is_available", "is_initialized", "constants"}


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def scan(path: Path) -> list[str]:
    """Every use of torch.distributed / deepspeed.comm in a module, but the harmless questions."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.startswith(DISTRIBUTED)]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = {a.name for a in node.names}
            if (node.module.startswith(DISTRIBUTED) and node.module != "torch.distributed.constants"
                    or node.module == "deepspeed" and "comm" in names
                    or node.module == "torch" and "distributed" in names):
                found.append(f"from {node.module} import {', '.join(sorted(names))}")
        elif isinstance(node, ast.Attribute):
            name = _dotted(node)
            if any(name.startswith(p + ".") and name.split(".")[2] not in HARMLESS for p in DISTRIBUTED):
                found.append(name)
    return sorted(set(found))


OWNER = PACKAGE / "runtime" / "distributed" / "dist.py"
MEETS = PACKAGE / "runtime" / "distributed" / "rendezvous.py"
FORMS_THE_GROUP = {"torch.distributed.TCPStore", "torch.distributed.init_process_group"}
"""What rendezvous.py, where the ranks meet, asks of torch.distributed: rank 0's store and the process group over it,
never a collective (dist.py's `init` calls it)."""


def touches(path: Path) -> list[str]:
    """What `path` does with the process group beyond what its module may (nothing, for most)."""
    return [] if path == OWNER else [o for o in scan(path) if not (path == MEETS and o in FORMS_THE_GROUP)]


def test_no_module_but_dist_touches_the_process_group():
    bad = [f"{p.relative_to(PACKAGE.parent)}: {o}" for p in sorted(PACKAGE.rglob("*.py")) for o in touches(p)]
    assert not bad, ("collectives outside mm_ds/runtime/distributed/dist.py (on GPUs they need device tensors; use mm_ds.runtime.distributed.dist): "
                     + "; ".join(bad))


def test_the_scan_finds_what_it_forbids(tmp_path):
    """The guard itself: each way of reaching a collective is caught, a harmless question is not."""
    f = tmp_path / "m.py"
    for src in ("import torch\ntorch.distributed.all_reduce(t)\n",
                "import torch.distributed as d\n",
                "from torch.distributed import all_reduce\n",
                "import deepspeed\ndeepspeed.comm.barrier()\n",
                "from deepspeed import comm\n",
                "from torch import distributed\n",
                "import torch\ntorch.distributed.broadcast_object_list([1])\n"):
        f.write_text(src)
        assert scan(f), src
    f.write_text("import torch\nif torch.distributed.is_initialized():\n    pass\n")
    assert not scan(f)
    assert sorted(scan(MEETS)) == sorted(FORMS_THE_GROUP)  # the allowance is all the rendezvous uses, and used


class _Sent(Exception):
    pass


def test_every_collective_puts_its_tensors_on_the_accelerator_device(monkeypatch):
    """No CPU machine has a second device type to catch a host tensor, so stand one in: `dist.device()` says
    "meta" and the fake collectives record the device of what they are handed."""
    seen = []

    def fake(tensor_or_list, *args, **kwargs):
        dev = kwargs.get("device")
        seen.append(dev if dev is not None else tensor_or_list.device)
        raise _Sent

    monkeypatch.setattr(dist, "device", lambda: torch.device("meta"))
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "all_reduce", fake)
    monkeypatch.setattr(torch.distributed, "broadcast_object_list", fake)
    for call in (lambda: dist.all_reduce([1.0, 2.0], "max"), lambda: dist.any_rank(True),
                 lambda: dist.all_reduce([3.0]), lambda: dist.broadcast_object({"a": 1}),
                 lambda: dist.all_reduce_start(torch.zeros(2, device="meta"))):
        with pytest.raises(_Sent):
            call()
    assert len(seen) == 5 and all(torch.device(d).type == "meta" for d in seen), seen
    with pytest.raises(ValueError, match="takes a tensor on meta"):  # the lagged agreement's: refused off the device
        dist.all_reduce_start(torch.zeros(2))


def test_a_world_of_one_needs_no_process_group():
    assert dist.all_reduce([1.0, 2.5], "sum") == [1.0, 2.5]
    assert dist.any_rank(False) is False and dist.broadcast_object([3]) == [3]
    assert dist.rank() == 0 and dist.world_size() == 1
