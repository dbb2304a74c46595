"""The decomposable attention model for natural language inference (Parikh et al. 2016), masked on both sides.

Explained in chapter 6, "Natural language inference with the decomposable attention model"
(``chapters/06_nli_decomposable_attention``); Murphy, PML 15.4.6. The model has three steps, each a method of
:class:`DecomposableAttention` so that its intermediate results can be inspected:

1. **Attend** (:meth:`DecomposableAttention.attend`): scores ``e_ij = F(a_i)^T F(b_j)`` between premise token
   ``a_i`` and hypothesis token ``b_j`` (Parikh et al., eq. 1); soft alignments
   ``beta_i = sum_j softmax_j(e_ij) b_j`` and ``alpha_j = sum_i softmax_i(e_ij) a_i`` (eq. 2).
2. **Compare** (:meth:`DecomposableAttention.compare`): ``v1_i = G([a_i; beta_i])``, ``v2_j = G([b_j; alpha_j])``
   (eq. 3).
3. **Aggregate** (:meth:`DecomposableAttention.aggregate`): ``v1 = sum_i v1_i``, ``v2 = sum_j v2_j`` (eq. 4),
   ``y = H([v1; v2])`` (eq. 5).

Masks, as everywhere in attnbook, are **bool with True = the token takes part** (a real token, not a pad). A pad
of either sentence is masked in *both* softmax directions and left out of *both* sums, so the logits do not
depend on how much padding a batch carries (tested). Passing ``None`` for a mask lets every position take part:
with padded inputs that is the unmasked variant whose failure the chapter measures.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from .masking import check_bool_mask, check_mask_for, masked_softmax

__all__ = ["Alignment", "DecomposableAttention", "count_parameters", "alignment_accuracy",
           "chance_alignment_accuracy"]


class Alignment(NamedTuple):
    """The result of the attend step, for a batch of premises ``a`` and hypotheses ``b``.

    Attributes:
        beta: ``(batch, len_a, d)``, the part of ``b`` softly aligned to each premise token (Parikh et al., eq. 2).
        alpha: ``(batch, len_b, d)``, the part of ``a`` softly aligned to each hypothesis token (eq. 2).
        scores: ``(batch, len_a, len_b)``, the unnormalized ``e_ij`` (eq. 1), pads included.
        weights_a: ``(batch, len_a, len_b)``, row ``i`` = softmax over ``j`` of ``e_ij`` (premise token ``i``
            attends over the hypothesis); masked entries are exactly 0, and so are pad rows.
        weights_b: ``(batch, len_b, len_a)``, row ``j`` = softmax over ``i`` of ``e_ij`` (hypothesis token ``j``
            attends over the premise); masked entries are exactly 0, and so are pad rows.
    """

    beta: Tensor
    alpha: Tensor
    scores: Tensor
    weights_a: Tensor
    weights_b: Tensor


def _mlp(in_size: int, hidden_size: int, dropout: float) -> nn.Sequential:
    """Two ReLU layers with dropout before each, as F, G and H in Parikh et al. (2016)."""
    return nn.Sequential(nn.Dropout(dropout), nn.Linear(in_size, hidden_size), nn.ReLU(),
                         nn.Dropout(dropout), nn.Linear(hidden_size, hidden_size), nn.ReLU())


def _check_tokens(name: str, x: Tensor) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.long, torch.int, torch.int32, torch.int64):
        raise TypeError(f"{name} must hold integer token ids, got dtype {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{name} must have shape (batch, length), got {tuple(x.shape)}")


def _check_mask(name: str, mask: Tensor | None, x: Tensor, x_name: str) -> None:
    """``mask`` must be None or a bool tensor of shape ``x.shape[:2]`` (:func:`attnbook.masking.check_mask_for`)."""
    if mask is not None:
        check_mask_for(x, mask, name, states_name=x_name)


class DecomposableAttention(nn.Module):
    """Parikh et al.'s (2016) decomposable attention model, vanilla version (no intra-sentence attention).

    Args:
        vocab_size: number of token ids; id ``padding_idx`` is the pad.
        embed_dim: size of the word embeddings (Parikh et al.: 300-d GloVe).
        hidden_size: size ``d`` of the projected embeddings and of every hidden layer of F, G, H (Parikh et al.: 200).
        num_classes: outputs of H's final linear layer; 3 for NLI, 1 for a regression head (e.g. semantic
            textual similarity).
        dropout: dropout probability before every linear layer of F, G and H (Parikh et al.: 0.2).
        padding_idx: the pad id; its embedding is the zero vector and gets no gradient.
        embeddings: optional ``(vocab_size, embed_dim)`` float tensor to initialize the embedding table with
            (e.g. GloVe rows).
        freeze_embeddings: keep the embedding table fixed (Parikh et al. do; the projection is still trained).

    Shapes: premises ``a`` are ``(batch, len_a)`` token ids, hypotheses ``b`` are ``(batch, len_b)``; masks are bool
    of the same shapes, True = a real token (takes part). ``None`` masks let every position take part.

    Parameters besides the embedding table: a linear projection ``embed_dim -> d`` without bias, F (``d -> d -> d``),
    G (``2d -> d -> d``) and H (``2d -> d -> d -> num_classes``). With ``embed_dim=300, hidden_size=200`` that is
    about 382K (:func:`count_parameters`), Parikh et al.'s "about 380K". After :meth:`forward`,
    ``.attention_weights`` holds the detached ``(weights_a, weights_b)`` of the :class:`Alignment`.

    Chapter 6, sections "The decomposable attention model" and "Masking both sides".
    """

    def __init__(self, vocab_size: int, embed_dim: int = 50, hidden_size: int = 100, num_classes: int = 3, *,
                 dropout: float = 0.2, padding_idx: int = 0, embeddings: Tensor | None = None,
                 freeze_embeddings: bool = False) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("embed_dim", embed_dim), ("hidden_size", hidden_size),
                            ("num_classes", num_classes)):
            if value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=padding_idx)
        if embeddings is not None:
            if tuple(embeddings.shape) != (vocab_size, embed_dim):
                raise ValueError(f"embeddings must have shape {(vocab_size, embed_dim)}, got {tuple(embeddings.shape)}")
            with torch.no_grad():
                self.embedding.weight.copy_(embeddings)
                self.embedding.weight[padding_idx].zero_()
        self.embedding.weight.requires_grad_(not freeze_embeddings)
        self.project = nn.Linear(embed_dim, hidden_size, bias=False)
        self.F = _mlp(hidden_size, hidden_size, dropout)
        self.G = _mlp(2 * hidden_size, hidden_size, dropout)
        self.H = nn.Sequential(_mlp(2 * hidden_size, hidden_size, dropout), nn.Linear(hidden_size, num_classes))
        self.attention_weights: tuple[Tensor, Tensor] | None = None

    # ------------------------------------------------------------------------------------------ the three steps
    def embed(self, tokens: Tensor) -> Tensor:
        """Token ids ``(batch, length)`` -> projected embeddings ``(batch, length, d)``."""
        _check_tokens("tokens", tokens)
        return self.project(self.embedding(tokens))

    def attend(self, a: Tensor, b: Tensor, mask_a: Tensor | None = None, mask_b: Tensor | None = None) -> Alignment:
        """Step 1: scores ``e_ij = F(a_i)^T F(b_j)`` and the soft alignments ``beta``, ``alpha`` (eqs. 1-2).

        Args:
            a: embedded premises ``(batch, len_a, d)``.
            b: embedded hypotheses ``(batch, len_b, d)``.
            mask_a, mask_b: bool ``(batch, len_a)`` and ``(batch, len_b)``, True = real token. A pair ``(i, j)``
                takes part in both softmaxes only if both tokens are real, so a premise pad gets no weight from any
                hypothesis token and vice versa, and a pad's own row of weights is all zeros. ``None`` = all real.

        Returns:
            An :class:`Alignment` (``beta``, ``alpha``, ``scores``, ``weights_a``, ``weights_b``).

        Raises:
            TypeError: a mask is not bool.
            ValueError: a mask's shape is not ``(batch, length)`` of its sentence.
        """
        _check_mask("mask_a", mask_a, a, "a")
        _check_mask("mask_b", mask_b, b, "b")
        f_a, f_b = self.F(a), self.F(b)
        scores = f_a @ f_b.transpose(1, 2)                                   # (batch, len_a, len_b), eq. 1
        if mask_a is None and mask_b is None:
            pair = None
        else:
            ma = mask_a if mask_a is not None else torch.ones(a.shape[:2], dtype=torch.bool, device=a.device)
            mb = mask_b if mask_b is not None else torch.ones(b.shape[:2], dtype=torch.bool, device=b.device)
            pair = ma[:, :, None] & mb[:, None, :]                           # both tokens real
        weights_a = masked_softmax(scores, pair, dim=2)                      # premise i over hypothesis j
        weights_b = masked_softmax(scores, pair, dim=1).transpose(1, 2)      # hypothesis j over premise i
        return Alignment(weights_a @ b, weights_b @ a, scores, weights_a, weights_b)

    def compare(self, a: Tensor, b: Tensor, beta: Tensor, alpha: Tensor) -> tuple[Tensor, Tensor]:
        """Step 2: ``v1_i = G([a_i; beta_i])`` ``(batch, len_a, d)`` and ``v2_j = G([b_j; alpha_j])``
        ``(batch, len_b, d)`` (eq. 3). Position-wise: pads are dealt with in :meth:`aggregate`."""
        return self.G(torch.cat([a, beta], dim=-1)), self.G(torch.cat([b, alpha], dim=-1))

    def aggregate(self, v1: Tensor, v2: Tensor, mask_a: Tensor | None = None, mask_b: Tensor | None = None
                  ) -> Tensor:
        """Step 3: sum the comparison vectors over the real tokens of each sentence (eq. 4) and classify,
        ``H([v1; v2])`` (eq. 5). Returns logits ``(batch, num_classes)``.

        Raises:
            TypeError: a mask is not bool.
            ValueError: a mask's shape is not ``(batch, length)`` of its sentence.
        """
        _check_mask("mask_a", mask_a, v1, "v1")
        _check_mask("mask_b", mask_b, v2, "v2")
        zero = torch.zeros((), dtype=v1.dtype, device=v1.device)
        if mask_a is not None:
            v1 = torch.where(mask_a[..., None], v1, zero)
        if mask_b is not None:
            v2 = torch.where(mask_b[..., None], v2, zero)
        return self.H(torch.cat([v1.sum(dim=1), v2.sum(dim=1)], dim=-1))

    def forward(self, premise: Tensor, hypothesis: Tensor, premise_mask: Tensor | None = None,
                hypothesis_mask: Tensor | None = None) -> Tensor:
        """Logits ``(batch, num_classes)`` for token ids ``premise`` ``(batch, len_a)`` and ``hypothesis``
        ``(batch, len_b)``, with bool masks (True = real token; ``None`` = every position takes part).

        An all-False ``premise_mask`` row gives a hypothesis-only prediction for that pair: its alignments are zero
        vectors and the premise sum is zero (no NaN).

        Raises:
            TypeError: ids are not integers, or a mask is not bool.
            ValueError: ids are not 2-D, the batch sizes differ, or a mask's shape differs from its ids'.
        """
        _check_tokens("premise", premise)
        _check_tokens("hypothesis", hypothesis)
        if premise.shape[0] != hypothesis.shape[0]:
            raise ValueError(f"premise and hypothesis batch sizes differ: {premise.shape[0]} and {hypothesis.shape[0]}")
        _check_mask("premise_mask", premise_mask, premise, "premise")
        _check_mask("hypothesis_mask", hypothesis_mask, hypothesis, "hypothesis")
        a, b = self.embed(premise), self.embed(hypothesis)
        align = self.attend(a, b, premise_mask, hypothesis_mask)
        self.attention_weights = (align.weights_a.detach(), align.weights_b.detach())
        v1, v2 = self.compare(a, b, align.beta, align.alpha)
        return self.aggregate(v1, v2, premise_mask, hypothesis_mask)


def count_parameters(model: nn.Module, include_embeddings: bool = False) -> int:
    """Number of parameters of ``model``, without its ``nn.Embedding`` tables unless ``include_embeddings``
    (Parikh et al. count the parameters besides the fixed word vectors)."""
    skip = set() if include_embeddings else {id(p) for m in model.modules() if isinstance(m, nn.Embedding)
                                             for p in m.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def alignment_accuracy(weights: Tensor, gold: Tensor) -> tuple[int, int]:
    """How often a token's arg-max attention lands on its gold aligned token.

    Args:
        weights: ``(batch, n_queries, n_keys)`` attention weights, e.g. ``Alignment.weights_b`` (hypothesis tokens
            over premise tokens).
        gold: ``(batch, n_queries)`` integer: the gold key index of each query token, ``-1`` where it has none
            (inserted tokens and pads are not counted).

    Returns:
        ``(hits, counted)``: the number of counted query tokens whose largest weight is on the gold key, and the
        number of counted tokens. Ties go to the lowest index (``torch.argmax``).

    Raises:
        ValueError: ``gold`` is not ``weights.shape[:2]``, or a gold index is ``>= n_keys``.

    Chapter 6, section "Is attention an alignment?".
    """
    if tuple(gold.shape) != tuple(weights.shape[:2]):
        raise ValueError(f"gold must have shape {tuple(weights.shape[:2])}, got {tuple(gold.shape)}")
    if gold.numel() and int(gold.max()) >= weights.shape[2]:
        raise ValueError(f"gold index {int(gold.max())} is out of range for {weights.shape[2]} keys")
    counted = gold >= 0
    hits = (weights.argmax(dim=-1) == gold) & counted
    return int(hits.sum()), int(counted.sum())


def chance_alignment_accuracy(key_mask: Tensor, gold: Tensor) -> float:
    """Expected :func:`alignment_accuracy` of attention that picks a real key uniformly at random: the mean, over
    counted query tokens (``gold >= 0``), of ``1 / (number of real keys)``.

    Args:
        key_mask: bool ``(batch, n_keys)``, True = real key (takes part). Integer masks are refused: counting a
            ``2`` as two keys would change the result silently.
        gold: integer ``(batch, n_queries)`` gold key indices, ``-1`` = not counted.

    Raises:
        TypeError: ``key_mask`` is not a bool tensor, or ``gold`` is not an integer tensor.
        ValueError: ``key_mask`` or ``gold`` is not 2-D, the batch sizes differ, a gold index is ``>= n_keys``, or
            no token is counted (the messages give the shapes and values).
    """
    check_bool_mask(key_mask, "key_mask")
    if not isinstance(gold, Tensor):
        raise TypeError(f"gold must be an integer torch.Tensor, got {type(gold).__name__}")
    if gold.dtype.is_floating_point or gold.dtype.is_complex or gold.dtype == torch.bool:
        raise TypeError(f"gold must hold integer key indices, got dtype {gold.dtype}")
    if key_mask.dim() != 2 or gold.dim() != 2:
        raise ValueError(f"key_mask must be (batch, n_keys) and gold (batch, n_queries), got {tuple(key_mask.shape)} "
                         f"and {tuple(gold.shape)}")
    if gold.numel() and int(gold.max()) >= key_mask.shape[1]:
        raise ValueError(f"gold index {int(gold.max())} is out of range for {key_mask.shape[1]} keys "
                         f"(key_mask has shape {tuple(key_mask.shape)})")
    if key_mask.shape[0] != gold.shape[0]:
        raise ValueError(f"key_mask and gold batch sizes differ: {key_mask.shape[0]} and {gold.shape[0]}")
    counted = gold >= 0
    if not bool(counted.any()):
        raise ValueError("no query token has a gold alignment (all gold entries are -1)")
    n_keys = key_mask.sum(dim=1, keepdim=True).clamp(min=1).to(torch.float64).expand_as(gold)
    return float((1.0 / n_keys)[counted].mean())
