"""The model: shapes, masked-only heads, the secondary head's tap, RoBERTa positions, padding, tying."""

import pytest
import torch
import torch.nn.functional as F

from mm_ds.config import ModelConfig
from mm_ds.model.model import LANGUAGE_PARAMS, RobertaMLM, param_count, param_groups, param_shapes
from mm_ds.tokens import IGNORE_INDEX, MASK, PAD

V = 97


def tiny(**kw) -> RobertaMLM:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=V, hidden_size=32, num_layers=4, num_heads=4, ffn_size=64, max_positions=40, **kw)
    return RobertaMLM(cfg).eval()


def batch(B=3, T=20, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(5, V, (B, T), generator=g)
    labels = torch.full_like(x, IGNORE_INDEX)
    sel = torch.rand(x.shape, generator=g) < 0.3
    sel[:, 0] = True
    labels[sel] = x[sel]
    x = x.masked_fill(sel, MASK)
    return x, labels


def test_shapes_and_state_dict_names():
    m = tiny(secondary_head_layer=2)
    x, labels = batch()
    out = m(x)
    assert out["logits_main"].shape == out["logits_secondary"].shape == (3, 20, V)
    keys = set(m.state_dict())
    assert {"embed.tokens.weight", "head.bias", "secondary_head.bias", "layers.3.attn.qkv.weight"} <= keys
    assert set(LANGUAGE_PARAMS) <= keys
    # Tied: no separate output projection matrix exists anywhere.
    assert [k for k, v in m.state_dict().items() if v.shape == (V, 32)] == ["embed.tokens.weight"]


def test_masked_only_head_matches_full_logits_and_sees_only_masked_rows():
    m = tiny(secondary_head_layer=2)
    x, labels = batch()
    rows = []
    hook = m.head.dense.register_forward_hook(lambda mod, inp, out: rows.append(inp[0].shape))
    out = m(x, labels)
    hook.remove()
    n_masked = int((labels != IGNORE_INDEX).sum())
    assert rows == [(n_masked, 32)]  # the head ran on the masked positions only
    full = m(x)
    sel = labels != IGNORE_INDEX
    for k in ("main", "secondary"):
        want = F.cross_entropy(full[f"logits_{k}"][sel], labels[sel])
        torch.testing.assert_close(out[f"loss_{k}"], want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out["loss"], (out["loss_main"] + out["loss_secondary"]) / 2)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_secondary_head_sees_exactly_layer_n_output(n):
    m = tiny(secondary_head_layer=n)
    x, _ = batch()
    seen = {}
    m.layers[n - 1].register_forward_hook(lambda mod, inp, out: seen.setdefault("h", out))
    out = m(x)
    want = m.secondary_head(seen["h"].view(*x.shape, -1), m.embed.tokens.weight)  # layers run on (B*T, h) rows
    assert torch.equal(out["logits_secondary"], want)
    assert not torch.equal(out["logits_secondary"], out["logits_main"])


def test_roberta_positions_and_padding_invariance():
    m = tiny()
    x, _ = batch(B=1, T=12)
    padded = torch.cat([x, torch.full((1, 5), PAD)], dim=1)
    mask = padded.ne(PAD)
    a, _ = m.encode(x)
    b, _ = m.encode(padded, attention_mask=mask)
    torch.testing.assert_close(a, b[:, :12], rtol=1e-5, atol=1e-5)
    # First real token sits at position PAD+1, as in RoBERTa; the table has max_positions + 2 rows.
    assert m.embed.positions.weight.shape[0] == 40 + PAD + 1


def test_init_matches_roberta():
    m = tiny()
    w = m.layers[0].ffn.fc1.weight
    assert abs(w.std().item() - 0.02) < 0.003
    assert torch.count_nonzero(m.layers[0].ffn.fc1.bias) == 0
    assert torch.count_nonzero(m.embed.tokens.weight[PAD]) == 0
    assert torch.count_nonzero(m.head.bias) == 0


def test_output_projection_gradient_reaches_embedding_rows_never_used_as_input():
    m = tiny().train()
    x, labels = batch()
    target_only = int(labels[labels != IGNORE_INDEX][0])
    x = x.masked_fill(x == target_only, 5 if target_only != 5 else 6)  # never an input token
    m(x, labels)["loss"].backward()
    assert m.embed.tokens.weight.grad[target_only].abs().sum() > 0


def test_param_groups_exclude_frozen_and_exempt_norms_and_biases():
    m = tiny()
    m.layers[0].requires_grad_(False)
    groups = param_groups(m, 0.01)
    ids = {id(p) for g in groups for p in g["params"]}
    assert all(id(p) not in ids for p in m.layers[0].parameters())
    no_decay = {id(p) for g in groups if g["weight_decay"] == 0 for p in g["params"]}
    assert id(m.layers[1].attn_norm.weight) in no_decay and id(m.head.bias) in no_decay
    assert id(m.layers[1].attn.qkv.weight) not in no_decay


@pytest.mark.parametrize("kw", [dict(), dict(secondary_head_layer=2), dict(num_layers=6, hidden_size=48, ffn_size=100),
                                dict(num_layers=1, max_positions=7, secondary_head_layer=1)])
def test_param_shapes_and_count_match_a_built_model(kw):
    """`param_count` is what `mm-ds plan` and surgery count with: it must be the built model's, with the
    secondary head (secondary_head_layer) and with any layer count (MINIPOST: N kept + 2 bridge layers)."""
    cfg = ModelConfig(**(dict(vocab_size=V, hidden_size=32, num_layers=4, num_heads=4, ffn_size=64,
                              max_positions=40) | kw))
    model = RobertaMLM(cfg)
    assert param_shapes(cfg) == {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert param_count(cfg) == sum(p.numel() for p in model.parameters()) == model.num_params()
    named = dict(model.named_parameters())
    for select in (lambda k: k in LANGUAGE_PARAMS, lambda k: k.startswith("layers.3.") or k.startswith("layers.4."),
                   lambda k: not k.startswith(("head.", "secondary_head."))):
        assert param_count(cfg, select) == sum(p.numel() for k, p in named.items() if select(k))


def test_param_count_of_minipost_and_minijoint_mini_models():
    """The mini-models surgery makes: MINIPOST's (N kept + 2 bridge layers), MINIJOINT's (N layers + the
    secondary head promoted); and the paper's BL_BASE size."""
    from mm_ds.model.surgery import build_minipost, extract_minijoint

    base = tiny().cfg
    post_cfg, post_sd = build_minipost(base, tiny().state_dict(), n_layers=2, new_layers=2)
    assert post_cfg.num_layers == 4 and param_count(post_cfg) == sum(t.numel() for t in post_sd.values())
    assert param_count(post_cfg, lambda k: k.startswith(("layers.2.", "layers.3."))) == \
        sum(p.numel() for k, p in RobertaMLM(post_cfg).named_parameters() if k.startswith(("layers.2.", "layers.3.")))
    joint = tiny(secondary_head_layer=2)
    mini_cfg, mini_sd = extract_minijoint(joint.cfg, joint.state_dict())
    assert param_count(mini_cfg) == sum(t.numel() for t in mini_sd.values()) == RobertaMLM(mini_cfg).num_params()
    paper = ModelConfig(vocab_size=50_000, max_positions=512)
    assert param_count(paper, lambda k: k in LANGUAGE_PARAMS) == 50_000 * 768 + 50_000
    assert 124e6 < param_count(paper) < 126e6
