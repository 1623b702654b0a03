"""The alignment check (mm_ds/eval/align.py): held-out text that leaves every training file as it was, MLM loss and
accuracy checked by hand and against a direct computation, the per-checkpoint cache, the command's errors, and
the report's table and curves, on a miniature recipe output written checkpoint by checkpoint (no training)."""
import hashlib
import json
import math
import shutil
import zlib
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mm_ds import cli
from mm_ds.config import ModelConfig, model_config_from_dict
from mm_ds.data.corpus import prepare
from mm_ds.data.world import generate_world, write_heldout
from mm_ds.eval import align, heldout, mlm_measure
from mm_ds.eval.mlm_measure import Fit
from mm_ds.model import surgery
from mm_ds.model.model import RobertaMLM
from mm_ds.pipeline import alignment
from mm_ds.runtime.checkpointing import checkpoint
from mm_ds.tokens import IGNORE_INDEX

TINY_WORLD = dict(seed=0, languages=("t1",), sentences=300, target_sentences=300,
                  task_sizes={"nli_train": 5, "paws_train": 5, "qa_train": 5, "dev": 5, "test": 5})


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _cfg(vocab: int, **kw) -> ModelConfig:
    return ModelConfig(**dict(vocab_size=vocab, hidden_size=16, num_layers=2, num_heads=2, ffn_size=32,
                              max_positions=40, dropout=0.0) | kw)


def _random_sd(cfg: ModelConfig, seed: int) -> dict:
    torch.manual_seed(seed)
    sd = RobertaMLM(cfg).state_dict()
    for k, v in sd.items():  # biases and norms away from their zero/one init: a wrong key would show
        v.add_(torch.randn(v.shape, generator=torch.Generator().manual_seed(zlib.crc32(k.encode()))) * 0.1)
    return sd


# ---------------------------------------------------------------- a miniature recipe output

@pytest.fixture(scope="module")
def fake_out(tmp_path_factory) -> Path:
    """OUT as `mm-ds run` lays it out for MINIJOINT (and a BL_BASE run the check skips): a generated world, the
    t1 corpus, a primary model with a secondary head, its extracted mini-model, and two Step-2 checkpoints whose
    language groups differ (written as weight directories, which is how load_final reads a consolidated checkpoint)."""
    out = tmp_path_factory.mktemp("align") / "out"
    generate_world(out / "world", **TINY_WORLD)
    prepare("t1", [str(out / "world" / "text" / "t1.txt")], str(out / "data" / "t1"), vocab_size=120,
            model_type="bpe", workers=1, progress=False)
    spm = str(out / "data" / "t1" / "spm.model")
    vocab = json.loads((out / "data" / "t1" / "meta.json").read_text())["vocab_size"]
    cfg = _cfg(vocab, secondary_head_layer=1)
    primary = _random_sd(cfg, 0)
    common = {"tokenizer": spm, "system": "minijoint", "format": checkpoint.FORMAT}
    checkpoint.write_final(out / "pretrain" / "minijoint" / "final", primary,
                           common | {"stage": "pretrain", "model": asdict(cfg), "lang": "en"})
    mcfg, mini = surgery.extract_minijoint(cfg, primary)
    checkpoint.write_final(out / "build_mini" / "minijoint" / "final", mini,
                           common | {"stage": "build_mini", "model": asdict(mcfg), "lang": "en",
                                     "primary": str(out / "pretrain" / "minijoint")})
    run_config = {"data": {"seq_len": 24, "mask_prob": 0.15, "random_prob": 0.1, "keep_prob": 0.1,
                           "corpus": str(out / "data" / "t1")}, "train": {"seed": 3}}
    for system in ("minijoint", "bl_base"):
        for step in (2, 4):
            g = torch.Generator().manual_seed(step)
            sd = dict(mini) | {"embed.tokens.weight": torch.randn(vocab, 16, generator=g) * 0.5,
                               "head.bias": torch.randn(vocab, generator=g)}
            checkpoint.write_final(out / "adapt" / system / "t1" / "checkpoints" / checkpoint.tag_for(step), sd,
                                   common | {"stage": "adapt", "system": system, "lang": "t1", "step": step,
                                             "flops": 1e9 * step, "model": asdict(mcfg), "run_config": run_config,
                                             "parent": str(out / "build_mini" / "minijoint"),
                                             "primary": str(out / "pretrain" / "minijoint")})
    return out


# ---------------------------------------------------------------- held-out text

def test_heldout_text_leaves_the_world_and_the_training_shards_byte_identical(tmp_path):
    def prepared() -> dict[str, str]:
        shutil.rmtree(tmp_path / "shards", ignore_errors=True)
        prepare("t1", [str(tmp_path / "a" / "text" / "t1.txt")], str(tmp_path / "shards"), vocab_size=120,
                model_type="bpe", workers=1, progress=False)
        return _hashes(tmp_path / "shards")

    generate_world(tmp_path / "a", **TINY_WORLD)
    world, shards = _hashes(tmp_path / "a"), prepared()
    path = write_heldout(tmp_path / "a", "t1", sentences=200)
    assert path == tmp_path / "a" / "heldout" / "t1.txt"
    assert {k: v for k, v in _hashes(tmp_path / "a").items() if not k.startswith("heldout/")} == world
    assert "heldout/t1.txt" not in json.loads((tmp_path / "a" / "world.json").read_text())["files"]
    assert prepared() == shards  # tokenizer, shards, meta.json
    generate_world(tmp_path / "b", **TINY_WORLD)  # and a world made afresh is the same world
    assert _hashes(tmp_path / "b") == world
    held = [line for line in path.read_text().splitlines() if line]
    trained = set((tmp_path / "a" / "text" / "t1.txt").read_text().splitlines())
    assert len(held) > 100 and not set(held) & trained  # new sentences, none of them trained on
    assert write_heldout(tmp_path / "a", "t1", sentences=200).read_bytes() == path.read_bytes()  # deterministic
    with pytest.raises(ValueError, match="t9"):
        write_heldout(tmp_path / "a", "t9")


# ---------------------------------------------------------------- the numbers

def test_mlm_metrics_on_a_hand_checked_case():
    """A head whose transform outputs zero predicts its bias everywhere: loss = -log softmax(bias)[label]."""
    cfg = _cfg(8, num_layers=1)
    sd = RobertaMLM(cfg).state_dict()
    sd["head.dense.weight"].zero_()
    sd["head.dense.bias"].zero_()
    sd["head.norm.bias"].zero_()
    p = torch.tensor([0.05, 0.05, 0.05, 0.05, 0.05, 0.5, 0.15, 0.1])
    sd["head.bias"] = p.log()
    ids = torch.tensor([[0, 5, 6, 7, 2], [0, 7, 7, 5, 2]])
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[0, 1], labels[0, 2], labels[1, 3] = 5, 6, 7  # predicted: 5 (right), 5 (wrong), 5 (wrong)
    got = align.mlm_metrics(cfg, sd, [{"input_ids": ids, "labels": labels, "attention_mask": None}])
    assert got["targets"] == 3
    assert got["loss"] == pytest.approx(-(math.log(0.5) + math.log(0.15) + math.log(0.1)) / 3, rel=1e-5)
    assert got["acc"] == pytest.approx(1 / 3)


def _masked_batch(vocab: int, shape: tuple[int, int], p: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids and MLM labels: a share `p` of positions (and always the first) are targets."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, shape, generator=g)
    labels = torch.where(torch.rand(shape, generator=g) < p, ids, torch.full_like(ids, IGNORE_INDEX))
    labels[:, 0] = ids[:, 0]
    return ids, labels


def test_primary_with_swap_of_a_minijoint_checkpoint_equals_a_direct_computation(fake_out):
    ckpt = fake_out / "adapt" / "minijoint" / "t1" / "checkpoints" / checkpoint.tag_for(4)
    meta, sd = checkpoint.load_final(ckpt)
    vocab = sd["embed.tokens.weight"].shape[0]
    ids, labels = _masked_batch(vocab, (3, 12), 0.3, seed=7)
    batches = [{"input_ids": ids[:2], "labels": labels[:2], "attention_mask": None},
               {"input_ids": ids[2:], "labels": labels[2:], "attention_mask": None}]
    row = align.row_for(ckpt, batches)

    # Directly: the primary model (secondary head included) with the checkpoint's embeddings and output bias put in
    # by hand.
    pmeta, psd = checkpoint.load_final(fake_out / "pretrain" / "minijoint")
    cfg = _cfg(vocab, secondary_head_layer=1)
    psd = dict(psd) | {"embed.tokens.weight": sd["embed.tokens.weight"], "head.bias": sd["head.bias"],
                       "secondary_head.bias": sd["head.bias"]}
    model = RobertaMLM(cfg)
    model.load_state_dict(psd)
    model.eval()
    with torch.no_grad():
        out = model(ids)
    sel = labels.ne(IGNORE_INDEX)
    for head, key in (("main", "step_bias"), ("secondary", "mini")):  # the mini-model is the secondary head's path
        logits = out[f"logits_{head}"][sel]
        assert row[f"{key}_loss"] == pytest.approx(F.cross_entropy(logits, labels[sel]).item(), rel=1e-5)
        assert row[f"{key}_acc"] == pytest.approx((logits.argmax(-1) == labels[sel]).float().mean().item())
    assert (row["step"], row["targets"], row["mini_layers"], row["primary_layers"]) == (4, int(sel.sum()), 1, 2)


def test_drop_secondary_head_keeps_every_other_tensor_bitwise():
    cfg = _cfg(30, secondary_head_layer=1)
    sd = _random_sd(cfg, 1)
    out_cfg, out = surgery.drop_secondary_head(cfg, sd)
    assert out_cfg.secondary_head_layer is None and out_cfg.num_layers == 2
    assert set(out) == {k for k in sd if not k.startswith("secondary_head.")}
    assert all(torch.equal(out[k], sd[k]) and out[k].data_ptr() != sd[k].data_ptr() for k in out)
    with pytest.raises(surgery.SurgeryError, match="needs a model with a secondary head"):
        surgery.drop_secondary_head(out_cfg, out)


# ---------------------------------------------------------------- cache, command, report

def test_rows_are_cached_per_checkpoint(fake_out, monkeypatch):
    rows, out = align.align(fake_out, settings=align.Settings(sequences=8))
    assert out == fake_out
    assert [(r["system"], r["step"]) for r in rows] == [(s, st) for s in ("bl_base", "minijoint") for st in (0, 2, 4)]
    assert all(r["sequences"] == 8 and r["targets"] > 0 for r in rows)
    assert rows[4]["primary_loss"] != rows[5]["primary_loss"]  # the checkpoints' groups differ
    assert rows[0]["mini_loss"] is None and rows[3]["mini_loss"] is not None  # BL_BASE trains its primary itself
    assert (fake_out / "world" / "heldout" / "t1.txt").is_file()

    def recomputed(*a, **k):
        raise AssertionError("a cached row was recomputed")

    monkeypatch.setattr(align, "row_for", recomputed)
    assert align.align(fake_out, settings=align.Settings(sequences=8))[0] == rows
    moved = fake_out.parent / "moved"
    shutil.copytree(fake_out, moved)
    assert align.align(moved, settings=align.Settings(sequences=8))[0] == rows  # a moved tree keeps its rows
    with pytest.raises(AssertionError, match="recomputed"):  # other settings: other rows
        align.align(fake_out, settings=align.Settings(sequences=6))


def test_align_command_errors_name_the_directory_and_what_it_expects(fake_out, tmp_path, capsys):
    assert cli.main(["align", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "nowhere") in err and "recipe output" in err and "checkpoints/step_*" in err
    (tmp_path / "empty").mkdir()
    assert cli.main(["align", str(tmp_path / "empty")]) == 2
    assert f"{tmp_path / 'empty'} has neither adapt/ nor complete checkpoints" in capsys.readouterr().err
    assert cli.main(["align", str(fake_out / "pretrain" / "minijoint")]) == 2
    assert "has neither adapt/ nor complete checkpoints" in capsys.readouterr().err
    assert cli.main(["align", str(fake_out), "--text", "t1"]) == 2
    assert "LANG=FILE" in capsys.readouterr().err
    assert cli.main(["aling"]) == 2 and "did you mean 'align'" in capsys.readouterr().err


def test_the_command_writes_the_table_and_curves(fake_out, tmp_path, capsys):
    heldout = tmp_path / "held.txt"
    heldout.write_text((fake_out / "world" / "text" / "t1.txt").read_text()[:3000])  # any t1 text will do
    run = fake_out / "adapt" / "minijoint" / "t1"
    assert cli.main(["align", str(run), "--text", f"t1={heldout}", "--sequences", "4"]) == 0
    printed = capsys.readouterr().out
    assert "| MINIJOINT | t1 |" in printed and "lowest primary loss at step" in printed
    rows = [json.loads(x) for x in (run / "align" / "align.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 2, 4] and all(r["sequences"] == 4 for r in rows)
    table = (run / "align" / "report" / "align.md").read_text()
    assert table.count("| MINIJOINT | t1 | ") == 5  # the summary, the gain and three checkpoints
    assert (run / "align" / "report" / "align_t1.png").stat().st_size > 0

    # mm-ds report picks up an align.jsonl beside the results it is given
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "align.jsonl").write_text((run / "align" / "align.jsonl").read_text())
    results = [dict(system=s, task="xnli", lang=lang, step=st, flops=st * 1e15, v100_days=st / 10, score=50 + st)
               for s in ("BL_BASE", "MINIJOINT") for lang in ("en", "t1") for st in (1, 2)]
    (tmp_path / "r" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
    assert cli.main(["report", str(tmp_path / "r" / "results.jsonl"), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "align.md").read_text() == table
    assert (tmp_path / "rep" / "align_t1.png").is_file()
    # and, with no task results at all, from the alignment rows alone: the MLM level's tables and curves
    assert cli.main(["report", "--align", str(tmp_path / "r" / "align.jsonl"), "--out", str(tmp_path / "mlm")]) == 0
    printed = capsys.readouterr().out
    assert "# MLM level" in printed and "## mlm: performance at training completion (Table 2)" in printed
    assert (tmp_path / "mlm" / "mlm" / "tables.md").is_file() and (tmp_path / "mlm" / "mlm" / "curves_mlm.png").is_file()
    assert not (tmp_path / "mlm" / "tables.md").exists()  # no task tables without task results
    assert cli.main(["report", "--out", str(tmp_path / "none")]) == 2
    assert "--align FILE" in capsys.readouterr().err


def test_the_recipe_checks_its_heldout_files(tmp_path):
    from mm_ds.config import ConfigError
    from mm_ds.pipeline.check import check
    from mm_ds.pipeline.recipe import load_recipe

    with pytest.raises(ConfigError, match="heldout.t9 is not a target language"):
        load_recipe("tiny", ["heldout.t9=x.txt"])
    with pytest.raises(ConfigError, match="align_sequences"):
        load_recipe("tiny", ["align_sequences=-1"])
    recipe = load_recipe("tiny", [f"heldout.t1={tmp_path / 'missing.txt'}"])
    problems = check(recipe, tmp_path / "out", strict=True).problems
    assert ("align/t1", f"held-out text {tmp_path / 'missing.txt'} does not exist; fix heldout.t1 in the recipe, or "
                        f"remove it (then t1 gets no alignment check)") in problems


def test_a_multidepth_checkpoint_is_scored_at_the_depth_step2_was_training(tmp_path):
    """§7's mini-model keeps every head: a checkpoint's mini-model row is its current phase's head, read through
    that many layers (the head after layer 1 during phase 1, after layer 2 during phase 2)."""
    cfg = _cfg(40, num_layers=3, secondary_head_layer=[1, 2])
    primary = _random_sd(cfg, 2)
    meta = {"format": checkpoint.FORMAT, "tokenizer": None, "system": "minijoint@1+2", "lang": "t1"}
    checkpoint.write_final(tmp_path / "pretrain" / "final", primary, meta | {"stage": "pretrain", "model": asdict(cfg)})
    mcfg, mini = surgery.extract_minijoint(cfg, primary)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(5, 40, (2, 10), generator=g)
    labels = torch.where(torch.rand(2, 10, generator=g) < 0.5, ids, torch.full_like(ids, IGNORE_INDEX))
    labels[:, 1] = ids[:, 1]
    model = RobertaMLM(cfg)
    model.load_state_dict(primary)
    model.eval()
    with torch.no_grad():
        out = model(ids)  # the mini-model's weights are the primary's: each depth's head gives the same logits
    sel = labels.ne(IGNORE_INDEX)
    for step, phases, head in ((2, [[1, 0, 2]], "secondary@1"), (4, [[1, 0, 2], [2, 2, 4]], "secondary@2")):
        ckpt = tmp_path / "adapt" / checkpoint.tag_for(step)
        checkpoint.write_final(ckpt, mini, meta | {"stage": "adapt", "step": step, "flops": 1e9, "model": asdict(mcfg),
                                                   "depth_phases": phases, "primary": str(tmp_path / "pretrain")})
        batches = [{"input_ids": ids, "labels": labels, "attention_mask": None}]
        logp = np.r_[np.full(5, -np.inf), np.full(35, -np.log(35))]  # no training corpus here either
        row = align.row_for(ckpt, batches, init_group=surgery.language_group(mini),  # no Step-2 parent here to
                            fit=Fit(batches, logp, {"loss": None, "acc": None}))  # rebuild it from
        want = F.cross_entropy(out[f"logits_{head}"][sel], labels[sel]).item()
        assert row["mini_loss"] == pytest.approx(want, rel=1e-5), head
        assert row["mini_layers"] == phases[-1][0]


def test_a_baselines_step_bias_and_unigram_rows_equal_direct_computations(fake_out):
    """BL_BASE: the primary with the checkpoint's group is the model Step 2 trained (no mini-model row); its step bias
    row is that model's main head as it is, at the last checkpoint and, with the untrained group
    (transfer.control_group), at step 0; the unigram row is the training shards' frequencies on the same tokens."""
    from mm_ds.eval.transfer import control_group

    ckpt = fake_out / "adapt" / "bl_base" / "t1" / "checkpoints" / checkpoint.tag_for(4)
    meta, sd = checkpoint.load_final(ckpt)
    vocab = sd["embed.tokens.weight"].shape[0]
    ids, labels = _masked_batch(vocab, (2, 10), 0.4, seed=8)
    batches = [{"input_ids": ids, "labels": labels, "attention_mask": None}]
    init = control_group(meta, 3)
    _, psd = checkpoint.load_final(fake_out / "pretrain" / "minijoint")
    cfg = _cfg(vocab)
    sel = labels.ne(IGNORE_INDEX)
    for group, init_ in ((sd, False), (init, True)):
        row = align.row_for(ckpt, batches, init=init_)
        model = RobertaMLM(cfg)
        model.load_state_dict({k: v for k, v in psd.items() if not k.startswith("secondary_head.")}
                              | {"embed.tokens.weight": group["embed.tokens.weight"], "head.bias": group["head.bias"]})
        model.eval()
        with torch.no_grad():
            logits = model(ids)["logits_main"][sel]
        assert row["step_bias_loss"] == pytest.approx(F.cross_entropy(logits, labels[sel]).item(), rel=1e-5)
        assert row["step_bias_acc"] == pytest.approx((logits.argmax(-1) == labels[sel]).float().mean().item())
        assert (row["unigram_loss"], row["unigram_acc"]) == pytest.approx(
            tuple(mlm_measure.unigram_metrics(fake_out / "data" / "t1", batches)[k] for k in ("loss", "acc")))
        assert row["fit_l1"] <= mlm_measure.FIT_TOLERANCE and row["fit_sequences"] == 2
        assert row["mini_loss"] is None and row["mini_layers"] is None and row["kind"] == "target"
        assert row["step"] == (0 if init_ else 4)


def test_unigram_metrics_by_hand(tmp_path):
    """Always the most frequent training piece; loss from add-one smoothed training frequencies."""
    (tmp_path / "t.txt").write_text("a a a b\nc a\n" * 50)
    meta = prepare("x", [str(tmp_path / "t.txt")], str(tmp_path / "c"), vocab_size=12, model_type="bpe", workers=1,
                   progress=False)
    from mm_ds.data.shards import TokenCorpus
    c = TokenCorpus(tmp_path / "c")
    counts = np.bincount(np.concatenate([c.shard_tokens(s) for s in range(c.num_shards)]), minlength=meta["vocab_size"])
    counts = counts.astype(float)
    counts[:5] = 0
    counts[5:] += 1
    top = int(counts.argmax())
    other = next(i for i in range(5, meta["vocab_size"]) if i != top)
    labels = torch.full((1, 6), IGNORE_INDEX)
    labels[0, 1], labels[0, 2], labels[0, 4] = top, top, other
    got = mlm_measure.unigram_metrics(tmp_path / "c", [{"input_ids": labels.clamp(min=0), "labels": labels}])
    p = counts / counts.sum()
    assert got["targets"] == 3 and got["acc"] == pytest.approx(2 / 3)
    assert got["loss"] == pytest.approx(-(2 * math.log(p[top]) + math.log(p[other])) / 3)


def test_a_prepared_corpus_held_out_slice_is_the_languages_held_out_text(tmp_path):
    (tmp_path / "t.txt").write_text("".join(f"line number {i} of the text\n" for i in range(400)))
    prepare("t1", [str(tmp_path / "t.txt")], str(tmp_path / "out" / "data" / "t1"), vocab_size=40, model_type="bpe",
            workers=1, progress=False, heldout=0.1)
    held = align.heldout_text("t1", {}, tmp_path / "out")
    assert held == tmp_path / "out" / "data" / "t1" / "heldout.txt" and 20 < len(held.read_text().splitlines()) < 60
    assert align.heldout_text("t1", {"t1": str(tmp_path / "t.txt")}, tmp_path / "out") == tmp_path / "t.txt"
    with pytest.raises(align.ConfigError, match="prepare t2 with `mm-ds prepare --heldout"):
        align.heldout_text("t2", {}, tmp_path / "out")


def test_only_the_head_of_a_large_heldout_text_is_encoded(tmp_path, monkeypatch, fake_out):
    """A held-out slice of a CC-100-sized corpus is gigabytes: the check encodes its first HELDOUT_BYTES, whole lines."""
    text = tmp_path / "held.txt"
    lines = (fake_out / "world" / "text" / "t1.txt").read_text().splitlines()[:200]
    text.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(heldout, "HELDOUT_BYTES", 1000)
    spm_model = str(fake_out / "data" / "t1" / "spm.model")
    where = align.heldout_corpus(text, "t1", spm_model, tmp_path / "cache")
    head = where.with_name(where.name + ".txt").read_text()
    assert len(head) <= 1000 and head.endswith("\n") and text.read_text().startswith(head)
    from mm_ds.data.corpus import decode_shard_lines
    assert [x for x in decode_shard_lines(where) if x] == [x for x in head.splitlines() if x]
    assert align.heldout_corpus(text, "t1", spm_model, tmp_path / "cache") == where  # cached


# ---------------------------------------------------------------- which runs: one rule for the run, its spread, the plan

def _prepared(out: Path, langs, lines: int = 1) -> None:
    """OUT/data/<lang> as `mm-ds prepare --heldout` leaves it, as far as the check reads it: meta.json's slice."""
    for lang in langs:
        (out / "data" / lang).mkdir(parents=True)
        (out / "data" / lang / "heldout.txt").write_text("a held-out line\n" * lines)
        (out / "data" / lang / "meta.json").write_text(json.dumps({"heldout": {"file": "heldout.txt", "lines": lines}}))


def test_the_spread_takes_the_runs_of_a_recipe_whose_heldout_text_is_the_prepared_slice(tmp_path, monkeypatch):
    """The real recipe holds a slice of each language out (prepare.heldout): its Step-2 runs, every system's, are
    spread over the launch's ranks (align_spread.py), a language's together. A language whose corpus kept no line
    out is left out, by the spread as by the run, which says so."""
    from mm_ds.pipeline.items import alignment as alignment_item
    from mm_ds.pipeline.items import runs_to_align
    from mm_ds.pipeline.recipe import load_recipe

    recipe, out = load_recipe("real"), tmp_path / "out"
    _prepared(out, ["de", "ar"])
    _prepared(out, ["sw"], lines=0)
    jobs, texts = runs_to_align(recipe, out)
    assert jobs == [[out / "adapt" / s / lang for s in ("bl_base", "bl_small", "minijoint", "minipost")]
                    for lang in ("de", "ar")] and texts == {}
    item = alignment_item(recipe, out)
    assert item.runs == tuple(tuple(str(r) for r in runs) for runs in jobs) and item.sequences == 512
    scored, said = [], []
    monkeypatch.setattr(alignment, "align_run", lambda run, *a, **k: scored.append(run) or [])
    monkeypatch.setattr(alignment, "source_rows", lambda *a, **k: [])
    assert alignment.align_recipe(recipe, out, say=said.append) == []
    assert sorted(scored) == sorted(r for runs in jobs for r in runs)
    assert said == ["[mm-ds] alignment check skipped for sw: no held-out text (recipe key heldout: {LANG: FILE}, or "
                    "prepare: {heldout: FRACTION} when OUT/data/LANG is prepared, with at least a line held out)"]


@pytest.mark.parametrize("name", ["tiny", "real", "paper"])
def test_the_run_its_spread_and_the_plan_take_the_same_runs(name, tmp_path, monkeypatch):
    """`align_recipe` (the run), `runs_to_align` (its spread over ranks) and `mm-ds plan`'s alignment row count the
    same Step-2 runs: every system in every language, whose held-out text is the generated world's (tiny) or the
    prepared corpus's slice (real, paper); the plan prices each run's checkpoints and step 0."""
    from mm_ds.pipeline.items import runs_to_align
    from mm_ds.pipeline.recipe import load_recipe
    from mm_ds.pipeline.stage_runs import stage_configs
    from mm_ds.tools.plan.plan import Cluster
    from mm_ds.tools.plan.totals import plan_alignment

    recipe, out = load_recipe(name), tmp_path / "out"
    _prepared(out, recipe.langs)
    scored = []
    monkeypatch.setattr(alignment, "align_run", lambda run, *a, **k: scored.append(run) or [])
    monkeypatch.setattr(alignment, "source_rows", lambda *a, **k: [])
    assert alignment.align_recipe(recipe, out, say=pytest.fail) == []
    jobs, _ = runs_to_align(recipe, out)
    assert sorted(r for runs in jobs for r in runs) == sorted(scored) == \
        sorted(out / "adapt" / s / lang for s in recipe.systems for lang in recipe.langs)
    cfgs = stage_configs(recipe)
    assert plan_alignment(recipe, cfgs, Cluster()).runs == \
        sum(cfgs[f"adapt/{run.parent.name}/{run.name}"].train.checkpoints() + 1 for run in scored)


# ---------------------------------------------------------------- the measure: a refit bias, the same for every system

def _nll(z, emb, b, targets_logp) -> float:
    """The refit's objective: mean logsumexp of the logits minus the frequency-weighted bias."""
    valid = torch.isfinite(targets_logp)
    return float(torch.logsumexp(z @ emb.T + b, 1).mean() - (targets_logp.exp()[valid] * b[valid]).sum())


def test_the_refit_bias_is_the_maximum_likelihood_one():
    """Constant contexts (a head that says nothing): the refit makes the head the unigram predictor exactly. Varied
    contexts: the mean prediction matches the frequencies, and no other bias does better; contexts that know the
    answer keep it (the refit takes out frequencies, not what the body says)."""
    g = torch.Generator().manual_seed(0)
    V, h, M = 12, 6, 400
    emb = torch.randn(V, h, generator=g)
    logp = torch.log_softmax(torch.randn(V, generator=g) * 2, 0)
    logp[:5] = -math.inf  # specials: never targets
    logp[5:] = torch.log_softmax(logp[5:], 0)
    z = torch.randn(1, h, generator=g).expand(M, h)
    b, info = mlm_measure.refit_bias(z, emb, logp)
    assert info["l1"] <= mlm_measure.FIT_TOLERANCE
    assert torch.allclose(torch.log_softmax(z[0] @ emb.T + b, 0)[5:], logp[5:], atol=1e-3)
    z = torch.randn(M, h, generator=g)
    b, info = mlm_measure.refit_bias(z, emb, logp)
    assert info["l1"] <= mlm_measure.FIT_TOLERANCE and 0 < info["steps"] < mlm_measure.FIT_MAX_STEPS
    for _ in range(5):
        nudged = b + torch.where(torch.isfinite(b), 0.05 * torch.randn(V, generator=g), torch.zeros(V))
        assert _nll(z, emb, b, logp) < _nll(z, emb, nudged, logp)
    labels = torch.multinomial(logp[5:].exp(), M, replacement=True, generator=g) + 5
    emb = 4 * torch.eye(V)  # each context's state is its answer's embedding
    knows = mlm_measure.main_head_metrics({"z": emb[labels], "labels": labels}, emb,
                                          mlm_measure.refit_bias(emb[labels], emb, logp)[0])
    assert knows["acc"] > 0.95


@pytest.fixture
def frequencies_only(fake_out, tmp_path) -> Path:
    """OUT with a MINIJOINT whose Step 2 learnt the target's piece frequencies only, along its secondary head's
    mean output, while the main head's mean output points the other way (cosine about -1): each head's output is
    one vector whatever comes in (dense weights zero), and E' = E0 + (centred log-frequency) along the secondary's."""
    out = tmp_path / "out"
    shutil.copytree(fake_out / "world", out / "world")
    shutil.copytree(fake_out / "data", out / "data")
    pmeta, primary = checkpoint.load_final(fake_out / "pretrain" / "minijoint")
    cfg = model_config_from_dict(pmeta["model"])
    signs = torch.tensor([1.0, -1.0] * 8)
    for head, sign in (("head", 1.0), ("secondary_head", -1.0)):  # heads whose output is one vector, whatever comes
        primary[f"{head}.dense.weight"] = torch.zeros(16, 16)
        primary[f"{head}.dense.bias"] = 3 * sign * signs
        primary[f"{head}.norm.weight"], primary[f"{head}.norm.bias"] = torch.ones(16), torch.zeros(16)
    common = {"tokenizer": pmeta["tokenizer"], "system": "minijoint", "format": checkpoint.FORMAT}
    checkpoint.write_final(out / "pretrain" / "minijoint" / "final", primary,  # English held-out text: the world's
                           pmeta | {"run_config": {"data": {"seq_len": 24, "mask_prob": 0.15}}})
    mcfg, mini = surgery.extract_minijoint(cfg, primary)
    checkpoint.write_final(out / "build_mini" / "minijoint" / "final", mini,
                           common | {"stage": "build_mini", "model": asdict(mcfg), "lang": "en",
                                     "primary": str(out / "pretrain" / "minijoint")})
    with torch.no_grad():
        u = mini["head.norm.weight"] * F.layer_norm(F.gelu(mini["head.dense.bias"]), (16,))  # the head's output
    logp = torch.as_tensor(mlm_measure.piece_logp(out / "data" / "t1"), dtype=torch.float32)
    prior = torch.where(torch.isfinite(logp), logp - logp[5:].mean(), torch.zeros_like(logp))
    tokens = mini["embed.tokens.weight"] + prior[:, None] * u / u.dot(u)  # E' = E0 + the frequencies along u
    run_config = {"data": {"seq_len": 24, "mask_prob": 0.15, "corpus": str(out / "data" / "t1")}, "train": {"seed": 3}}
    checkpoint.write_final(out / "adapt" / "minijoint" / "t1" / "checkpoints" / checkpoint.tag_for(4),
                           dict(mini) | {"embed.tokens.weight": tokens},
                           common | {"stage": "adapt", "lang": "t1", "step": 4, "flops": 4e9, "model": asdict(mcfg),
                                     "run_config": run_config, "parent": str(out / "build_mini" / "minijoint"),
                                     "primary": str(out / "pretrain" / "minijoint")})
    return out


def test_a_minijoint_prior_read_through_the_other_head_is_not_scored_below_its_control(frequencies_only):
    """Issue 39. MINIJOINT's Step 2 trains through the secondary head; here it learnt the target's piece frequencies
    only, along that head's mean output, and the main head's mean output points the other way (cosine about -1).
    Read through the main head with the bias Step 2 left, the frequencies come out inverted, far below the control
    (the old measure: main's `primary_loss`); the measure reads both through a refit bias, which scores each exactly
    as the unigram predictor: Step 2 learnt frequencies, no more, and no less than its control."""
    rows = align.align(frequencies_only, settings=align.Settings(sequences=16))[0]
    control, last = [r for r in rows if r["kind"] == "target"]
    assert last["mini_loss"] < control["mini_loss"] - 0.3  # Step 2 learnt the frequencies through its head
    assert last["primary_loss"] <= control["primary_loss"] + 1e-3 and last["primary_acc"] >= control["primary_acc"]
    assert last["step_bias_loss"] > control["step_bias_loss"] + 1  # read through the main head as Step 2 left it
    for r in (control, last):
        assert (r["primary_loss"], r["primary_acc"]) == pytest.approx((r["unigram_loss"], r["unigram_acc"]), abs=2e-3)
    (two,) = [r for r in rows if r["kind"] == "source" and r["model"] == "primary"]  # in English, the diagnosis:
    assert two["head_cosine"] < -0.9 and two["secondary_bias_loss"] != two["loss"]  # the heads' means point apart


def test_the_diagnosis_reads_the_control_and_the_last_checkpoint_four_ways(frequencies_only, capsys):
    """`mm-ds align OUT --diagnose N` on the frequencies-only MINIJOINT: (a) the step bias drops far below the control,
    (b) the refit bias scores E' as E0 (both the unigram predictor), (c) the fresh read-out scores both alike."""
    assert cli.main(["align", str(frequencies_only), "--sequences", "16", "--diagnose", "16",
                     "--readout-classes", "20"]) == 0
    rows = [json.loads(x) for x in (frequencies_only / "report" / "align_diagnosis.jsonl").read_text().splitlines()]
    control, last = rows
    assert (control["step"], last["step"], last["fit_sequences"]) == (0, 4, 16)
    assert last["step_bias_loss"] > control["step_bias_loss"] + 1
    assert last["refit_loss"] == pytest.approx(control["refit_loss"], abs=1e-3) == pytest.approx(last["unigram_loss"],
                                                                                                 abs=1e-3)
    assert last["readout_acc"] == pytest.approx(control["readout_acc"], abs=0.02) and 0 < last["coverage"] <= 1
    assert last["mini_loss"] < control["mini_loss"] - 0.3
    table = (frequencies_only / "report" / "align_diagnosis.md").read_text()
    assert "| MINIJOINT | t1 | E0 (control) |" in table and "| MINIJOINT | t1 | E' (step 4) |" in table
    assert "Defect or scale" in capsys.readouterr().out


def test_the_readout_answers_with_a_piece_where_other_is_the_likeliest_class():
    """(c) over the 2 most frequent pieces and "other": where the top layer says nothing and "other" holds most
    targets, the read-out must still answer the most frequent piece (right on its 30%), not "other" (never right)."""
    from mm_ds.eval.align_diagnose import readout

    logp = np.log(np.array([0.30, 0.10, 0.06] + [0.54 / 9] * 9))  # "other": 60% of the targets
    labels = torch.tensor([0] * 30 + [1] * 10 + [2] * 6 + [3 + i % 9 for i in range(54)])
    feats = {"top": torch.ones(len(labels), 4), "labels": labels}
    r = readout(feats, feats, logp, classes=2)
    assert r["readout_acc"] == pytest.approx(0.30, abs=1e-6) and r["coverage"] == pytest.approx(0.40)
