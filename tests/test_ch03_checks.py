"""The checks that chapter 3 ("Parametric attention") keeps in collapsed cells, where the library tests do not already
make them: cosine attention is dot-product attention on unit keys at temperature ||q|| / beta (eq-cosine-as-dot),
for the scores and for the weights, with and without a padding mask; and attnbook's MultiHeadAttention equals
torch's nn.MultiheadAttention once the weights are copied and the masks negated (section "Multiple heads")."""

import pytest
import torch
import torch.nn.functional as F

from attnbook.attention import CosineAttention, DotProductAttention
from attnbook.masking import lengths_to_mask


@pytest.mark.parametrize("beta", [0.5, 1.0, 4.0])
def test_cosine_is_dot_product_on_unit_keys_at_temperature_norm_q_over_beta(beta):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 6, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 6, 5, generator=g, dtype=torch.float64)
    k_unit = k / k.norm(dim=-1, keepdim=True)
    as_dot = beta * (q @ k_unit.transpose(-1, -2)) / q.norm(dim=-1, keepdim=True)
    reference = beta * F.cosine_similarity(q.unsqueeze(2), k.unsqueeze(1), dim=-1)
    cosine = CosineAttention(init_scale=beta).double()
    torch.testing.assert_close(as_dot, reference, rtol=0, atol=1e-12)
    # the module keeps log(beta) as a float32 parameter: beta itself is exact to float32 rounding
    torch.testing.assert_close(cosine.scores(q, k), reference, rtol=1e-7, atol=0)

    mask = lengths_to_mask(torch.tensor([6, 4]), 6)[:, None, :]
    out = cosine(q, k, v, mask)
    # dot-product attention (unscaled) of the queries q * beta / ||q|| against the unit keys
    dot = DotProductAttention(scaled=False).double()
    expected = dot(q * cosine.scale / q.norm(dim=-1, keepdim=True), k_unit, v, mask)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(cosine.attention_weights, dot.attention_weights, rtol=0, atol=1e-12)
    assert cosine.attention_weights[1, :, 4:].abs().max() == 0


def test_multi_head_attention_equals_torch_with_copied_weights_and_translated_masks():
    """Chapter 3, section "Multi-head attention": attnbook's MultiHeadAttention with its weights copied into
    nn.MultiheadAttention (W_Q, W_K, W_V stacked in in_proj_weight) and the masks negated (torch: True = ignored)
    gives the same outputs and per-head weights under a causal and a key-padding mask."""
    from torch import nn

    from attnbook.attention import MultiHeadAttention, causal_mask

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 16, generator=g)
    token_mask = lengths_to_mask(torch.tensor([6, 8]), 8)  # (batch, n), True = takes part
    ours = MultiHeadAttention(embed_dim=16, num_heads=4)
    out_ours = ours(x, x, x, token_mask[:, None, :] & causal_mask(8))
    theirs = nn.MultiheadAttention(16, 4, batch_first=True)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        theirs.out_proj.load_state_dict(ours.out_proj.state_dict())
    out_theirs, w_theirs = theirs(x, x, x, key_padding_mask=~token_mask, attn_mask=~causal_mask(8),
                                  average_attn_weights=False)
    torch.testing.assert_close(out_ours, out_theirs, rtol=0, atol=1e-6)
    torch.testing.assert_close(ours.attention_weights, w_theirs, rtol=0, atol=1e-6)


def test_causal_mask_renormalized_after_the_softmax_equals_minus_infinity_before_it():
    """Chapter 3, section "Stage 3: the causal mask": zeroing the weights of later keys and renormalizing each row
    gives the weights of a softmax over scores set to -inf above the diagonal, which is what torch's fused kernel
    with is_causal=True computes (checked through its output) and what attnbook's masked_softmax gives."""
    from attnbook.attention import causal_mask
    from attnbook.masking import masked_softmax

    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 5, 5, generator=g, dtype=torch.float64)
    values = torch.randn(3, 5, 4, generator=g, dtype=torch.float64)
    mask = causal_mask(5)
    zeroed = torch.softmax(scores, -1) * mask
    renormalized = zeroed / zeroed.sum(-1, keepdim=True)
    minus_inf = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
    torch.testing.assert_close(renormalized, minus_inf, rtol=0, atol=1e-15)
    torch.testing.assert_close(masked_softmax(scores, mask), minus_inf, rtol=0, atol=1e-15)
    # F.sdpa scales q.k by 1/sqrt(d); with q = scores-rows and k = I * sqrt(d) its logits are the scores themselves
    q, k = scores, torch.eye(5, dtype=torch.float64).expand(3, 5, 5) * 5 ** 0.5
    fused = F.scaled_dot_product_attention(q, k, values, is_causal=True)
    torch.testing.assert_close(fused, minus_inf @ values, rtol=0, atol=1e-12)


def test_self_attention_ignores_word_order():
    """Chapter 3, section "Self-attention ignores word order": permuting the inputs of torch's
    nn.MultiheadAttention (no mask, no positions) permutes its outputs the same way, and so for attnbook's."""
    from torch import nn

    from attnbook.attention import MultiHeadAttention

    torch.manual_seed(0)
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    order = torch.tensor([5, 2, 0, 4, 1, 3])
    theirs = nn.MultiheadAttention(8, 2, batch_first=True).double()
    ours = MultiHeadAttention(embed_dim=8, num_heads=2).double()
    for module, call in ((theirs, lambda m, t: m(t, t, t)[0]), (ours, lambda m, t: m(t, t, t))):
        torch.testing.assert_close(call(module, x[:, order]), call(module, x)[:, order], rtol=0, atol=1e-12)
