"""The checks that chapter 3 ("Parametric attention") keeps in collapsed cells, where the library tests do not already
make them: cosine attention is dot-product attention on unit keys at temperature ||q|| / beta (eq-cosine-as-dot),
for the scores and for the weights, with and without a padding mask."""

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
