"""Surgery: pure functions on (config, state_dict), tested bitwise on tiny models."""

import pytest
import torch

from mm_ds.config import ModelConfig
from mm_ds.interop.hf import HF_TOKEN_TYPE, from_hf_roberta, hf_config, to_hf_roberta
from mm_ds.model.model import LANGUAGE_PARAMS, RobertaMLM
from mm_ds.model.surgery import (SurgeryError, build_minipost, check_compatible, check_state_dict, check_vocab,
                                 extract_minijoint, init_target_embeddings, language_group, minipost_trainable,
                                 swap_embeddings)
from mm_ds.tokens import PAD, SPECIAL_PIECES

V = 97


def cfg_(**kw) -> ModelConfig:
    base = dict(vocab_size=V, hidden_size=32, num_layers=4, num_heads=4, ffn_size=64, max_positions=24)
    return ModelConfig(**(base | kw))


def model(cfg: ModelConfig, seed: int = 0) -> RobertaMLM:
    torch.manual_seed(seed)
    m = RobertaMLM(cfg)
    with torch.no_grad():  # non-trivial LayerNorms and biases, so a wrong copy cannot hide behind 1s and 0s
        for name, p in m.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return m.eval()


def snapshot(sd):
    return {k: v.clone() for k, v in sd.items()}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def ids(B=2, T=12, seed=1, vocab=V):
    x = torch.randint(5, vocab, (B, T), generator=torch.Generator().manual_seed(seed))
    x[1, -3:] = PAD
    return x, x.ne(PAD).long()


# ---------------------------------------------------------------- MINIJOINT

def test_extract_minijoint_logits_equal_the_second_head():
    cfg = cfg_(secondary_head_layer=2)
    with_secondary = model(cfg)
    sd = with_secondary.state_dict()
    before = snapshot(sd)
    mini_cfg, mini_sd = extract_minijoint(cfg, sd)
    assert mini_cfg.num_layers == 2 and mini_cfg.secondary_head_layer is None
    assert_same(sd, before)  # input untouched
    mini = RobertaMLM(mini_cfg).eval()
    mini.load_state_dict(mini_sd, strict=True)
    x, mask = ids()
    with torch.no_grad():
        want = with_secondary(x, attention_mask=mask)["logits_secondary"]
        got = mini(x, attention_mask=mask)["logits_main"]
    assert torch.equal(got, want)
    assert all(mini_sd[k].data_ptr() != sd[k].data_ptr() for k in mini_sd if k in sd)  # no aliasing


def test_extract_minijoint_errors():
    cfg = cfg_()
    with pytest.raises(SurgeryError, match="secondary_head_layer is None"):
        extract_minijoint(cfg, model(cfg).state_dict())
    cfg2 = cfg_(secondary_head_layer=2)
    sd = dict(model(cfg2).state_dict())
    del sd["secondary_head.bias"]
    with pytest.raises(SurgeryError, match="missing secondary_head.bias"):
        extract_minijoint(cfg2, sd)
    sd = dict(model(cfg2).state_dict())
    sd["layers.1.ffn.fc1.weight"] = torch.zeros(65, 32)
    with pytest.raises(SurgeryError, match=r"layers.1.ffn.fc1.weight has shape \(65, 32\), expected \(64, 32\)"):
        extract_minijoint(cfg2, sd)


# ---------------------------------------------------------------- MINIPOST

def test_build_minipost_copies_bitwise_and_inits_bridge_layers():
    cfg = cfg_()
    sd = model(cfg).state_dict()
    before = snapshot(sd)
    mini_cfg, mini_sd = build_minipost(cfg, sd, n_layers=2, new_layers=2, seed=0)
    assert_same(sd, before)
    assert mini_cfg.num_layers == 4 and mini_cfg.secondary_head_layer is None
    RobertaMLM(mini_cfg).load_state_dict(mini_sd, strict=True)
    for k, v in mini_sd.items():
        if k.startswith(("embed.", "head.", "layers.0.", "layers.1.")):
            assert torch.equal(v, sd[k]), k
    for i in (2, 3):
        assert torch.equal(mini_sd[f"layers.{i}.attn_norm.weight"], torch.ones(32))
        assert torch.equal(mini_sd[f"layers.{i}.ffn.fc1.bias"], torch.zeros(64))
        w = mini_sd[f"layers.{i}.attn.qkv.weight"]
        assert 0.01 < w.std().item() < 0.03 and not torch.equal(w, sd[f"layers.{i}.attn.qkv.weight"])
    assert not torch.equal(mini_sd["layers.2.ffn.fc1.weight"], mini_sd["layers.3.ffn.fc1.weight"])
    _, again = build_minipost(cfg, sd, n_layers=2, seed=0)
    _, other = build_minipost(cfg, sd, n_layers=2, seed=1)
    assert_same(again, mini_sd)  # deterministic from the seed
    assert not torch.equal(other["layers.2.attn.qkv.weight"], mini_sd["layers.2.attn.qkv.weight"])
    assert torch.equal(other["layers.1.attn.qkv.weight"], mini_sd["layers.1.attn.qkv.weight"])


def test_minipost_trainable_selects_only_the_bridge_layers():
    cfg = cfg_()
    mini_cfg, mini_sd = build_minipost(cfg, model(cfg).state_dict(), n_layers=2)
    trainable = minipost_trainable(mini_cfg, 2)
    names = {n for n, _ in RobertaMLM(mini_cfg).named_parameters() if trainable(n)}
    assert names == {k for k in mini_sd if k.startswith(("layers.2.", "layers.3."))} and names
    with pytest.raises(SurgeryError, match="no bridge layer"):
        minipost_trainable(mini_cfg, 4)


def test_build_minipost_errors():
    cfg = cfg_(secondary_head_layer=2)
    with pytest.raises(SurgeryError, match="secondary_head_layer=2"):
        build_minipost(cfg, model(cfg).state_dict())
    cfg = cfg_()
    with pytest.raises(SurgeryError, match="n_layers=5 .* model.num_layers=4"):
        build_minipost(cfg, model(cfg).state_dict(), n_layers=5)


# ---------------------------------------------------------------- target-language embeddings

def vocabs():
    src = list(SPECIAL_PIECES) + [f"▁s{i}" for i in range(V - 5)]
    # 30 pieces shared (in another order), the rest new
    tgt = list(SPECIAL_PIECES) + [f"▁s{i}" for i in range(60, 30, -1)] + [f"▁t{i}" for i in range(40)]
    return src, tgt


def test_init_target_embeddings_copies_overlap_and_draws_the_rest():
    cfg = cfg_(secondary_head_layer=2)
    sd = model(cfg).state_dict()
    before = snapshot(sd)
    src, tgt = vocabs()
    tgt_cfg, lang, report = init_target_embeddings(cfg, sd, src, tgt, seed=0)
    assert_same(sd, before)
    assert tgt_cfg.vocab_size == len(tgt) == 75 and set(lang) == set(LANGUAGE_PARAMS)
    assert report["overlap"] == 30 and report["copied"] == 35 and report["random"] == 40
    assert report["share"] == pytest.approx(30 / 70)
    emb = lang["embed.tokens.weight"]
    src_id = {p: i for i, p in enumerate(src)}
    for t, piece in enumerate(tgt):
        if t == PAD:
            assert torch.equal(emb[t], torch.zeros(32))
        elif piece in src_id:
            s = src_id[piece]
            assert torch.equal(emb[t], sd["embed.tokens.weight"][s]), piece
            for b in ("head.bias", "secondary_head.bias"):
                assert torch.equal(lang[b][t], sd[b][s])
        else:
            for b in ("head.bias", "secondary_head.bias"):
                assert lang[b][t].item() == 0.0
    new = emb[35:]
    assert 0.015 < new.std().item() < 0.025 and abs(new.mean().item()) < 0.005
    _, again, _ = init_target_embeddings(cfg, sd, src, tgt, seed=0)
    _, other, _ = init_target_embeddings(cfg, sd, src, tgt, seed=1)
    assert_same(again, lang)
    assert torch.equal(other["embed.tokens.weight"][:35], emb[:35])
    assert not torch.equal(other["embed.tokens.weight"][35:], new)
    # The group loads into the source body: a model for the target language.
    _, tgt_sd = swap_embeddings(cfg, sd, lang)
    RobertaMLM(tgt_cfg).load_state_dict(tgt_sd, strict=True)


def test_init_target_embeddings_single_head_and_errors():
    cfg = cfg_()
    sd = model(cfg).state_dict()
    src, tgt = vocabs()
    _, lang, _ = init_target_embeddings(cfg, sd, src, tgt)
    assert set(lang) == {"embed.tokens.weight", "head.bias"}
    with pytest.raises(SurgeryError, match="src_vocab has 96 pieces .* model.vocab_size=97"):
        init_target_embeddings(cfg, sd, src[:-1], tgt)


# ---------------------------------------------------------------- embedding swap

def test_swap_out_and_back_is_identity_and_body_untouched():
    cfg = cfg_(secondary_head_layer=2)
    sd = model(cfg).state_dict()
    before = snapshot(sd)
    src_group = language_group(sd)
    src, tgt = vocabs()
    tgt_cfg, lang, _ = init_target_embeddings(cfg, sd, src, tgt, seed=3)
    new_cfg, new_sd = swap_embeddings(cfg, sd, lang)
    assert new_cfg.vocab_size == len(tgt) and cfg.vocab_size == V  # input config unchanged
    assert_same(sd, before)
    for k, v in new_sd.items():
        assert torch.equal(v, lang[k] if k in LANGUAGE_PARAMS else sd[k]), k  # body bitwise untouched
    back_cfg, back_sd = swap_embeddings(new_cfg, new_sd, src_group)
    assert back_cfg == cfg
    assert_same(back_sd, sd)
    m = RobertaMLM(new_cfg)
    m.load_state_dict(new_sd, strict=True)


def test_swap_into_mini_and_downstream_models():
    cfg = cfg_(secondary_head_layer=2)
    sd = model(cfg).state_dict()
    src, tgt = vocabs()
    _, lang, _ = init_target_embeddings(cfg, sd, src, tgt)
    # The mini-model has one head: secondary_head.bias in the group is ignored.
    mini_cfg, mini_sd = extract_minijoint(cfg, sd)
    c, s = swap_embeddings(mini_cfg, mini_sd, lang)
    assert torch.equal(s["head.bias"], lang["head.bias"]) and "secondary_head.bias" not in s
    RobertaMLM(c).load_state_dict(s, strict=True)
    # A downstream model: encoder + task head, no MLM head: only the token embeddings swap.
    down = {k: v for k, v in sd.items() if k.startswith(("embed.", "layers."))}
    down |= {"task_head.dense.weight": torch.randn(32, 32), "task_head.out_proj.bias": torch.randn(3)}
    c, s = swap_embeddings(cfg, down, lang)
    assert s.keys() == down.keys() and torch.equal(s["embed.tokens.weight"], lang["embed.tokens.weight"])
    assert torch.equal(s["task_head.out_proj.bias"], down["task_head.out_proj.bias"])


def test_swap_errors():
    cfg = cfg_(secondary_head_layer=2)
    sd = model(cfg).state_dict()
    group = language_group(sd)
    no_secondary = {k: v for k, v in group.items() if k != "secondary_head.bias"}
    with pytest.raises(SurgeryError, match="secondary_head.bias"):
        swap_embeddings(cfg, sd, no_secondary)
    other = model(cfg_(hidden_size=48, num_heads=4))
    with pytest.raises(SurgeryError, match=r"hidden size 48 .* model.hidden_size=32"):
        swap_embeddings(cfg, sd, language_group(other.state_dict()))
    with pytest.raises(SurgeryError, match="non-language keys embed.positions.weight"):
        swap_embeddings(cfg, sd, group | {"embed.positions.weight": sd["embed.positions.weight"]})
    bad = group | {"head.bias": torch.zeros(V + 1)}
    with pytest.raises(SurgeryError, match=r"head.bias has shape \(98,\), expected \(97,\)"):
        swap_embeddings(cfg, sd, bad)


def test_check_vocab():
    group = language_group(model(cfg_()).state_dict())
    check_vocab(group, V)
    with pytest.raises(SurgeryError, match="vocab 97 .* tokenizer has 120 pieces"):
        check_vocab(group, 120)


# ---------------------------------------------------------------- mini-model <-> primary

def test_check_compatible():
    cfg = cfg_(secondary_head_layer=2)
    primary = model(cfg).state_dict()
    mini_cfg, mini_sd = extract_minijoint(cfg, primary)
    check_compatible(cfg, primary, mini_cfg, mini_sd)
    # After Step 2 the mini-model has other embeddings and head biases: still compatible.
    src, tgt = vocabs()
    _, lang, _ = init_target_embeddings(mini_cfg, mini_sd, src, tgt)
    check_compatible(cfg, primary, *swap_embeddings(mini_cfg, mini_sd, lang))
    # A mini-model of another primary model.
    other_cfg, other_sd = extract_minijoint(cfg, model(cfg, seed=1).state_dict())
    with pytest.raises(SurgeryError, match="embed.positions.weight differs"):
        check_compatible(cfg, primary, other_cfg, other_sd)
    tweaked = dict(mini_sd) | {"layers.1.ffn.fc2.bias": mini_sd["layers.1.ffn.fc2.bias"] + 1e-3}
    with pytest.raises(SurgeryError, match="layers.1.ffn.fc2.bias differs"):
        check_compatible(cfg, primary, mini_cfg, tweaked)
    wide_cfg = cfg_(hidden_size=48, secondary_head_layer=2)
    wide_mini = extract_minijoint(wide_cfg, model(wide_cfg).state_dict())
    with pytest.raises(SurgeryError, match="model.hidden_size=48 in the mini-model, 32 in the primary"):
        check_compatible(cfg, primary, *wide_mini)
    # MINIPOST: only the bottom N layers are shared.
    single = cfg_()
    primary = model(single).state_dict()
    post_cfg, post_sd = build_minipost(single, primary, n_layers=2)
    check_compatible(single, primary, post_cfg, post_sd, shared_layers=2)
    with pytest.raises(SurgeryError, match="layers.2.attn.qkv.weight differs .* shared_layers=N"):
        check_compatible(single, primary, post_cfg, post_sd)


# ---------------------------------------------------------------- HF RobertaForMaskedLM

def test_hf_import_matches_logits():
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.RobertaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=64, max_position_embeddings=26, type_vocab_size=1,
                                        layer_norm_eps=1e-5, pad_token_id=1)
    torch.manual_seed(0)
    hf = transformers.RobertaForMaskedLM(hf_cfg).eval()
    with torch.no_grad():  # a non-zero token-type row and biases, so the folding is really tested
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf_sd = hf.state_dict()
    cfg, sd = from_hf_roberta(hf_cfg.to_dict(), hf_sd)
    assert (cfg.num_layers, cfg.max_positions, cfg.layer_norm_eps) == (2, 24, 1e-5)
    ours = RobertaMLM(cfg).eval()
    ours.load_state_dict(sd, strict=True)
    x, mask = ids()
    with torch.no_grad():
        want = hf(input_ids=x, attention_mask=mask).logits
        got = ours(x, attention_mask=mask)["logits_main"]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # import -> export -> import is the identity on our weights
    cfg2, sd2 = from_hf_roberta(hf_config(cfg), to_hf_roberta(cfg, sd))
    assert cfg2 == cfg
    assert_same(sd2, sd)


def test_hf_export_matches_logits():
    transformers = pytest.importorskip("transformers")
    cfg = cfg_(num_layers=2)
    ours = model(cfg)
    hf_sd = to_hf_roberta(cfg, ours.state_dict())
    hf = transformers.RobertaForMaskedLM(transformers.RobertaConfig(**hf_config(cfg))).eval()
    hf.load_state_dict(hf_sd, strict=True)
    x, mask = ids()
    with torch.no_grad():
        want = ours(x, attention_mask=mask)["logits_main"]
        got = hf(input_ids=x, attention_mask=mask).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    cfg2, sd2 = from_hf_roberta(hf.config.to_dict(), hf.state_dict())
    assert cfg2 == cfg
    assert_same(sd2, ours.state_dict())


def test_hf_errors():
    cfg = cfg_(num_layers=2)
    sd = model(cfg).state_dict()
    hf_sd, hcfg = to_hf_roberta(cfg, sd), hf_config(cfg)
    with pytest.raises(SurgeryError, match="pad_token_id=0 .* pad_token_id=1"):
        from_hf_roberta(hcfg | {"pad_token_id": 0}, hf_sd)
    with pytest.raises(SurgeryError, match="hidden_act='relu'"):
        from_hf_roberta(hcfg | {"hidden_act": "relu"}, hf_sd)
    # type_vocab_size > 1 is folded (row 0; tests/test_import_export.py); a table not matching it is refused
    with pytest.raises(SurgeryError, match=r"shape \(1, 32\), expected \(type_vocab_size=2, hidden_size=32\)"):
        from_hf_roberta(hcfg | {"type_vocab_size": 2}, hf_sd)
    two = dict(hf_sd) | {HF_TOKEN_TYPE: torch.randn(2, 32)}
    _, folded = from_hf_roberta(hcfg | {"type_vocab_size": 2}, two)
    assert torch.equal(folded["embed.positions.weight"], sd["embed.positions.weight"] + two[HF_TOKEN_TYPE][0])
    with pytest.raises(SurgeryError, match="missing roberta.encoder.layer.2"):
        from_hf_roberta(hcfg | {"num_hidden_layers": 3}, hf_sd)
    untied = dict(hf_sd) | {"lm_head.decoder.weight": hf_sd["lm_head.decoder.weight"] + 1}
    with pytest.raises(SurgeryError, match="not tied"):
        from_hf_roberta(hcfg, untied)
    with_secondary = cfg_(num_layers=2, secondary_head_layer=1)
    with pytest.raises(SurgeryError, match="drop_secondary_head"):
        to_hf_roberta(with_secondary, model(with_secondary).state_dict())
    exported = to_hf_roberta(with_secondary, model(with_secondary).state_dict(), drop_secondary_head=True)
    assert not any("secondary" in k for k in exported)
    with pytest.raises(SurgeryError, match="does not match its config"):
        check_state_dict(cfg, {k: v for k, v in sd.items() if k != "embed.norm.bias"})
