"""The commands the README and the module docs show are commands that work: each `deepspeed ...` line parses
with DeepSpeed's own launcher parser, each `mm-ds ...` names a real command, each recipe and preset exists."""

import re
import shlex
from pathlib import Path

import pytest

from mm_ds import cli, config
from mm_ds.config import recipe_names

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "docs" / "bench.md", *sorted((ROOT / "mm_ds").rglob("*.py")), *sorted((ROOT / "launchers").glob("*"))]


def example_lines(path: Path):
    """(line number, text) of the lines that show commands: README code blocks, and indented lines of
    docstrings and script comments."""
    fenced = False
    for no, raw in enumerate(path.read_text().splitlines(), 1):
        if raw.startswith("```"):
            fenced = not fenced
            continue
        if path.suffix == ".md":
            if fenced:
                yield no, raw
        elif path.suffix == ".py":
            if raw.startswith("    "):  # docstring examples are indented
                yield no, raw
        elif raw.startswith("#  "):  # launcher scripts show their use in comments
            yield no, raw.lstrip("#")


def commands(prog: str) -> list[tuple[str, list[str]]]:
    """(where, argv) of every example line in the docs that runs `prog` (comments and continuations dropped)."""
    found = []
    for path in DOCS:
        for no, line in example_lines(path):
            line = line.split(" # ")[0].strip().rstrip("\\").strip()
            m = re.match(rf"^(?:[A-Z_]+=\S+ )*{re.escape(prog)} (.+)$", line)
            if m and "$" not in line and "..." not in m.group(1):
                try:
                    found.append((f"{path.relative_to(ROOT)}:{no}", shlex.split(m.group(1))))
                except ValueError:
                    continue
    return found


DEEPSPEED = commands("deepspeed")
MM_DS = commands("mm-ds")


def test_the_docs_show_launcher_and_mm_ds_commands():
    assert DEEPSPEED and len(MM_DS) > 20


@pytest.mark.parametrize("where,argv", DEEPSPEED, ids=[w for w, _ in DEEPSPEED])
def test_deepspeed_lines_parse_with_deepspeeds_launcher(where, argv):
    from deepspeed.launcher.runner import parse_args

    try:
        args = parse_args(argv)
    except SystemExit:
        pytest.fail(f"{where}: `deepspeed {' '.join(argv)}` does not parse (its flag for a module is --module)")
    if args.user_script.startswith("mm_ds"):
        assert args.module, f"{where}: a module needs --module"
        assert args.user_args and args.user_args[0] in cli.STAGE_COMMANDS | cli.TOOL_COMMANDS, where


@pytest.mark.parametrize("where,argv", MM_DS, ids=[w for w, _ in MM_DS])
def test_mm_ds_lines_name_real_commands_presets_and_recipes(where, argv):
    assert argv[0] in cli.STAGE_COMMANDS | cli.TOOL_COMMANDS, f"{where}: no command {argv[0]!r}"
    if "--preset" in argv and argv[0] != "bench":  # bench's --preset is a model size
        name = argv[argv.index("--preset") + 1]
        assert name in config.preset_names(), f"{where}: no preset {name!r}"
    if argv[0] == "run" and len(argv) > 1 and not argv[1].startswith("-") and not argv[1].endswith((".yaml", ".yml")):
        assert argv[1] in recipe_names(), f"{where}: no recipe {argv[1]!r}"


MANUALS = [ROOT / "README.md", ROOT / "docs" / "results.md"]


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors (lower case, punctuation dropped, spaces to hyphens); code blocks skipped."""
    found, fenced = set(), False
    for line in path.read_text().splitlines():
        fenced ^= line.startswith("```")
        if line.startswith("#") and not fenced:
            found.add(re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-"))
    return found


def test_the_readme_is_a_manual_not_a_notebook():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines < 400, f"README.md has {lines} lines: keep it a user's manual; dated measurements go to docs/results.md"


@pytest.mark.parametrize("path", MANUALS, ids=[p.name for p in MANUALS])
def test_relative_links_resolve(path):
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue  # http:, https:, mailto:
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        assert dest.exists(), f"{path.relative_to(ROOT)}: link to {target!r}: no file {dest}"
        if anchor:
            assert anchor in anchors(dest), f"{path.relative_to(ROOT)}: link to {target!r}: no such heading in {dest.name}"
