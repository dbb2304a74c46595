"""attnbook.interpret against independent references: finite differences (gradient importance), an explicit loop
over shortened reviews (leave-one-out), scipy's kendalltau on hand-made rankings, exact invariances (permuting
uniform weights changes nothing), and padding invariance of the classifier."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import kendalltau
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from attnbook.interpret import (AttentionClassifier, gradient_importance, kendall_tau, leave_one_out_importance,
                                permutation_effect, uniform_weights)
from attnbook.masking import lengths_to_mask

ENCODERS = ["bigru", "cnn", "none"]


def _model(encoder, uniform=False, seed=0):
    torch.manual_seed(seed)
    return AttentionClassifier(20, embed_size=6, hidden_size=4, attention_size=5, uniform=uniform,
                               encoder=encoder).double().eval()


def _batch(seed=0, b=4, t=7):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 3, 5, 1])[:b]
    ids = torch.randint(1, 20, (b, t), generator=g) * lengths_to_mask(lengths, t)
    return ids, lengths


@pytest.mark.parametrize("encoder", ENCODERS)
def test_classifier_weights_and_padding_invariance(encoder):
    model = _model(encoder)
    ids, lengths = _batch()
    logits, w = model(ids, lengths)
    mask = lengths_to_mask(lengths, 7)
    assert torch.all(w[~mask] == 0) and torch.allclose(w.sum(-1), torch.ones(4, dtype=torch.float64))
    longer = torch.cat([ids, torch.zeros(4, 3, dtype=torch.long)], dim=1)      # three more pads
    logits2, w2 = model(longer, lengths)
    assert torch.allclose(logits, logits2, atol=1e-12) and torch.allclose(w, w2[:, :7], atol=1e-12)


@pytest.mark.parametrize("encoder", ENCODERS)
def test_gradient_importance_matches_finite_differences(encoder):
    model = _model(encoder)
    ids, lengths = _batch(b=2)
    imp = gradient_importance(model, ids, lengths)
    emb = model.embed(ids).detach()
    eps = 1e-6
    for i in range(2):
        for t in range(int(lengths[i])):
            grad = torch.zeros(emb.shape[-1], dtype=torch.float64)
            for k in range(emb.shape[-1]):
                plus, minus = emb.clone(), emb.clone()
                plus[i, t, k] += eps
                minus[i, t, k] -= eps
                p = torch.sigmoid(model(ids, lengths, embeddings=plus)[0][i])
                m = torch.sigmoid(model(ids, lengths, embeddings=minus)[0][i])
                grad[k] = (p - m) / (2 * eps)
            assert torch.isclose(imp[i, t].double(), grad.norm(), rtol=1e-4, atol=1e-8)
    assert torch.all(imp[~lengths_to_mask(lengths, 7)] == 0)
    detached = gradient_importance(model, ids, lengths, detach_attention=True)
    assert detached.shape == imp.shape


@pytest.mark.parametrize("encoder", ENCODERS)
def test_leave_one_out_matches_an_explicit_loop(encoder):
    model = _model(encoder)
    ids, lengths = _batch()
    loo = leave_one_out_importance(model, ids, lengths, batch_size=3)
    for i in range(4):
        n = int(lengths[i])
        full = torch.sigmoid(model(ids[i:i + 1, :n], lengths[i:i + 1])[0])
        for t in range(n):
            if n == 1:
                assert loo[i, t] == 0
                continue
            short = torch.cat([ids[i, :t], ids[i, t + 1:n]])[None]
            p = torch.sigmoid(model(short, torch.tensor([n - 1]))[0])
            assert torch.isclose(loo[i, t], (p - full).abs().float()[0], atol=1e-6)
        assert torch.all(loo[i, n:] == 0)


class _RecordingModel(torch.nn.Module):
    """Wraps a classifier and records the shape of every ids tensor it is called with."""

    def __init__(self, model):
        super().__init__()
        self.model, self.shapes = model, []

    def embed(self, ids):
        return self.model.embed(ids)

    def forward(self, ids, lengths, **kwargs):
        self.shapes.append(tuple(ids.shape))
        return self.model(ids, lengths, **kwargs)


def _leave_one_out_all_at_once(model, ids, lengths, batch_size):
    """The former implementation, which built every shortened variant before batching (memory ~ B * T**2)."""
    probs = torch.sigmoid(model(ids, lengths)[0])
    out = torch.zeros(ids.shape, dtype=torch.float32)
    variants, owners = [], []
    for i in range(ids.shape[0]):
        n = int(lengths[i])
        if n < 2:
            continue
        keep = ~torch.eye(n, dtype=torch.bool)
        shortened = ids[i, :n].expand(n, n)[keep].reshape(n, n - 1)
        variants.append(torch.nn.functional.pad(shortened, (0, ids.shape[1] - (n - 1))))
        owners.extend((i, t) for t in range(n))
    variants = torch.cat(variants)
    new_lengths = torch.tensor([int(lengths[i]) - 1 for i, _ in owners])
    new_probs = torch.cat([torch.sigmoid(model(variants[s:s + batch_size], new_lengths[s:s + batch_size])[0])
                           for s in range(0, len(variants), batch_size)])
    rows, cols = torch.tensor([i for i, _ in owners]), torch.tensor([t for _, t in owners])
    out[rows, cols] = (new_probs - probs[rows]).abs().float()
    return out


@pytest.mark.parametrize("encoder", ENCODERS)
@pytest.mark.parametrize("batch_size", [1, 4, 100])
def test_leave_one_out_scores_batch_by_batch_with_identical_results(encoder, batch_size):
    model = _RecordingModel(_model(encoder))
    ids, lengths = _batch(seed=1)
    ids[1, 3:] = 9                                   # padding that is not 0: the variants must still pad with 0
    loo = leave_one_out_importance(model, ids, lengths, batch_size=batch_size)
    assert model.shapes[0] == (4, 7)                 # the full batch, once
    assert all(shape[0] <= batch_size and shape[1] == 7 for shape in model.shapes[1:])
    assert max(math.prod(shape) for shape in model.shapes[1:]) <= batch_size * 7
    assert len(model.shapes) == 1 + math.ceil(15 / batch_size)    # 7 + 3 + 5 variants (the length-1 row has none)
    assert torch.equal(loo, _leave_one_out_all_at_once(model.model, ids, lengths, batch_size))


class _LargestStorage(TorchDispatchMode):
    """Records the largest storage (in elements) of any tensor that an aten op returns while the mode is active."""

    largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.untyped_storage().nbytes() // t.element_size())
        return out


class _CheapModel(torch.nn.Module):
    """Follows the protocol with no tensor larger than its input: logit = mean id / 10."""

    def forward(self, ids, lengths):
        return ids.double().mean(-1) / 10, None


def test_leave_one_out_memory_grows_with_batch_size_times_length_not_length_squared():
    """Old: every shortened variant of every row in one (sum of lengths, T) tensor before scoring (~ B * T**2)."""
    b, t, batch_size = 3, 40, 8
    lengths = torch.tensor([40, 35, 1])
    ids = torch.randint(1, 20, (b, t), generator=torch.Generator().manual_seed(0)) * lengths_to_mask(lengths, t)
    with _LargestStorage() as mode:
        loo = leave_one_out_importance(_CheapModel(), ids, lengths, batch_size=batch_size)
    assert mode.largest <= max(b, batch_size) * t                # 320 elements; the old code made 75 * 40 = 3000
    assert torch.equal(loo, _leave_one_out_all_at_once(_CheapModel(), ids, lengths, batch_size))


def test_leave_one_out_batch_size_must_be_positive():
    ids, lengths = _batch()
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        leave_one_out_importance(_model("none"), ids, lengths, batch_size=0)


def test_kendall_tau_against_scipy():
    a = np.array([[0.1, 0.5, 0.2, 0.9, 0.0], [1, 2, 3, 0, 0], [3, 3, 3, 9, 9], [1, 0, 0, 0, 0]], dtype=float)
    b = np.array([[0.3, 0.1, 0.2, 0.8, 0.5], [3, 2, 1, 7, 7], [1, 2, 3, 0, 0], [2, 0, 0, 0, 0]], dtype=float)
    taus = kendall_tau(a, b, [5, 3, 3, 1])
    assert np.isclose(taus[0], kendalltau(a[0], b[0]).statistic)
    assert np.isclose(taus[1], -1.0)                    # reversed ranking of the 3 valid positions
    assert np.isnan(taus[2]) and np.isnan(taus[3])      # constant over the valid part; a single position
    with pytest.raises(ValueError, match=r"lengths must have shape \(4,\), got \(3,\)"):
        kendall_tau(a, b, [1, 2, 3])
    with pytest.raises(ValueError, match="a and b must be 2-D of the same shape"):
        kendall_tau(a, b[:2], [1, 2, 3, 4])


def test_uniform_weights():
    mask = lengths_to_mask(torch.tensor([4, 1, 0]), 4)
    w = uniform_weights(mask)
    assert torch.allclose(w[0], torch.full((4,), 0.25)) and w[1].tolist() == [1, 0, 0, 0] and w[2].sum() == 0
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        uniform_weights(mask.float())


@pytest.mark.parametrize("encoder", ENCODERS)
def test_permutation_effect(encoder):
    ids, lengths = _batch()
    uniform = _model(encoder, uniform=True)
    assert torch.all(permutation_effect(uniform, ids, lengths, 20, torch.Generator().manual_seed(0)) < 1e-12)
    model = _model(encoder)
    effect = permutation_effect(model, ids, lengths, 30, torch.Generator().manual_seed(0))
    assert effect.shape == (4,) and effect[3] == 0 and effect[0] > 0       # length 1: nothing to permute
    again = permutation_effect(model, ids, lengths, 30, torch.Generator().manual_seed(0))
    assert torch.equal(effect, again)
    with pytest.raises(ValueError, match="n_permutations must be >= 1, got 0"):
        permutation_effect(model, ids, lengths, 0)


def test_permuted_weights_stay_on_valid_positions():
    """Wrap a model to record the weights it is given: each permutation is a rearrangement of the valid weights."""
    model = _model("cnn")
    ids, lengths = _batch()
    _, w = model(ids, lengths)
    seen = []

    class Spy(torch.nn.Module):
        def forward(self, ids_, lengths_, *, embeddings=None, weights=None):
            if weights is not None:
                seen.append(weights)
            return model(ids_, lengths_, embeddings=embeddings, weights=weights)

    permutation_effect(Spy(), ids, lengths, 5, torch.Generator().manual_seed(1))
    mask = lengths_to_mask(lengths, 7)
    for permuted in seen:
        assert torch.all(permuted[~mask] == 0)
        for i in range(4):
            n = int(lengths[i])
            assert torch.allclose(permuted[i, :n].sort().values, w[i, :n].sort().values)


def test_classifier_errors():
    with pytest.raises(ValueError, match="encoder must be 'bigru', 'cnn' or 'none', got 'lstm'"):
        AttentionClassifier(10, encoder="lstm")
    with pytest.raises(ValueError, match="all sizes must be positive"):
        AttentionClassifier(0)


# ---------------------------------------------------------------- BinaryView: chapter 5's classifier as a protocol model
from attnbook.interpret import BinaryView  # noqa: E402
from attnbook.models import BiGRUClassifier  # noqa: E402


def _bigru(pooling="attention", seed=0, num_classes=2):
    torch.manual_seed(seed)
    return BiGRUClassifier(20, embed_size=6, hidden_size=4, attention_size=5, num_classes=num_classes,
                           pooling=pooling).double().eval()


def test_binary_view_gives_the_models_probability_and_weights():
    model = _bigru()
    view = BinaryView(model)
    ids, lengths = _batch()
    logits, weights = model(ids, lengths)
    logit, view_weights = view(ids, lengths)
    assert torch.allclose(torch.sigmoid(logit), torch.softmax(logits, -1)[:, 1], atol=1e-12)
    assert torch.equal(view_weights, weights)
    # the logit is v . (sum_t alpha_t h_t) + b with v, b from the classifier's two rows
    h = model.encoder(model.embedding(ids), lengths)
    by_hand = torch.einsum("bt,btd->bd", weights, h) @ view.direction + view.bias
    assert torch.allclose(logit, by_hand, atol=1e-12)
    same, _ = view(ids, lengths, embeddings=model.embedding(ids), weights=weights)
    assert torch.allclose(same, logit, atol=1e-12)


def test_binary_view_with_uniform_weights_is_the_masked_mean_model():
    attention, mean = _bigru("attention"), _bigru("mean")
    mean.load_state_dict({k: v for k, v in attention.state_dict().items() if not k.startswith("pooling.")})
    ids, lengths = _batch()
    uniform = uniform_weights(lengths_to_mask(lengths, 7)).double()
    logit, _ = BinaryView(attention)(ids, lengths, weights=uniform)
    mean_logits, mean_weights = mean(ids, lengths)
    assert torch.allclose(torch.sigmoid(logit), torch.softmax(mean_logits, -1)[:, 1], atol=1e-12)
    assert torch.allclose(mean_weights, uniform)


def test_binary_view_gradient_importance_matches_finite_differences():
    view = BinaryView(_bigru())
    ids, lengths = torch.tensor([[3, 5, 7, 0], [2, 9, 0, 0]]), torch.tensor([3, 2])
    imp = gradient_importance(view, ids, lengths)
    emb = view.embed(ids).detach()
    eps = 1e-6
    for i, t in ((0, 0), (0, 2), (1, 1)):
        grad = torch.zeros(emb.shape[-1], dtype=torch.float64)
        for k in range(emb.shape[-1]):
            plus, minus = emb.clone(), emb.clone()
            plus[i, t, k] += eps
            minus[i, t, k] -= eps
            p = torch.sigmoid(view(ids, lengths, embeddings=plus)[0][i])
            m = torch.sigmoid(view(ids, lengths, embeddings=minus)[0][i])
            grad[k] = (p - m) / (2 * eps)
        assert imp[i, t].item() == pytest.approx(grad.norm().item(), rel=1e-5)
    assert torch.all(imp[0, 3:] == 0) and torch.all(imp[1, 2:] == 0)


def test_binary_view_errors():
    with pytest.raises(TypeError, match="model must be an attnbook.models.BiGRUClassifier, got AttentionClassifier"):
        BinaryView(_model("bigru"))
    with pytest.raises(ValueError, match="model must have 2 classes, got 3"):
        BinaryView(_bigru(num_classes=3))
    with pytest.raises(ValueError, match="weighted sum .* got 'last'"):
        BinaryView(_bigru("last"))
    view = BinaryView(_bigru())
    ids, lengths = _batch()
    with pytest.raises(ValueError, match=r"embeddings must have shape \(4, 7, 6\) to match ids of shape \(4, 7\), "
                                         r"got \(4, 7, 5\)"):
        view(ids, lengths, embeddings=torch.zeros(4, 7, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"weights must have the shape of ids \(4, 7\), got \(4, 6\)"):
        view(ids, lengths, weights=torch.zeros(4, 6))
    with pytest.raises(ValueError, match=r"ids must have shape \(batch, length\), got \(7,\)"):
        view(ids[0], lengths)
    with pytest.raises(TypeError, match="ids must be a torch.Tensor, got list"):
        view([[1, 2]], lengths)
