"""attnbook.transformer (chapter 8) against independent references: torch's nn.TransformerEncoderLayer,
nn.TransformerDecoderLayer, their stacks and nn.Transformer with copied weights (in both directions, with torch's
masks negated), the sinusoid formula written out with ``math``, RoPE as a complex multiplication, a step-by-step
decoder written with teacher forcing, and the padding properties of the classifier."""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attnbook.attention import MultiHeadAttention, causal_mask
from attnbook.masking import lengths_to_mask
from attnbook.seq2seq import beam_search, greedy_decode
from attnbook.text import BOS_ID, EOS_ID, PAD_ID
from attnbook.transformer import (
    LearnedPositionalEncoding,
    RotaryMultiHeadAttention,
    SinusoidalPositionalEncoding,
    Transformer,
    TransformerClassifier,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerDecoderState,
    TransformerEmbedding,
    TransformerEncoder,
    TransformerEncoderLayer,
    copy_from_torch,
    copy_to_torch,
    pad_attention_mass,
    positions_from_mask,
    rotary_embedding,
    sinusoidal_encoding,
)

pytestmark = pytest.mark.usefixtures("one_thread")

D, H, FF = 8, 2, 16
TOL = dict(rtol=1e-10, atol=1e-12)
F64 = torch.float64


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def _perturb(module, seed=1):
    """Move every parameter off its initial value (zero biases, unit LayerNorm weights), so that a swapped or
    missing tensor in the copy shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=F64).to(p.dtype))
    return module


def _pair(kind, norm_first, activation, direction, seed=0):
    """A book layer and a torch layer with the same fp64 weights, in eval mode, copied in ``direction``."""
    torch.manual_seed(seed)
    book_cls, torch_cls = {"encoder": (TransformerEncoderLayer, nn.TransformerEncoderLayer),
                           "decoder": (TransformerDecoderLayer, nn.TransformerDecoderLayer)}[kind]
    if direction == "to_torch":
        ours = _perturb(book_cls(D, H, FF, 0.0, activation, norm_first=norm_first).double()).eval()
        return ours, copy_to_torch(ours)
    theirs = _perturb(torch_cls(D, H, FF, 0.0, activation, norm_first=norm_first, batch_first=True, dtype=F64)).eval()
    return copy_from_torch(theirs), theirs


def _torch_call(module, *args, no_grad, **kwargs):
    """torch's output, with autograd on (the reference path) or off (torch's fused fast path in eval mode)."""
    with torch.set_grad_enabled(not no_grad):
        return module(*args, **kwargs)


# ------------------------------------------------------------------------------------ masks for the comparisons
B, N, S, T = 3, 5, 5, 4                             # batch, encoder length, source length, target length
SRC_PAD = lengths_to_mask(torch.tensor([5, 3, 2]), 5)        # True = real token
TGT_PAD = lengths_to_mask(torch.tensor([4, 2, 1]), 4)
_g = torch.Generator().manual_seed(7)
SELF = torch.rand(B, N, N, generator=_g) < 0.6
SELF[:, :, 0] = True                                # every query keeps a real key (torch gives NaN otherwise)
CROSS = torch.rand(B, T, S, generator=_g) < 0.6
CROSS[:, :, 0] = True
PER_HEAD = torch.rand(B, H, N, N, generator=_g) < 0.6
PER_HEAD[..., 0] = True

# name -> (book kwargs, torch kwargs); torch's boolean masks are True = ignored, hence the ~.
ENCODER_MASKS = {
    "none": ({}, {}),
    "padding": (dict(padding_mask=SRC_PAD), dict(src_key_padding_mask=~SRC_PAD)),
    "self_mask": (dict(self_mask=SELF), dict(src_mask=~SELF.repeat_interleave(H, 0))),
    "causal": (dict(self_mask=causal_mask(N)), dict(src_mask=~causal_mask(N))),
    "per_head": (dict(self_mask=PER_HEAD), dict(src_mask=~PER_HEAD.reshape(B * H, N, N))),
    "padding+self_mask": (dict(padding_mask=SRC_PAD, self_mask=SELF),
                          dict(src_key_padding_mask=~SRC_PAD, src_mask=~SELF.repeat_interleave(H, 0))),
    "padding+causal": (dict(padding_mask=SRC_PAD, self_mask=causal_mask(N)),
                       dict(src_key_padding_mask=~SRC_PAD, src_mask=~causal_mask(N))),
}
DECODER_MASKS = {
    "none": (dict(causal=False), {}),
    "causal": (dict(causal=True), dict(tgt_mask=~causal_mask(T))),
    "tgt_padding": (dict(causal=False, tgt_padding_mask=TGT_PAD), dict(tgt_key_padding_mask=~TGT_PAD)),
    "memory_padding": (dict(causal=False, memory_padding_mask=SRC_PAD), dict(memory_key_padding_mask=~SRC_PAD)),
    "cross_mask": (dict(causal=False, cross_mask=CROSS), dict(memory_mask=~CROSS.repeat_interleave(H, 0))),
    "causal+paddings": (dict(causal=True, tgt_padding_mask=TGT_PAD, memory_padding_mask=SRC_PAD),
                        dict(tgt_mask=~causal_mask(T), tgt_key_padding_mask=~TGT_PAD,
                             memory_key_padding_mask=~SRC_PAD)),
    "all": (dict(causal=True, tgt_padding_mask=TGT_PAD, memory_padding_mask=SRC_PAD, cross_mask=CROSS),
            dict(tgt_mask=~causal_mask(T), tgt_key_padding_mask=~TGT_PAD, memory_key_padding_mask=~SRC_PAD,
                 memory_mask=~CROSS.repeat_interleave(H, 0))),
}


# ------------------------------------------------------------------------------------ layers equal torch's
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("direction", ["to_torch", "from_torch"])
@pytest.mark.parametrize("no_grad", [False, True])
def test_encoder_layer_equals_torch_under_every_mask(norm_first, activation, direction, no_grad):
    ours, theirs = _pair("encoder", norm_first, activation, direction)
    x = _randn(B, N, D)
    for name, (book_kw, torch_kw) in ENCODER_MASKS.items():
        expected = _torch_call(theirs, x, no_grad=no_grad, **torch_kw)
        torch.testing.assert_close(ours(x, **book_kw), expected, **TOL, msg=name)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("direction", ["to_torch", "from_torch"])
def test_decoder_layer_equals_torch_under_every_mask(norm_first, activation, direction):
    ours, theirs = _pair("decoder", norm_first, activation, direction)
    tgt, memory = _randn(B, T, D, seed=1), _randn(B, S, D, seed=2)
    for name, (book_kw, torch_kw) in DECODER_MASKS.items():
        torch.testing.assert_close(ours(tgt, memory, **book_kw), theirs(tgt, memory, **torch_kw), **TOL, msg=name)


def test_copied_weights_are_the_same_tensors_values():
    """The book's q/k/v projections are torch's packed in_proj rows, in the order q, k, v."""
    ours, theirs = _pair("decoder", False, "relu", "to_torch")
    for book_mha, torch_mha in ((ours.self_attn, theirs.self_attn), (ours.multihead_attn, theirs.multihead_attn)):
        packed = torch.cat([book_mha.q_proj.weight, book_mha.k_proj.weight, book_mha.v_proj.weight])
        assert torch.equal(packed, torch_mha.in_proj_weight)
        assert torch.equal(book_mha.out_proj.bias, torch_mha.out_proj.bias)
    assert torch.equal(ours.norm3.weight, theirs.norm3.weight)
    assert not theirs.training and theirs.self_attn.batch_first


def test_torch_masks_have_the_opposite_polarity():
    """Passing the book's mask to torch unnegated masks the real tokens instead of the pads."""
    ours, theirs = _pair("encoder", False, "relu", "to_torch")
    x = _randn(B, N, D)
    right = theirs(x, src_key_padding_mask=~SRC_PAD)
    wrong = theirs(x, src_key_padding_mask=SRC_PAD)
    torch.testing.assert_close(ours(x, padding_mask=SRC_PAD), right, **TOL)
    assert not torch.allclose(wrong[1:], right[1:])                  # rows 1, 2 have pads; row 0 none (NaN in torch)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("final_norm", [False, True])
@pytest.mark.parametrize("direction", ["to_torch", "from_torch"])
def test_stacks_of_two_layers_equal_torch(norm_first, final_norm, direction):
    torch.manual_seed(0)
    if direction == "to_torch":
        norm = nn.LayerNorm(D) if final_norm else None
        enc = _perturb(TransformerEncoder(TransformerEncoderLayer(D, H, FF, 0.0, "gelu", norm_first=norm_first), 2,
                                          norm).double()).eval()
        dec = _perturb(TransformerDecoder(TransformerDecoderLayer(D, H, FF, 0.0, "gelu", norm_first=norm_first), 2,
                                          None if norm is None else nn.LayerNorm(D)).double()).eval()
        t_enc, t_dec = copy_to_torch(enc), copy_to_torch(dec)
    else:
        norm = (lambda: nn.LayerNorm(D, dtype=F64)) if final_norm else (lambda: None)
        t_enc = _perturb(nn.TransformerEncoder(nn.TransformerEncoderLayer(
            D, H, FF, 0.0, "gelu", batch_first=True, norm_first=norm_first, dtype=F64), 2, norm(),
            enable_nested_tensor=False)).eval()
        t_dec = _perturb(nn.TransformerDecoder(nn.TransformerDecoderLayer(
            D, H, FF, 0.0, "gelu", batch_first=True, norm_first=norm_first, dtype=F64), 2, norm())).eval()
        enc, dec = copy_from_torch(t_enc), copy_from_torch(t_dec)
    assert len(enc.layers) == len(t_enc.layers) == 2
    assert not torch.equal(enc.layers[0].linear1.weight, enc.layers[1].linear1.weight)   # perturbed apart
    x, tgt = _randn(B, S, D), _randn(B, T, D, seed=1)
    memory = enc(x, padding_mask=SRC_PAD)
    torch.testing.assert_close(memory, t_enc(x, src_key_padding_mask=~SRC_PAD), **TOL)
    out = dec(tgt, memory, tgt_padding_mask=TGT_PAD, memory_padding_mask=SRC_PAD)
    expected = t_dec(tgt, memory, tgt_mask=~causal_mask(T), tgt_key_padding_mask=~TGT_PAD,
                     memory_key_padding_mask=~SRC_PAD)
    torch.testing.assert_close(out, expected, **TOL)


def _translator(norm_first=False, activation="relu", final_norm=None, positional="sinusoidal", seed=0, scale=1.0,
                src_v=11, tgt_v=9):
    torch.manual_seed(seed)
    model = Transformer(src_v, tgt_v, d_model=D, nhead=H, num_encoder_layers=2, num_decoder_layers=2,
                        dim_feedforward=FF, dropout=0.0, activation=activation, norm_first=norm_first,
                        positional=positional, max_len=16, final_norm=final_norm).double()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    return model.eval()


SRC = torch.tensor([[4, 5, 6, 7, EOS_ID], [8, 9, EOS_ID, PAD_ID, PAD_ID], [10, EOS_ID, PAD_ID, PAD_ID, PAD_ID]])
SRC_LENGTHS = torch.tensor([5, 3, 2])
TGT_IN = torch.tensor([[BOS_ID, 4, 5, 6], [BOS_ID, 7, PAD_ID, PAD_ID], [BOS_ID, PAD_ID, PAD_ID, PAD_ID]])


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_translation_model_equals_nn_transformer(norm_first, activation):
    """The book's stacks equal nn.Transformer's; the whole model equals book embeddings -> nn.Transformer ->
    book output layer, with torch's masks negated."""
    ours = _perturb(_translator(norm_first, activation, final_norm=True))
    theirs = copy_to_torch(ours)
    assert isinstance(theirs, nn.Transformer) and not theirs.training
    src_emb, tgt_emb = ours.encoder.embedding(SRC), ours.decoder.embedding(TGT_IN)
    torch_kw = dict(tgt_mask=~causal_mask(T), src_key_padding_mask=~SRC_PAD, tgt_key_padding_mask=~TGT_PAD,
                    memory_key_padding_mask=~SRC_PAD)
    memory = ours.encoder.stack(src_emb, padding_mask=SRC_PAD)
    out = ours.decoder.stack(tgt_emb, memory, tgt_padding_mask=TGT_PAD, memory_padding_mask=SRC_PAD)
    torch.testing.assert_close(out, theirs(src_emb, tgt_emb, **torch_kw), **TOL)
    logits, weights = ours(SRC, SRC_LENGTHS, TGT_IN)                   # right-padded target: no target mask needed
    del torch_kw["tgt_key_padding_mask"]
    torch.testing.assert_close(logits, ours.decoder.out(theirs(src_emb, tgt_emb, **torch_kw)), **TOL)
    assert weights.shape == (B, T, S) and torch.all(weights[~SRC_PAD[:, None, :].expand(B, T, S)] == 0)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True, but self.use_nested_tensor is False")
@pytest.mark.parametrize("norm_first", [False, True])
def test_nn_transformer_weights_load_into_the_book_model(norm_first):
    """From torch's own nn.Transformer (default construction: final norms, nested-tensor fast path under no_grad)."""
    torch.manual_seed(3)
    theirs = _perturb(nn.Transformer(D, H, 2, 2, FF, 0.0, batch_first=True, norm_first=norm_first,
                                     dtype=F64)).eval()
    ours = copy_from_torch(theirs, into=_translator(norm_first, final_norm=True))
    src_emb, tgt_emb = _randn(B, S, D), _randn(B, T, D, seed=1)
    with torch.no_grad():
        expected = theirs(src_emb, tgt_emb, tgt_mask=~causal_mask(T), src_key_padding_mask=~SRC_PAD,
                          memory_key_padding_mask=~SRC_PAD)
    memory = ours.encoder.stack(src_emb, padding_mask=SRC_PAD)
    torch.testing.assert_close(ours.decoder.stack(tgt_emb, memory, memory_padding_mask=SRC_PAD), expected, **TOL)


def test_post_ln_model_without_final_norm_maps_to_torch_without_norm():
    ours = _perturb(_translator(norm_first=False))                     # final_norm=None: none for post-LN
    assert ours.encoder.stack.norm is None and ours.decoder.stack.norm is None
    theirs = copy_to_torch(ours)
    assert theirs.encoder.norm is None and theirs.decoder.norm is None
    src_emb, tgt_emb = ours.encoder.embedding(SRC), ours.decoder.embedding(TGT_IN)
    expected = ours.decoder.out(theirs(src_emb, tgt_emb, tgt_mask=~causal_mask(T), src_key_padding_mask=~SRC_PAD,
                                       memory_key_padding_mask=~SRC_PAD))
    torch.testing.assert_close(ours(SRC, SRC_LENGTHS, TGT_IN)[0], expected, **TOL)
    with pytest.raises(ValueError, match="final norm"):
        copy_from_torch(nn.Transformer(D, H, 2, 2, FF, 0.0, batch_first=True, dtype=F64), into=ours)


# ------------------------------------------------------------------------------------ positions
def test_sinusoidal_encoding_equals_the_formula():
    d, n = 6, 9
    expected = torch.tensor([[math.sin(pos / 10000 ** (2 * (j // 2) / d)) if j % 2 == 0
                              else math.cos(pos / 10000 ** (2 * (j // 2) / d)) for j in range(d)]
                             for pos in range(n)], dtype=F64)
    torch.testing.assert_close(sinusoidal_encoding(torch.arange(n), d, dtype=F64), expected, rtol=0, atol=1e-12)
    pe = SinusoidalPositionalEncoding(d)
    x = _randn(2, n, d)
    torch.testing.assert_close(pe(x), x + expected, rtol=0, atol=1e-12)
    positions = torch.tensor([[0, 0, 0, 1, 2, 3, 4, 5, 6], list(range(9))])      # per row
    torch.testing.assert_close(pe(x, positions), x + expected[positions], rtol=0, atol=1e-12)


def test_learned_positions_add_a_row_per_position():
    pe = LearnedPositionalEncoding(6, 4).double()
    x = _randn(2, 3, 4)
    positions = torch.tensor([[0, 1, 2], [3, 4, 5]])
    torch.testing.assert_close(pe(x, positions), x + pe.embedding.weight[positions], rtol=0, atol=0)
    torch.testing.assert_close(pe(x), x + pe.embedding.weight[:3], rtol=0, atol=0)


def test_embedding_is_scaled_by_sqrt_d_model_and_pad_is_zero():
    emb = TransformerEmbedding(10, 8, positional="none", dropout=0.0)
    ids = torch.tensor([[3, PAD_ID]])
    out = emb(ids)
    torch.testing.assert_close(out[0, 0], emb.embedding.weight[3] * math.sqrt(8))
    assert torch.all(out[0, 1] == 0)


@pytest.mark.parametrize("seed", range(3))
def test_encoder_layer_without_positions_is_permutation_equivariant(seed):
    """Self-attention is a set operation: permuting the tokens (and their mask) permutes the outputs."""
    torch.manual_seed(seed)
    layer = _perturb(TransformerEncoderLayer(D, H, FF, 0.0, norm_first=bool(seed % 2)).double()).eval()
    stack = TransformerEncoder(layer, 2).eval()
    x, perm = _randn(B, N, D, seed=seed), torch.randperm(N)
    for module in (layer, stack):
        out = module(x, padding_mask=SRC_PAD)
        torch.testing.assert_close(module(x[:, perm], padding_mask=SRC_PAD[:, perm]), out[:, perm], **TOL)


def _rope_complex(x, positions, base=10000.0):
    """RoPE as a complex multiplication: pair (x_2i, x_2i+1) is z_i = x_2i + i x_2i+1, rotated to
    z_i * exp(i pos theta_i) (Su et al. 2021, eq. 13)."""
    d = x.shape[-1]
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())
    theta = base ** (-torch.arange(0, d, 2, dtype=F64) / d)
    return torch.view_as_real(z * torch.polar(torch.ones_like(theta), positions[..., None].to(F64) * theta)
                              ).reshape(x.shape)


def test_rope_equals_complex_rotation_and_preserves_norms():
    x, positions = _randn(2, 7, 8), torch.tensor([0, 1, 2, 3, 10, 100, 1000])
    rotated = rotary_embedding(x, positions)
    torch.testing.assert_close(rotated, _rope_complex(x, positions), **TOL)
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1), **TOL)
    assert torch.equal(rotary_embedding(x, torch.zeros(7, dtype=torch.long)), x)   # position 0: no rotation


@pytest.mark.parametrize("shift", [1, 17, 500])
def test_rope_scores_depend_only_on_the_offset(shift):
    q, k = _randn(6, 8), _randn(6, 8, seed=1)
    pos = torch.tensor([0, 1, 2, 5, 8, 13])
    scores = rotary_embedding(q, pos) @ rotary_embedding(k, pos).T
    shifted = rotary_embedding(q, pos + shift) @ rotary_embedding(k, pos + shift).T
    torch.testing.assert_close(shifted, scores, **TOL)
    # ... and not on the positions themselves: other offsets give other scores.
    assert not torch.allclose(rotary_embedding(q, pos) @ rotary_embedding(k, pos + shift).T, scores)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(0, 4000), n=st.integers(0, 4000), shift=st.integers(0, 4000), seed=st.integers(0, 100))
def test_rope_score_is_a_function_of_the_offset(m, n, shift, seed):
    """(R_m q) . (R_n k) = (R_(m+c) q) . (R_(n+c) k) = q . (R_(n-m) k) for n >= m (Su et al. 2021, eq. 16)."""
    q, k = _randn(8, seed=seed), _randn(8, seed=seed + 1)
    score = lambda a, b: float(rotary_embedding(q, torch.tensor(a)) @ rotary_embedding(k, torch.tensor(b)))
    assert score(m + shift, n + shift) == pytest.approx(score(m, n), abs=1e-9)
    lo, hi = min(m, n), max(m, n)
    assert score(lo, hi) == pytest.approx(float(q @ rotary_embedding(k, torch.tensor(hi - lo))), abs=1e-9)


def test_rotary_attention_is_invariant_to_shifting_all_positions():
    torch.manual_seed(0)
    att = _perturb(RotaryMultiHeadAttention(D, H).double())
    x = _randn(B, N, D)
    mask = SRC_PAD[:, None, :]
    pos = torch.arange(N)
    out = att(x, x, x, mask, query_positions=pos)
    torch.testing.assert_close(att(x, x, x, mask, query_positions=pos + 9), out, **TOL)
    per_row = torch.stack([pos + 3 * b for b in range(B)])                     # a different shift per row
    torch.testing.assert_close(att(x, x, x, mask, query_positions=per_row), out, **TOL)
    # With positions 0 for all tokens there is no rotation: the plain MultiHeadAttention.
    plain = MultiHeadAttention(D, H).double()
    plain.load_state_dict(att.state_dict())
    torch.testing.assert_close(att(x, x, x, mask, query_positions=torch.zeros(N, dtype=torch.long)),
                               plain(x, x, x, mask), **TOL)


def test_positions_from_mask():
    left = torch.tensor([[False, False, True, True, True], [True, True, True, True, True],
                         [False, False, False, False, False]])
    assert positions_from_mask(left).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 0, 0, 0]]
    right = torch.tensor([[True, True, False]])
    assert positions_from_mask(right).tolist() == [[0, 1, 1]]
    assert positions_from_mask(right).dtype == torch.int64


# ------------------------------------------------------------------------------------ fully padded rows
@pytest.mark.parametrize("norm_first", [False, True])
def test_a_fully_padded_row_gets_a_zero_attention_context(norm_first):
    """Attention outputs out_proj's bias (zero context); residual, LayerNorm and FFN then apply as usual."""
    torch.manual_seed(0)
    layer = _perturb(TransformerEncoderLayer(D, H, FF, 0.0, norm_first=norm_first).double()).eval()
    x = _randn(2, 4, D)
    mask = torch.tensor([[True, True, False, False], [False, False, False, False]])
    out = layer(x, padding_mask=mask)
    ff = lambda h: layer.linear2(F.relu(layer.linear1(h)))
    bias = layer.self_attn.out_proj.bias
    if norm_first:
        h = x[1] + bias
        expected = h + ff(layer.norm2(h))
    else:
        h = layer.norm1(x[1] + bias)
        expected = layer.norm2(h + ff(h))
    torch.testing.assert_close(out[1], expected, **TOL)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("norm_first", [False, True])
def test_fully_padded_rows_are_finite_in_training_with_finite_gradients(norm_first):
    torch.manual_seed(0)
    enc = TransformerEncoderLayer(D, H, FF, dropout=0.5, norm_first=norm_first).train()
    dec = TransformerDecoderLayer(D, H, FF, dropout=0.5, norm_first=norm_first).train()
    x, tgt = torch.randn(2, 4, D, requires_grad=True), torch.randn(2, 3, D, requires_grad=True)
    mask = torch.tensor([[True, True, False, False], [False, False, False, False]])
    memory = enc(x, padding_mask=mask)
    out = dec(tgt, memory, memory_padding_mask=mask, tgt_padding_mask=torch.tensor([[True] * 3, [False] * 3]))
    assert torch.isfinite(memory).all() and torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(tgt.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in [*enc.parameters(), *dec.parameters()] if p.grad is not None)


def test_torch_sdpa_gives_zeros_for_a_query_without_keys():
    q, k, v = _randn(1, 2, 4), _randn(1, 3, 4, seed=1), _randn(1, 3, 4, seed=2)
    mask = torch.tensor([[[True, False, True], [False, False, False]]])
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(out[0, 1], torch.zeros(4, dtype=F64))
    assert torch.isfinite(out).all()


def test_what_torch_multihead_attention_does_on_a_fully_padded_row():
    """Pinned torch (2.13): NaN with need_weights=True (pytorch issue #160064) in training and eval mode, and in
    the fast path (eval mode without autograd: need_weights=False, and the encoder layer); the SDPA path
    (need_weights=False, with autograd) gives the zero context, i.e. the book's output."""
    torch.manual_seed(0)
    ours = _perturb(MultiHeadAttention(D, H).double())
    theirs = nn.MultiheadAttention(D, H, batch_first=True, dtype=F64)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        theirs.out_proj.load_state_dict(ours.out_proj.state_dict())
    x = _randn(2, 3, D)
    real = torch.tensor([[True, True, False], [False, False, False]])
    book = ours(x, x, x, real[:, None, :])
    assert torch.isfinite(book).all()
    torch.testing.assert_close(book[1], ours.out_proj.bias.expand(3, D), **TOL)
    for training in (True, False):
        out, weights = theirs.train(training)(x, x, x, key_padding_mask=~real, need_weights=True)
        assert out[1].isnan().all() and weights[1].isnan().all()
        torch.testing.assert_close(out[0], book[0], **TOL)
    for training in (True, False):
        out, _ = theirs.train(training)(x, x, x, key_padding_mask=~real, need_weights=False)
        torch.testing.assert_close(out, book, **TOL)
    with torch.no_grad():
        out, _ = theirs.eval()(x, x, x, key_padding_mask=~real, need_weights=False)
    assert out[1].isnan().all()
    torch.testing.assert_close(out[0], book[0], **TOL)
    layer = copy_to_torch(TransformerEncoderLayer(D, H, FF, 0.0).double()).eval()
    with torch.no_grad():
        assert layer(x, src_key_padding_mask=~real)[1].isnan().all()


def test_torch_encoder_layer_on_an_empty_row_in_each_mode():
    """Chapter 8, exercise "ex-tf-empty-review": pinned torch's nn.TransformerEncoderLayer gives finite values for a
    row without tokens in training mode and in eval mode with autograd, NaN on the fast path (eval mode under
    no_grad); nn.TransformerEncoder on that path packs the batch into a nested tensor and gives zeros there."""
    torch.manual_seed(0)
    layer = copy_to_torch(TransformerEncoderLayer(16, 2, 32, dropout=0.0))
    pad_rows = torch.tensor([[False] * 6, [True] * 6])          # torch: True = ignored; row 1 has no token
    x = torch.randn(2, 6, 16)
    assert torch.isfinite(layer.train()(x, src_key_padding_mask=pad_rows)).all()
    assert torch.isfinite(layer.eval()(x, src_key_padding_mask=pad_rows)).all()
    with torch.no_grad():
        fast = layer.eval()(x, src_key_padding_mask=pad_rows)
        stack = nn.TransformerEncoder(layer, 1, enable_nested_tensor=True).eval()
        with warnings.catch_warnings():          # torch warns (once per process) that nested tensors are a prototype
            warnings.simplefilter("ignore", UserWarning)
            nested = stack(x, src_key_padding_mask=pad_rows)
    assert fast[1].isnan().all() and torch.isfinite(fast[0]).all()
    assert torch.equal(nested[1], torch.zeros(6, 16))
    torch.testing.assert_close(nested[0], fast[0])


# ------------------------------------------------------------------------------------ classifier
SENTENCES = [[4, 5, 6, 7], [8, 9], [10]]


def _padded(length, side):
    ids = torch.zeros(len(SENTENCES), length, dtype=torch.long)
    for b, s in enumerate(SENTENCES):
        if side == "post":
            ids[b, :len(s)] = torch.tensor(s)
        else:
            ids[b, length - len(s):] = torch.tensor(s)
    return ids, torch.tensor([len(s) for s in SENTENCES])


def _classifier(seed=0, **kw):
    torch.manual_seed(seed)
    model = TransformerClassifier(12, 3, d_model=D, nhead=H, num_layers=2, dim_feedforward=FF, dropout=0.0,
                                  max_len=16, **kw).double()
    return _perturb(model).eval()


def _logits_at(model, side, lengths=(4, 7)):
    return [model(*_padded(n, side))[0] for n in lengths]


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope", "none"])
@pytest.mark.parametrize("readout", ["first", "mean"])
@pytest.mark.parametrize("positions", ["index", "first_token"])
def test_masked_right_padding_is_invariant_to_extra_padding(positional, readout, positions):
    model = _classifier(positional=positional, readout=readout, positions=positions, padding_side="post")
    short, long = _logits_at(model, "post")
    torch.testing.assert_close(long, short, **TOL)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
@pytest.mark.parametrize("readout", ["first", "mean"])
def test_left_padding_with_index_positions_changes_logits_even_when_masked(positional, readout):
    model = _classifier(positional=positional, readout=readout, positions="index", padding_side="pre")
    short, long = _logits_at(model, "pre")
    for b in range(3):                                # every row has 3 more pads in front: every row moves
        assert not torch.allclose(long[b], short[b], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope"])
@pytest.mark.parametrize("readout", ["first", "mean"])
def test_left_padding_with_positions_from_the_first_token_is_invariant(positional, readout):
    model = _classifier(positional=positional, readout=readout, positions="first_token", padding_side="pre")
    short, long = _logits_at(model, "pre")
    torch.testing.assert_close(long, short, **TOL)
    # ... and gives what right padding gives: the same tokens at the same positions.
    right = _classifier(positional=positional, readout=readout, positions="first_token", padding_side="post")
    torch.testing.assert_close(right(*_padded(5, "post"))[0], short, **TOL)


def test_rope_makes_left_padding_with_index_positions_invariant():
    """RoPE scores depend on offsets only: shifting every real token by the number of pads changes nothing."""
    model = _classifier(positional="rope", positions="index", padding_side="pre")
    short, long = _logits_at(model, "pre")
    torch.testing.assert_close(long, short, **TOL)


@pytest.mark.parametrize("positional", ["sinusoidal", "rope", "none"])
def test_unmasked_right_padding_changes_logits(positional):
    model = _classifier(positional=positional, masked=False, padding_side="post", readout="mean")
    short, long = _logits_at(model, "post")
    assert torch.allclose(short[0], model(*_padded(4, "post"))[0][0])       # row 0 has no pad at length 4 ...
    for b in range(3):                                                        # ... and pads at length 7
        assert not torch.allclose(long[b], short[b], rtol=1e-6, atol=1e-6)


def test_attention_weights_and_the_mass_on_pads():
    ids, lengths = _padded(6, "post")
    real = lengths_to_mask(lengths, 6)
    masked = _classifier(masked=True)
    logits, attention = masked(ids, lengths, return_attention=True)
    assert attention.shape == (3, 2, H, 6, 6) and logits.shape == (3, 3)
    torch.testing.assert_close(attention.sum(-1), torch.ones(3, 2, H, 6, dtype=F64), **TOL)
    assert torch.all(pad_attention_mass(attention, real) == 0)
    assert masked(ids, lengths)[1] is None
    torch.testing.assert_close(masked(ids, lengths)[0], logits, **TOL)       # weights or not: the same logits
    _, attention = _classifier(masked=False)(ids, lengths, return_attention=True)
    mass = pad_attention_mass(attention, real)
    expected = torch.stack([attention[b][..., :int(lengths[b]), int(lengths[b]):].sum(-1).mean(-1) for b in range(3)])
    torch.testing.assert_close(mass, expected, **TOL)
    assert torch.all(mass > 0)


@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("side", ["post", "pre"])
def test_the_fused_path_equals_the_explicit_path(masked, side, monkeypatch):
    """Without attention weights every self-attention calls torch's fused ``F.scaled_dot_product_attention`` with
    the book's mask (True = takes part, as torch's function reads a bool mask); with ``return_attention=True`` the
    explicit masked softmax. Same logits in eval mode, and in training mode (no dropout) the same gradients."""
    calls = []
    fused_kernel = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs.get("attn_mask"))
        return fused_kernel(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    model = _classifier(masked=masked, padding_side=side)
    ids, lengths = _padded(7, side)
    fused, none = model(ids, lengths)
    assert none is None and len(calls) == 2                               # one call per layer
    if masked:
        real = lengths_to_mask(lengths, 7) if side == "post" else lengths_to_mask(lengths, 7).flip(-1)
        assert all(torch.equal(m[:, 0, 0], real) for m in calls)         # True at real tokens: not negated
    calls.clear()
    explicit, weights = model(ids, lengths, return_attention=True)
    assert not calls and weights.shape == (3, 2, H, 7, 7)
    torch.testing.assert_close(fused, explicit, **TOL)
    grads = []
    for attention in (False, True):
        model.train().zero_grad()
        model(ids, lengths, return_attention=attention)[0].square().sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("readout", ["first", "mean"])
@pytest.mark.parametrize("side", ["post", "pre"])
def test_readouts_pick_the_first_real_token_or_the_masked_mean(readout, side):
    model = _classifier(readout=readout, padding_side=side)
    ids, lengths = _padded(6, side)
    real = lengths_to_mask(lengths, 6) if side == "post" else lengths_to_mask(lengths, 6).flip(-1)
    h = model.encoder(model.embedding(ids), padding_mask=real)
    if readout == "first":
        pooled = h[torch.arange(3), real.float().argmax(1)]                  # the first True of each row
    else:
        pooled = torch.stack([h[b][real[b]].mean(0) for b in range(3)])
    torch.testing.assert_close(model(ids, lengths)[0], model.classifier(pooled), **TOL)


@pytest.mark.parametrize("readout", ["first", "mean"])
@pytest.mark.parametrize("side", ["post", "pre"])
def test_a_review_without_tokens_gives_the_classifier_bias(readout, side):
    model = _classifier(readout=readout, padding_side=side)
    ids, lengths = _padded(4, side)
    ids[2], lengths[2] = 0, 0
    logits, attention = model(ids, lengths, return_attention=True)
    assert torch.isfinite(logits).all() and torch.isfinite(attention).all()
    torch.testing.assert_close(logits[2], model.classifier.bias, **TOL)


# ------------------------------------------------------------------------------------ decoding
def _reference_greedy(model, src, max_len):
    """Greedy decoding of one unpadded sentence by re-running the teacher-forced model on the growing prefix."""
    tokens, score = [BOS_ID], 0.0
    for _ in range(max_len):
        with torch.no_grad():
            logits, _ = model(src[None], torch.tensor([len(src)]), torch.tensor([tokens]))
        logp = torch.log_softmax(logits[0, -1], -1)
        y = int(logp.argmax())
        score += float(logp[y])
        tokens.append(y)
        if y == EOS_ID:
            break
    out = tokens[1:]
    return (out[:-1] if out[-1] == EOS_ID else out), score


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_greedy_decoding_matches_a_step_by_step_reference(positional, norm_first):
    model = _translator(norm_first=norm_first, positional=positional, scale=2.0, seed=1)
    decoded = greedy_decode(model, SRC, SRC_LENGTHS, max_len=6)
    for b in range(3):
        tokens, score = _reference_greedy(model, SRC[b, :int(SRC_LENGTHS[b])], 6)
        assert decoded.tokens[b] == tokens
        assert decoded.scores[b].item() == pytest.approx(score, rel=1e-10)
        assert decoded.weights[b].shape == (min(len(tokens) + 1, 6), int(SRC_LENGTHS[b]))
    assert len({tuple(t) for t in decoded.tokens}) > 1                    # the sentences decode differently
    one_beam = beam_search(model, SRC, SRC_LENGTHS, beam_size=1, max_len=6, length_penalty=0.0)
    assert one_beam.tokens == decoded.tokens
    torch.testing.assert_close(one_beam.scores, decoded.scores, **TOL)
    assert len(beam_search(model, SRC, SRC_LENGTHS, beam_size=3, max_len=6).tokens) == 3


def test_teacher_forcing_equals_stepping_and_padding_does_not_change_decoding():
    model = _translator(scale=2.0)
    enc = model.encode(SRC, SRC_LENGTHS)
    logits, weights = model.decoder(TGT_IN, enc.state, enc.memory, enc.mask)
    state = enc.state
    for t in range(T):
        step_logits, state, step_w = model.decoder.step(TGT_IN[:, t], state, enc.memory, enc.mask)
        torch.testing.assert_close(step_logits, logits[:, t], **TOL)
        torch.testing.assert_close(step_w, weights[:, t], **TOL)
    assert isinstance(state, TransformerDecoderState) and torch.equal(state.tokens, TGT_IN)
    padded = torch.cat([SRC, torch.zeros(3, 3, dtype=torch.long)], 1)
    assert greedy_decode(model, padded, SRC_LENGTHS, max_len=5).tokens == \
        greedy_decode(model, SRC, SRC_LENGTHS, max_len=5).tokens
    model.train()
    greedy_decode(model, SRC, SRC_LENGTHS, max_len=2)
    assert model.training                                                   # restored by greedy_decode


def test_an_empty_target_gives_empty_logits():
    model = _translator()
    logits, weights = model(SRC, SRC_LENGTHS, TGT_IN[:, :0])
    assert logits.shape == (3, 0, 9) and weights.shape == (3, 0, 5)


# ------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("kwargs, error, message", [
    (dict(d_model=10, nhead=3), ValueError, "d_model must be divisible by nhead"),
    (dict(d_model=8, nhead=2, batch_first=False), ValueError, "batch-first only"),
    (dict(d_model=8, nhead=2, activation="tanh"), ValueError, r"activation must be one of \['relu', 'gelu'\]"),
    (dict(d_model=8, nhead=2, dropout=1.0), ValueError, r"dropout must be a number in \[0, 1\), got 1.0"),
    (dict(d_model=8, nhead=2, dropout="0.1x"), ValueError, r"dropout must be a number in \[0, 1\), got '0.1x'"),
    (dict(d_model=8, nhead=0), ValueError, "nhead must be >= 1"),
    (dict(d_model=8.0, nhead=2), TypeError, "d_model must be an int"),
    (dict(d_model=6, nhead=2, rotary=True), ValueError, "even head size"),
    (dict(d_model=8, nhead=2, layer_norm_eps=0.0), ValueError, "layer_norm_eps must be positive"),
])
@pytest.mark.parametrize("cls", [TransformerEncoderLayer, TransformerDecoderLayer])
def test_layer_constructor_errors(cls, kwargs, error, message):
    with pytest.raises(error, match=message):
        cls(**kwargs)


def test_encoder_layer_call_errors():
    layer = TransformerEncoderLayer(D, H, FF)
    x = torch.randn(3, 5, D)
    with pytest.raises(ValueError, match=r"src must have shape \(batch, length, d_model=8\), got \(5, 8\)"):
        layer(x[0])
    with pytest.raises(ValueError, match=r"d_model=8\), got \(3, 5, 4\)"):
        layer(x[..., :4])
    with pytest.raises(TypeError, match="src must have a floating dtype"):
        layer(x.long())
    with pytest.raises(TypeError, match="padding_mask must be a bool tensor"):
        layer(x, padding_mask=SRC_PAD.float())
    with pytest.raises(ValueError, match=r"padding_mask must have shape \(batch, length\) = \(3, 5\), got \(3, 4\)"):
        layer(x, padding_mask=SRC_PAD[:, :4])
    with pytest.raises(TypeError, match="self_mask must be a bool tensor"):
        layer(x, self_mask=causal_mask(5).long())
    with pytest.raises(ValueError, match=r"self_mask of shape \(4, 4\) does not broadcast"):
        layer(x, self_mask=causal_mask(4))
    with pytest.raises(ValueError, match=r"self_mask of shape \(3, 3, 5, 5\) does not broadcast"):
        layer(x, self_mask=torch.ones(3, 3, 5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="positions is used by rotary layers only"):
        layer(x, positions=torch.arange(5))
    rotary = TransformerEncoderLayer(D, H, FF, rotary=True)
    with pytest.raises(ValueError, match="a rotary layer needs positions"):
        rotary(x)
    with pytest.raises(TypeError, match="positions must have an integer dtype"):
        rotary(x, positions=torch.arange(5.0))
    with pytest.raises(ValueError, match=r"positions must have shape \(length,\) = \(5,\)"):
        rotary(x, positions=torch.arange(4))
    with pytest.raises(ValueError, match="positions must be non-negative"):
        rotary(x, positions=torch.arange(5) - 1)


def test_decoder_layer_call_errors():
    layer = TransformerDecoderLayer(D, H, FF)
    tgt, memory = torch.randn(3, 4, D), torch.randn(3, 5, D)
    with pytest.raises(ValueError, match="same batch size"):
        layer(tgt, memory[:2])
    with pytest.raises(ValueError, match=r"memory must have shape \(batch, length, d_model=8\)"):
        layer(tgt, memory[..., :4])
    with pytest.raises(ValueError, match=r"memory_padding_mask must have shape \(batch, length\) = \(3, 5\)"):
        layer(tgt, memory, memory_padding_mask=TGT_PAD)
    with pytest.raises(ValueError, match=r"tgt_padding_mask must have shape \(batch, length\) = \(3, 4\)"):
        layer(tgt, memory, tgt_padding_mask=SRC_PAD)
    with pytest.raises(ValueError, match=r"cross_mask of shape \(4, 4\) does not broadcast to .* \(3, 4, 5\)"):
        layer(tgt, memory, cross_mask=causal_mask(4))


def test_position_errors():
    with pytest.raises(ValueError, match="d_model must be even"):
        sinusoidal_encoding(torch.arange(3), 5)
    with pytest.raises(TypeError, match="positions must have an integer dtype"):
        sinusoidal_encoding(torch.arange(3.0), 4)
    with pytest.raises(ValueError, match="positions must be non-negative"):
        sinusoidal_encoding(torch.tensor([-1]), 4)
    with pytest.raises(ValueError, match="d_model must be even"):
        SinusoidalPositionalEncoding(3)
    with pytest.raises(ValueError, match=r"positions must be < max_len=4 for learned positions, got max 6"):
        LearnedPositionalEncoding(4, 2)(torch.randn(1, 7, 2))
    with pytest.raises(ValueError, match="even last dim"):
        rotary_embedding(torch.randn(2, 3), torch.arange(2))
    with pytest.raises(ValueError, match=r"positions of shape \(3,\) does not broadcast to x.shape\[:-1\] = \(2,\)"):
        rotary_embedding(torch.randn(2, 4), torch.arange(3))
    with pytest.raises(TypeError, match="x must be a floating torch.Tensor"):
        rotary_embedding(torch.ones(2, 4, dtype=torch.long), torch.arange(2))
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        positions_from_mask(torch.ones(2, 3))
    with pytest.raises(ValueError, match="needs query_positions"):
        RotaryMultiHeadAttention(D, H)(torch.randn(1, 2, D), torch.randn(1, 2, D), torch.randn(1, 2, D))
    with pytest.raises(ValueError, match="even head size"):
        RotaryMultiHeadAttention(6, 2)
    with pytest.raises(ValueError, match=r"positional must be one of \['sinusoidal', 'learned', 'rope', 'none'\]"):
        TransformerEmbedding(5, 4, positional="alibi")


def test_stack_and_copy_errors():
    layer = TransformerEncoderLayer(D, H, FF)
    with pytest.raises(TypeError, match="expected an attnbook.transformer.TransformerEncoderLayer"):
        TransformerEncoder(nn.TransformerEncoderLayer(D, H, FF, batch_first=True), 2)
    with pytest.raises(ValueError, match="num_layers must be >= 1"):
        TransformerEncoder(layer, 0)
    with pytest.raises(TypeError, match="norm must be an nn.LayerNorm or None"):
        TransformerEncoder(layer, 2, nn.Identity())
    with pytest.raises(ValueError, match="rotary layer has no torch counterpart"):
        copy_to_torch(TransformerEncoderLayer(D, H, FF, rotary=True))
    with pytest.raises(ValueError, match="rotary layer has no torch counterpart"):
        copy_to_torch(_translator(positional="rope"))
    with pytest.raises(TypeError, match="copy_to_torch expects one of the book's"):
        copy_to_torch(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="copy_from_torch expects nn.TransformerEncoderLayer"):
        copy_from_torch(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="needs into=a book Transformer"):
        copy_from_torch(nn.Transformer(D, H, 1, 1, FF, batch_first=True))
    gelu = nn.TransformerEncoderLayer(D, H, FF, activation="gelu", batch_first=True)
    with pytest.raises(ValueError, match=r"configurations differ \(book, torch\): \{'activation': \('relu', 'gelu'\)"):
        copy_from_torch(gelu, into=layer)
    with pytest.raises(TypeError, match="corresponds to torch's nn.TransformerEncoderLayer"):
        copy_from_torch(nn.TransformerDecoderLayer(D, H, FF, batch_first=True), into=layer)
    with pytest.raises(ValueError, match="only relu and gelu activations can be copied"):
        copy_from_torch(nn.TransformerEncoderLayer(D, H, FF, activation=torch.tanh, batch_first=True))
    with pytest.raises(ValueError, match="differ in depth: 2 and 1 layers"):
        copy_from_torch(nn.TransformerEncoder(nn.TransformerEncoderLayer(D, H, FF, batch_first=True), 1,
                                              enable_nested_tensor=False), into=TransformerEncoder(layer, 2))


def test_model_option_and_call_errors():
    with pytest.raises(ValueError, match=r"readout must be one of \['first', 'mean'\], got 'last'"):
        _classifier(readout="last")
    with pytest.raises(ValueError, match=r"padding_side must be one of \['post', 'pre'\], got 'left'"):
        _classifier(padding_side="left")
    with pytest.raises(ValueError, match=r"positions must be one of \['index', 'first_token'\]"):
        _classifier(positions="absolute")
    model = _classifier()
    ids, lengths = _padded(4, "post")
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, 4\]"):
        model(ids, lengths + 1)
    with pytest.raises(TypeError, match="lengths must have an integer dtype"):
        model(ids, lengths.float())
    with pytest.raises(TypeError, match="ids must hold integer token ids"):
        model(ids.float(), lengths)
    with pytest.raises(ValueError, match=r"attention must have shape \(batch, ..., length, length\)"):
        pad_attention_mass(torch.rand(3, 2, 2, 4, 4), torch.ones(3, 5, dtype=torch.bool))
    translator = _translator()
    enc = translator.encode(SRC, SRC_LENGTHS)
    with pytest.raises(TypeError, match="state must be a TransformerDecoderState"):
        translator.decoder(TGT_IN, enc.state.tokens, enc.memory, enc.mask)
    with pytest.raises(ValueError, match=r"mask must have shape \(batch, 1, src_len\) = \(3, 1, 5\)"):
        translator.decoder(TGT_IN, enc.state, enc.memory, enc.mask[:, 0])
    with pytest.raises(ValueError, match=r"src_lengths must lie in \[1, 5\]"):
        translator(SRC, SRC_LENGTHS * 0, TGT_IN)
