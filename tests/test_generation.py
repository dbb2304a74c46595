"""attnbook.generation (chapter 8): the causal mask combined with the padding mask against torch's
``F.scaled_dot_product_attention`` (``is_causal`` and ``attn_mask``), the key/value cache against recomputing the
whole prefix (the translator's greedy and beam decoding, the decoder-only language model), and batched generation of
left-padded prompts against one-by-one generation."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnbook.attention import causal_mask, scaled_dot_product_attention
from attnbook.generation import (
    CachedDecoderState,
    DecoderOnlyLM,
    KVCache,
    causal_padding_mask,
    generate,
    is_left_padded,
    left_pad,
    with_kv_cache,
)
from attnbook.seq2seq import beam_search, greedy_decode
from attnbook.transformer import Transformer

pytestmark = pytest.mark.usefixtures("one_thread")

F64 = torch.float64


def _perturb(module, seed=1, scale=0.3):
    """Move every parameter off its initial value (learned positions start at zero, LayerNorms at one)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def _lm(positional="sinusoidal", norm_first=True, dtype=F64, seed=0):
    torch.manual_seed(seed)
    model = DecoderOnlyLM(30, 16, 2, 2, 32, positional=positional, norm_first=norm_first, max_len=64)
    return _perturb(model.to(dtype)).eval()


def _left_padded(seed=0):
    """Three prompts of lengths 7, 4 and 6, left-padded to 7: ids and the padding mask (True = real token)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 30, (3, 7), generator=g)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, :3] = False
    mask[2, :1] = False
    return ids.masked_fill(~mask, 0), mask


# ----------------------------------------------------------------------------------- causal and padding masks
def test_causal_padding_mask_is_the_and_of_both():
    pad = torch.tensor([[False, False, True, True], [True, True, True, False]])
    got = causal_padding_mask(pad)
    for b in range(2):
        for i in range(4):
            for j in range(4):
                assert bool(got[b, i, j]) == (j <= i and bool(pad[b, j]))
    assert torch.equal(causal_padding_mask(pad, 1), got[:, -1:])
    assert causal_padding_mask(pad, 0).shape == (2, 0, 4)
    # a leading pad of a left-padded row has no valid key: its row is empty
    assert not got[0, 0].any() and not got[0, 1].any()


def test_causal_padding_mask_errors():
    with pytest.raises(TypeError):
        causal_padding_mask(torch.ones(2, 3))
    with pytest.raises(ValueError, match="shape"):
        causal_padding_mask(torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="n_queries"):
        causal_padding_mask(torch.ones(2, 3, dtype=torch.bool), 4)


def test_the_combined_mask_equals_torch_sdpa_with_attn_mask_and_is_causal_without_padding():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 4, generator=g, dtype=F64) for _ in range(3))
    pad = torch.tensor([[True] * 5, [False, False, True, True, True]])
    combined = causal_padding_mask(pad)[:, None]
    ours = scaled_dot_product_attention(q, k, v, combined)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=combined)
    # torch gives the leading pads' empty rows zeros too (PyTorch >= 2.5)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    assert (ours[1, :, :2] == 0).all()
    no_padding = scaled_dot_product_attention(q, k, v, causal_mask(5))
    torch.testing.assert_close(no_padding, F.scaled_dot_product_attention(q, k, v, is_causal=True),
                               rtol=1e-12, atol=1e-12)


def test_torch_math_kernel_rejects_is_causal_with_attn_mask():
    """What the pinned torch does when given both: the math kernel raises; which kernel runs decides it, so the
    book passes the combined mask as ``attn_mask`` alone."""
    q = k = v = torch.randn(1, 1, 3, 4)
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    with sdpa_kernel(SDPBackend.MATH), pytest.raises(RuntimeError, match="is_causal"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)


def test_torch_is_causal_aligns_a_single_query_with_the_first_key():
    """The pitfall of ``is_causal`` with a cache: one query against t keys sees only the first key (the mask is
    aligned top-left); attnbook's ``causal_mask(1, t)`` aligns bottom-right: the last query sees every key."""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 1, 1, 4, generator=g), torch.randn(1, 1, 3, 4, generator=g), torch.randn(1, 1, 3, 4,
                                                                                                      generator=g)
    top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(top_left, v[:, :, :1])
    assert causal_mask(1, 3).all()


# ----------------------------------------------------------------------------------------------- the KV cache
@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope"])
@pytest.mark.parametrize("norm_first", [True, False])
def test_lm_generation_with_the_cache_equals_recomputing_the_prefix(positional, norm_first):
    model = _lm(positional, norm_first)
    ids, mask = _left_padded()
    for rule in ("mask", "index"):
        cached = generate(model, ids, mask, 12, use_cache=True, positions=rule)
        full = generate(model, ids, mask, 12, use_cache=False, positions=rule)
        assert torch.equal(cached.tokens, full.tokens)
        torch.testing.assert_close(cached.logits, full.logits, rtol=0, atol=1e-10)


def test_lm_cache_in_float32_agrees_to_1e_5():
    model = _lm(dtype=torch.float32)
    ids, mask = _left_padded()
    cached, full = (generate(model, ids, mask, 16, use_cache=c) for c in (True, False))
    assert torch.equal(cached.tokens, full.tokens)
    assert (cached.logits - full.logits).abs().max() < 1e-5


def test_prefill_through_the_cache_equals_the_forward_pass():
    model = _lm("rope")
    ids, mask = _left_padded()
    from attnbook.transformer import positions_from_mask
    pos = positions_from_mask(mask)
    logits, cache = model.forward_cached(ids, model.empty_cache(3), mask, pos)
    torch.testing.assert_close(logits, model(ids, mask, pos), rtol=0, atol=1e-12)
    assert isinstance(cache, KVCache) and cache.length == 7
    assert cache.layers[0].keys.shape == (3, 2, 7, 8)
    assert torch.equal(cache.next_positions, mask.sum(1))


@pytest.mark.parametrize("positional", ["sinusoidal", "rope"])
@pytest.mark.parametrize("norm_first", [True, False])
def test_translator_greedy_and_beam_with_the_cache_equal_the_uncached_model(positional, norm_first):
    torch.manual_seed(0)
    model = _perturb(Transformer(20, 25, 16, 2, 2, 2, 32, dropout=0.0, norm_first=norm_first,
                                 positional=positional).double(), scale=0.1).eval()
    src = torch.randint(3, 20, (4, 6), generator=torch.Generator().manual_seed(2))
    lengths = torch.tensor([6, 4, 5, 2])
    src = src.masked_fill(torch.arange(6) >= lengths[:, None], 0)
    cached = with_kv_cache(model)
    a, b = greedy_decode(model, src, lengths, 15), greedy_decode(cached, src, lengths, 15)
    assert a.tokens == b.tokens
    torch.testing.assert_close(a.scores, b.scores, rtol=0, atol=1e-10)
    for wa, wb in zip(a.weights, b.weights):
        torch.testing.assert_close(wa, wb, rtol=0, atol=1e-10)
    c, d = beam_search(model, src, lengths, 3, 15), beam_search(cached, src, lengths, 3, 15)
    assert c.tokens == d.tokens
    torch.testing.assert_close(c.scores, d.scores, rtol=0, atol=1e-10)


def test_the_cached_translator_shares_weights_and_teacher_forces_like_the_model():
    torch.manual_seed(0)
    model = Transformer(20, 25, 16, 2, 1, 1, 32, dropout=0.0).double().eval()
    cached = with_kv_cache(model)
    assert cached.decoder.out is model.decoder.out
    src, lengths = torch.randint(3, 20, (2, 5)), torch.tensor([5, 5])
    tgt = torch.randint(3, 25, (2, 4))
    torch.testing.assert_close(cached(src, lengths, tgt)[0], model(src, lengths, tgt)[0], rtol=0, atol=0)
    enc = cached.encode(src, lengths)
    assert isinstance(enc.state, CachedDecoderState) and enc.state.cache.length == 0
    _, state, _ = cached.decoder.step(torch.ones(2, dtype=torch.long), enc.state, enc.memory, enc.mask)
    with pytest.raises(ValueError, match="empty state"):
        cached.decoder(tgt, state, enc.memory, enc.mask)
    with pytest.raises(TypeError):
        with_kv_cache(DecoderOnlyLM(10, 8, 2, 1, 16))


# ------------------------------------------------------------------------------- batched left-padded generation
def _one_by_one(model, ids, mask, n, **options):
    return torch.cat([generate(model, ids[r:r + 1, mask[r]], None, n, **options).tokens for r in range(len(ids))])


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope"])
def test_left_padded_batch_equals_one_by_one_with_positions_from_the_mask(positional):
    model = _lm(positional)
    ids, mask = _left_padded()
    for use_cache in (True, False):
        batched = generate(model, ids, mask, 12, use_cache=use_cache, positions="mask")
        assert torch.equal(batched.tokens, _one_by_one(model, ids, mask, 12, positions="mask"))


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_left_padded_batch_with_index_positions_differs_from_one_by_one(positional):
    model = _lm(positional)
    ids, mask = _left_padded()
    batched = generate(model, ids, mask, 12, positions="index")
    alone = _one_by_one(model, ids, mask, 12, positions="index")
    assert torch.equal(batched.tokens[0], alone[0])          # the row without pads
    assert not torch.equal(batched.tokens, alone)
    torch.testing.assert_close(batched.logits[0], generate(model, ids[:1], None, 12).logits[0])


def test_rotary_positions_make_index_positions_harmless_and_dropping_the_mask_is_not():
    model = _lm("rope")
    ids, mask = _left_padded()
    alone = _one_by_one(model, ids, mask, 12)
    assert torch.equal(generate(model, ids, mask, 12, positions="index").tokens, alone)
    assert not torch.equal(generate(model, ids, mask, 12, mask_pads=False).tokens, alone)


def test_generate_restores_training_mode_and_checks_its_arguments():
    model = _lm().train()
    ids, mask = _left_padded()
    generate(model, ids, mask, 2)
    assert model.training
    with pytest.raises(ValueError, match="positions"):
        generate(model, ids, mask, 2, positions="first")
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, ids, mask, 0)
    with pytest.raises(ValueError, match="shape"):
        generate(model, ids, mask[:, 1:], 2)
    with pytest.raises(TypeError):
        generate(Transformer(5, 5, 8, 2, 1, 1, 16), ids, mask, 2)
    with pytest.raises(ValueError, match="positional"):
        DecoderOnlyLM(10, positional="none")


# ------------------------------------------------------------------- right padding, default positions, EOS stop
def _right_padded(seed=0):
    """The prompts of ``_left_padded`` with their pads moved to the right (a training batch's layout)."""
    ids, mask = _left_padded(seed)
    right_ids, right_mask = torch.zeros_like(ids), torch.zeros_like(mask)
    for r in range(len(ids)):
        n = int(mask[r].sum())
        right_ids[r, :n], right_mask[r, :n] = ids[r, mask[r]], True
    return right_ids, right_mask


def test_generate_refuses_right_padded_prompts_and_names_the_rows():
    model = _lm()
    ids, mask = _right_padded()
    with pytest.raises(ValueError, match=r"left-padded prompts .* rows \[1, 2\] have a pad after a real token"):
        generate(model, ids, mask, 4)
    gap = torch.ones(1, 5, dtype=torch.bool)
    gap[0, 2] = False                                          # a pad between real tokens
    with pytest.raises(ValueError, match=r"rows \[0\]"):
        generate(model, torch.ones(1, 5, dtype=torch.long), gap, 4)
    with pytest.raises(ValueError, match=r"at least one real token; rows \[1\]"):
        generate(model, torch.ones(2, 3, dtype=torch.long), torch.tensor([[True] * 3, [False] * 3]), 4)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope"])
def test_right_padded_prompts_left_padded_by_left_pad_equal_one_by_one_generation(positional):
    model = _lm(positional)
    ids, mask = _right_padded()
    alone = torch.cat([generate(model, ids[r:r + 1, mask[r]], None, 12).tokens for r in range(len(ids))])
    left_ids, left_mask = left_pad(ids, mask)
    torch.testing.assert_close(left_mask, _left_padded()[1], rtol=0, atol=0)
    for use_cache in (True, False):
        assert torch.equal(generate(model, left_ids, left_mask, 12, use_cache=use_cache).tokens, alone)


def test_left_pad_and_is_left_padded():
    ids = torch.tensor([[5, 6, 0, 0], [0, 7, 0, 8], [0, 0, 9, 4]])
    mask = ids != 0
    assert is_left_padded(mask).tolist() == [False, False, True]
    new_ids, new_mask = left_pad(ids, mask, pad_id=3)
    assert new_ids.tolist() == [[3, 3, 5, 6], [3, 3, 7, 8], [3, 3, 9, 4]]
    assert is_left_padded(new_mask).all() and torch.equal(new_mask.sum(1), mask.sum(1))
    with pytest.raises(TypeError, match="padding_mask"):
        is_left_padded(ids)
    with pytest.raises(ValueError, match=r"shape \(batch, T\)"):
        is_left_padded(mask[0])
    with pytest.raises(ValueError, match="shape of ids"):
        left_pad(ids, mask[:, 1:])


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_forward_with_a_padding_mask_counts_positions_from_the_mask(positional):
    """Without ``positions``, a left-padded row's real tokens get the logits of the row run alone (positions from
    the mask), not those of index positions; a right-padded row's real tokens keep their array indices."""
    model = _lm(positional)
    ids, mask = _left_padded()
    out = model(ids, mask)
    for r in range(len(ids)):
        torch.testing.assert_close(out[r, mask[r]], model(ids[r:r + 1, mask[r]])[0], rtol=0, atol=1e-12)
    index = model(ids, mask, torch.arange(7))
    assert (index[1, mask[1]] - out[1, mask[1]]).abs().max() > 1e-3     # the old default moved row 1
    right_ids, right_mask = _right_padded()
    torch.testing.assert_close(model(right_ids, right_mask)[right_mask],
                               model(right_ids, right_mask, torch.arange(7))[right_mask], rtol=0, atol=0)


def test_forward_cached_continues_positions_from_the_last_real_token_by_default():
    model = _lm("learned")
    ids, mask = _left_padded()
    logits, cache = model.forward_cached(ids, model.empty_cache(3), mask)
    assert torch.equal(cache.next_positions, mask.sum(1))
    nxt = torch.tensor([[4], [5], [6]])
    step, cache2 = model.forward_cached(nxt, cache, torch.ones(3, 1, dtype=torch.bool))
    assert torch.equal(cache2.next_positions, mask.sum(1) + 1)
    for r in range(3):                                   # the reference: each row alone, no pads, no cache
        alone = model(torch.cat([ids[r, mask[r]], nxt[r]])[None])[0]
        torch.testing.assert_close(logits[r, mask[r]], alone[:-1], rtol=0, atol=1e-12)
        torch.testing.assert_close(step[r, 0], alone[-1], rtol=0, atol=1e-12)


def test_eos_stops_each_row_and_the_batch():
    model = _lm()
    ids, mask = _left_padded()
    free = generate(model, ids, mask, 12)
    eos = int(free.tokens[0, 3])                         # the token row 0 generates fourth
    for use_cache in (True, False):
        got = generate(model, ids, mask, 12, eos_id=eos, pad_id=0, use_cache=use_cache)
        for r in range(3):                               # reference: the free run, cut after its first eos
            row = free.tokens[r]
            hits = (row == eos).nonzero()
            end = int(hits[0]) + 1 if len(hits) else 12
            want = torch.cat([row[:end], torch.zeros(12 - end, dtype=row.dtype)])
            n = got.tokens.shape[1]
            assert torch.equal(got.tokens[r], want[:n]) and (want[n:] == 0).all()
    # every row stops on its first token: one step, one column
    first = generate(model, ids[:1], mask[:1], 12, eos_id=int(free.tokens[0, 0]))
    assert first.tokens.shape == (1, 1) and first.logits.shape == (1, 1, 30)


def test_eos_id_and_pad_id_are_checked():
    model = _lm()
    ids, mask = _left_padded()
    with pytest.raises(ValueError, match="eos_id must be < vocab_size=30, got 30"):
        generate(model, ids, mask, 2, eos_id=30)
    with pytest.raises(ValueError, match="eos_id"):
        generate(model, ids, mask, 2, eos_id=-1)
    with pytest.raises(ValueError, match="pad_id"):
        generate(model, ids, mask, 2, eos_id=1, pad_id=-1)
