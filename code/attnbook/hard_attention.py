"""Soft and hard attention, and how to train through a discrete choice: REINFORCE and straight-through Gumbel-softmax.

Explained in chapter 7, "Soft and hard attention" (``chapters/07_soft_hard_attention``). Soft attention returns the
expected value of the attended features, ``z = sum_i alpha_i a_i``; hard attention samples one location
``s ~ Categorical(alpha)`` and returns ``a_s`` (Xu et al. 2015, sections 4.1-4.2; Mnih et al. 2014). The sample has
no gradient, so the scorer is trained with

- the score-function (REINFORCE) estimator (Williams 1992), :func:`reinforce_surrogate`, with a moving-average
  baseline (:class:`MovingAverageBaseline`) and an entropy bonus, as Xu et al. (eq. 12) do; or
- the straight-through Gumbel-softmax estimator (Jang et al. 2017; Maddison et al. 2017), :func:`gumbel_softmax`
  with ``hard=True``: a one-hot sample forward, the gradient of the relaxed sample backward (the straight-through
  idea of Bengio et al. 2013).

The model is a digit captioner (:class:`DigitCaptioner`): a small CNN (:class:`DigitEncoder`) gives a grid of
annotation vectors, and a GRU decoder (:class:`AttentionGRUDecoder`) attends over the grid in one of the three
modes ``"soft"``, ``"hard"`` or ``"gumbel"`` at every output token; :func:`captioning_loss` gives the training loss
of each mode. Data: :mod:`attnbook.data.digits`; experiment grid and CLI: :mod:`attnbook.experiments.hard_attention`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import AdditiveAttention

__all__ = [
    "MODES",
    "sample_gumbel",
    "gumbel_softmax",
    "straight_through",
    "reinforce_surrogate",
    "MovingAverageBaseline",
    "DigitEncoder",
    "AttentionGRUDecoder",
    "DecoderOutput",
    "DigitCaptioner",
    "captioning_loss",
]

#: The three ways of attending: expected features, a REINFORCE-trained sample, a straight-through Gumbel sample.
MODES = ("soft", "hard", "gumbel")


def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


# ----------------------------------------------------------------------------------------------- estimators
def sample_gumbel(shape: torch.Size | tuple[int, ...], *, generator: torch.Generator | None = None,
                  dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> Tensor:
    """Standard Gumbel noise ``g = -log(-log u)``, ``u ~ Uniform(0, 1)``, of the given shape.

    ``argmax_i (logits_i + g_i)`` is then an exact sample of ``Categorical(softmax(logits))`` (the Gumbel-max
    trick; Jang et al. 2017, eq. 1). ``u`` is kept inside ``[tiny, 1)`` so that ``g`` is always finite.

    Args:
        shape: output shape.
        generator: a seeded ``torch.Generator`` for reproducible noise (on ``device``); ``None`` = global RNG.
        dtype: a floating dtype.
        device: where to create the noise.
    """
    u = torch.rand(shape, generator=generator, dtype=dtype, device=device)
    tiny = torch.finfo(dtype).tiny
    minus_log_u = (-torch.log(u.clamp(min=tiny))).clamp(min=tiny)     # in (0, 88], never 0
    return -torch.log(minus_log_u)


def straight_through(hard: Tensor, soft: Tensor) -> Tensor:
    """``hard`` in the forward pass, the gradient of ``soft`` in the backward pass: ``hard + soft - soft.detach()``.

    The straight-through estimator (Bengio et al. 2013): treat a non-differentiable step (rounding, arg max,
    sampling) as if it were the differentiable ``soft`` surrogate when back-propagating. The gradient is biased:
    it is the gradient of ``soft``, not of ``hard``'s expectation. Chapter 7, section "Straight-through estimators".

    Raises:
        ValueError: the shapes differ.
    """
    if hard.shape != soft.shape:
        raise ValueError(f"hard and soft must have the same shape, got {tuple(hard.shape)} and {tuple(soft.shape)}")
    return hard + (soft - soft.detach())


def gumbel_softmax(logits: Tensor, tau: float = 1.0, hard: bool = False, dim: int = -1, *,
                   generator: torch.Generator | None = None) -> Tensor:
    """Gumbel-softmax (Concrete) sample ``softmax((logits + g) / tau)``; with ``hard=True``, straight-through one-hot.

    Same semantics as ``torch.nn.functional.gumbel_softmax`` (Jang et al. 2017, eq. 2; Maddison et al. 2017), plus
    a ``generator`` for reproducible samples. With ``hard=True`` the forward value is the one-hot vector of
    ``argmax(logits + g)``, an exact sample of ``Categorical(softmax(logits))``, and the backward pass uses the
    gradient of the relaxed sample (:func:`straight_through`).

    Args:
        logits: unnormalized log-probabilities, float (fp16, bf16, fp32 or fp64), any shape; categories along
            ``dim``, of which there must be at least one. ``-inf`` excludes a category (it is never sampled), as
            long as one category per row is finite. Other dims may be empty (an empty result).
        tau: temperature, finite and > 0; small = close to one-hot but high-variance gradients, large = close to
            uniform.
        hard: return a straight-through one-hot sample.
        dim: the axis of categories.
        generator: seeded ``torch.Generator`` for the Gumbel noise (on ``logits.device``); ``None`` = global RNG.

    Returns:
        Tensor shaped like ``logits``, of its dtype, summing to 1 along ``dim`` (one-hot if ``hard``). fp16/bf16
        logits: the noise, ``(logits + g) / tau`` and the softmax are computed in fp32 and the sample is cast back,
        so large finite logits or a small ``tau`` give no NaN; in every dtype the row maximum of ``logits + g`` is
        subtracted before dividing by ``tau``, so the division cannot overflow to ``inf``.

    Raises:
        TypeError: ``logits`` is not a floating tensor.
        ValueError: ``tau`` is not positive and finite, ``dim`` is out of range, or ``logits`` has no category
            along ``dim`` (the message gives the shape).

    Chapter 7, section "Straight-through Gumbel-softmax".
    """
    if not isinstance(logits, Tensor) or not logits.is_floating_point():
        raise TypeError(f"logits must be a floating torch.Tensor, got {getattr(logits, 'dtype', type(logits))}")
    if not (tau > 0 and math.isfinite(tau)):
        raise ValueError(f"tau must be positive and finite, got {tau}")
    if not -max(logits.dim(), 1) <= dim < max(logits.dim(), 1):
        raise ValueError(f"dim={dim} is out of range for logits of shape {tuple(logits.shape)}")
    if logits.dim() > 0 and logits.shape[dim] == 0:
        raise ValueError(f"logits must have at least one category along dim={dim}, got shape {tuple(logits.shape)}")
    compute = torch.float32 if logits.dtype in (torch.float16, torch.bfloat16) else logits.dtype
    perturbed = logits.to(compute) + sample_gumbel(logits.shape, generator=generator, dtype=compute,
                                                   device=logits.device)
    if perturbed.numel():  # shift by the row maximum (no effect on the softmax), so that dividing cannot overflow
        perturbed = perturbed - perturbed.detach().amax(dim=dim, keepdim=True)
    soft = torch.softmax(perturbed / tau, dim=dim)
    if not hard:
        return soft.to(logits.dtype)
    index = soft.argmax(dim=dim, keepdim=True)
    one_hot = torch.zeros_like(logits).scatter_(dim, index, 1.0)
    return straight_through(one_hot, soft.to(logits.dtype))


def reinforce_surrogate(log_prob: Tensor, reward: Tensor, baseline: Tensor | float = 0.0) -> Tensor:
    """Surrogate whose gradient is the score-function (REINFORCE) estimate of ``grad E[reward]``.

    For samples ``s ~ p_theta``, ``grad_theta E[R(s)] = E[(R(s) - b) grad_theta log p_theta(s)]`` for any ``b`` that
    does not depend on ``s`` (Williams 1992; Xu et al. 2015, eq. 12). This returns
    ``(reward - baseline).detach() * log_prob`` elementwise; the mean of it over samples, differentiated, is the
    Monte Carlo estimate. *Maximize* it (minimize its negative). The baseline does not change the expectation, only
    the variance; the reward must not carry gradient of its own into this term (it is detached).

    Args:
        log_prob: ``log p_theta(s)`` of the sampled choices, float, any shape, differentiable.
        reward: the reward of each sample, broadcastable to ``log_prob``.
        baseline: a float or a tensor broadcastable to ``log_prob`` (e.g. :class:`MovingAverageBaseline`'s value).

    Returns:
        Tensor shaped like ``log_prob``.

    Raises:
        ValueError: ``reward`` or ``baseline`` does not broadcast to ``log_prob`` (shapes in the message).

    Chapter 7, section "Hard attention and REINFORCE".
    """
    advantage = reward - baseline if isinstance(baseline, Tensor) else reward - float(baseline)
    try:
        shape = torch.broadcast_shapes(advantage.shape, log_prob.shape)
    except RuntimeError:
        shape = None
    if shape != log_prob.shape:
        raise ValueError(
            f"reward - baseline of shape {tuple(advantage.shape)} does not broadcast to log_prob of shape "
            f"{tuple(log_prob.shape)}"
        )
    return advantage.detach() * log_prob


class MovingAverageBaseline:
    """Exponential moving average of rewards, ``b <- momentum * b + (1 - momentum) * mean(reward)``.

    The baseline of Xu et al. (2015, section 4.1) and Mnih et al. (2014). Rewards are averaged over the first
    (batch) dim, so a reward of shape ``(batch, T)`` keeps one baseline per time step ``(T,)``. Use
    :attr:`value` (the baseline *before* this batch) in :func:`reinforce_surrogate`, then :meth:`update`.

    Args:
        momentum: in [0, 1); 0 = the previous batch's mean.

    Raises:
        ValueError: ``momentum`` is outside [0, 1).
    """

    def __init__(self, momentum: float = 0.9) -> None:
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.momentum = float(momentum)
        self.value: Tensor | None = None

    def get(self, like: Tensor) -> Tensor:
        """The current baseline broadcastable to ``like`` (zeros before the first update)."""
        if self.value is None:
            return torch.zeros_like(like[0])
        return self.value.to(like.device, like.dtype)

    def update(self, reward: Tensor) -> Tensor:
        """Fold the batch mean of ``reward`` (detached) into the average; return the new value."""
        mean = reward.detach().float().mean(0)
        self.value = mean if self.value is None else self.momentum * self.value + (1 - self.momentum) * mean
        return self.value


# ----------------------------------------------------------------------------------------------- model
class DigitEncoder(nn.Module):
    """Small CNN: canvas ``(batch, 1, H, W)`` -> annotation vectors ``(batch, H/2 * W/2, annotation_size)``.

    Two 3x3 convolutions, 2x2 max-pooling, a third 3x3 convolution (receptive field 10x10 pixels, enough to see
    one 8x8 digit), then two coordinate channels (row and column in [-1, 1], so that the decoder can attend by
    position) and a linear map to ``annotation_size``. Row-major flattening: location ``l`` is grid cell
    ``(l // (W/2), l % (W/2))``, as in Xu et al.'s ``a = {a_1, ..., a_L}``.

    Raises:
        ValueError: a size is not positive; at call time, the input is not ``(batch, 1, H, W)`` with even H, W.
    """

    def __init__(self, channels: int = 16, annotation_size: int = 32) -> None:
        super().__init__()
        if channels <= 0 or annotation_size <= 0:
            raise ValueError(f"sizes must be positive, got channels={channels}, annotation_size={annotation_size}")
        self.conv = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(),
        )
        self.proj = nn.Linear(channels + 2, annotation_size)
        self.annotation_size = annotation_size

    def forward(self, images: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """Return ``(annotations (batch, L, annotation_size), (grid_h, grid_w))`` with ``L = grid_h * grid_w``."""
        if images.dim() != 4 or images.shape[1] != 1 or images.shape[2] % 2 or images.shape[3] % 2:
            raise ValueError(f"images must be (batch, 1, H, W) with even H and W, got {tuple(images.shape)}")
        feats = self.conv(images)                                     # (batch, C, H/2, W/2)
        b, _, gh, gw = feats.shape
        rows = torch.linspace(-1, 1, gh, device=images.device, dtype=feats.dtype)
        cols = torch.linspace(-1, 1, gw, device=images.device, dtype=feats.dtype)
        coords = torch.stack(torch.meshgrid(rows, cols, indexing="ij"))  # (2, gh, gw)
        feats = torch.cat([feats, coords.expand(b, -1, -1, -1)], dim=1)
        return self.proj(feats.flatten(2).transpose(1, 2)), (gh, gw)


@dataclass
class DecoderOutput:
    """What :class:`AttentionGRUDecoder` returns for a batch of ``B`` captions of ``T`` tokens over ``L`` locations.

    Attributes:
        logits: ``(B, T, vocab_size)``, scores of the next token.
        alpha: ``(B, T, L)``, the attention distribution ``softmax(scores)`` at each step.
        weights: ``(B, T, L)``, the weights actually used: ``alpha`` (soft) or a one-hot choice (hard, gumbel).
        log_prob: ``(B, T)``, ``log alpha`` of the chosen location (hard mode; ``None`` otherwise).
        entropy: ``(B, T)``, entropy of ``alpha`` in nats.
        tokens: ``(B, T)``, the greedy tokens (arg max of ``logits``).
    """

    logits: Tensor
    alpha: Tensor
    weights: Tensor
    log_prob: Tensor | None
    entropy: Tensor
    tokens: Tensor


class AttentionGRUDecoder(nn.Module):
    """GRU decoder that attends over annotation vectors before every token: soft, hard or Gumbel (Xu et al. 2015).

    At step ``t`` with previous state ``h_{t-1}`` and previous token ``y_{t-1}`` (a start token at ``t = 0``):

    - scores ``e_ti = w^T tanh(W_q h_{t-1} + W_k a_i)`` (:class:`attnbook.attention.AdditiveAttention`),
      ``alpha_t = softmax(e_t)``;
    - ``"soft"``: context ``z_t = sum_i alpha_ti a_i``;
      ``"hard"``: ``s_t ~ Categorical(alpha_t)``, ``z_t = a_{s_t}`` (trained with REINFORCE);
      ``"gumbel"``: ``z_t = sum_i y_ti a_i`` with ``y_t`` = :func:`gumbel_softmax` ``(e_t, tau, hard=True)``.
      When not ``stochastic`` (evaluation), hard and gumbel take the arg max location;
    - ``h_t = GRU([E y_{t-1}; z_t], h_{t-1})``, ``logits_t = W_o [h_t; z_t]``.

    ``h_0 = tanh(W_init mean_i a_i)``, as in Xu et al. (section 3.1.2).

    Args:
        annotation_size: size of each annotation vector.
        vocab_size: number of output tokens (the start token is extra, index ``vocab_size``).
        mode: ``"soft"``, ``"hard"`` or ``"gumbel"``.
        hidden_size, embed_size, attention_size: layer sizes.
        tau: Gumbel-softmax temperature (gumbel mode).

    Raises:
        ValueError: unknown mode, a size that is not positive, or ``tau <= 0``.
    """

    def __init__(self, annotation_size: int, vocab_size: int, mode: str = "soft", hidden_size: int = 64,
                 embed_size: int = 16, attention_size: int = 32, tau: float = 1.0) -> None:
        super().__init__()
        self.mode = _check_mode(mode)
        if min(annotation_size, vocab_size, hidden_size, embed_size, attention_size) <= 0:
            raise ValueError("all sizes must be positive")
        if not tau > 0:
            raise ValueError(f"tau must be positive, got {tau}")
        self.vocab_size, self.tau = vocab_size, float(tau)
        self.init_h = nn.Linear(annotation_size, hidden_size)
        self.embed = nn.Embedding(vocab_size + 1, embed_size)
        self.attention = AdditiveAttention(hidden_size, annotation_size, attention_size)
        self.gru = nn.GRUCell(embed_size + annotation_size, hidden_size)
        self.out = nn.Linear(hidden_size + annotation_size, vocab_size)

    def forward(self, annotations: Tensor, captions: Tensor | None = None, max_len: int | None = None, *,
                stochastic: bool | None = None, generator: torch.Generator | None = None) -> DecoderOutput:
        """Decode ``max_len`` tokens (or ``captions.shape[1]`` with teacher forcing on ``captions``).

        Args:
            annotations: ``(B, L, annotation_size)``.
            captions: int64 ``(B, T)`` target tokens for teacher forcing; ``None`` = feed back the greedy tokens.
            max_len: number of tokens when ``captions`` is None.
            stochastic: sample locations (hard, gumbel); ``None`` = ``self.training``.
            generator: seeded generator for the location samples.

        Raises:
            ValueError: neither ``captions`` nor ``max_len`` is given.
        """
        if captions is None and max_len is None:
            raise ValueError("give captions (teacher forcing) or max_len (greedy decoding)")
        steps = captions.shape[1] if captions is not None else int(max_len)
        stochastic = self.training if stochastic is None else stochastic
        b = annotations.shape[0]
        h = torch.tanh(self.init_h(annotations.mean(1)))
        prev = torch.full((b,), self.vocab_size, dtype=torch.long, device=annotations.device)
        logits, alphas, used, log_probs, entropies, tokens = [], [], [], [], [], []
        for t in range(steps):
            scores = self.attention.scores(h.unsqueeze(1), annotations).squeeze(1)   # (B, L)
            log_alpha = torch.log_softmax(scores, dim=-1)
            alpha = log_alpha.exp()
            entropies.append(-(alpha * log_alpha).sum(-1))
            if self.mode == "soft":
                weights = alpha
            elif self.mode == "hard":
                if stochastic:
                    choice = torch.multinomial(alpha.detach(), 1, generator=generator)   # (B, 1)
                else:
                    choice = alpha.argmax(-1, keepdim=True)
                log_probs.append(log_alpha.gather(1, choice).squeeze(1))
                weights = torch.zeros_like(alpha).scatter_(1, choice, 1.0)           # no gradient to alpha
            else:
                if stochastic:
                    weights = gumbel_softmax(scores, self.tau, hard=True, generator=generator)
                else:
                    weights = torch.zeros_like(alpha).scatter_(1, alpha.argmax(-1, keepdim=True), 1.0)
            context = torch.bmm(weights.unsqueeze(1), annotations).squeeze(1)       # (B, annotation_size)
            h = self.gru(torch.cat([self.embed(prev), context], dim=-1), h)
            step_logits = self.out(torch.cat([h, context], dim=-1))
            token = step_logits.argmax(-1)
            logits.append(step_logits)
            alphas.append(alpha)
            used.append(weights)
            tokens.append(token)
            prev = captions[:, t] if captions is not None else token
        stack = lambda xs: torch.stack(xs, dim=1)
        return DecoderOutput(logits=stack(logits), alpha=stack(alphas), weights=stack(used),
                             log_prob=stack(log_probs) if log_probs else None, entropy=stack(entropies),
                             tokens=stack(tokens))


class DigitCaptioner(nn.Module):
    """:class:`DigitEncoder` + :class:`AttentionGRUDecoder`: canvas -> caption of digits, with attention maps.

    Call: ``model(images (B, 1, H, W), captions=None, max_len=None, stochastic=None, generator=None)`` ->
    :class:`DecoderOutput`; ``model.grid_shape`` holds ``(H/2, W/2)`` after a call, to reshape ``alpha`` into
    ``(B, T, H/2, W/2)`` maps. All three modes have the same parameters, so a state dict trained in one mode loads
    into the others (used to compare gradient estimators at one checkpoint).
    """

    def __init__(self, mode: str = "soft", vocab_size: int = 10, channels: int = 16, annotation_size: int = 32,
                 hidden_size: int = 64, embed_size: int = 16, attention_size: int = 32, tau: float = 1.0) -> None:
        super().__init__()
        self.encoder = DigitEncoder(channels, annotation_size)
        self.decoder = AttentionGRUDecoder(annotation_size, vocab_size, mode, hidden_size, embed_size,
                                           attention_size, tau)
        self.grid_shape: tuple[int, int] | None = None

    @property
    def mode(self) -> str:
        return self.decoder.mode

    def forward(self, images: Tensor, captions: Tensor | None = None, max_len: int | None = None, *,
                stochastic: bool | None = None, generator: torch.Generator | None = None) -> DecoderOutput:
        annotations, self.grid_shape = self.encoder(images)
        return self.decoder(annotations, captions, max_len, stochastic=stochastic, generator=generator)


def captioning_loss(out: DecoderOutput, captions: Tensor, mode: str, *,
                    baseline: MovingAverageBaseline | None = None, reinforce_weight: float = 1.0,
                    entropy_weight: float = 0.0, update_baseline: bool = True) -> tuple[Tensor, dict[str, float]]:
    """Training loss of a :class:`DigitCaptioner` output, per mode; returns ``(loss, stats)``.

    - soft and gumbel: mean token cross-entropy ``-log p(y_t | ...)`` (the Gumbel gradient is straight-through).
    - hard (Xu et al. 2015, eq. 12): cross-entropy, minus ``reinforce_weight`` times the REINFORCE surrogate
      (:func:`reinforce_surrogate`) whose reward for the location chosen at step ``t`` is the *reward to go*
      ``R_t = sum_{t' >= t} log p(y_t' | ...)`` (earlier tokens do not depend on that choice, so leaving them out
      lowers the variance without bias), minus the per-step moving-average ``baseline``, minus
      ``entropy_weight`` times the entropy of ``alpha`` (a bonus that keeps the policy exploring).

    All terms are averaged over the batch and the ``T`` tokens.

    Args:
        out: the decoder output (teacher-forced on ``captions``).
        captions: int64 ``(B, T)``.
        mode: ``"soft"``, ``"hard"`` or ``"gumbel"``.
        baseline: hard mode only; ``None`` = no baseline (plain REINFORCE).
        reinforce_weight, entropy_weight: the weights of the two extra terms (hard mode).
        update_baseline: fold this batch's rewards into ``baseline`` after using it.

    Returns:
        The scalar loss and floats ``nll`` (mean token cross-entropy), ``entropy`` and, in hard mode, ``reward``
        (mean sequence log-likelihood) and ``baseline`` (mean baseline used).

    Raises:
        ValueError: unknown mode, or hard mode with ``out.log_prob`` None (the output was not from hard mode).
    """
    _check_mode(mode)
    nll = F.cross_entropy(out.logits.transpose(1, 2), captions, reduction="none")      # (B, T)
    stats = {"nll": nll.mean().item(), "entropy": out.entropy.mean().item()}
    loss = nll.mean()
    if mode != "hard":
        return loss, stats
    if out.log_prob is None:
        raise ValueError("hard mode needs out.log_prob (the decoder must run in hard mode)")
    reward_to_go = (-nll).flip(1).cumsum(1).flip(1).detach()                            # (B, T)
    b = baseline.get(reward_to_go) if baseline is not None else torch.zeros_like(reward_to_go[0])
    surrogate = reinforce_surrogate(out.log_prob, reward_to_go, b)
    loss = loss - reinforce_weight * surrogate.mean() - entropy_weight * out.entropy.mean()
    stats.update(reward=reward_to_go[:, 0].mean().item(), baseline=float(b[0]))
    if baseline is not None and update_baseline:
        baseline.update(reward_to_go)
    return loss, stats
