"""setup.py admits what the tests cover: torch and deepspeed exactly the releases in constraints.txt (the
versions `make test` installs), whose behaviour mm-ds relies on; every other range contains its tested
version. Installed versions are the tested ones."""

import ast
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def setup_requirements() -> list[Requirement]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    kw = {k.arg: k.value for k in call.keywords}
    reqs = ast.literal_eval(kw["install_requires"])
    reqs += [r for extra in ast.literal_eval(kw["extras_require"]).values() for r in extra]
    return [Requirement(r) for r in reqs]


def pinned() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, v = line.partition("==")
            pins[name.lower()] = v
    return pins


def test_torch_and_deepspeed_are_pinned_to_the_tested_releases():
    pins = pinned()
    for req in setup_requirements():
        if req.name in ("torch", "deepspeed"):
            assert str(req.specifier) == f"=={pins[req.name]}", req


@pytest.mark.parametrize("req", setup_requirements(), ids=str)
def test_every_range_contains_its_tested_version(req):
    pins = pinned()
    assert req.name.lower() in pins, f"{req.name} is not in constraints.txt"
    assert req.specifier.contains(pins[req.name.lower()]), (req, pins[req.name.lower()])


@pytest.mark.parametrize("name", ["torch", "deepspeed", "sentencepiece", "transformers"])
def test_the_installed_versions_are_the_tested_ones(name):
    assert version(name).split("+")[0] == pinned()[name]
