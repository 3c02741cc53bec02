"""Llama-MoE transformer: shapes, causality, deterministic init, sizes, load balancing, learning."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from titan_fp8.models.llama_moe import FLAVORS, ModelArgs, Transformer, apply_rope, rope_tables
from titan_fp8.models.moe import MoE, MoEArgs


def debug_args(**moe_overrides) -> ModelArgs:
    base = FLAVORS["debug"]
    return dataclasses.replace(base, moe=dataclasses.replace(base.moe, **moe_overrides))


def test_forward_shapes_dtype_and_structure():
    torch.manual_seed(0)
    m = Transformer(FLAVORS["debug"])
    tokens = torch.randint(0, 256, (2, 17))
    logits = m(tokens)
    assert logits.shape == (2, 17, 256) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    assert list(m.layers.keys()) == ["0", "1", "2"]
    assert hasattr(m.layers["0"], "feed_forward") and not hasattr(m.layers["0"], "moe")
    assert isinstance(m.layers["1"].moe, MoE) and not hasattr(m.layers["1"], "feed_forward")
    for name in ("wq", "wk", "wv", "wo"):
        assert isinstance(getattr(m.layers["1"].attention, name), torch.nn.Linear)
    assert m.layers["1"].moe.shared_expert is not None
    # bf16 parameters still give float32 logits
    assert m.bfloat16()(tokens).dtype == torch.float32


def test_causal_future_tokens_never_change_earlier_logits():
    torch.manual_seed(1)
    m = Transformer(FLAVORS["debug"])
    tokens = torch.randint(0, 256, (2, 24))
    base = m(tokens)
    for j in (5, 16, 23):
        changed = tokens.clone()
        changed[:, j] = (changed[:, j] + 101) % 256
        out = m(changed)
        torch.testing.assert_close(out[:, :j], base[:, :j], rtol=1e-5, atol=1e-5)
        assert (out[:, j:] - base[:, j:]).abs().max() > 1e-3  # the change is seen from j on


def test_rope_is_a_rotation_that_sees_only_relative_position():
    torch.manual_seed(6)
    head_dim, n = 16, 40
    cos, sin = rope_tables(head_dim, n, 10000.0, device="cpu")
    q = torch.randn(1, 1, 1, head_dim, dtype=torch.float64).expand(1, n, 1, head_dim)
    k = torch.randn(1, 1, 1, head_dim, dtype=torch.float64).expand(1, n, 1, head_dim)
    rq, rk = apply_rope(q, cos, sin)[0, :, 0], apply_rope(k, cos, sin)[0, :, 0]
    torch.testing.assert_close(rq.norm(dim=-1), q[0, :, 0].norm(dim=-1), rtol=1e-6, atol=1e-6)
    dots = rq @ rk.T  # dots[m, n] must depend on m - n only
    for shift in (1, 7, 20):
        torch.testing.assert_close(dots[shift:, shift:], dots[:-shift, :-shift], rtol=1e-5, atol=1e-5)
    assert (dots[0, 1:] - dots[0, 0]).abs().max() > 1e-2  # and it does depend on it


def test_init_is_deterministic_given_seed_and_survives_meta_flow():
    args = FLAVORS["debug"]
    torch.manual_seed(7)
    a = Transformer(args)
    torch.manual_seed(7)
    b = Transformer(args)
    torch.manual_seed(8)
    c = Transformer(args)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["layers.1.moe.experts.w13"], sc["layers.1.moe.experts.w13"])

    # FSDP2 flow: build on meta, materialise, init -> same as init_weights on a real-device model
    with torch.device("meta"):
        m = Transformer(args)
    m.to_empty(device="cpu")
    torch.manual_seed(9)
    m.init_weights()
    torch.manual_seed(9)
    a.init_weights()
    sm, sa = m.state_dict(), a.state_dict()
    assert all(torch.equal(sm[k], sa[k]) for k in sa)
    torch.testing.assert_close(m.rope_cos, a.rope_cos, rtol=0, atol=0)
    tokens = torch.randint(0, 256, (1, 12))
    assert torch.equal(m(tokens), a(tokens))


def test_llama_moe_size_on_meta():
    with torch.device("meta"):
        m = Transformer(FLAVORS["llama_moe"])
    a = m.args
    total, active = m.num_params(active_only=False), m.num_params(active_only=True)
    assert 2e9 <= total <= 4e9, total
    # analytic count: attention + routed + shared + router + norms per layer, embedding + head + norm
    hd = a.head_dim
    attn = a.dim * a.n_heads * hd * 2 + a.dim * a.n_kv_heads * hd * 2
    routed = 3 * a.dim * a.moe.hidden_dim * a.moe.num_experts
    shared = 3 * a.dim * a.moe.shared_hidden_dim * a.moe.num_shared_experts
    per_layer = attn + routed + shared + a.dim * a.moe.num_experts + 2 * a.dim
    assert total == a.n_layers * per_layer + 2 * a.vocab_size * a.dim + a.dim
    expected_active = a.n_layers * (per_layer - routed + routed * a.moe.top_k // a.moe.num_experts) \
        + a.vocab_size * a.dim + a.dim
    assert active == expected_active
    s = 4096
    assert m.flops_per_token(s) == 6 * active + 12 * a.n_layers * a.n_heads * hd * s


def test_aux_loss_positive_when_enabled_and_sums_layers():
    torch.manual_seed(2)
    tokens = torch.randint(0, 256, (2, 16))
    m = Transformer(debug_args(load_balance="aux_loss", aux_loss_coef=0.01))
    m(tokens)
    aux = m.aux_loss()
    assert aux.dim() == 0 and torch.isfinite(aux) and aux > 0
    per_layer = [layer.moe.aux_loss for layer in m.layers.values() if layer.is_moe]
    assert len(per_layer) == 2
    torch.testing.assert_close(aux, per_layer[0] + per_layer[1])
    # perfectly balanced routing gives coef per layer; any routing gives at least ~coef
    assert aux > 0.5 * 0.01 * 2
    aux.backward()
    assert m.layers["1"].moe.router.gate.weight.grad.abs().sum() > 0  # the loss reaches the router

    for mode in ("none", "aux_free"):
        m = Transformer(debug_args(load_balance=mode))
        m(tokens)
        assert m.aux_loss() == 0


def test_aux_free_bias_moves_toward_balance():
    torch.manual_seed(3)
    args = debug_args(load_balance="aux_free", bias_update_rate=0.02, score_func="sigmoid", route_norm=True)
    m = Transformer(args)
    moe = m.layers["1"].moe
    # small gate: tokens differ a little in their scores; a bias makes all prefer experts 0 and 1
    with torch.no_grad():
        moe.router.gate.weight.normal_(0, 0.02)
        moe.router.expert_bias.copy_(torch.tensor([0.3, 0.2, 0.0, 0.0]))
    tokens = torch.randint(0, 256, (4, 32))
    m(tokens)
    load0 = moe.tokens_per_expert.clone()
    assert load0[2] == 0 and load0[3] == 0  # all on experts 0 and 1
    bias0 = moe.router.expert_bias.clone()
    m.update_router_biases()
    step = moe.router.expert_bias - bias0
    torch.testing.assert_close(step, torch.tensor([-0.02, -0.02, 0.02, 0.02]))
    assert moe.load_since_update.sum() == 0  # reset after the update
    spread = [load0.max() - load0.min()]
    for _ in range(12):
        m(tokens)
        m.update_router_biases()
        load = moe.tokens_per_expert
        spread.append((load.max() - load.min()).item())
    assert max(spread[-4:]) < 0.6 * spread[0], spread
    assert m.layers["2"].moe.router.expert_bias.abs().sum() > 0  # every MoE layer updated


def test_update_router_biases_is_noop_without_aux_free():
    m = Transformer(debug_args(load_balance="aux_loss"))
    m(torch.randint(0, 256, (1, 8)))
    m.update_router_biases()
    assert all(layer.moe.router.expert_bias.abs().sum() == 0 for layer in m.layers.values() if layer.is_moe)


def test_a_few_steps_lower_the_loss_on_a_fixed_batch():
    torch.manual_seed(4)
    m = Transformer(FLAVORS["debug"])
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.0)
    data = torch.randint(0, 256, (4, 33))
    inputs, targets = data[:, :-1], data[:, 1:]
    losses = []
    for _ in range(25):
        logits = m(inputs)
        ce = F.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1))
        (ce + m.aux_loss()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        m.update_router_biases()
        losses.append(ce.item())
    assert losses[0] > 5.0  # ~ln(256) at init
    assert losses[-1] < 0.6 * losses[0], losses


def test_bad_inputs_and_args_name_the_culprit():
    m = Transformer(FLAVORS["debug"])
    with pytest.raises(ValueError, match="tokens"):
        m(torch.randn(1, 4))
    with pytest.raises(ValueError, match="max_seq_len"):
        m(torch.zeros(1, 257, dtype=torch.long))
    with pytest.raises(ValueError, match="n_kv_heads"):
        ModelArgs(dim=64, n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="n_dense_layers"):
        ModelArgs(n_layers=2, n_dense_layers=3)
    with pytest.raises(ValueError, match="score_func"):
        ModelArgs(moe=MoEArgs(score_func="tanh"))
