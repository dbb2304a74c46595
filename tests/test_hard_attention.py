"""attnbook.hard_attention against independent references: the exact gradient of an expectation by enumeration
(REINFORCE is unbiased), categorical probabilities and torch's F.gumbel_softmax (Gumbel-softmax marginals), scipy's
Gumbel distribution (the noise), and the model's gradient paths for the three attention modes."""

import math

import pytest
import torch
import torch.nn.functional as F
from scipy import stats

from attnbook.hard_attention import (
    MODES,
    AttentionGRUDecoder,
    DecoderOutput,
    DigitCaptioner,
    DigitEncoder,
    MovingAverageBaseline,
    captioning_loss,
    gumbel_softmax,
    reinforce_surrogate,
    sample_gumbel,
    straight_through,
)

LOGITS = torch.tensor([0.3, -1.2, 1.0, 0.0, -0.4], dtype=torch.float64)
REWARD = torch.tensor([2.0, -1.0, 0.5, 3.0, 1.5], dtype=torch.float64)


def _exact_gradient(logits, reward):
    """d/dlogits of E_{s ~ softmax(logits)}[reward(s)] = sum_s p_s reward_s, by enumeration and autograd."""
    theta = logits.clone().requires_grad_()
    (torch.softmax(theta, -1) * reward).sum().backward()
    return theta.grad


def _reinforce_samples(logits, reward, n, baseline, seed):
    """Per-sample REINFORCE gradients (n, K) by the textbook formula (r_s - b)(e_s - p), and the gradient of the
    mean of reinforce_surrogate over the same samples (autograd)."""
    theta = logits.clone().requires_grad_()
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(logits, -1)
    s = torch.multinomial(probs, n, replacement=True, generator=g)
    surrogate = reinforce_surrogate(torch.log_softmax(theta, -1)[s], reward[s], baseline)
    mean_grad = torch.autograd.grad(surrogate.mean(), theta)[0]
    per_sample = (reward[s] - baseline)[:, None] * (F.one_hot(s, len(logits)).double() - probs)
    return per_sample, mean_grad


@pytest.mark.parametrize("baseline", [0.0, 1.2, torch.tensor(-3.0, dtype=torch.float64)])
def test_reinforce_is_unbiased_against_enumeration(baseline):
    exact = _exact_gradient(LOGITS, REWARD)
    n = 40_000
    per_sample, mean_grad = _reinforce_samples(LOGITS, REWARD, n, baseline, seed=1)
    assert torch.allclose(per_sample.mean(0), mean_grad, atol=1e-12)
    stderr = per_sample.std(0) / math.sqrt(n)
    z = (mean_grad - exact) / stderr
    assert z.abs().max() < 4.5, f"REINFORCE deviates from the exact gradient by {z.tolist()} standard errors"


def test_reinforce_baseline_reduces_variance_but_not_mean():
    n = 20_000
    good = (torch.softmax(LOGITS, -1) * REWARD).sum()     # the expected reward: a good constant baseline
    plain, _ = _reinforce_samples(LOGITS, REWARD, n, 0.0, seed=2)
    based, _ = _reinforce_samples(LOGITS, REWARD, n, good, seed=2)
    assert based.var(0).sum() < 0.5 * plain.var(0).sum()
    # The same samples: the baseline term's mean is b * mean(e_s - p), which vanishes in expectation.
    exact = _exact_gradient(LOGITS, REWARD)
    assert (based.mean(0) - exact).abs().max() < 4.5 * (based.std(0) / math.sqrt(n)).max()


def test_reinforce_surrogate_detaches_reward_and_checks_shapes():
    log_prob = torch.zeros(3, requires_grad=True)
    reward = torch.ones(3, requires_grad=True)
    out = reinforce_surrogate(log_prob, reward, 0.5)
    out.sum().backward()
    assert reward.grad is None and torch.allclose(log_prob.grad, torch.full((3,), 0.5))
    with pytest.raises(ValueError, match=r"reward - baseline of shape \(4,\) does not broadcast to log_prob"):
        reinforce_surrogate(torch.zeros(3), torch.zeros(4))


def test_sample_gumbel_matches_scipy_gumbel_and_is_finite():
    g = torch.Generator().manual_seed(0)
    x = sample_gumbel((20_000,), generator=g, dtype=torch.float64)
    assert torch.isfinite(x).all()
    assert stats.kstest(x.numpy(), stats.gumbel_r.cdf).pvalue > 1e-3
    again = sample_gumbel((20_000,), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert torch.equal(x, again)


@pytest.mark.parametrize("tau", [0.5, 1.0, 5.0])
def test_hard_gumbel_softmax_marginals_are_the_categorical_probabilities(tau):
    logits = LOGITS.float()
    n = 30_000
    probs = torch.softmax(logits, -1)
    ours = gumbel_softmax(logits.expand(n, -1), tau, hard=True, generator=torch.Generator().manual_seed(3))
    assert torch.all(ours.sum(-1) == 1) and torch.all((ours == 0) | (ours == 1))
    torch.manual_seed(4)
    theirs = F.gumbel_softmax(logits.expand(n, -1), tau=tau, hard=True)
    for sample in (ours, theirs):
        freq = sample.mean(0)
        stderr = (probs * (1 - probs) / n).sqrt()
        assert ((freq - probs) / stderr).abs().max() < 4.5
    # Chi-square goodness of fit of our counts against the categorical probabilities.
    counts = ours.sum(0).double().numpy()
    expected = torch.softmax(LOGITS, -1).numpy() * n
    assert stats.chisquare(counts, expected * counts.sum() / expected.sum()).pvalue > 1e-3


def test_soft_gumbel_samples_sum_to_one_and_sharpen_with_low_tau():
    logits = LOGITS.float().expand(2000, -1)
    cold = gumbel_softmax(logits, 0.1, generator=torch.Generator().manual_seed(0))
    warm = gumbel_softmax(logits, 10.0, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(cold.sum(-1), torch.ones(2000), atol=1e-5)
    assert cold.max(-1).values.mean() > 0.9 > warm.max(-1).values.mean()


def test_hard_gumbel_softmax_gradient_is_the_soft_samples_gradient():
    logits = torch.randn(4, 6, generator=torch.Generator().manual_seed(0), requires_grad=True)
    upstream = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    hard = gumbel_softmax(logits, 0.7, hard=True, generator=torch.Generator().manual_seed(2))
    (g_hard,) = torch.autograd.grad((hard * upstream).sum(), logits)
    soft = gumbel_softmax(logits, 0.7, hard=False, generator=torch.Generator().manual_seed(2))
    (g_soft,) = torch.autograd.grad((soft * upstream).sum(), logits)
    assert torch.allclose(g_hard, g_soft, atol=1e-6)
    assert torch.equal(hard.argmax(-1), soft.argmax(-1))


def test_straight_through_forward_and_backward():
    soft = torch.tensor([0.2, 0.7, 0.1], requires_grad=True)
    hard = torch.tensor([0.0, 1.0, 0.0])
    out = straight_through(hard, soft)
    assert torch.equal(out.detach(), hard)
    (out * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert torch.equal(soft.grad, torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match=r"same shape, got \(3,\) and \(2,\)"):
        straight_through(hard, soft[:2])


def test_gumbel_softmax_errors():
    with pytest.raises(ValueError, match="tau must be positive and finite, got 0"):
        gumbel_softmax(torch.zeros(3), tau=0)
    with pytest.raises(TypeError, match="logits must be a floating torch.Tensor"):
        gumbel_softmax(torch.zeros(3, dtype=torch.long))


def test_moving_average_baseline():
    b = MovingAverageBaseline(momentum=0.5)
    assert torch.equal(b.get(torch.ones(4, 2)), torch.zeros(2))
    b.update(torch.tensor([[2.0, 4.0], [4.0, 8.0]]))
    assert torch.equal(b.value, torch.tensor([3.0, 6.0]))
    b.update(torch.tensor([[1.0, 2.0]]))
    assert torch.equal(b.value, torch.tensor([2.0, 4.0]))
    with pytest.raises(ValueError, match=r"momentum must be in \[0, 1\), got 1.0"):
        MovingAverageBaseline(1.0)


# ----------------------------------------------------------------------------------------------- model
def _batch(seed=0, b=5, h=8, w=24, t=3):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, 1, h, w, generator=g), torch.randint(0, 10, (b, t), generator=g)


@pytest.mark.parametrize("mode", MODES)
def test_decoder_weights_and_gradient_paths(mode):
    torch.manual_seed(0)
    model = DigitCaptioner(mode).train()
    images, captions = _batch()
    out = model(images, captions, generator=torch.Generator().manual_seed(0))
    assert out.logits.shape == (5, 3, 10) and out.alpha.shape == (5, 3, 4 * 12) and model.grid_shape == (4, 12)
    assert torch.allclose(out.alpha.sum(-1), torch.ones(5, 3), atol=1e-5)
    if mode == "soft":
        assert torch.equal(out.weights, out.alpha) and out.log_prob is None
    else:
        assert torch.all(out.weights.detach().sum(-1) == 1) and torch.all(out.weights.detach().max(-1).values == 1)
    # Cross-entropy alone: gradient reaches the attention scorer in soft and gumbel mode, not in hard mode.
    nll = F.cross_entropy(out.logits.transpose(1, 2), captions)
    grads = torch.autograd.grad(nll, list(model.decoder.attention.parameters()), allow_unused=True,
                                retain_graph=True)
    reached = any(g is not None and g.abs().sum() > 0 for g in grads)
    assert reached == (mode != "hard")
    if mode == "hard":
        loss, stats_ = captioning_loss(out, captions, "hard", baseline=MovingAverageBaseline())
        grads = torch.autograd.grad(loss, list(model.decoder.attention.parameters()))
        assert any(g.abs().sum() > 0 for g in grads) and {"reward", "baseline"} <= set(stats_)


def test_hard_loss_uses_reward_to_go():
    """The REINFORCE term of step t is weighted by the log-likelihood of tokens t..T-1 (checked on a fake output)."""
    log_prob = torch.zeros(1, 3, requires_grad=True)
    logits = torch.log(torch.tensor([[[0.5, 0.5], [0.25, 0.75], [0.9, 0.1]]]))
    out = DecoderOutput(logits=logits, alpha=torch.full((1, 3, 2), 0.5), weights=torch.zeros(1, 3, 2),
                        log_prob=log_prob, entropy=torch.zeros(1, 3), tokens=torch.zeros(1, 3, dtype=torch.long))
    captions = torch.tensor([[0, 1, 0]])
    loss, _ = captioning_loss(out, captions, "hard")
    loss.backward()
    ll = torch.log(torch.tensor([0.5, 0.75, 0.9]))
    to_go = torch.stack([ll.sum(), ll[1:].sum(), ll[2:].sum()])
    assert torch.allclose(log_prob.grad[0], -to_go / 3)


def test_soft_loss_is_cross_entropy_and_errors():
    torch.manual_seed(0)
    model = DigitCaptioner("soft")
    images, captions = _batch()
    out = model(images, captions)
    loss, _ = captioning_loss(out, captions, "soft")
    assert torch.allclose(loss, F.cross_entropy(out.logits.reshape(-1, 10), captions.reshape(-1)))
    with pytest.raises(ValueError, match=r"mode must be one of \('soft', 'hard', 'gumbel'\), got 'medium'"):
        captioning_loss(out, captions, "medium")
    with pytest.raises(ValueError, match="hard mode needs out.log_prob"):
        captioning_loss(out, captions, "hard")


def test_state_dict_is_shared_by_all_modes_and_eval_is_deterministic():
    torch.manual_seed(0)
    soft = DigitCaptioner("soft").eval()
    images, _ = _batch()
    for mode in ("hard", "gumbel"):
        other = DigitCaptioner(mode).eval()
        other.load_state_dict(soft.state_dict())
        a, b = other(images, max_len=3), other(images, max_len=3)
        assert torch.equal(a.tokens, b.tokens)
        # Same parameters, same first attention distribution; eval mode picks its arg max location.
        first = soft(images, max_len=3).alpha[:, 0]
        assert torch.allclose(a.alpha[:, 0], first)
        assert torch.equal(a.weights[:, 0].argmax(-1), first.argmax(-1))


def test_model_errors():
    with pytest.raises(ValueError, match=r"mode must be one of .*got 'glance'"):
        AttentionGRUDecoder(8, 10, mode="glance")
    with pytest.raises(ValueError, match="tau must be positive, got -1"):
        AttentionGRUDecoder(8, 10, tau=-1)
    with pytest.raises(ValueError, match="all sizes must be positive"):
        AttentionGRUDecoder(0, 10)
    with pytest.raises(ValueError, match="sizes must be positive, got channels=0"):
        DigitEncoder(channels=0)
    with pytest.raises(ValueError, match=r"images must be \(batch, 1, H, W\) with even H and W, got \(2, 1, 7, 24\)"):
        DigitEncoder()(torch.zeros(2, 1, 7, 24))
    with pytest.raises(ValueError, match="give captions"):
        DigitCaptioner()(torch.zeros(2, 1, 8, 24))
