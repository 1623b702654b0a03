"""`mm-ds extend` end to end at tiny size: an English RobertaForMaskedLM written with `transformers` (random
weights, a SentencePiece tokenizer trained on the generated world's English) and the world's t1 text in, a
t1 model out that `AutoTokenizer` / `AutoModelForMaskedLM` / the fill-mask pipeline load; its body is the
source's bit for bit, its embeddings are Step 2's; a re-run does nothing; `--check` names what is wrong."""

import json
import shutil
import time

import pytest
import torch

from mm_ds import checkpoint, tokens
from mm_ds.cli import main
from mm_ds.data.tokenizer import train_spm
from mm_ds.data.world import generate_world
from mm_ds.interop import hf_tokenizer

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402  (transformers brings it)

EMBED, BIAS = "roberta.embeddings.word_embeddings.weight", "lm_head.bias"
POS, TYPE = "roberta.embeddings.position_embeddings.weight", "roberta.embeddings.token_type_embeddings.weight"
LANGUAGE = {EMBED, BIAS, "lm_head.decoder.weight", "lm_head.decoder.bias"}  # the tied copies follow the two
TINY = ["train.steps=6", "train.checkpoint_every=3", "train.log_every=1", "train.warmup_steps=1",
        "train.global_batch=4", "train.micro_batch=4", "data.seq_len=32"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("world")
    generate_world(d, languages=("t1",), sentences=1500, target_sentences=800,
                   task_sizes={"nli_train": 1, "paws_train": 1, "qa_train": 1, "dev": 1, "test": 1})
    return d / "text"


@pytest.fixture(scope="module")
def src(world, tmp_path_factory):
    """What a user has: an English RoBERTa saved by transformers, with its SentencePiece and tokenizer files."""
    d = tmp_path_factory.mktemp("en-roberta")
    train_spm(world.joinpath("en.txt").read_text().split("\n")[:1500], d / "spm", vocab_size=300,
              character_coverage=1.0, threads=1, seed=0)
    vocab = hf_tokenizer.build(d / "spm.model", 64)
    cfg = transformers.RobertaConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=3,
                                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=66,
                                     type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.RobertaForMaskedLM(cfg)
    with torch.no_grad():  # LayerNorms and biases away from 1 and 0: a body copied wrong cannot hide
        for p in model.parameters():
            p.add_(torch.randn(p.shape) * 0.05)
    model.save_pretrained(d)
    vocab.save_pretrained(str(d))
    return d


def extend(*argv) -> int:
    return main(["extend", *map(str, argv)])


@pytest.fixture(scope="module")
def done(src, world, tmp_path_factory):
    out = tmp_path_factory.mktemp("ext") / "t1"
    text = out.parent / "t1-text"  # a directory of files, as a corpus often comes
    text.mkdir()
    lines = (world / "t1.txt").read_text().splitlines(keepends=True)
    (text / "a.txt").write_text("".join(lines[:400]))
    (text / "b.txt").write_text("".join(lines[400:]))
    args = [src, "--lang", "t1", "--text", text, "--source-text", world / "en.txt", "--out", out,
            "--vocab-size", 200, "--model-type", "bpe", *TINY]
    t0 = time.time()
    assert extend(*args) == 0
    return out, args, time.time() - t0


def test_the_target_model_loads_with_transformers(done, src):
    out, _, _ = done
    hf = out / "hf"
    tok = transformers.AutoTokenizer.from_pretrained(str(hf))
    model, info = transformers.AutoModelForMaskedLM.from_pretrained(str(hf), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    target = checkpoint.read_meta(out / "adapt" / "t1" / checkpoint.FINAL)
    vocab = json.loads((out / "data" / "t1" / "meta.json").read_text())["vocab_size"]
    assert len(tok) == model.config.vocab_size == vocab != len(transformers.AutoTokenizer.from_pretrained(str(src)))
    assert (hf / "spm.model").read_bytes() == open(target["tokenizer"], "rb").read()
    words = open(json.loads((out / "extend.json").read_text())["text"][0] + "/a.txt").readline().split()
    sentence = " ".join(["<mask>", *words[1:]])  # a sentence of the new language, its first word masked
    fill = transformers.pipeline("fill-mask", model=str(hf), device="cpu")
    got = fill(sentence, top_k=3)
    assert len(got) == 3 and all("<mask>" not in g["sequence"] and 0 <= g["token"] < vocab for g in got)
    assert tok(sentence).input_ids[:2] == [tokens.BOS, tokens.MASK]


def test_the_body_is_the_source_bit_for_bit_and_the_embeddings_are_step_2s(done, src):
    out, _, _ = done
    got, source = load_file(str(out / "hf" / "model.safetensors")), load_file(str(src / "model.safetensors"))
    # the token-type row a single-segment input always adds lives in the positions (interop.hf.token_type_fold)
    assert torch.equal(got[POS], source[POS] + source[TYPE][0]) and not got[TYPE].any()
    body = set(source) - LANGUAGE - {POS, TYPE}
    assert len(body) > 40 and body <= set(got)
    for k in body:
        assert torch.equal(got[k], source[k]), k
    _, adapted = checkpoint.load_final(out / "adapt" / "t1")
    assert torch.equal(got[EMBED], adapted["embed.tokens.weight"]) and torch.equal(got[BIAS], adapted["head.bias"])
    # Step 2 trained them: the rows of pieces both vocabularies share started from the source's, and moved
    sp_src = [p for p in hf_tokenizer.read_proto(src / "spm.model").pieces]
    sp_tgt = [p for p in hf_tokenizer.read_proto(out / "hf" / "spm.model").pieces]
    src_row = {p.piece: i for i, p in enumerate(sp_src)}
    shared = [(i, src_row[p.piece]) for i, p in enumerate(sp_tgt) if p.piece in src_row and i >= len(tokens.SPECIAL_IDS)]
    assert shared
    moved = [not torch.equal(got[EMBED][i], source[EMBED][j]) for i, j in shared]
    assert all(moved)
    # MINIPOST: Step 2 ran over the 1 + 2-layer mini-model Step 1b trained on the source text
    meta = checkpoint.read_meta(out / "build_mini" / checkpoint.FINAL)
    assert (meta["model"]["num_layers"], meta["step"], meta["lang"]) == (3, 6, "en")


def test_a_rerun_does_nothing(done, capsys):
    out, args, first = done
    stamp = {p: p.stat().st_mtime_ns for p in (out / "hf" / "model.safetensors",
                                               out / "adapt" / "t1" / checkpoint.FINAL / checkpoint.WEIGHTS)}
    capsys.readouterr()
    t0 = time.time()
    assert extend(*args) == 0
    said = capsys.readouterr().out
    assert "[mm-ds extend] skip import: complete" in said and "skip build_mini/build_mini: complete" in said
    assert "skip adapt/adapt/t1: complete" in said and "skip export" in said
    assert {p: p.stat().st_mtime_ns for p in stamp} == stamp
    assert time.time() - t0 < first / 2


def test_an_interrupted_stage_resumes_from_its_checkpoint(done, capsys):
    out, args, _ = done
    run = out / "adapt" / "t1"
    shutil.rmtree(run / checkpoint.FINAL)  # as if stopped after the step-3 checkpoint
    for ckpt in checkpoint.list_checkpoints(run):
        if ckpt.name.endswith("6"):
            shutil.rmtree(ckpt)
    capsys.readouterr()
    assert extend(*args) == 0
    said = capsys.readouterr().out
    assert "resume adapt/adapt/t1 from step_" in said and "exported" in said
    assert checkpoint.read_meta(run / checkpoint.FINAL)["step"] == 6


def test_check_names_the_missing_text_and_a_source_that_is_no_model(src, world, tmp_path, capsys):
    out = tmp_path / "x"
    assert extend(src, "--lang", "t1", "--text", world / "t1.txt", "--source-text", world / "en.txt",
                  "--out", out, "--check", *TINY) == 0
    assert "ok: 2 stage runs can start" in capsys.readouterr().out
    assert not out.exists()  # --check writes nothing

    missing = tmp_path / "no-such.txt"
    assert extend(src, "--lang", "t1", "--text", missing, "--system", "bl_base", "--out", out, "--check") == 1
    said = capsys.readouterr().out
    assert f"--text {missing} does not exist" in said and "1 problem" in said
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("")
    assert extend(src, "--lang", "t1", "--text", tmp_path / "empty", "--system", "bl_base", "--out", out,
                  "--check") == 1
    assert f"--text {tmp_path / 'empty'}: the directory holds no non-empty file" in capsys.readouterr().out

    not_model = tmp_path / "notes"
    not_model.mkdir()
    (not_model / "readme.txt").write_text("not a model")
    assert extend(not_model, "--lang", "t1", "--text", world / "t1.txt", "--out", out, "--check") == 1
    said = capsys.readouterr().out
    assert f"SRC {not_model} is neither a Hugging Face model directory" in said
    assert "--source-text" in said  # MINIPOST without source text: named too

    # and the run itself refuses before writing anything
    assert extend(not_model, "--lang", "t1", "--text", world / "t1.txt", "--out", out) == 2
    assert f"SRC {not_model}" in capsys.readouterr().err and not out.exists()


def test_check_catches_stage_configs_against_the_source_model(src, world, tmp_path, capsys):
    # 3 source layers: a mini-model over all of them, and a sequence longer than its 64 positions
    assert extend(src, "--lang", "t1", "--text", world / "t1.txt", "--source-text", world / "en.txt", "--out",
                  tmp_path / "x", "--check", "build_mini/mini.layers=3", "adapt/data.seq_len=100") == 1
    said = capsys.readouterr().out
    assert "mini.layers=3 must lie in [1, 3)" in said and "data.seq_len=100 exceeds" in said


def test_check_of_a_finished_run_and_of_other_arguments_into_it(done, src, world, capsys):
    out, args, _ = done
    assert extend(*args, "--check") == 0
    assert "ok: 2 stage runs can start" in capsys.readouterr().out
    # the same OUT with BL_BASE (no Step 1b, no English text): two models' stages would mix
    assert extend(src, "--lang", "t1", "--text", world / "t1.txt", "--system", "bl_base", "--out", out,
                  "--check") == 1
    said = capsys.readouterr().out
    assert f"{out} holds an extend run made with other arguments (system: 'minipost' -> 'bl_base'" in said
    assert extend(src, "--lang", "t1", "--text", world / "t1.txt", "--system", "bl_base", "--out",
                  out.parent / "bl", "--check") == 0
    assert "ok: 1 stage runs can start" in capsys.readouterr().out
