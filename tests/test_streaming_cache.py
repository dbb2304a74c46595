"""StreamingLLM's cache (:class:`attnbook.sinks.SinkCache`, :func:`attnbook.sinks.streaming_step`,
:func:`attnbook.sinks.streaming_generate`) against independent references: the model's ordinary forward over the
whole prefix (before anything is trimmed), the model's ordinary forward over the kept tokens with positions
``0 .. t - 1`` (renumbering, one layer, where the cached keys depend on their token only), and chapter 8's
:class:`attnbook.generation.KVCache` of rotated keys trimmed by hand (no renumbering, any depth)."""

import pytest
import torch

from attnbook.generation import DecoderOnlyLM, KVCache, LayerCache
from attnbook.sinks import SinkCache, streaming_generate, streaming_step

pytestmark = pytest.mark.usefixtures("one_thread")
N_SINK, WINDOW = 2, 3


def _model(layers=2, positional="rope", seed=0):
    torch.manual_seed(seed)
    return DecoderOnlyLM(17, d_model=16, nhead=2, num_layers=layers, dim_feedforward=24, positional=positional,
                         max_len=64).double().eval()


def _ids(batch=2, length=12, seed=1):
    return torch.randint(1, 17, (batch, length), generator=torch.Generator().manual_seed(seed))


def _kept(t):
    """The original indices kept after ``t + 1`` tokens: the first N_SINK and the last WINDOW."""
    return sorted(set(range(min(N_SINK, t + 1))) | set(range(max(t + 1 - WINDOW, 0), t + 1)))


@torch.no_grad()
@pytest.mark.parametrize("renumber", [True, False])
def test_nothing_is_trimmed_before_the_cache_is_full(renumber):
    model, ids = _model(), _ids()
    cache = None
    for t in range(N_SINK + WINDOW):
        logits, cache = streaming_step(model, ids[:, t], cache, N_SINK, WINDOW, renumber=renumber)
        torch.testing.assert_close(logits, model(ids[:, : t + 1])[:, -1], atol=1e-12, rtol=1e-10)
    assert cache.positions.tolist() == list(range(N_SINK + WINDOW)) and cache.seen == N_SINK + WINDOW


@torch.no_grad()
def test_renumbered_cache_equals_recomputing_the_kept_tokens_at_positions_from_zero():
    """One layer: the cached (unrotated) keys depend on their token only, so the trimmed, renumbered cache is
    the model run afresh on the kept tokens with positions 0 .. t - 1."""
    model, ids = _model(layers=1), _ids()
    cache = None
    for t in range(ids.shape[1]):
        logits, cache = streaming_step(model, ids[:, t], cache, N_SINK, WINDOW, renumber=True)
        kept = _kept(t)
        torch.testing.assert_close(logits, model(ids[:, kept])[:, -1], atol=1e-12, rtol=1e-10)
        assert cache.positions.tolist() == kept


@torch.no_grad()
def test_without_renumbering_the_cache_equals_a_trimmed_cache_of_rotated_keys():
    """Two layers: trimming chapter 8's KVCache (rotated keys, original positions) gives the same logits as the
    sink cache with renumber=False; renumbering gives other logits once the cache is trimmed."""
    model, ids = _model(), _ids()
    ours, kv = None, model.empty_cache(ids.shape[0])
    for t in range(ids.shape[1]):         # chapter 8's cache: feed, then trim by hand
        logits, ours = streaming_step(model, ids[:, t], ours, N_SINK, WINDOW, renumber=False)
        step, kv = model.forward_cached(ids[:, t : t + 1], kv, positions=torch.full((ids.shape[0], 1), t))
        # the next token will make WINDOW recent ones: keep WINDOW - 1 besides the sinks
        keep = [i for i in range(kv.length) if i < N_SINK or i >= kv.length - (WINDOW - 1)]
        kv = KVCache(tuple(LayerCache(c.keys[:, :, keep], c.values[:, :, keep]) for c in kv.layers),
                     kv.padding_mask[:, keep], kv.next_positions)
        torch.testing.assert_close(logits, step[:, -1], atol=1e-12, rtol=1e-10)
    renumbered = streaming_generate(model, ids, 1, N_SINK, WINDOW, renumber=True)[1][:, -1]
    assert (renumbered - logits).abs().max() > 1e-3


@torch.no_grad()
def test_streaming_generate_feeds_the_prompt_then_generates():
    model, ids = _model(), _ids(length=4)
    tokens, logits = streaming_generate(model, ids, 3, N_SINK, WINDOW)
    assert tokens.shape == (2, 3) and logits.shape == (2, 6, 17)
    torch.testing.assert_close(logits[:, :4], model(ids), atol=1e-12, rtol=1e-10)   # nothing trimmed yet
    assert torch.equal(tokens[:, 0], model(ids)[:, -1].argmax(-1))
    model.train()
    streaming_generate(model, ids, 1, N_SINK, WINDOW)
    assert model.training                                                              # restored


@pytest.mark.parametrize("call, error, message", [
    (lambda m: streaming_step(torch.nn.Linear(2, 2), torch.tensor([1]), None, 1, 1), TypeError,
     "model must be an attnbook.generation.DecoderOnlyLM, got Linear"),
    (lambda m: streaming_step(_model(1, "sinusoidal"), torch.tensor([1]), None, 1, 1), ValueError,
     "only rotary positions allow"),
    (lambda m: streaming_step(m, torch.tensor([[1]]), None, 1, 1), ValueError,
     r"tokens must be \(batch,\) int64, one token per row, got \(1, 1\)"),
    (lambda m: streaming_step(m, torch.tensor([1]), (), 1, 1), TypeError, "cache must be a SinkCache or None"),
    (lambda m: streaming_step(m, torch.tensor([1]), None, 1, 0), ValueError, "window"),
    (lambda m: streaming_step(m, torch.tensor([1]), None, -1, 1), ValueError, "n_sink"),
    (lambda m: streaming_step(m, torch.tensor([1]), None, 1, 1, renumber=1), TypeError,
     "renumber must be True or False, got 1"),
    (lambda m: streaming_generate(m, torch.zeros(1, 0, dtype=torch.long), 1, 1, 1), ValueError,
     r"ids must be \(batch, T\) with T >= 1, got \(1, 0\)"),
    (lambda m: streaming_generate(m, torch.ones(1, 2, dtype=torch.long), 0, 1, 1), ValueError, "max_new_tokens"),
])
def test_errors(call, error, message):
    with pytest.raises(error, match=message):
        call(_model(1))
    assert SinkCache._fields == ("keys", "values", "positions", "seen")
