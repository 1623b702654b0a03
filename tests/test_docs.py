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


def test_the_readmes_prose_fits_120_columns():
    """Prose wraps at 120 columns; a table row or a program's output shown as it prints may not."""
    fenced, wide = False, []
    for no, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1):
        fenced ^= line.startswith("```")
        if len(line) > 120 and not fenced and not line.startswith("|"):
            wide.append(f"README.md:{no} ({len(line)} columns)")
    assert not wide, f"rewrap these lines within 120 columns: {', '.join(wide)}"


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


# ---------------------------------------------------------------- the README's cluster path, followed literally

CLUSTER_SECTION = "## On a cluster: from a fresh clone to a 4 x 8 run"
TASK_FILES = ["mnli/multinli_1.0_train.jsonl", "squad/train-v1.1.json", "paws-x/train.en.tsv",
              *(f"xnli/xnli.test.{lang}.tsv" for lang in "en ar bg de el es fr hi ru sw th tr ur vi zh".split()),
              *(f"paws-x/test.{lang}.tsv" for lang in "en de es fr zh".split()),
              *(f"mlqa/test-context-{lang}-question-{lang}.json" for lang in "en ar de es hi vi zh".split()),
              *(f"xquad/xquad.{lang}.json" for lang in "en ar de el es hi ru th tr vi zh".split())]
"""The task files in the short layout docs/cluster.md lists (the README names some of them)."""


def cluster_commands() -> list[list[str]]:
    """The README cluster section's `mm-ds` lines that need no GPU and no data work: plans without a bench file and
    the checks."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(CLUSTER_SECTION):]
    section = section[:section.index("\n## ")]
    block = section[section.index("```\n") + 4:]
    lines = [line.split(" # ")[0].strip() for line in block[:block.index("```")].splitlines()]
    return [shlex.split(line)[1:] for line in lines if line.startswith("mm-ds ") and
            ("--check" in line or line.startswith("mm-ds plan") and "--bench" not in line)]


def test_the_readmes_cluster_path_checks_out_with_fake_hosts(tmp_path, monkeypatch, capsys):
    """Follow the README's cluster section on a machine with none of the cluster: four fake hosts in `hosts` (its
    `gpu01 slots=8` lines; pdsh and ssh stand-ins on PATH), CC-100 files and the task files where the section and
    docs/cluster.md put them. The plan prints the budget, `--check` passes every stage at 4 x 8 (the hostfile's 4
    hosts) side by side with the data checked (not skipped), and `--only prepare --check` lists the 15 languages."""
    import lzma
    import os

    from mm_ds.pipeline import run as pipeline
    from mm_ds.tools.plan import plan

    commands = cluster_commands()
    assert [argv[:2] for argv in commands] == [["plan", "paper"], ["run", "paper"], ["run", "paper"]]
    cluster = (ROOT / "docs" / "cluster.md").read_text()
    for name in ("mnli/multinli_1.0_train.jsonl", "xnli/xnli.test.LANG.tsv", "paws-x/test.LANG.tsv",
                 "squad/train-v1.1.json", "mlqa/test-context-LANG-question-LANG.json", "xquad/xquad.LANG.json",
                 "corpus/cc100/LANG.txt.xz"):
        assert name in cluster, f"docs/cluster.md no longer lists {name}: update TASK_FILES"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts").write_text("".join(f"gpu0{i} slots=8\n" for i in range(1, 5)))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("pdsh", "ssh"):  # the runner's executables, as a login node with pdsh has them
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "corpus" / "cc100").mkdir(parents=True)
    for lang in "en ar bg de el es fr hi ru sw th tr ur vi zh".split():
        (tmp_path / "corpus" / "cc100" / f"{lang}.txt.xz").write_bytes(lzma.compress(b"one line of text\n"))
    for name in TASK_FILES:
        (tmp_path / "tasks" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tasks" / name).write_text("")

    for argv in commands:
        main = plan.main if argv[0] == "plan" else pipeline.main
        code = main(argv[1:])
        out = capsys.readouterr().out
        assert code == 0, (argv, out[-3000:])
        if argv[0] == "plan":
            text = " ".join(out.split())
            assert "in jobs of at most 48 h, at 2.5 USD per GPU-hour" in text and "data preparation" in text
            assert max(map(len, out.splitlines())) <= 120
        elif "--only" in argv:
            assert out.startswith("mm-ds run paper --only prepare --check: ok: 15 language(s) to prepare\n")
        else:
            assert out.startswith("mm-ds run paper --check: ok: 126 stage runs can start\nlaunch: deepspeed through "
                                  "DeepSpeed's pdsh runner: 4 node(s) x 8 rank(s) = world size 32 on gpu01, gpu02, "
                                  "gpu03, gpu04; master gpu01:29500\n"), out[:3000]
            assert "task files not checked" not in out and "text inputs not checked" not in out  # the data was
            assert "launch.spread=4: 56 adapt runs side by side on 4 groups of 1 node(s) x 8 ranks" in out
