"""An exported model as a `transformers` user runs it: AutoTokenizer + AutoModelFor... + pipeline, offline,
with the tokenizer files export writes. Its ids are mm-ds's encoding (features.encode_pair), and the pipelines'
predictions are our model's. The SentencePiece models come from mm-ds's own trainer on generated text, in
both of its algorithms (unigram: the default; bpe: the tiny recipes')."""

import json

import pytest
import torch

from mm_ds import tokens
from mm_ds.config import ModelConfig, to_dict
from mm_ds.data.features import context_pieces, encode_pair
from mm_ds.data.tokenizer import check_spm, train_spm
from mm_ds.interop import export
from mm_ds.model.heads import RobertaForTask
from mm_ds.model.model import RobertaMLM
from mm_ds.runtime.checkpointing import checkpoint
from support.textgen import sentences

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

TEXTS = ["the big cat sees the dog .", "The  OLD farmer   helps a child near the river", "  naïve ｆｕｌｌ ① café ",
         "unknown 你好 characters !?", "a", ""]
PAIRS = [("the cat sees the dog .", "a dog follows the bird ."), ("river", "the quiet teacher finds the stone")]


@pytest.fixture(scope="module", params=["unigram", "bpe"])
def tok(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    train_spm(sentences(1500), d / "spm", vocab_size=120, character_coverage=1.0, threads=1, seed=0,
              model_type=request.param)
    check_spm(d / "spm.model")
    return d / "spm.model"


def cfg_(tok) -> ModelConfig:
    vocab = spm.SentencePieceProcessor(model_file=str(tok)).get_piece_size()
    return ModelConfig(vocab_size=vocab, hidden_size=32, num_layers=2, num_heads=4, ffn_size=64, max_positions=64)


def exported(tmp_path, model, tok, **meta) -> str:
    torch.manual_seed(0)
    with torch.no_grad():  # biases and LayerNorms away from 0 and 1, so predictions depend on every weight
        for p in model.parameters():
            p.add_(torch.randn(p.shape) * 0.05)
    meta = {"stage": "pretrain", "system": "bl_base", "lang": "en", "step": 1, "tokens": 0, "flops": 0.0,
            "flops_cumulative": 0.0, "parent": None, "model": to_dict(model.cfg), "tokenizer": str(tok)} | meta
    checkpoint.write_final(tmp_path / "run" / "final", model.state_dict(), meta)
    export(tmp_path / "run", tmp_path / "hf")
    return str(tmp_path / "hf")


def test_tokenizer_ids_are_mm_ds_encoding(tmp_path, tok):
    m = RobertaMLM(cfg_(tok)).eval()
    out = exported(tmp_path, m, tok)
    files = {p.name for p in (tmp_path / "hf").iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "spm.model"} <= files
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    want_class = "XLMRobertaTokenizer" if "unigram" in str(tok) else "TokenizersBackend"
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["tokenizer_class"] == want_class
    assert (hf_tok.bos_token_id, hf_tok.pad_token_id, hf_tok.eos_token_id, hf_tok.unk_token_id,
            hf_tok.mask_token_id) == tokens.SPECIAL_IDS
    assert (hf_tok.cls_token_id, hf_tok.sep_token_id) == (tokens.BOS, tokens.EOS)
    assert hf_tok.model_max_length == m.cfg.max_positions and len(hf_tok) == m.cfg.vocab_size
    sp = spm.SentencePieceProcessor(model_file=str(tok))
    for text in TEXTS:
        assert hf_tok(text).input_ids == [tokens.BOS, *sp.encode(text), tokens.EOS], text
    for a, b in PAIRS:
        assert hf_tok(a, b).input_ids == encode_pair(sp, a, b, 512), (a, b)
    # "<mask>" in text is the mask token (the space before it belongs to it, as in RoBERTa)
    assert hf_tok("the <mask> sees").input_ids == [tokens.BOS, *sp.encode("the"), tokens.MASK,
                                                   *sp.encode("sees"), tokens.EOS]
    batch = hf_tok(["a", TEXTS[0]], padding=True, return_tensors="pt")
    assert batch.input_ids[0, -1] == tokens.PAD and "token_type_ids" not in batch


def test_fill_mask_pipeline_predicts_as_our_model(tmp_path, tok):
    m = RobertaMLM(cfg_(tok)).eval()
    fill = transformers.pipeline("fill-mask", model=exported(tmp_path, m, tok), device="cpu")
    got = fill("the big <mask> sees the dog .", top_k=3)
    ids = fill.tokenizer("the big <mask> sees the dog .", return_tensors="pt").input_ids
    with torch.no_grad():
        probs = m(ids)["logits_main"][0, ids[0].tolist().index(tokens.MASK)].softmax(-1)
    top = probs.topk(3)
    assert [p["token"] for p in got] == top.indices.tolist()
    assert [p["score"] for p in got] == pytest.approx(top.values.tolist(), abs=1e-5)
    assert all(p["sequence"] and "<mask>" not in p["sequence"] for p in got)


def test_task_models_run_with_the_tokenizer(tmp_path, tok):
    m = RobertaForTask(cfg_(tok), "pair_classification", 3).eval()
    clf = transformers.pipeline("text-classification", model=exported(tmp_path / "xnli", m, tok, stage="finetune",
                                task="xnli", kind="pair_classification", num_labels=3), device="cpu", top_k=None)
    a, b = PAIRS[0]
    got = {p["label"]: p["score"] for p in clf({"text": a, "text_pair": b})}
    sp = spm.SentencePieceProcessor(model_file=str(tok))
    with torch.no_grad():
        probs = m(torch.tensor([encode_pair(sp, a, b, 512)]))["logits"][0].softmax(-1)
    assert got == pytest.approx(dict(zip(("entailment", "neutral", "contradiction"), probs.tolist())), abs=1e-5)

    # transformers 5 has no question-answering pipeline: its user runs tokenizer and model, as here
    m = RobertaForTask(cfg_(tok), "extractive_qa", 0).eval()
    out = exported(tmp_path / "mlqa", m, tok, stage="finetune", task="mlqa", kind="extractive_qa", num_labels=0)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    hf = transformers.AutoModelForQuestionAnswering.from_pretrained(out).eval()
    question, context = "who helps the child ?", "the old farmer helps the child near the river ."
    enc = hf_tok(question, context, return_offsets_mapping=True, return_tensors="pt")
    ctx_ids, spans = context_pieces(sp, context)
    assert enc.input_ids[0].tolist() == [tokens.BOS, *sp.encode(question), tokens.EOS, tokens.EOS, *ctx_ids,
                                         tokens.EOS]  # qa_features' window
    # answer spans map back to the same characters (a lone "▁" piece: empty in ours, the next character's in HF's)
    in_ctx = [i for i, s in enumerate(enc.sequence_ids(0)) if s == 1]
    lone = [sp.id_to_piece(i) == "\u2581" for i in ctx_ids]
    assert [tuple(enc.offset_mapping[0, i].tolist()) for i, x in zip(in_ctx, lone) if not x] == \
        [span for span, x in zip(spans, lone) if not x]
    with torch.no_grad():
        got, want = hf(input_ids=enc.input_ids, attention_mask=enc.attention_mask), m(enc.input_ids)
    torch.testing.assert_close(got.start_logits, want["start_logits"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.end_logits, want["end_logits"], atol=1e-5, rtol=1e-5)


def test_a_tokenizer_transformers_cannot_reproduce_is_not_shipped(tmp_path):
    """SentencePiece options the transformers pipeline does not model (here: pieces across spaces) are
    caught at export by comparing encodings: weights and spm.model are written, tokenizer files are not."""
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences(1500)), model_prefix=str(tmp_path / "sp"),
                                   vocab_size=120, bos_id=0, pad_id=1, eos_id=2, unk_id=3, minloglevel=2,
                                   user_defined_symbols=["<mask>"], hard_vocab_limit=False, split_by_whitespace=False)
    torch.manual_seed(0)
    m = RobertaMLM(cfg_(tmp_path / "sp.model"))
    checkpoint.write_final(tmp_path / "run" / "final", m.state_dict(), {
        "stage": "pretrain", "system": "bl_base", "lang": "en", "step": 1, "model": to_dict(m.cfg),
        "tokenizer": str(tmp_path / "sp.model")})
    out = export(tmp_path / "run", tmp_path / "hf")
    assert out["tokenizer_class"] is None
    assert any("no transformers tokenizer written" in n and "SentencePiece [0," in n for n in out["notes"])
    files = {p.name for p in (tmp_path / "hf").iterdir()}
    assert "spm.model" in files and "model.safetensors" in files and "tokenizer.json" not in files
    assert "AutoTokenizer" not in (tmp_path / "hf" / "README.md").read_text()
