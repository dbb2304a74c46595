"""attnbook.toy_attention (chapter 3, section "A trained head: the largest digit so far"): the model's head against
torch's fused attention with a causal mask, the target against a plain Python running maximum, the share of weight
on the right positions on hand-built weights (ties and the first row included), the key ranking and the words at
their edges, that training is deterministic and learns the task, and every error path."""

import itertools
from dataclasses import replace
import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from attnbook import toy_attention as toy

SMALL = toy.RunningMaxConfig(steps=5, batch_size=8, n_test=16)


def test_running_max_equals_a_python_running_maximum():
    tokens = toy.running_max_batch(20, SMALL, torch.Generator().manual_seed(0))
    assert tokens.shape == (20, SMALL.seq_len) and tokens.dtype == torch.int64
    assert 0 <= tokens.min() and tokens.max() < SMALL.n_digits
    expected = [list(itertools.accumulate(row, max)) for row in tokens.tolist()]
    assert toy.running_max(tokens).tolist() == expected


def test_the_head_is_torch_sdpa_with_a_causal_mask():
    model = toy.make_model(SMALL)
    tokens = toy.running_max_batch(4, SMALL, torch.Generator().manual_seed(1))
    with torch.no_grad():
        x = model.embed(tokens)
        q, k, v = model.W_Q(x), model.W_K(x), model.W_V(x)
        for causal in (True, False):
            logits = model(tokens, causal=causal)
            reference = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            torch.testing.assert_close(logits, model.out(reference), rtol=1e-5, atol=1e-6)
            scores = q @ k.transpose(-1, -2) / math.sqrt(SMALL.d_k)
            if causal:
                upper = torch.ones(SMALL.seq_len, SMALL.seq_len, dtype=torch.bool).triu(1)
                scores = scores.masked_fill(upper, -math.inf)
            torch.testing.assert_close(model.attention_weights, scores.softmax(-1), rtol=1e-5, atol=1e-6)
    table = toy.score_table(model)
    assert table.shape == (SMALL.n_digits, SMALL.n_digits) and table.dtype == np.float64


def test_training_is_deterministic_and_restores_the_thread_count():
    threads = torch.get_num_threads()
    a, losses_a = toy.train_running_max(SMALL)
    b, losses_b = toy.train_running_max(SMALL)
    assert torch.get_num_threads() == threads
    assert losses_a == losses_b and len(losses_a) == SMALL.steps
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, q), name
    assert not a.training


def test_the_default_training_learns_the_task():
    cfg = toy.RunningMaxConfig()
    model, _ = toy.train_running_max(cfg)
    tokens = toy.running_max_batch(cfg.n_test, cfg, torch.Generator().manual_seed(cfg.test_seed))
    report = toy.evaluate(model, tokens)
    assert report["accuracy"] > 0.95 and report["share"] > 0.9
    assert report["share_no_mask"] < report["share"] and report["accuracy_no_mask"] < report["accuracy"]
    ranking = toy.key_ranking(toy.score_table(model))
    assert ranking["rising"] == cfg.n_digits and ranking["top_gap"] > 0


def test_share_on_running_max_on_hand_built_weights():
    tokens = torch.tensor([[3, 1, 4, 4]])  # running maximum 3 3 4 4; the 4 appears twice
    one_hot = torch.tensor([[[1.0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0.5, 0.5]]])
    assert toy.share_on_running_max(one_hot, tokens) == 1.0
    uniform = torch.tril(torch.ones(4, 4))
    uniform = (uniform / uniform.sum(-1, keepdim=True))[None]
    # rows 2..4 put 1/2, 1/3 and 2/4 on positions holding the running maximum; the first row is left out
    assert toy.share_on_running_max(uniform, tokens) == pytest.approx((1 / 2 + 1 / 3 + 2 / 4) / 3)
    assert toy.share_on_running_max(uniform, tokens, skip_first=False) == pytest.approx((1 + 1 / 2 + 1 / 3 + 2 / 4) / 4)
    # weight on a later position never counts, even when it holds a larger digit
    ahead = torch.tensor([[[0, 0, 1.0, 0], [0, 0, 1, 0], [0, 0, 1, 0], [0, 0, 1, 0]]])
    assert toy.share_on_running_max(ahead, tokens, skip_first=False) == pytest.approx(0.5)


def test_share_on_running_max_errors():
    with pytest.raises(ValueError, match=r"weights must be \(batch, n, n\) and tokens \(batch, n\); got weights "
                                         r"\(1, 3, 3\) and tokens \(1, 4\)"):
        toy.share_on_running_max(torch.ones(1, 3, 3), torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="skip_first needs sequences of at least 2 tokens"):
        toy.share_on_running_max(torch.ones(1, 1, 1), torch.zeros(1, 1, dtype=torch.long))


def test_key_ranking_at_its_edges():
    rising = np.add.outer(np.zeros(3), [0.0, 1.0, 3.0])
    assert toy.key_ranking(rising) == {"rising": 3, "n_queries": 3, "top_gap": 2.0}
    flat = np.zeros((3, 3))  # no rise anywhere; the last query digit has one key only, which counts as rising
    assert toy.key_ranking(flat) == {"rising": 1, "n_queries": 3, "top_gap": 0.0}
    falling = -rising
    assert toy.key_ranking(falling)["top_gap"] == -2.0
    with pytest.raises(ValueError, match=r"table must be square and at least 2 x 2, got shape \(2, 3\)"):
        toy.key_ranking(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"got shape \(1, 1\)"):
        toy.key_ranking(np.zeros((1, 1)))


@pytest.mark.parametrize("share,words", [(1.0, "all"), (0.96, "nearly all"), (0.95, "nearly all"), (0.7, "most"),
                                         (0.5, "about half"), (0.45, "about half"), (0.2, "less than half"),
                                         (0.0, "none")])
def test_share_words(share, words):
    assert toy.share_words(share) == words


@pytest.mark.parametrize("share", [-0.1, 1.5, float("nan")])
def test_share_words_errors(share):
    with pytest.raises(ValueError, match="share must be in"):
        toy.share_words(share)


@pytest.mark.parametrize("change,message", [
    ({"n_digits": 1}, "n_digits must be at least 2, got 1"), ({"seq_len": 0}, "seq_len must be a positive int, got 0"),
    ({"d_k": 2.0}, "d_k must be a positive int, got 2.0"), ({"steps": True}, "steps must be a positive int, got True"),
    ({"lr": 0.0}, "lr must be positive and finite, got 0.0"), ({"lr": math.inf}, "lr must be positive and finite")])
def test_config_errors(change, message):
    with pytest.raises(ValueError, match=message):
        toy.RunningMaxConfig(**change)


def test_report_table_names_every_entry_in_words():
    table = toy.report_table({"accuracy": 0.99951, "share": 0.9, "accuracy_no_mask": 0.6, "share_no_mask": 0.5})
    assert table.columns.tolist() == ["small demonstration"]
    assert table.index.tolist() == list(toy.REPORT_LABELS.values())
    assert table.iloc[0, 0] == 1.0


def test_value_table_is_the_prediction_of_a_one_token_sequence():
    """With one key, the softmax gives it weight 1, so the model's logits are the read-out of that key's value."""
    model = toy.make_model(SMALL)
    table = toy.value_table(model)
    assert table.shape == (SMALL.n_digits, SMALL.n_digits) and table.dtype == np.float64
    with torch.no_grad():
        for digit in range(SMALL.n_digits):
            logits = model(torch.tensor([[digit]]))[0, 0].double().numpy()
            np.testing.assert_allclose(table[digit], logits, rtol=1e-6, atol=1e-6)


def test_the_trained_values_carry_their_digit():
    cfg = toy.RunningMaxConfig()
    model, _ = toy.train_running_max(cfg)
    assert (toy.value_table(model).argmax(1) == np.arange(cfg.n_digits)).all()


@pytest.mark.parametrize("q_var, k_var, std, start", [
    (0.37, 0.33, 0.44, "below 1"), (2.0, 3.0, 2.5, "above 1"), (0.5, 2.0, 1.0, "not both 1"),
    (1.0, 1.0, 1.0, "not both 1"), (0.999, 0.999, 0.999, "below 1"),
])
def test_start_spread_words(q_var, k_var, std, start):
    assert toy.start_spread_words(q_var, k_var, std).startswith(start)


@pytest.mark.parametrize("args, message", [
    ((0.0, 0.5, 0.3), "q_var must be positive"), ((0.5, -1.0, 0.3), "k_var must be positive"),
    ((0.5, 0.5, math.nan), "score_std must be positive"), ((0.5, math.inf, 0.3), "k_var must be positive"),
    ((0.5, 0.5, 1.0), "would contradict"), ((2.0, 2.0, 1.0), "would contradict"),
])
def test_start_spread_words_errors(args, message):
    with pytest.raises(ValueError, match=message):
        toy.start_spread_words(*args)


def test_the_unscaled_head_multiplies_the_scores_by_sqrt_dk():
    cfg = toy.RunningMaxConfig(d_k=64)
    tokens = toy.running_max_batch(4, cfg, torch.Generator().manual_seed(0))
    scaled = toy.make_model(cfg).scores(tokens)
    unscaled = toy.make_model(replace(cfg, scaled=False)).scores(tokens)
    torch.testing.assert_close(unscaled, scaled * 8.0)


def test_scale_sentence_follows_the_runs_at_its_edges():
    def runs(on, off, sd_on=0.3, sd_off=5.0):
        rows = [{"scaled": True, "seed": i, "start_sd": sd_on, "accuracy": a} for i, a in enumerate(on)]
        rows += [{"scaled": False, "seed": i, "start_sd": sd_off, "accuracy": a} for i, a in enumerate(off)]
        return pd.DataFrame(rows)

    text = toy.scale_sentence(runs([1.0, 1.0], [0.93, 0.98]), 256)
    assert text.startswith("At d_k = 256 the unscaled scores start with a standard deviation of about 5.0, "
                           "against 0.3 with the factor.")
    assert text.endswith("every run reached accuracy 1.000; without it, the same steps reached only 0.930 to "
                         "0.980.")
    assert "the unscaled runs did better" in toy.scale_sentence(runs([0.9], [0.95]), 256)
    assert "The accuracies overlap" in toy.scale_sentence(runs([0.9, 1.0], [0.95]), 256)
    with pytest.raises(ValueError, match="with and without"):
        toy.scale_sentence(runs([1.0], [])[lambda f: f.scaled], 256)


def test_scale_comparison_trains_both_heads_from_the_same_seeds():
    cfg = toy.RunningMaxConfig(steps=3, n_test=50)
    losses, summary = toy.scale_comparison(cfg, seeds=(0, 1))
    assert list(summary.scaled) == [True, True, False, False] and list(summary.seed) == [0, 1, 0, 1]
    assert len(losses) == 4 * 3 and summary.start_sd[2] > summary.start_sd[0]
    with pytest.raises(ValueError, match="seeds"):
        toy.scale_comparison(cfg, seeds=())
