"""Import (HF, XLM-R, fairseq, DeepSpeed) and export (MLM, classifier, QA, MINIJOINT mini, swapped language):
logit parity with `transformers`, bitwise round trips, and errors that name the file and the key.
Every HF checkpoint is built locally from a config: nothing is downloaded."""

import argparse
import json
import random
import shutil

import pytest
import sentencepiece as spm
import torch

from mm_ds.config import ModelConfig, to_dict
from mm_ds.interop import InteropError, export, export_main, import_hf, import_main
from mm_ds.interop.fairseq_import import FAIRSEQ_KEYS, import_fairseq
from mm_ds.model.heads import RobertaForTask
from mm_ds.model.model import RobertaMLM
from mm_ds.runtime.checkpointing import checkpoint
from mm_ds.tokens import PAD

transformers = pytest.importorskip("transformers")

WORDS = ("the cat sat on a mat while dogs ran far away hello world über naïve house garden river "
         "mountain quick brown fox jumps over lazy stone music paper window").split()


def _lines(seed=0, n=400):
    rnd = random.Random(seed)
    return [" ".join(rnd.choice(WORDS) for _ in range(10)) for _ in range(n)]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    """SentencePiece models: two in mm-ds's layout (ids = rows, <mask>=4), one in XLM-R's (<unk>=0 <s>=1 </s>=2)."""
    d = tmp_path_factory.mktemp("spm")
    ours = dict(model_type="unigram", bos_id=0, pad_id=1, eos_id=2, unk_id=3, user_defined_symbols=["<mask>"],
                minloglevel=2, hard_vocab_limit=False)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(_lines()), model_prefix=str(d / "en"), vocab_size=60,
                                   **ours)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(_lines(1)), model_prefix=str(d / "de"), vocab_size=50,
                                   **ours)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(_lines(2)), model_prefix=str(d / "xlmr"),
                                   vocab_size=70, model_type="bpe", minloglevel=2, hard_vocab_limit=False)
    return {k: d / f"{k}.model" for k in ("en", "de", "xlmr")}


def size(path) -> int:
    return spm.SentencePieceProcessor(model_file=str(path)).get_piece_size()


def cfg_(vocab, **kw) -> ModelConfig:
    return ModelConfig(**(dict(vocab_size=vocab, hidden_size=32, num_layers=2, num_heads=4, ffn_size=64,
                               max_positions=24) | kw))


def perturb(m, seed=0):
    """Non-trivial LayerNorms, biases and token-type rows, so a wrong copy cannot hide behind 1s and 0s."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return m.eval()


def ids(vocab, padded=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(5, vocab, (2, 9), generator=g)
    x[:, 0] = 0
    x[:, -1] = 2
    mask = torch.ones_like(x)
    if padded:
        x[1, 6:] = PAD
        mask[1, 6:] = 0
    return x, mask


def write_model(out, model, meta=None, **extra):
    meta = {"stage": "pretrain", "system": "bl_base", "lang": "en", "step": 5, "tokens": 0, "flops": 0.0,
            "flops_cumulative": 0.0, "parent": None, "model": to_dict(model.cfg)} | (meta or {}) | extra
    return checkpoint.write_final(out / "final", model.state_dict(), meta)


def hf_mlm(vocab, cls="RobertaForMaskedLM", **kw):
    cfg = getattr(transformers, "XLMRobertaConfig" if cls.startswith("XLM") else "RobertaConfig")(
        **dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
               max_position_embeddings=26, type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2) | kw)
    torch.manual_seed(0)
    return perturb(getattr(transformers, cls)(cfg))


def ours(run):
    meta, sd = checkpoint.load_final(run)
    m = RobertaMLM(ModelConfig(**meta["model"])).eval()
    m.load_state_dict(sd, strict=True)
    return meta, m


def loaded(auto, path):
    model, info = getattr(transformers, auto).from_pretrained(str(path), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


# ---------------------------------------------------------------- import: HF

def test_hf_import_matches_hf_logits(tmp_path, tok):
    V = size(tok["en"])
    hf = hf_mlm(V)
    hf.save_pretrained(tmp_path / "hf")
    assert import_main(["--from", "hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run"),
                        "--tokenizer", str(tok["en"])]) == 0
    meta, m = ours(tmp_path / "run")
    assert (meta["stage"], meta["system"], meta["lang"], meta["step"], meta["parent"]) == ("pretrain", "bl_base",
                                                                                           "en", 0, None)
    assert meta["imported_from"]["format"] == "hf" and meta["tokenizer_conversion"] is None
    assert open(meta["tokenizer"], "rb").read() == tok["en"].read_bytes()
    checkpoint.verify(tmp_path / "run" / "final")  # the manifest covers spm.model
    x, mask = ids(V)
    with torch.no_grad():
        want = hf(input_ids=x, attention_mask=mask).logits
        torch.testing.assert_close(m(x, attention_mask=mask)["logits_main"], want, atol=1e-5, rtol=1e-5)


def test_hf_import_folds_a_two_row_token_type_table(tmp_path, tok):
    """transformers' default type_vocab_size=2: row 0 folds into the positions (equal logits for
    token_type_ids = 0, as RoBERTa is used); row 1 is dropped, and the meta says so."""
    V = size(tok["en"])
    hf = hf_mlm(V, type_vocab_size=2)
    tt = hf.roberta.embeddings.token_type_embeddings.weight
    assert tt.shape == (2, 32) and tt.abs().min() > 0 and not torch.equal(tt[0], tt[1])
    hf.save_pretrained(tmp_path / "hf")
    meta = import_hf(tmp_path / "hf", tmp_path / "run", tokenizer=tok["en"])
    note = meta["imported_from"]["token_type_embeddings"]
    assert note["token_type_rows"] == 2 and "rows 1..1 (different from row 0)" in note["dropped"]
    _, m = ours(tmp_path / "run")
    for seed, padded in ((0, True), (1, False), (2, True)):
        x, mask = ids(V, padded=padded, seed=seed)
        with torch.no_grad():
            want = hf(input_ids=x, attention_mask=mask, token_type_ids=torch.zeros_like(x)).logits
            torch.testing.assert_close(m(x, attention_mask=mask)["logits_main"], want, atol=1e-5, rtol=1e-5)
    # a table whose shape does not match the config cannot be folded: the error names both
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg | {"type_vocab_size": 3}))
    with pytest.raises(InteropError, match=r"token_type_embeddings.weight has shape \(2, 32\), expected "
                                           r"\(type_vocab_size=3"):
        import_hf(tmp_path / "hf", tmp_path / "run2", tokenizer=tok["en"])


def test_xlmr_import_converts_the_fairseq_offset(tmp_path, tok):
    """XLM-R: row = spm id + 1, <pad> row 1, <mask> last. The import moves <mask> to row 4 and rewrites the
    SentencePiece model so its ids are the new rows; text gives the same logits up to that permutation."""
    n = size(tok["xlmr"])
    hf = hf_mlm(n + 2, cls="XLMRobertaForMaskedLM")
    hf.save_pretrained(tmp_path / "hf")
    shutil.copy(tok["xlmr"], tmp_path / "hf" / "sentencepiece.bpe.model")
    meta = import_hf(tmp_path / "hf", tmp_path / "run")
    assert meta["tokenizer_conversion"]["rows_moved"] == n + 2 - 4
    src, conv = (spm.SentencePieceProcessor(model_file=str(p)) for p in (tok["xlmr"], meta["tokenizer"]))
    assert (conv.bos_id(), conv.pad_id(), conv.eos_id(), conv.unk_id(), conv.piece_to_id("<mask>")) == (0, 1, 2, 3, 4)
    text = "hello naïve world the quick fox über"
    assert conv.encode(text, out_type=str) == src.encode(text, out_type=str)  # same segmentation
    hf_ids = [0] + [i + 1 if i >= 3 else 3 for i in src.encode(text)] + [2]  # XLMRobertaTokenizer's ids
    our_ids = [0] + conv.encode(text) + [2]
    perm = torch.tensor([0, 1, 2, 3, n + 1] + list(range(4, n + 1)))  # our row -> XLM-R row
    assert perm[torch.tensor(our_ids)].tolist() == hf_ids
    _, m = ours(tmp_path / "run")
    with torch.no_grad():
        want = hf(input_ids=torch.tensor([hf_ids])).logits[..., perm]
        torch.testing.assert_close(m(torch.tensor([our_ids]))["logits_main"], want, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- import: a model's own Hugging Face tokenizer

@pytest.fixture(scope="module")
def bbpe(tmp_path_factory):
    """A byte-level BPE RoBERTa directory as roberta-base's: <s>=0 <pad>=1 </s>=2 <unk>=3, <mask> last."""
    from tokenizers import ByteLevelBPETokenizer

    d = tmp_path_factory.mktemp("bbpe")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(_lines(), vocab_size=120, min_frequency=2, special_tokens=["<s>", "<pad>", "</s>", "<unk>"])
    bpe.save_model(str(d))
    tok = transformers.RobertaTokenizer.from_pretrained(str(d))
    assert tok.mask_token_id == len(tok) - 1
    hf_mlm(len(tok)).save_pretrained(d)
    tok.save_pretrained(str(d))
    return d


def test_byte_level_bpe_import_keeps_its_tokenizer_and_logits(tmp_path, bbpe, capsys):
    """The import writes the model's own tokenizer with <mask> moved to id 4 and the rows after it one down, as
    the embedding rows; text encodes as the source's tokenizer does up to that permutation, with equal logits.
    Its export loads with AutoTokenizer (those ids) and AutoModelForMaskedLM (those logits)."""
    src_tok = transformers.AutoTokenizer.from_pretrained(str(bbpe))
    n = len(src_tok)
    meta = import_hf(bbpe, tmp_path / "run")
    assert meta["tokenizer"].endswith("final/tokenizer.json") and meta["tokenizer_conversion"]["rows_moved"] == n - 4
    from tokenizers import Tokenizer
    conv = Tokenizer.from_file(meta["tokenizer"])
    text = "über <mask> the fox"
    perm = torch.tensor([0, 1, 2, 3, n - 1] + list(range(4, n - 1)))  # our row -> the source's
    src_ids, our_ids = src_tok(text).input_ids, conv.encode(text).ids
    assert src_ids[0] == 0 and src_ids[-1] == 2 and src_tok.mask_token_id in src_ids
    assert perm[torch.tensor(our_ids)].tolist() == src_ids
    hf = transformers.AutoModelForMaskedLM.from_pretrained(str(bbpe)).eval()
    _, m = ours(tmp_path / "run")
    with torch.no_grad():
        want = hf(input_ids=torch.tensor([src_ids])).logits[..., perm]
        torch.testing.assert_close(m(torch.tensor([our_ids]))["logits_main"], want, atol=1e-5, rtol=1e-5)
    export(tmp_path / "run", tmp_path / "hf")
    files = {p.name for p in (tmp_path / "hf").iterdir()}
    assert "tokenizer.json" in files and "spm.model" not in files
    assert "AutoTokenizer" in (tmp_path / "hf" / "README.md").read_text()
    back = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert back(text).input_ids == our_ids and back.mask_token_id == 4 and back.pad_token_id == 1
    with torch.no_grad():
        got = loaded("AutoModelForMaskedLM", tmp_path / "hf")(input_ids=torch.tensor([our_ids])).logits
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # Step 3 encodes task data with SentencePiece: it refuses the parent and says what to do instead
    from mm_ds.cli import main
    capsys.readouterr()
    assert main(["finetune", "--preset", "tiny/finetune", "--out", str(tmp_path / "ft"), "finetune.task=xnli",
                 f"parent={tmp_path / 'run'}", f"finetune.data_root={tmp_path}"]) == 2
    assert "tokenizes with a Hugging Face tokenizer" in capsys.readouterr().err


def test_prepare_encodes_with_an_imported_tokenizer_json(tmp_path, bbpe, monkeypatch):
    """MINIPOST's Step 1b corpus in the source model's own pieces: ids as the converted tokenizer gives them,
    lines stripped (a blank line is a document break), decoded back to the text; the same on worker threads."""
    from tokenizers import Tokenizer

    from mm_ds.data.corpus import decode_shard_lines, prepare
    from mm_ds.data.shards import TokenCorpus

    meta = import_hf(bbpe, tmp_path / "run")
    lines = _lines(5, 20)
    text = "\n".join(lines[:10]) + "\n  \n" + "\n".join(f" {ln} " for ln in lines[10:]) + "\n"  # spaces: stripped
    (tmp_path / "en.txt").write_text(text)
    prepare("en", [str(tmp_path / "en.txt")], str(tmp_path / "corpus"), spm_model=meta["tokenizer"], workers=1,
            progress=False)
    corpus, tok = TokenCorpus(tmp_path / "corpus"), Tokenizer.from_file(meta["tokenizer"])
    assert corpus.spm_model.name == "tokenizer.json" and corpus.vocab_size == tok.get_vocab_size() == size_of(bbpe)
    assert [corpus.line(i).tolist() for i in range(len(lines))] == \
        [tok.encode(ln, add_special_tokens=False).ids + [2] for ln in lines]
    assert corpus.document_starts().tolist() == [0, 10]
    assert list(decode_shard_lines(tmp_path / "corpus")) == lines[:10] + [""] + lines[10:]
    from mm_ds.data import inputs
    monkeypatch.setattr(inputs, "CHUNK_BYTES", 200)  # several chunks in flight on 2 threads
    prepare("en", [str(tmp_path / "en.txt")], str(tmp_path / "two"), spm_model=meta["tokenizer"], workers=2,
            progress=False)
    for name in ("shard_00000.bin", "shard_00000.idx.npy", "shard_00000.docs.npy"):
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "corpus" / name).read_bytes()


def size_of(hf_dir) -> int:
    return json.loads((hf_dir / "config.json").read_text())["vocab_size"]


def test_xlmr_saved_without_its_sentencepiece_model_imports_through_its_tokenizer_json(tmp_path):
    """transformers 5 saves XLM-R's tokenizer as tokenizer.json alone: the import reads it (a Unigram model with
    SentencePiece's spelling) and gives the same model and ids as from sentencepiece.bpe.model."""
    spm.SentencePieceTrainer.train(sentence_iterator=iter(_lines(3)), model_prefix=str(tmp_path / "xlmr"),
                                   vocab_size=70, minloglevel=2, hard_vocab_limit=False)  # XLM-R's: unigram
    n = size(tmp_path / "xlmr.model")
    hf = hf_mlm(n + 2, cls="XLMRobertaForMaskedLM")
    for d in ("spm", "json"):
        hf.save_pretrained(tmp_path / d)
        shutil.copy(tmp_path / "xlmr.model", tmp_path / d / "sentencepiece.bpe.model")
    transformers.XLMRobertaTokenizer.from_pretrained(str(tmp_path / "json")).save_pretrained(str(tmp_path / "json"))
    (tmp_path / "json" / "sentencepiece.bpe.model").unlink()
    a, b = import_hf(tmp_path / "spm", tmp_path / "a"), import_hf(tmp_path / "json", tmp_path / "b")
    assert b["tokenizer"].endswith("tokenizer.json") and a["tokenizer"].endswith("spm.model")
    for k, v in checkpoint.load_final(tmp_path / "a")[1].items():
        assert torch.equal(checkpoint.load_final(tmp_path / "b")[1][k], v), k
    from tokenizers import Tokenizer

    from mm_ds.data.tokenizer import pieces
    text = "hello naïve world the quick fox über"
    assert Tokenizer.from_file(b["tokenizer"]).encode(text, add_special_tokens=False).ids == \
        spm.SentencePieceProcessor(model_file=a["tokenizer"]).encode(text)
    assert pieces(b["tokenizer"])[5:] == pieces(a["tokenizer"])[5:]  # the same pieces, as overlap compares them


def test_pieces_are_spelled_as_sentencepiece_spells_them(tmp_path):
    """Overlap initialisation compares pieces by the text they stand for, a word start as ▁: a byte-level BPE's
    Ġ (GPT-2's character for the space byte) and its bytes-as-characters are respelled; a byte that is no whole
    character is SentencePiece's byte-fallback piece; Metaspace pieces are SentencePiece's already; WordPiece marks
    the inside of a word instead. Special tokens keep their names."""
    from tokenizers import Tokenizer, decoders, models
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from mm_ds.data.tokenizer import BYTE_OF, pieces

    assert BYTE_OF == {c: b for b, c in bytes_to_unicode().items()}
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    cases = {
        decoders.ByteLevel(): (["Ġthe", "the", "ĠfÃ¼r", "Ã", "Ã¼", "Ġ", "ĠĠ", "Ċ", "é", "Ã©"],
                               ["▁the", "the", "▁für", "<0xC3>", "ü", "▁", "▁▁", "\n", "<0xE9>", "é"]),
        decoders.Metaspace(): (["▁the", "the", "<0xC3>"], ["▁the", "the", "<0xC3>"]),
        decoders.WordPiece(): (["the", "##the"], ["▁the", "the"]),
    }
    for decoder, (raw, spelled) in cases.items():
        t = Tokenizer(models.WordLevel({p: i for i, p in enumerate(specials + raw)}, unk_token="<unk>"))
        t.add_special_tokens(specials)
        t.add_tokens(["new word"])  # an added token is its raw text
        t.decoder = decoder
        t.save(str(tmp_path / "tokenizer.json"))
        assert pieces(tmp_path / "tokenizer.json") == specials + spelled + ["new▁word"], decoder


def test_import_export_import_is_the_identity(tmp_path, tok):
    hf = hf_mlm(size(tok["en"]))
    hf.save_pretrained(tmp_path / "hf")
    import_hf(tmp_path / "hf", tmp_path / "a", tokenizer=tok["en"])
    export(tmp_path / "a", tmp_path / "hf2")
    assert (tmp_path / "hf2" / "spm.model").read_bytes() == tok["en"].read_bytes()
    import_main(["--from", "hf", str(tmp_path / "hf2"), "--out", str(tmp_path / "b")])  # finds spm.model
    (ma, a), (mb, b) = checkpoint.load_final(tmp_path / "a"), checkpoint.load_final(tmp_path / "b")
    assert ma["model"] == mb["model"] and a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype == torch.float32 and torch.equal(a[k], b[k]), k


# ---------------------------------------------------------------- export

def test_export_mlm_matches_ours(tmp_path, tok):
    torch.manual_seed(0)
    m = perturb(RobertaMLM(cfg_(size(tok["en"]))))
    write_model(tmp_path / "run", m, tokenizer=str(tok["en"]))
    assert export_main([str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    hf = loaded("AutoModelForMaskedLM", tmp_path / "hf")
    assert type(hf).__name__ == "RobertaForMaskedLM"
    files = {p.name for p in (tmp_path / "hf").iterdir()}
    assert {"config.json", "model.safetensors", "spm.model", "README.md", "mm_ds_source.json"} <= files
    x, mask = ids(m.cfg.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=x, attention_mask=mask).logits,
                                   m(x, attention_mask=mask)["logits_main"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind,auto", [("pair_classification", "AutoModelForSequenceClassification"),
                                       ("extractive_qa", "AutoModelForQuestionAnswering")])
def test_export_task_models_match_ours(tmp_path, tok, kind, auto):
    torch.manual_seed(0)
    n = 3 if kind == "pair_classification" else 0
    m = perturb(RobertaForTask(cfg_(size(tok["en"])), kind, n))
    write_model(tmp_path / "run", m, stage="finetune", task="xnli" if n else "mlqa", kind=kind, num_labels=n,
                tokenizer=str(tok["en"]))
    export(tmp_path / "run", tmp_path / "hf")
    hf = loaded(auto, tmp_path / "hf")
    # HF's QA head does not mask padding (ours does): compare QA on unpadded input
    x, mask = ids(m.cfg.vocab_size, padded=kind == "pair_classification")
    with torch.no_grad():
        got, want = hf(input_ids=x, attention_mask=mask), m(x, attention_mask=mask)
    if n:
        assert hf.config.id2label == {0: "entailment", 1: "neutral", 2: "contradiction"}
        torch.testing.assert_close(got.logits, want["logits"], atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(got.start_logits, want["start_logits"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.end_logits, want["end_logits"], atol=1e-5, rtol=1e-5)


def test_export_minijoint_main_and_mini(tmp_path, tok):
    torch.manual_seed(0)
    m = perturb(RobertaMLM(cfg_(size(tok["en"]), num_layers=3, secondary_head_layer=1)))
    write_model(tmp_path / "run", m, system="minijoint", tokenizer=str(tok["en"]))
    export(tmp_path / "run", tmp_path / "main")
    export(tmp_path / "run", tmp_path / "mini", mini=True)
    main, mini = loaded("AutoModelForMaskedLM", tmp_path / "main"), loaded("AutoModelForMaskedLM", tmp_path / "mini")
    assert (main.config.num_hidden_layers, mini.config.num_hidden_layers) == (3, 1)
    x, mask = ids(m.cfg.vocab_size)
    with torch.no_grad():
        want = m(x, attention_mask=mask)
        torch.testing.assert_close(main(input_ids=x, attention_mask=mask).logits, want["logits_main"],
                                   atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(mini(input_ids=x, attention_mask=mask).logits, want["logits_secondary"],
                                   atol=1e-5, rtol=1e-5)


def test_export_with_target_language_embeddings(tmp_path, tok):
    torch.manual_seed(0)
    primary = perturb(RobertaMLM(cfg_(size(tok["en"]))))
    write_model(tmp_path / "en", primary, tokenizer=str(tok["en"]))
    adapted = perturb(RobertaMLM(cfg_(size(tok["de"]))), seed=1)
    write_model(tmp_path / "de", adapted, stage="adapt", lang="de", tokenizer=str(tok["de"]))
    with pytest.raises(InteropError, match=f"{tok['de']} has {size(tok['de'])} pieces but embed.tokens.weight"):
        export(tmp_path / "en", tmp_path / "bad", tokenizer=tok["de"])  # wrong language's tokenizer
    out = export(tmp_path / "en", tmp_path / "hf", lang_from=tmp_path / "de")
    assert out["lang"] == "de" and (tmp_path / "hf" / "spm.model").read_bytes() == tok["de"].read_bytes()
    hf = loaded("AutoModelForMaskedLM", tmp_path / "hf")
    assert torch.equal(hf.roberta.embeddings.word_embeddings.weight, adapted.embed.tokens.weight)
    assert torch.equal(hf.roberta.encoder.layer[1].output.dense.weight, primary.layers[1].ffn.fc2.weight)


# ---------------------------------------------------------------- import: fairseq, DeepSpeed

def to_fairseq(m: RobertaMLM) -> dict:
    """Our MLM in fairseq RoBERTa's layout (the inverse of FAIRSEQ_KEYS), with its tied lm_head.weight."""
    sd, out = m.state_dict(), {}
    for ours_key, fs in FAIRSEQ_KEYS:
        for i in range(m.cfg.num_layers) if "{i}" in ours_key else (None,):
            t = sd[ours_key.format(i=i)]
            names = [f.format(i=i) for f in fs] if isinstance(fs, tuple) else [fs.format(i=i)]
            out |= dict(zip(names, t.chunk(len(names), dim=0)))
    out["encoder.lm_head.weight"] = sd["embed.tokens.weight"]
    out["encoder.sentence_encoder.version"] = torch.tensor([2.0])
    return {k: v.clone() for k, v in out.items()}


def test_fairseq_import_matches_ours(tmp_path, tok):
    """dict.txt lists the pieces in frequency (not spm) order, plus fairseq's madeupword padding."""
    sp = spm.SentencePieceProcessor(model_file=str(tok["xlmr"]))
    pieces = [sp.id_to_piece(i) for i in range(3, sp.get_piece_size())]
    random.Random(0).shuffle(pieces)
    dict_pieces = pieces + ["madeupword0000", "madeupword0001"]
    rows = ["<s>", "<pad>", "</s>", "<unk>"] + dict_pieces + ["<mask>"]
    d = tmp_path / "fs"
    d.mkdir()
    (d / "dict.txt").write_text("".join(f"{p} {100 - i}\n" for i, p in enumerate(dict_pieces)))
    shutil.copy(tok["xlmr"], d / "sentencepiece.bpe.model")
    torch.manual_seed(0)
    ref = perturb(RobertaMLM(cfg_(len(rows))))  # the fairseq model, in fairseq's row order
    args = {"arch": "roberta_base", "encoder_embed_dim": 32, "encoder_layers": 2, "encoder_attention_heads": 4,
            "encoder_ffn_embed_dim": 64, "activation_fn": "gelu", "encoder_normalize_before": False, "dropout": 0.1}
    torch.save({"model": to_fairseq(ref), "args": argparse.Namespace(**args), "extra_state": {"epoch": 3}},
               d / "model.pt")
    assert import_main(["--from", "fairseq", str(d), "--out", str(tmp_path / "run")]) == 0
    meta, m = ours(tmp_path / "run")
    assert meta["imported_from"]["arch"] == "roberta_base"
    assert meta["tokenizer_conversion"]["unused_rows"] == 2  # the madeupwords keep rows, never produced
    conv = spm.SentencePieceProcessor(model_file=meta["tokenizer"])
    text = "hello naïve world the quick fox über"
    assert conv.encode(text, out_type=str) == sp.encode(text, out_type=str)
    fs_ids = [0] + [rows.index(p) for p in sp.encode(text, out_type=str)] + [2]  # fairseq's encoding
    our_ids = [0] + conv.encode(text) + [2]
    perm = torch.tensor([0, 1, 2, 3, len(rows) - 1] + list(range(4, len(rows) - 1)))
    assert perm[torch.tensor(our_ids)].tolist() == fs_ids
    with torch.no_grad():
        want = ref(torch.tensor([fs_ids]))["logits_main"][..., perm]
        torch.testing.assert_close(m(torch.tensor([our_ids]))["logits_main"], want, atol=1e-5, rtol=1e-5)

    # cfg as plain dicts (fairseq >= 0.10 layout), our own tokenizer and no dict.txt: ids are the rows
    torch.manual_seed(1)
    plain = perturb(RobertaMLM(cfg_(size(tok["en"]))))
    (d / "dict.txt").unlink()
    torch.save({"model": to_fairseq(plain), "cfg": {"model": args}}, d / "model.pt")
    import_fairseq(d, tmp_path / "run2", tokenizer=tok["en"])
    _, m2 = ours(tmp_path / "run2")
    for k, v in plain.state_dict().items():
        assert torch.equal(m2.state_dict()[k], v), k


class Opaque:  # stands in for omegaconf's DictConfig: not a tensor container
    pass


def test_fairseq_pickles_are_refused_unless_trusted(tmp_path, tok):
    torch.manual_seed(0)
    m = perturb(RobertaMLM(cfg_(size(tok["en"]))))
    args = {"encoder_embed_dim": 32, "encoder_layers": 2, "encoder_attention_heads": 4, "encoder_ffn_embed_dim": 64}
    d = tmp_path / "fs"
    d.mkdir()
    torch.save({"model": to_fairseq(m), "args": args, "opaque": Opaque()}, d / "model.pt")
    with pytest.raises(InteropError, match=r"model.pt: torch.load\(weights_only=True\) refused.*--trust-pickle"):
        import_fairseq(d, tmp_path / "run", tokenizer=tok["en"])
    import_fairseq(d, tmp_path / "run", tokenizer=tok["en"], trust_pickle=True)
    assert torch.equal(checkpoint.load_final(tmp_path / "run")[1]["layers.1.ffn.fc1.weight"],
                       m.state_dict()["layers.1.ffn.fc1.weight"])


def test_deepspeed_import_consolidates(tmp_path, tok):
    """A ZeRO-0 engine checkpoint of this system (built by hand: no engine needed) -> fp32 final/."""
    torch.manual_seed(0)
    m = perturb(RobertaMLM(cfg_(size(tok["en"]))))
    ckpt = checkpoint.checkpoints_dir(tmp_path / "src") / checkpoint.tag_for(7)
    ckpt.mkdir(parents=True)
    torch.save({"module": {k: v.half() for k, v in m.state_dict().items()}}, ckpt / "mp_rank_00_model_states.pt")
    meta = {"stage": "pretrain", "system": "minipost", "lang": "en", "step": 7, "model": to_dict(m.cfg),
            "zero_stage": 0, "tokenizer": str(tok["en"]), "format": checkpoint.FORMAT}
    checkpoint.write_json_atomic(ckpt / checkpoint.META, meta)
    checkpoint.write_manifest(ckpt)
    checkpoint.write_text_atomic(checkpoint.checkpoints_dir(tmp_path / "src") / checkpoint.LATEST, ckpt.name)
    assert import_main(["--from", "deepspeed", str(tmp_path / "src"), "--out", str(tmp_path / "run")]) == 0
    got_meta, sd = checkpoint.load_final(tmp_path / "run")
    assert (got_meta["step"], got_meta["system"]) == (7, "minipost")
    assert got_meta["tokenizer"].endswith("final/spm.model")
    for k, v in m.state_dict().items():
        assert sd[k].dtype == torch.float32 and torch.equal(sd[k], v.half().float()), k


# ---------------------------------------------------------------- bad input

def test_unsupported_architectures(tmp_path):
    bert = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                   intermediate_size=64, architectures=["BertForMaskedLM"])
    gpt2 = transformers.GPT2Config(vocab_size=50, n_embd=32, n_layer=1, n_head=4, architectures=["GPT2LMHeadModel"])
    task = transformers.RobertaConfig(architectures=["RobertaForSequenceClassification"])
    for name, cfg in (("bert", bert), ("gpt2", gpt2), ("task", task)):
        cfg.save_pretrained(tmp_path / name)
        with pytest.raises(InteropError, match=r"config.json: architectures=\[.*\] model_type=.* is not supported"):
            import_hf(tmp_path / name, tmp_path / "run", no_tokenizer=True)


def test_missing_files_and_mismatches(tmp_path, tok):
    V = size(tok["en"])
    hf = hf_mlm(V)
    hf.config.save_pretrained(tmp_path / "noweights")
    with pytest.raises(InteropError, match="noweights: no weights file; expected one of model.safetensors"):
        import_hf(tmp_path / "noweights", tmp_path / "run", tokenizer=tok["en"])
    with pytest.raises(InteropError, match="no config.json"):
        import_hf(tmp_path, tmp_path / "run")

    hf.save_pretrained(tmp_path / "hf")
    # shape mismatch: config.json says a wider FFN than the weights have
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg | {"intermediate_size": 48}))
    with pytest.raises(InteropError, match=r"model.safetensors with .*config.json: HF roberta.encoder.layer.0."
                                           r"intermediate.dense.weight has shape \(64, 32\), expected \(48, 32\)"):
        import_hf(tmp_path / "hf", tmp_path / "run", tokenizer=tok["en"])
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))

    # tokenizer of another size than the embedding matrix
    with pytest.raises(InteropError, match=rf"tokenizer {tok['de']} \(\d+ pieces.* roberta.embeddings.word_"
                                           rf"embeddings.weight has {V}"):
        import_hf(tmp_path / "hf", tmp_path / "run", tokenizer=tok["de"])
    # no tokenizer beside the weights: say where mm-ds looked and what to pass
    with pytest.raises(InteropError, match="no tokenizer found .looked for spm.model.*tokenizer.json.*; pass "
                                           "--tokenizer with the model's SentencePiece model or tokenizer.json"):
        import_hf(tmp_path / "hf", tmp_path / "run")
    # a Hugging Face tokenizer of another model (here: an empty byte-level BPE)
    (tmp_path / "hf" / "vocab.json").write_text("{}")
    (tmp_path / "hf" / "merges.txt").write_text("")
    with pytest.raises(InteropError, match=f"the tokenizer has \\d+ tokens but model.safetensors roberta.embeddings."
                                           f"word_embeddings.weight has {V} rows"):
        import_hf(tmp_path / "hf", tmp_path / "run")
    meta = import_hf(tmp_path / "hf", tmp_path / "run", no_tokenizer=True)
    assert meta["tokenizer"] is None
    with pytest.raises(InteropError, match="already exists; pass --force"):
        import_hf(tmp_path / "hf", tmp_path / "run", no_tokenizer=True)

    # fairseq: dictionary of another size, missing model.pt
    d = tmp_path / "fs"
    d.mkdir()
    (d / "dict.txt").write_text("a 3\nb 2\n")
    torch.manual_seed(0)
    m = RobertaMLM(cfg_(V))
    args = {"encoder_embed_dim": 32, "encoder_layers": 2, "encoder_attention_heads": 4, "encoder_ffn_embed_dim": 64}
    torch.save({"model": to_fairseq(m), "args": args}, d / "model.pt")
    with pytest.raises(InteropError, match=rf"dict.txt: 2 pieces \+ 5 specials = 7 rows, but model.pt encoder."
                                           rf"sentence_encoder.embed_tokens.weight has {V}"):
        import_fairseq(d, tmp_path / "fsrun", tokenizer=tok["xlmr"])
    bad = to_fairseq(m)
    bad["encoder.sentence_encoder.layers.1.fc2.weight"] = torch.zeros(32, 48)
    torch.save({"model": bad, "args": args}, d / "model.pt")
    with pytest.raises(InteropError, match=r"layers.1.fc2.weight has shape \(32, 48\), expected \(32, 64\)"):
        import_fairseq(d, tmp_path / "fsrun", no_tokenizer=True)
    with pytest.raises(InteropError, match="nowhere/model.pt does not exist"):
        import_fairseq(tmp_path / "nowhere", tmp_path / "fsrun")


def test_pytorch_bin_loads_weights_only(tmp_path, tok):
    hf = hf_mlm(size(tok["en"]))
    hf.save_pretrained(tmp_path / "a")
    hf.config.save_pretrained(tmp_path / "b")
    torch.save({k: v.half() for k, v in hf.state_dict().items()}, tmp_path / "b" / "pytorch_model.bin")
    import_hf(tmp_path / "a", tmp_path / "ra", tokenizer=tok["en"])
    meta = import_hf(tmp_path / "b", tmp_path / "rb", tokenizer=tok["en"])
    assert meta["imported_from"]["dtype"] == "float16"
    a, b = checkpoint.load_final(tmp_path / "ra")[1], checkpoint.load_final(tmp_path / "rb")[1]
    for k in a:  # positions hold the token-type row added on import: a sum of halves, not half a sum
        assert b[k].dtype == torch.float32, k
        if k != "embed.positions.weight":
            assert torch.equal(b[k], a[k].half().float()), k
    torch.save({"w": torch.zeros(1), "x": Opaque()}, tmp_path / "b" / "pytorch_model.bin")
    with pytest.raises(InteropError, match=r"pytorch_model.bin: torch.load\(weights_only=True\) refused"):
        import_hf(tmp_path / "b", tmp_path / "rc", tokenizer=tok["en"])
