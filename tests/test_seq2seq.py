"""attnbook.seq2seq: encoder, attention decoder, greedy decoding and beam search (chapter 4).

References are independent of the code under test: an unpacked ``nn.GRU`` run on each sentence alone, attention and
GRU steps written out by hand with the module's weights, and exhaustive search over all short outputs.
"""

import functools
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnbook.attention import AdditiveAttention, DotProductAttention
from attnbook.masking import lengths_to_mask
from attnbook.seq2seq import (MODEL_KINDS, AttentionDecoder, DecoderState, Encoder, Seq2Seq, beam_search,
                              greedy_decode, make_seq2seq)
from attnbook.text import BOS_ID, EOS_ID, PAD_ID, pad_batch

KINDS = list(MODEL_KINDS)
SRC_V, TGT_V = 11, 9


def _model(kind, seed=0, src_v=SRC_V, tgt_v=TGT_V, embed=6, hidden=8, scale=2.0, scaled=True):
    """A small random fp64 model; weights scaled up so that the outputs are far from uniform (no near-ties)."""
    torch.manual_seed(seed)
    model = make_seq2seq(kind, src_v, tgt_v, embed_size=embed, hidden_size=hidden, scaled=scaled).double()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    return model.eval()


SENTENCES = [[4, 5, 6, 7, 8, EOS_ID], [9, 10, EOS_ID], [5, 4, 6, EOS_ID]]


# ----------------------------------------------------------------------------------------------- encoder
def test_encoder_equals_gru_run_on_each_sentence_alone():
    torch.manual_seed(1)
    enc = Encoder(SRC_V, 5, 4, bidirectional=True).double()
    src, lengths = pad_batch(SENTENCES, length=8)
    outputs, final = enc(src, lengths)
    assert outputs.shape == (3, 8, 8) and final.shape == (3, 8)
    for b, sentence in enumerate(SENTENCES):
        alone, h_n = enc.rnn(enc.embedding(torch.tensor([sentence])))   # no padding at all
        n = len(sentence)
        torch.testing.assert_close(outputs[b, :n], alone[0], rtol=0, atol=1e-12)
        assert torch.all(outputs[b, n:] == 0)
        torch.testing.assert_close(final[b], torch.cat([h_n[0, 0], h_n[1, 0]]), rtol=0, atol=1e-12)


def test_encoder_unidirectional_and_two_layers():
    enc = Encoder(SRC_V, 5, 4, bidirectional=False, num_layers=2)
    src, lengths = pad_batch(SENTENCES)
    outputs, final = enc(src, lengths)
    assert enc.output_size == 4 and outputs.shape == (3, 6, 4) and final.shape == (3, 4)
    # The final state of a unidirectional GRU is its output at the last real token.
    torch.testing.assert_close(final, outputs[torch.arange(3), lengths - 1])


# ----------------------------------------------------------------------------------------------- padding
@pytest.mark.parametrize("kind", KINDS)
def test_source_padding_does_not_change_decoding(kind):
    model = _model(kind)
    sentence = SENTENCES[0]
    runs = []
    for pad_to in (len(sentence), 9, 15):
        src, lengths = pad_batch([sentence], length=pad_to)
        runs.append(greedy_decode(model, src, lengths, max_len=7))
    for other in runs[1:]:
        assert other.tokens == runs[0].tokens
        torch.testing.assert_close(other.scores, runs[0].scores, rtol=0, atol=1e-12)
        if runs[0].weights is not None:
            torch.testing.assert_close(other.weights[0], runs[0].weights[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["bahdanau", "luong-dot", "luong-general", "luong-general-context"])
def test_padding_gets_zero_weight_and_a_batch_decodes_like_single_sentences(kind):
    model = _model(kind)
    src, lengths = pad_batch(SENTENCES, length=10)
    logits, weights = model(src, lengths, torch.full((3, 4), BOS_ID))
    assert logits.shape == (3, 4, TGT_V) and weights.shape == (3, 4, 10)
    for b, n in enumerate(lengths.tolist()):
        assert torch.all(weights[b, :, n:] == 0)
        torch.testing.assert_close(weights[b, :, :n].sum(-1), torch.ones(4, dtype=torch.float64))
    batch = greedy_decode(model, src, lengths, max_len=6)
    for b, sentence in enumerate(SENTENCES):
        alone = greedy_decode(model, torch.tensor([sentence]), torch.tensor([len(sentence)]), max_len=6)
        assert batch.tokens[b] == alone.tokens[0]
        torch.testing.assert_close(batch.weights[b], alone.weights[0], rtol=0, atol=1e-12)
        assert batch.weights[b].shape[1] == len(sentence)


def test_model_without_attention_sees_only_the_final_state():
    model = _model("none")
    src, lengths = pad_batch(SENTENCES)
    enc = model.encode(src, lengths)
    y = torch.full((3,), BOS_ID)
    logits, _, weights = model.decoder.step(y, enc.state, enc.memory, enc.mask)
    other, _, _ = model.decoder.step(y, enc.state, torch.randn_like(enc.memory), enc.mask)
    assert weights is None
    torch.testing.assert_close(logits, other, rtol=0, atol=0)
    assert greedy_decode(model, src, lengths, max_len=5).weights is None


# ----------------------------------------------------------------------------------------------- equations
def _step_inputs(model):
    src, lengths = pad_batch(SENTENCES, length=7)
    enc = model.encode(src, lengths)
    return enc, torch.tensor([BOS_ID, 5, 6])


def test_bahdanau_step_equals_the_equations():
    model = _model("bahdanau")
    dec = model.decoder
    enc, y = _step_inputs(model)
    logits, state, weights = dec.step(y, enc.state, enc.memory, enc.mask)
    s_prev, H = enc.state.hidden, enc.memory
    att = dec.attention
    e = att.w_v(torch.tanh(att.W_q(s_prev)[:, None, :] + att.W_k(H))).squeeze(-1)       # a(s_{t-1}, h_i)
    e = e.masked_fill(~enc.mask[:, 0], -math.inf)
    alpha = torch.softmax(e, -1)
    c = torch.einsum("bs,bsd->bd", alpha, H)
    s = dec.cell(torch.cat([dec.embedding(y), c], -1), s_prev)
    torch.testing.assert_close(weights, alpha)
    torch.testing.assert_close(state.hidden, s)
    torch.testing.assert_close(logits, dec.out(s))


@pytest.mark.parametrize("scaled", [True, False], ids=["scaled", "unscaled"])
@pytest.mark.parametrize("kind", ["luong-dot", "luong-general", "luong-general-context"])
def test_luong_step_equals_the_equations(kind, scaled):
    """Luong et al. (2015) eq. 5, 7, 8 with input feeding, by hand; the scores divided by sqrt(d) when scaled."""
    model = _model(kind, scaled=scaled)
    dec = model.decoder
    enc, y = _step_inputs(model)
    feed = torch.randn(3, dec.feed_size, dtype=torch.float64)
    state0 = DecoderState(enc.state.hidden, feed, None)
    logits, state, weights = dec.step(y, state0, enc.memory, enc.mask)
    h = dec.cell(torch.cat([dec.embedding(y), feed], -1), enc.state.hidden)            # input feeding
    keys = enc.memory if kind == "luong-dot" else dec.attention.W_a(enc.memory)
    d = h.shape[-1]
    score = torch.einsum("bd,bsd->bs", h, keys) / (math.sqrt(d) if scaled else 1.0)
    alpha = torch.softmax(score.masked_fill(~enc.mask[:, 0], -math.inf), -1)
    c = torch.einsum("bs,bsd->bd", alpha, enc.memory)
    h_tilde = c if kind == "luong-general-context" else torch.tanh(dec.W_c(torch.cat([c, h], -1)))
    torch.testing.assert_close(weights, alpha)
    torch.testing.assert_close(state.feed, h_tilde)
    torch.testing.assert_close(logits, dec.out(h_tilde))
    assert (dec.W_c is None) == (kind == "luong-general-context")
    assert dec.attention.scaled is scaled


@pytest.mark.parametrize("kind", ["luong-dot", "luong-general"])
def test_scaled_luong_context_equals_torch_sdpa(kind):
    """The context of a scaled Luong step is torch's fused attention with its default scale 1/sqrt(d), and the
    unscaled one is the same call with scale=1 (SDPA's bool mask also means True = takes part)."""
    for scaled, sdpa_scale in ((True, None), (False, 1.0)):
        model = _model(kind, scaled=scaled)
        dec = model.decoder
        enc, y = _step_inputs(model)
        _, state, _ = dec.step(y, enc.state, enc.memory, enc.mask)
        h = dec.cell(torch.cat([dec.embedding(y), enc.state.feed], -1), enc.state.hidden)
        keys = enc.memory if kind == "luong-dot" else dec.attention.W_a(enc.memory)
        c = F.scaled_dot_product_attention(h[:, None, :], keys, enc.memory, attn_mask=enc.mask,
                                           scale=sdpa_scale)[:, 0]
        torch.testing.assert_close(state.feed, torch.tanh(dec.W_c(torch.cat([c, h], -1))))


def test_unscaled_scores_are_sqrt_d_times_the_scaled_ones():
    """Same weights, scaled=True or False: the unscaled weights are the softmax of sqrt(d) x the scaled scores."""
    hidden = 8
    scaled, unscaled = _model("luong-general", hidden=hidden), _model("luong-general", hidden=hidden, scaled=False)
    enc, y = _step_inputs(scaled)
    _, _, w_scaled = scaled.decoder.step(y, enc.state, enc.memory, enc.mask)
    _, _, w_unscaled = unscaled.decoder.step(y, enc.state, enc.memory, enc.mask)
    logw = torch.log(w_scaled).masked_fill(~enc.mask[:, 0], -math.inf)     # scaled scores up to a constant per row
    torch.testing.assert_close(w_unscaled, torch.softmax(math.sqrt(hidden) * logw, -1))
    assert make_seq2seq("luong-dot", 5, 5, hidden_size=hidden).decoder.attention.scaled is True    # the default


def test_teacher_forcing_equals_stepping():
    for kind in KINDS:
        model = _model(kind)
        src, lengths = pad_batch(SENTENCES)
        tgt_in = torch.tensor([[BOS_ID, 4, 5, 6], [BOS_ID, 7, 8, PAD_ID], [BOS_ID, 4, 4, 4]])
        logits, weights = model(src, lengths, tgt_in)
        enc = model.encode(src, lengths)
        state = enc.state
        for t in range(4):
            step_logits, state, w = model.decoder.step(tgt_in[:, t], state, enc.memory, enc.mask)
            torch.testing.assert_close(logits[:, t], step_logits)
            if w is not None:
                torch.testing.assert_close(weights[:, t], w)


# ----------------------------------------------------------------------------------------------- decoding
@pytest.mark.parametrize("kind", KINDS)
def test_beam_search_with_beam_one_equals_greedy(kind):
    model = _model(kind, seed=3)
    src, lengths = pad_batch(SENTENCES)
    greedy = greedy_decode(model, src, lengths, max_len=8)
    beam = beam_search(model, src, lengths, beam_size=1, max_len=8, length_penalty=0.0)
    assert beam.tokens == greedy.tokens
    torch.testing.assert_close(beam.scores, greedy.scores)
    if greedy.weights is not None:
        for a, b in zip(beam.weights, greedy.weights):
            torch.testing.assert_close(a, b)


def _exhaustive_scores(model, sentence, max_len, vocab):
    """Log-probability and length of every output of at most ``max_len`` tokens (ending at <eos>, or cut at
    ``max_len``), scored by teacher forcing all outputs of one length in one batch."""
    outputs = []
    for n in range(1, max_len + 1):
        seqs = [s for s in itertools.product(range(vocab), repeat=n)
                if EOS_ID not in s[:-1] and (n == max_len or s[-1] == EOS_ID)]
        src = torch.tensor([sentence] * len(seqs))
        logits, _ = model(src, torch.full((len(seqs),), len(sentence)), torch.tensor([[BOS_ID, *s[:-1]] for s in seqs]))
        logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(seqs)[..., None]).squeeze(-1).sum(-1)
        outputs += [([t for t in s if t != EOS_ID], lp.item(), n) for s, lp in zip(seqs, logp)]
    return outputs


@pytest.mark.parametrize("kind", ["none", "bahdanau", "luong-general"])
def test_wide_beam_search_is_exact_search(kind):
    vocab, max_len = 6, 3                       # 4 special tokens + 2 words; 6**3 = 216 outputs at most
    model = _model(kind, seed=5, tgt_v=vocab, scale=3.0)
    sentence = [4, 5, 6, EOS_ID]
    outputs = _exhaustive_scores(model, sentence, max_len, vocab)
    for length_penalty in (0.0, 1.0):
        beam = beam_search(model, torch.tensor([sentence]), torch.tensor([4]), beam_size=vocab ** max_len,
                           max_len=max_len, length_penalty=length_penalty)
        best, best_logp, best_n = max(outputs, key=lambda o: o[1] / o[2] ** length_penalty)
        assert beam.tokens[0] == best
        assert beam.scores[0].item() == pytest.approx(best_logp / best_n ** length_penalty, abs=1e-9)


def test_beam_search_returns_one_hypothesis_per_sentence_with_weights():
    model = _model("bahdanau", seed=2)
    src, lengths = pad_batch(SENTENCES)
    out = beam_search(model, src, lengths, beam_size=4, max_len=6)
    assert len(out.tokens) == 3 and out.scores.shape == (3,)
    for tokens, w, n in zip(out.tokens, out.weights, lengths.tolist()):
        assert EOS_ID not in tokens and len(tokens) <= 6     # a random model may emit any other token
        assert w.shape[1] == n and w.shape[0] in (len(tokens), len(tokens) + 1)
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[0], dtype=torch.float64))


def test_decoding_restores_training_mode():
    model = _model("luong-dot").train()
    src, lengths = pad_batch(SENTENCES)
    greedy_decode(model, src, lengths, max_len=3)
    beam_search(model, src, lengths, max_len=3)
    assert model.training


# ----------------------------------------------------------------------------------------------- errors
def test_make_seq2seq_errors():
    with pytest.raises(ValueError, match=r"unknown model kind 'transformer'; choose one of \['none', 'bahdanau'"):
        make_seq2seq("transformer", 5, 5)
    with pytest.raises(ValueError, match="hidden_size must be even .* got 7"):
        make_seq2seq("none", 5, 5, hidden_size=7)
    with pytest.raises(TypeError, match="scaled must be a bool, got str 'yes'"):
        make_seq2seq("luong-dot", 5, 5, scaled="yes")


def test_decoder_constructor_errors():
    att = DotProductAttention(scaled=False)
    with pytest.raises(ValueError, match="style must be 'bahdanau' or 'luong', got 'vaswani'"):
        AttentionDecoder(9, 4, 8, 8, att, style="vaswani")
    with pytest.raises(ValueError, match="style='luong' needs an attention module"):
        AttentionDecoder(9, 4, 8, 8, None, style="luong")
    with pytest.raises(ValueError, match="attention_layer_size is a Luong option"):
        AttentionDecoder(9, 4, 8, 8, AdditiveAttention(8, 8, 8), attention_layer_size=8)
    with pytest.raises(ValueError, match="attention_layer_size must be positive or None, got 0"):
        AttentionDecoder(9, 4, 8, 8, att, style="luong", attention_layer_size=0)
    with pytest.raises(TypeError, match="attention must be an nn.Module from attnbook.attention or None, got function"):
        AttentionDecoder(9, 4, 8, 8, lambda q, k, v, m: q)
    with pytest.raises(ValueError, match="sizes must be positive, got vocab_size=0"):
        AttentionDecoder(0, 4, 8, 8)
    with pytest.raises(ValueError, match="sizes must be positive, got vocab_size=5, embed_size=0"):
        Encoder(5, 0, 4)
    with pytest.raises(ValueError, match="encoder.output_size=8 must equal decoder.memory_size=6"):
        Seq2Seq(Encoder(5, 4, 4), AttentionDecoder(5, 4, 8, 6))


def test_call_errors():
    model = _model("luong-general")
    src, lengths = pad_batch(SENTENCES)
    with pytest.raises(TypeError, match="src must hold integer token ids .* got dtype torch.float32"):
        model(src.float(), lengths, src)
    with pytest.raises(ValueError, match=r"src must have shape \(batch, length\), got \(6,\)"):
        model.encoder(src[0], lengths)
    with pytest.raises(ValueError, match=r"lengths must lie in \[1, 6\] for src of shape \(3, 6\), got min 3 "
                                         r"and max 7"):
        model.encoder(src, torch.tensor([6, 3, 7]))
    with pytest.raises(ValueError, match=r"lengths must have shape \(3,\) \(one length per row of src of shape "
                                         r"\(3, 6\)\), got \(2,\)"):
        model.encoder(src, torch.tensor([6, 3]))
    with pytest.raises(TypeError, match="src must be a torch.Tensor of token ids, got list"):
        model.encoder(SENTENCES, lengths)
    with pytest.raises(ValueError, match="src has batch 3 but tgt_in has batch 2"):
        model(src, lengths, src[:2])
    enc = model.encode(src, lengths)
    y = torch.full((3,), BOS_ID)
    with pytest.raises(TypeError, match="mask must be a bool tensor .* got dtype torch.int64"):
        model.decoder.step(y, enc.state, enc.memory, enc.mask.long())
    with pytest.raises(ValueError, match=r"mask must have shape \(batch, 1, src_len\) = \(3, 1, 6\), got \(3, 6\)"):
        model.decoder.step(y, enc.state, enc.memory, enc.mask[:, 0])
    with pytest.raises(ValueError, match=r"memory must have shape \(batch, src_len, 8\), got \(3, 6, 5\)"):
        model.decoder.step(y, enc.state, enc.memory[..., :5], enc.mask)
    with pytest.raises(ValueError, match=r"state.hidden must have shape \(3, 8\), got \(2, 8\)"):
        model.decoder.step(y, enc.state.index_select(torch.tensor([0, 1])), enc.memory, enc.mask)
    with pytest.raises(ValueError, match=r"y_prev must have shape \(batch,\), got \(3, 1\)"):
        model.decoder.step(y[:, None], enc.state, enc.memory, enc.mask)


def test_decoding_errors():
    model = _model("bahdanau")
    src, lengths = pad_batch(SENTENCES)
    with pytest.raises(TypeError, match="model must be an attnbook.seq2seq.Seq2Seq, got Linear"):
        greedy_decode(nn.Linear(2, 2), src, lengths)
    with pytest.raises(ValueError, match="max_len must be >= 1, got 0"):
        greedy_decode(model, src, lengths, max_len=0)
    with pytest.raises(ValueError, match="beam_size must be >= 1, got 0"):
        beam_search(model, src, lengths, beam_size=0)
    with pytest.raises(ValueError, match="length_penalty must be >= 0, got -1"):
        beam_search(model, src, lengths, length_penalty=-1)


@pytest.mark.parametrize("attention", [AdditiveAttention(8, 8, 5), DotProductAttention(scaled=False, query_size=8,
                                                                                        key_size=8),
                                       DotProductAttention(scaled=True, query_size=8, key_size=8)],
                         ids=["additive", "general", "general-scaled"])
def test_projected_keys_fast_path_equals_the_module_call(attention):
    torch.manual_seed(0)
    dec = AttentionDecoder(TGT_V, 4, 8, 8, attention.double()).double()
    memory = torch.randn(3, 6, 8, dtype=torch.float64)
    mask = lengths_to_mask(torch.tensor([6, 2, 4]), 6)[:, None, :]
    query = torch.randn(3, 8, dtype=torch.float64)
    fast_context, fast_weights = dec._attend(query, memory, mask, dec.project_keys(memory))
    slow_context = attention(query[:, None, :], memory, memory, mask)[:, 0]
    torch.testing.assert_close(fast_context, slow_context)
    torch.testing.assert_close(fast_weights, attention.scores(query[:, None, :], memory)
                               .masked_fill(~mask, -math.inf).softmax(-1)[:, 0])
    assert dec.project_keys(memory) is not None
    assert AttentionDecoder(TGT_V, 4, 8, 8, DotProductAttention(scaled=False)).project_keys(memory) is None


# ----------------------------------------------------------------------------------- degenerate sizes (issue 18)
@pytest.mark.parametrize("kind", KINDS)
def test_an_empty_batch_gives_empty_outputs(kind):
    """Batch 0 failed inside pack_padded_sequence ("Cannot pack empty tensors"); now the defined empty results."""
    model = _model(kind)
    src, lengths = torch.zeros(0, 4, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    logits, weights = model(src, lengths, torch.zeros(0, 3, dtype=torch.long))
    assert logits.shape == (0, 3, TGT_V) and logits.dtype == torch.float64
    assert (weights is None) == (kind == "none") and (weights is None or weights.shape == (0, 3, 4))
    for decode in (greedy_decode, functools.partial(beam_search, beam_size=3)):
        out = decode(model, src, lengths, max_len=5)
        assert out.tokens == [] and out.scores.shape == (0,) and out.scores.dtype == torch.float64
        assert out.weights == (None if kind == "none" else [])


@pytest.mark.parametrize("kind", KINDS)
def test_an_empty_target_gives_empty_logits(kind):
    """tgt_len 0 failed in torch.stack of no steps; now logits (batch, 0, vocab) and weights (batch, 0, src_len)."""
    model = _model(kind)
    src, lengths = pad_batch(SENTENCES)
    logits, weights = model(src, lengths, torch.zeros(3, 0, dtype=torch.long))
    assert logits.shape == (3, 0, TGT_V)
    assert (weights is None) == (kind == "none") and (weights is None or weights.shape == (3, 0, 6))


def test_sizes_and_lengths_errors_name_the_argument():
    model = _model("bahdanau")
    src, lengths = pad_batch(SENTENCES)
    with pytest.raises(ValueError, match=r"src must have at least one position \(src_len >= 1\) for a non-empty "
                                         r"batch, got shape \(2, 0\)"):
        model(torch.zeros(2, 0, dtype=torch.long), torch.tensor([1, 1]), src[:2])
    with pytest.raises(TypeError, match=r"src_lengths must have an integer dtype, got torch.float32"):
        greedy_decode(model, src, lengths.float())
    with pytest.raises(ValueError, match=r"src_lengths must have shape \(3,\) \(one length per row of src of shape "
                                         r"\(3, 6\)\), got \(2,\)"):
        beam_search(model, src, lengths[:2])
    with pytest.raises(ValueError, match=r"src_lengths must have shape \(3,\)"):
        model.encode(src, lengths[:1])
    with pytest.raises(TypeError, match="max_len must be an int, got float 2.5"):
        greedy_decode(model, src, lengths, max_len=2.5)
    with pytest.raises(TypeError, match="beam_size must be an int, got float 2.0"):
        beam_search(model, src, lengths, beam_size=2.0)
    enc = model.encode(src, lengths)
    with pytest.raises(ValueError, match=r"tgt_in has batch 2 but memory has batch 3 \(shapes \(2, 4\) and "
                                         r"\(3, 6, 8\)\)"):
        model.decoder(src[:2, :4], enc.state, enc.memory, enc.mask)


# ----------------------------------------------------------------------------------------------- beam_steps
def _path_log_prob(model, src, lengths, tokens):
    """Total log-probability of ``tokens`` (ending in <eos>) under teacher forcing: the model's forward pass, not
    the search's own bookkeeping."""
    tgt_in = torch.tensor([[BOS_ID] + tokens[:-1]])
    logits, _ = model(src, lengths, tgt_in)
    return F.log_softmax(logits, -1)[0, torch.arange(len(tokens)), torch.tensor(tokens)].sum().item()


@pytest.mark.parametrize("kind", ["bahdanau", "luong-general"])
@pytest.mark.parametrize("beam_size", [1, 3])
def test_beam_steps_chosen_path_is_the_search_result_with_its_log_probability(kind, beam_size):
    from attnbook.seq2seq import beam_steps

    model = _model(kind)
    src, lengths = pad_batch([SENTENCES[0]])
    steps = beam_steps(model, src, lengths, beam_size=beam_size, max_len=6)
    best = beam_search(model, src, lengths, beam_size=beam_size, max_len=6)
    path = steps[steps.chosen].sort_values("step")
    assert path.step.tolist() == list(range(1, steps.step.max() + 1))        # one chosen node per step
    tokens = [t for t in path.token.tolist() if t != PAD_ID]
    assert tokens[: len(best.tokens[0])] == best.tokens[0]
    assert steps.groupby("step").size().max() <= beam_size
    assert (steps.groupby("step").score.apply(lambda s: s.is_monotonic_decreasing)).all()   # ranked
    ended = path[path.done]
    if len(ended):   # the chosen hypothesis ended: its total score is the teacher-forced log-probability
        full = tokens[: tokens.index(EOS_ID) + 1]
        assert ended.score.iloc[-1] == pytest.approx(_path_log_prob(model, src, lengths, full), abs=1e-9)
    if beam_size == 1:
        assert tokens[: len(best.tokens[0])] == greedy_decode(model, src, lengths, max_len=6).tokens[0]


def test_beam_steps_wants_one_sentence():
    from attnbook.seq2seq import beam_steps

    src, lengths = pad_batch(SENTENCES[:2])
    with pytest.raises(ValueError, match=r"src must hold exactly one sentence, shape \(1, src_len\), got \(2, 6\)"):
        beam_steps(_model("bahdanau"), src, lengths)
