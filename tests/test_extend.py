"""`mm-ds extend` end to end at tiny size, from the two kinds of English model users have, both written by
`transformers` (random weights) with a tokenizer trained here on the generated world's English:

    xlmr   XLMRobertaForMaskedLM + XLM-R's SentencePiece layout (<unk>=0 <s>=1 </s>=2, row = id + 1, <mask> last),
           the layout of XLM-R and of fairseq-trained RoBERTa models
    bbpe   RobertaForMaskedLM + a byte-level BPE trained with `tokenizers` (roberta-base's layout, <mask> last)

and the world's t1 text in; out comes a t1 model that AutoTokenizer / AutoModelForMaskedLM / the fill-mask
pipeline load offline, whose ids are the t1 SentencePiece model's and whose logits are mm-ds's own; its body is
the source's bit for bit, its embeddings Step 2's, started from the source rows of the pieces both vocabularies
share (matched by the text they stand for); its model card has the held-out loss next to the control. `--check`
agrees with the run; a re-run does nothing; models extend cannot take are refused by `--check`."""

import json
import re
import shutil
import time

import pytest
import sentencepiece as spm
import torch

from mm_ds import tokens
from mm_ds.cli import main
from mm_ds.config import model_config_from_dict
from mm_ds.data.world import generate_world
from mm_ds.eval.transfer import control_group
from mm_ds.model import surgery
from mm_ds.model.model import RobertaMLM
from mm_ds.pipeline import extend_card
from mm_ds.pipeline.extend import parser
from mm_ds.runtime.checkpointing import checkpoint

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402  (transformers brings it)
from tokenizers import ByteLevelBPETokenizer  # noqa: E402
from transformers.convert_slow_tokenizer import bytes_to_unicode  # noqa: E402

EMBED, BIAS = "roberta.embeddings.word_embeddings.weight", "lm_head.bias"
POS, TYPE = "roberta.embeddings.position_embeddings.weight", "roberta.embeddings.token_type_embeddings.weight"
LANGUAGE = {EMBED, BIAS, "lm_head.decoder.weight", "lm_head.decoder.bias"}  # the tied copies follow the two
TINY = ["train.steps=6", "train.checkpoint_every=3", "train.log_every=1", "train.warmup_steps=1",
        "train.global_batch=4", "train.micro_batch=4", "data.seq_len=32"]
KINDS = ("xlmr", "bbpe")
FLAGS = {o for a in parser()._actions for o in a.option_strings}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("world")
    generate_world(d, languages=("t1",), sentences=1500, target_sentences=800,
                   task_sizes={"nli_train": 1, "paws_train": 1, "qa_train": 1, "dev": 1, "test": 1})
    return d / "text"


def _xlmr(d, english):
    """XLM-R: SentencePiece's own default ids, as XLM-R's sentencepiece.bpe.model has them; the transformers
    tokenizer adds the fairseq offset (<pad> row 1, <mask> last). The directory holds both, as on the Hub."""
    spm.SentencePieceTrainer.train(sentence_iterator=iter(english), model_prefix=str(d / "sentencepiece.bpe"),
                                   vocab_size=300, character_coverage=1.0, minloglevel=2)
    tok = transformers.XLMRobertaTokenizer.from_pretrained(str(d))
    return tok, transformers.XLMRobertaConfig, transformers.XLMRobertaForMaskedLM


def _bbpe(d, english):
    """roberta-base's layout: <s>=0 <pad>=1 </s>=2 <unk>=3, GPT-2's byte-level BPE, <mask> after the pieces."""
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(english + ["über naïve café"], vocab_size=300, min_frequency=2,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>"])
    bpe.save_model(str(d))  # vocab.json + merges.txt, as on the Hub
    tok = transformers.RobertaTokenizer.from_pretrained(str(d))
    return tok, transformers.RobertaConfig, transformers.RobertaForMaskedLM


def english_model(kind, world, tmp_path_factory):
    """What a user has: an English masked LM saved by transformers, with its tokenizer files."""
    d = tmp_path_factory.mktemp(f"en-{kind}")
    tok, config, model_class = {"xlmr": _xlmr, "bbpe": _bbpe}[kind](
        d, world.joinpath("en.txt").read_text().split("\n")[:1500])
    assert tok.mask_token_id == len(tok) - 1 and tok.pad_token_id == 1
    cfg = config(vocab_size=len(tok), hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=66, type_vocab_size=1, pad_token_id=1,
                 bos_token_id=0, eos_token_id=2)
    torch.manual_seed(0)
    model = model_class(cfg)
    with torch.no_grad():  # LayerNorms and biases away from 1 and 0: a body copied wrong cannot hide
        for p in model.parameters():
            p.add_(torch.randn(p.shape) * 0.05)
    model.save_pretrained(d)
    tok.save_pretrained(str(d))
    return d


@pytest.fixture(scope="module")
def bbpe_src(world, tmp_path_factory):
    return english_model("bbpe", world, tmp_path_factory)


@pytest.fixture(scope="module", params=KINDS)
def src(request, world, tmp_path_factory):
    return request.getfixturevalue("bbpe_src") if request.param == "bbpe" else \
        english_model(request.param, world, tmp_path_factory)


def extend(*argv) -> int:
    return main(["extend", *map(str, argv)])


def flags_of(said: str) -> set[str]:
    """The flags a message tells the user to pass (--key=value overrides are no flags)."""
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*(?![\w=-])", said))


@pytest.fixture(scope="module")
def done(src, world, tmp_path_factory):
    """--check first, then the run: they agree. The xlmr run takes the default target vocabulary."""
    out = tmp_path_factory.mktemp("ext") / "t1"
    text = out.parent / "t1-text"  # a directory of files, as a corpus often comes
    text.mkdir()
    lines = (world / "t1.txt").read_text().splitlines(keepends=True)
    (text / "a.txt").write_text("".join(lines[:400]))
    (text / "b.txt").write_text("".join(lines[400:]))
    size = [] if src.name.startswith("en-xlmr") else ["--vocab-size", 200]
    args = [src, "--lang", "t1", "--text", text, "--source-text", world / "en.txt", "--out", out,
            *size, "--model-type", "bpe", *TINY]
    assert extend(*args, "--check") == 0
    t0 = time.time()
    assert extend(*args) == 0
    return out, args, time.time() - t0


def ours(out):
    """mm-ds's own model of the result: the imported source with Step 2's language group swapped in."""
    meta, sd = checkpoint.load_final(out / "import")
    _, group = checkpoint.load_final(out / "adapt" / "t1")
    cfg, sd = surgery.swap_embeddings(model_config_from_dict(meta["model"]), sd, surgery.language_group(group))
    m = RobertaMLM(cfg).eval()
    m.load_state_dict(sd, strict=True)
    return m


@pytest.mark.ranks
def test_the_target_model_loads_offline_with_our_ids_and_logits(done, src):
    from huggingface_hub import constants
    assert constants.HF_HUB_OFFLINE  # conftest: HF_HUB_OFFLINE=1, any request to the Hub raises
    out, _, _ = done
    hf = out / "hf"
    tok = transformers.AutoTokenizer.from_pretrained(str(hf))
    model, info = transformers.AutoModelForMaskedLM.from_pretrained(str(hf), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    target = checkpoint.read_meta(out / "adapt" / "t1" / checkpoint.FINAL)
    vocab = json.loads((out / "data" / "t1" / "meta.json").read_text())["vocab_size"]
    assert len(tok) == model.config.vocab_size == vocab
    assert (hf / "spm.model").read_bytes() == open(target["tokenizer"], "rb").read()
    words = (out / "data" / "text" / "t1.heldout.txt").read_text().split("\n")[0].split()
    sentence = " ".join(["<mask>", *words[1:]])  # a sentence of the new language, its first word masked
    sp = spm.SentencePieceProcessor(model_file=str(hf / "spm.model"))
    ids = tok(sentence).input_ids
    assert ids == [tokens.BOS, tokens.MASK, *sp.encode(" ".join(words[1:])), tokens.EOS]
    fill = transformers.pipeline("fill-mask", model=str(hf), device="cpu")
    got = fill(sentence, top_k=3)
    with torch.no_grad():
        logits = ours(out)(torch.tensor([ids]))["logits_main"]
        torch.testing.assert_close(model.eval()(input_ids=torch.tensor([ids])).logits, logits, atol=1e-5, rtol=1e-5)
    top = logits[0, 1].softmax(-1).topk(3)
    assert [g["token"] for g in got] == top.indices.tolist()
    assert [g["score"] for g in got] == pytest.approx(top.values.tolist(), abs=1e-5)
    assert all("<mask>" not in g["sequence"] for g in got)


def _source_row(src_tok, piece: str) -> int | None:
    """The source row of a target SentencePiece piece, matched by the text it stands for (▁: a word start),
    computed here independently: XLM-R's pieces are SentencePiece's; a byte-level BPE spells each UTF-8 byte as
    a character of GPT-2's table (transformers' bytes_to_unicode), the space byte as Ġ."""
    if isinstance(src_tok, transformers.RobertaTokenizer):
        chars = bytes_to_unicode()
        piece = "".join(chars[b] for b in piece.replace("\u2581", " ").encode("utf-8"))
    i = src_tok.convert_tokens_to_ids(piece)
    return None if i in (None, src_tok.unk_token_id) else i


@pytest.mark.ranks
def test_shared_pieces_start_from_the_source_rows_and_the_body_is_the_sources(done, src):
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
    # Step 2 started each shared piece's row from the source's row of the same text (footnote 1), and moved it
    src_tok = transformers.AutoTokenizer.from_pretrained(str(src))
    sp = spm.SentencePieceProcessor(model_file=str(out / "hf" / "spm.model"))
    shared = [(i, j) for i in range(len(tokens.SPECIAL_IDS), sp.get_piece_size())
              if (j := _source_row(src_tok, sp.id_to_piece(i))) is not None]
    meta = checkpoint.read_meta(out / "adapt" / "t1" / checkpoint.FINAL)
    assert len(shared) == meta["overlap"]["overlap"] >= 20
    start = control_group(meta, meta["run_config"]["train"]["seed"])["embed.tokens.weight"]
    for i, j in shared:
        assert torch.equal(start[i], source[EMBED][j]), sp.id_to_piece(i)
        assert not torch.equal(got[EMBED][i], source[EMBED][j])
    # MINIPOST: Step 2 ran over the 1 + 2-layer mini-model Step 1b trained on the source text
    meta = checkpoint.read_meta(out / "build_mini" / checkpoint.FINAL)
    assert (meta["model"]["num_layers"], meta["step"], meta["lang"]) == (3, 6, "en")


@pytest.mark.ranks
def test_the_model_card(done, src, capsys):
    out, args, _ = done
    card = (out / "hf" / "README.md").read_text()
    front, body = card.split("---\n")[1], card.split("---\n", 2)[2]
    assert "language:\n- t1\n" in front and f"base_model: {src.name}\n" in front and "- minipost\n" in front
    corpus = json.loads((out / "data" / "t1" / "meta.json").read_text())
    vocab = corpus["vocab_size"]
    # --vocab-size, else the source's vocabulary (at most 50k), fewer where the text supports fewer
    asked = 200 if "--vocab-size" in map(str, args) else json.loads((src / "config.json").read_text())["vocab_size"]
    assert corpus["settings"]["vocab_size"] == asked >= vocab
    assert f"| target vocabulary | {vocab:,} SentencePiece pieces" in body
    assert "| Step 1b (mini-model bridge layers) | 6 updates, " in body and "tokens of en text" in body
    assert "| Step 2 (target embeddings) | 6 updates, " in body and "MINIPOST" in body
    metrics = json.loads((out / "card.json").read_text())["metrics"]
    r, c = metrics["result"], metrics["control"]
    assert f"| this model | {r['loss']:.3f} | {100 * r['acc']:.1f}% |" in body
    assert f"| control: Step 2's initial (untrained) embeddings | {c['loss']:.3f} | {100 * c['acc']:.1f}% |" in body
    assert r["targets"] == c["targets"] > 50 and r["loss"] < c["loss"]  # Step 2 learnt something, even in 6 updates
    # the result's loss is the exported model's, as transformers computes it on the same held-out batches
    from mm_ds.eval.align import Settings, eval_batches
    meta = checkpoint.read_meta(out / "adapt" / "t1" / checkpoint.FINAL)
    (heldout,) = [p for p in (out / "heldout").glob("t1.*") if p.is_dir()]  # the encoded corpus, beside its text
    model = transformers.AutoModelForMaskedLM.from_pretrained(str(out / "hf")).eval()
    loss = targets = 0.0
    with torch.no_grad():
        for b in eval_batches(heldout, meta["run_config"]["data"], Settings()):
            n = int((b["labels"] != tokens.IGNORE_INDEX).sum())
            got = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"])
            loss += float(got.loss) * n
            targets += n
    assert targets == r["targets"] and loss / targets == pytest.approx(r["loss"], abs=1e-4)
    assert "Demo-sized" in body and "--presets paper" in body and "AutoTokenizer" in body


@pytest.mark.ranks
def test_a_rerun_does_nothing_and_warns_of_the_demo_size(done, capsys):
    out, args, first = done
    stamp = {p: p.stat().st_mtime_ns for p in (out / "hf" / "model.safetensors", out / "hf" / "README.md",
                                               out / "adapt" / "t1" / checkpoint.FINAL / checkpoint.WEIGHTS)}
    capsys.readouterr()
    t0 = time.time()
    assert extend(*args) == 0
    said = capsys.readouterr().out
    assert "[mm-ds extend] skip import: complete" in said and "skip build_mini: complete" in said
    assert "skip adapt/t1: complete" in said and "skip export" in said
    assert {p: p.stat().st_mtime_ns for p in stamp} == stamp
    assert time.time() - t0 < first / 2
    warning = said.strip().splitlines()[-1]
    assert warning.startswith("[mm-ds extend] warning: Demo-sized") and f"--out {out}-paper --presets paper" in warning
    assert flags_of(said) <= FLAGS


@pytest.mark.ranks
def test_an_interrupted_stage_resumes_from_its_checkpoint(done, capsys):
    out, args, _ = done
    if "xlmr" in str(args[0]):
        pytest.skip("one source kind is enough: resuming does not depend on it")
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


@pytest.mark.ranks
def test_check_of_a_finished_run_and_of_other_arguments_into_it(done, src, world, capsys):
    out, args, _ = done
    assert extend(*args, "--check") == 0
    assert "ok: 2 stage runs can start" in capsys.readouterr().out
    # the same OUT with BL_BASE (no Step 1b, no English text): two models' stages would mix
    assert extend(src, "--lang", "t1", "--text", world / "t1.txt", "--system", "bl_base", "--out", out,
                  "--check") == 1
    said = capsys.readouterr().out
    assert f"{out} holds an extend run made with other arguments (" in said
    assert "system: 'minipost' -> 'bl_base'" in said
    assert extend(src, "--lang", "t1", "--text", world / "t1.txt", "--system", "bl_base", "--out",
                  out.parent / "bl", "--check") == 0
    assert "ok: 1 stage runs can start" in capsys.readouterr().out


# ---------------------------------------------------------------- what --check refuses, and says instead

def test_check_names_the_missing_text_and_a_source_that_is_no_model(src, world, tmp_path, capsys):
    out = tmp_path / "x"
    missing = tmp_path / "no-such.txt"
    assert extend(src, "--lang", "t1", "--text", missing, "--system", "bl_base", "--out", out, "--check") == 1
    said = capsys.readouterr().out
    assert f"--text {missing} does not exist" in said and "1 problem" in said and not out.exists()
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("")
    assert extend(src, "--lang", "t1", "--text", tmp_path / "empty", "--system", "bl_base", "--out", out,
                  "--check", "--vocab-size", 5) == 1
    said = capsys.readouterr().out
    assert f"--text {tmp_path / 'empty'}: the directory holds no non-empty file" in said
    assert "--vocab-size 5 leaves no room beyond the 5 special pieces" in said
    (tmp_path / "blank.txt").write_text("\n  \n\t\n")  # prepare would find nothing to encode
    assert extend(src, "--lang", "t1", "--text", tmp_path / "blank.txt", "--system", "bl_base", "--out", out,
                  "--check") == 1
    assert f"--text {tmp_path / 'blank.txt'} holds no line of text" in capsys.readouterr().out

    not_model = tmp_path / "notes"
    not_model.mkdir()
    (not_model / "readme.txt").write_text("not a model")
    assert extend(not_model, "--lang", "t1", "--text", world / "t1.txt", "--out", out, "--check") == 1
    said = capsys.readouterr().out
    assert f"SRC {not_model} is neither a Hugging Face model directory" in said
    assert "--source-text" in said and flags_of(said) <= FLAGS  # MINIPOST without source text: named too

    # and the run itself refuses before writing anything
    assert extend(not_model, "--lang", "t1", "--text", world / "t1.txt", "--out", out) == 2
    assert f"SRC {not_model}" in capsys.readouterr().err and not out.exists()


def test_check_catches_stage_configs_against_the_source_model(src, world, tmp_path, capsys):
    # 3 source layers: a mini-model over all of them, and a sequence longer than its 64 positions
    assert extend(src, "--lang", "t1", "--text", world / "t1.txt", "--source-text", world / "en.txt", "--out",
                  tmp_path / "x", "--check", "build_mini/mini.layers=3", "adapt/data.seq_len=100") == 1
    said = capsys.readouterr().out
    assert "mini.layers=3 must lie in [1, 3)" in said and "data.seq_len=100 exceeds" in said


def _copy(src, to, drop=()):
    shutil.copytree(src, to, ignore=shutil.ignore_patterns(*drop))
    return to


@pytest.mark.parametrize("case", ["bert", "gpt2", "weights", "no_tokenizer", "other_size", "other_specials",
                                  "unknown_spelling"])
def test_check_refuses_what_extend_cannot_take_and_says_what_it_needs(case, bbpe_src, world, tmp_path, capsys):
    src, d, extra = bbpe_src, tmp_path / case, []
    if case in ("bert", "gpt2"):  # another architecture, with a tokenizer mm-ds could read
        cfg = (transformers.BertConfig(vocab_size=301, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                       intermediate_size=64) if case == "bert" else
               transformers.GPT2Config(vocab_size=301, n_embd=32, n_layer=1, n_head=4))
        model = (transformers.BertForMaskedLM if case == "bert" else transformers.GPT2LMHeadModel)(cfg)
        model.save_pretrained(d)
        transformers.AutoTokenizer.from_pretrained(str(src)).save_pretrained(str(d))
        want = [f"architectures=['{type(model).__name__}']", "mm-ds imports RoBERTa-family masked LMs",
                "RobertaForMaskedLM, XLMRobertaForMaskedLM"]
    elif case == "weights":  # config.json and the weights disagree: found from the safetensors header
        _copy(src, d)
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps(cfg | {"intermediate_size": 48}))
        want = ["model.safetensors with", "intermediate.dense.weight has shape (64, 32), expected (48, 32)"]
    elif case == "no_tokenizer":
        _copy(src, d, ["tokenizer*", "vocab.json", "merges.txt"])
        want = ["no tokenizer found (looked for spm.model", "tokenizer.json", "pass --tokenizer"]
    elif case == "other_size":  # --tokenizer: another model's
        _copy(src, d)
        other = transformers.AutoTokenizer.from_pretrained(str(src)).backend_tokenizer
        other.add_tokens(["Ġzebra"])
        other.save(str(tmp_path / "other.json"))
        extra = ["--tokenizer", tmp_path / "other.json"]
        want = ["the tokenizer has 302 tokens but model.safetensors roberta.embeddings.word_embeddings.weight has 301"]
    else:  # tokenizer.json as it is (no RoBERTa class rebuilding it): BERT's [UNK], or a decoder mm-ds cannot spell
        _copy(src, d)
        config = json.loads((d / "tokenizer_config.json").read_text()) | {"tokenizer_class": "TokenizersBackend"}
        spec = json.loads((d / "tokenizer.json").read_text())
        if case == "other_specials":
            config["unk_token"] = "[UNK]"
            spec = json.loads(json.dumps(spec).replace('"<unk>"', '"[UNK]"'))
            want = ["the tokenizer has no <unk>; mm-ds takes RoBERTa-family models, whose special tokens are <s> "
                    "<pad> </s> <unk> <mask>"]
        else:
            spec["decoder"] = {"type": "Fuse"}
            want = ["the tokenizer's decoder 'Fuse' is not one whose pieces mm-ds can compare",
                    "ByteLevel, Metaspace, WordPiece"]
        (d / "tokenizer_config.json").write_text(json.dumps(config))
        (d / "tokenizer.json").write_text(json.dumps(spec))
    assert extend(d, "--lang", "t1", "--text", world / "t1.txt", "--source-text", world / "en.txt", "--out",
                  tmp_path / "x", "--check", *extra) == 1
    said = capsys.readouterr().out
    assert "1 problem" in said and f"SRC {d}: " in said, said
    for w in want:
        assert w in said, said
    assert flags_of(said) <= FLAGS, said  # nothing recommends a flag extend does not have


@pytest.mark.ranks
def test_the_held_out_text_is_the_tail_of_the_text_and_never_trained_on(done, tmp_path):
    out, _, _ = done
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("".join(f"a{i}\n" for i in range(5)))
    b.write_text("".join(f"b{i}\n" for i in range(20)))
    train, held = extend_card.split_heldout([str(a), str(b)], tmp_path / "split", "xx")
    # 26 lines (a blank one between the files: a document break); the last tenth held out
    assert held.read_text() == "b18\nb19\n" and train.read_text().split("\n")[:7] == ["a0", "a1", "a2", "a3", "a4", "",
                                                                                    "b0"]
    assert train.read_text().endswith("b17\n")
    b.write_text("changed\n")
    assert extend_card.split_heldout([str(a), str(b)], tmp_path / "split", "xx") == (train, held)  # written once
    # the run's own: its tail, and the corpus Step 2 trained on does not hold it
    split = [(out / "data" / "text" / f"t1.{part}.txt").read_text().split("\n") for part in ("train", "heldout")]
    given = "".join(f.read_text() for f in sorted((out.parent / "t1-text").iterdir())).split("\n")
    assert [x for x in split[0] + split[1] if x] == [x for x in given if x] and len(split[1]) > 50
    settings = json.loads((out / "data" / "t1" / "meta.json").read_text())["settings"]
    assert settings["inputs"] == [str(out / "data" / "text" / "t1.train.txt")]
    # a held-out text too short to mask a token gives no score, and the card says so
    (tmp_path / "empty.txt").write_text("\n")
    metrics = extend_card.heldout_metrics(out / "import", out / "adapt" / "t1", tmp_path / "empty.txt", tmp_path)
    assert metrics == {"heldout": str(tmp_path / "empty.txt"), "lines": 1}


def test_the_default_target_vocabulary_follows_the_source_up_to_the_papers_50k():
    from mm_ds.config import ModelConfig
    from mm_ds.pipeline.extend import default_vocab

    def cfg(v):
        return ModelConfig(vocab_size=v, hidden_size=32, num_layers=1, num_heads=4, ffn_size=64, max_positions=16)
    assert [default_vocab(cfg(v)) for v in (300, 50265, 250002)] == [300, 50000, 50000]  # tiny, roberta, XLM-R
