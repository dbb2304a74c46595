"""Chapter 6's page helpers in attnbook.experiments.nli: early stopping (train(keep_best=True)), the pad sums behind
Fig. fig-nli-pad-sum (checked against the model's own logits and a direct sum), and every sentence template at its
edge values (one-hot, even and spread rows; a swing above and below the interval; which side changes a prediction)."""

import numpy as np
import pandas as pd
import pytest
import torch

from attnbook.data.nli import LABELS, build_vocab, encode
from attnbook.experiments import nli as exp

TINY = exp.NLIConfig(n_train=120, n_valid=40, n_test=40, embed_dim=8, hidden_size=8, epochs=3, batch_size=32)


@pytest.fixture(scope="module")
def tiny():
    splits = exp.load_data(TINY)
    vocab = build_vocab(splits["train"])
    return splits, vocab


def test_keep_best_restores_the_best_validation_epoch(tiny):
    splits, vocab = tiny
    train_b, valid_b = encode(splits["train"], vocab), encode(splits["validation"], vocab)
    model = exp.make_model(TINY, vocab)
    history = exp.train(model, train_b, TINY, valid=valid_b, device="cpu", keep_best=True)
    kept = history[history["kept"]]
    assert len(kept) == 1 and kept["valid_acc"].iloc[0] == history["valid_acc"].max()
    # the model holds the kept epoch's weights: its validation accuracy is the kept one
    acc = exp.evaluate(exp.predict(model, valid_b)["logits"], valid_b.labels)["accuracy"]
    assert acc == pytest.approx(kept["valid_acc"].iloc[0])
    plain = exp.train(exp.make_model(TINY, vocab), train_b, TINY, valid=valid_b, device="cpu")
    assert plain["kept"].tolist() == [False] * (TINY.epochs - 1) + [True]


def test_keep_best_needs_validation_pairs(tiny):
    splits, vocab = tiny
    with pytest.raises(ValueError, match="keep_best=True needs valid pairs"):
        exp.train(exp.make_model(TINY, vocab), encode(splits["train"], vocab), TINY, device="cpu", keep_best=True)


@torch.no_grad()
def test_pad_sums_agree_with_the_model_and_a_direct_sum(tiny):
    splits, vocab = tiny
    model = exp.make_model(TINY, vocab).double().eval()
    ex_ = splits["test"][0]
    longest = max(len(ex_.premise), len(ex_.hypothesis))
    table = exp.pad_sums(model, ex_, vocab, [longest, longest + 5, longest + 20], reference=longest + 5)
    assert len(table) == 9 and set(table["side"]) == {"both", "premise", "hypothesis"}
    for _, row in table.iterrows():
        pad_to = {"both": (row.pad_to, row.pad_to), "premise": (row.pad_to, longest + 5),
                  "hypothesis": (longest + 5, row.pad_to)}[row.side]
        batch = encode([ex_], vocab, pad_to=pad_to)
        probs = torch.softmax(model(batch.premise, batch.hypothesis)[0], -1)      # the model, no masks
        assert [row[label] for label in LABELS] == pytest.approx(probs.tolist(), abs=1e-9)
        assert row.premise_pads == pad_to[0] - len(ex_.premise)
    # premise-only padding: every premise pad adds the same vector, so the pads' part grows linearly
    prem = table[table.side == "premise"].set_index("pad_to")
    per_pad = prem["v1_pads"] / prem["premise_pads"].where(prem["premise_pads"] > 0)
    assert np.allclose(per_pad.dropna(), per_pad.dropna().iloc[0])
    with pytest.raises(ValueError, match="must be >= "):
        exp.pad_sums(model, ex_, vocab, [longest - 1], reference=longest)


def _table(pred_ref="neutral", pred_far="entailment", premise="entailment", hypothesis="neutral", mass=0.0,
           v1_ref=2.0, v1_far=9.0, pads_ref=5, pads_far=35):
    rows = []
    for side, far_pred in (("both", pred_far), ("premise", premise), ("hypothesis", hypothesis)):
        for length, pred, v1, pads in ((10, pred_ref, v1_ref, pads_ref), (40, far_pred, v1_far, pads_far)):
            rows.append({"side": side, "pad_to": length, "predicted": pred, "v1_pads": v1, "v1_real": 5.0,
                         "hyp_pad_mass": mass, "hyp_pad_token": "is", "premise_pads": pads})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("kwargs, side_words", [
    ({}, "comes from the premise side"),
    ({"premise": "neutral", "hypothesis": "entailment"}, "comes from the hypothesis side"),
    ({"premise": "entailment", "hypothesis": "entailment"}, "either sentence alone"),
    ({"premise": "neutral", "hypothesis": "neutral"}, "Neither sentence padded alone"),
])
def test_pad_sum_sentences_name_the_side_the_data_show(kwargs, side_words):
    text = exp.pad_sum_sentences(_table(**kwargs), reference=10, far=40)
    assert side_words in text["side"]


def test_pad_sum_sentences_at_edge_values():
    text = exp.pad_sum_sentences(_table(mass=0.0), reference=10, far=40)
    assert text["attention"].startswith("The attention is not the route") and "0.00" in text["attention"]
    text = exp.pad_sum_sentences(_table(mass=0.86), reference=10, far=40)
    assert "“is” puts 0.86 of its weight" in text["attention"]
    assert "grows from 2.0 at 10 tokens to 9.0 at 40" in text["sum"]
    assert "shrinks from 9.0" in exp.pad_sum_sentences(_table(v1_ref=9.0, v1_far=2.0), reference=10, far=40)["sum"]
    assert "stays at 2.0," in exp.pad_sum_sentences(_table(v1_ref=2.0, v1_far=2.01), reference=10, far=40)["sum"]
    with pytest.raises(ValueError, match="at pad_to=20"):
        exp.pad_sum_sentences(_table(), reference=20, far=40)


def test_pad_sum_sentence_follows_the_vector_per_pad():
    """The norm per pad is the pads' part divided by the number of pads (2.0 / 5 = 0.40, 9.0 / 35 = 0.26): it
    shrinks while the part grows (the chapter's case), grows with it, or there is no pad to follow."""
    text = exp.pad_sum_sentences(_table(), reference=10, far=40)["sum"]
    assert "that vector shrinks (its norm from 0.40 to 0.26), but the pads' part" in text
    assert "grows from 2.0 at 10 tokens to 9.0 at 40, against 5.0" in text
    text = exp.pad_sum_sentences(_table(pads_ref=5, pads_far=6), reference=10, far=40)["sum"]
    assert "that vector grows (its norm from 0.40 to 1.50), and the pads' part" in text
    text = exp.pad_sum_sentences(_table(v1_ref=2.0, v1_far=14.0, pads_far=35), reference=10, far=40)["sum"]
    assert "stays about the same (its norm from 0.40 to 0.40), and" in text
    text = exp.pad_sum_sentences(_table(v1_ref=0.0, pads_ref=0), reference=10, far=40)["sum"]
    assert text.startswith("The pads' part of the premise's sum grows from 0.0") and "vector" not in text


def test_row_focus_at_edge_values():
    keys = ["every", "dog", "is"]
    assert exp.row_focus([1.0, 0.0, 0.0], keys) == 'puts 1.00 of its weight on "every"'
    assert exp.row_focus([1 / 3] * 3, keys) == "spreads its weight evenly over the premise"
    assert exp.row_focus([0.5, 0.3, 0.2], keys) == 'spreads its weight over several words, most (0.50) on "every"'
    assert exp.row_focus([0.9, 0.1, 0.0], keys).startswith("puts 0.90")        # exactly at the threshold
    with pytest.raises(ValueError, match="one weight per key"):
        exp.row_focus([0.5, 0.5], keys)
    with pytest.raises(ValueError, match="one weight per key"):
        exp.row_focus([], [])
    with pytest.raises(ValueError, match="one_word must lie in"):
        exp.row_focus([1.0, 0, 0], keys, one_word=0)


def test_epoch_swing_and_its_errors():
    history = pd.DataFrame({"valid_acc": [0.5, 0.7, 0.9, 0.85, 0.93]})
    assert exp.epoch_swing(history, last=3) == pytest.approx(8.0)
    assert exp.epoch_swing(history, last=5) == pytest.approx(20.0)
    assert exp.epoch_swing(pd.DataFrame({"valid_acc": [0.8, 0.8]})) == 0.0
    with pytest.raises(ValueError, match="last must be >= 2"):
        exp.epoch_swing(history, last=1)
    with pytest.raises(ValueError, match="at least two epochs"):
        exp.epoch_swing(pd.DataFrame({"valid_acc": [0.8, float("nan")]}))


def test_one_run_sentence_at_edge_values():
    assert "cannot rank" in exp.one_run_sentence(5.0, -0.1, -1.2, 1.0)
    assert "cannot rank" in exp.one_run_sentence(1.2, -0.1, -1.2, 1.0)          # swing equal to the reach
    assert "cannot rank" in exp.one_run_sentence(0.0, 0.0, 0.0, 0.0)            # zero everywhere
    text = exp.one_run_sentence(0.5, 3.0, 2.0, 4.0)
    assert "larger than the 0.5 points" in text and "cannot rank" not in text
    assert "larger than" in exp.one_run_sentence(0.5, -3.0, -4.0, -2.0)        # a negative gap
    with pytest.raises(ValueError, match="ci_low <= ci_high"):
        exp.one_run_sentence(1.0, 0.0, 1.0, -1.0)
    with pytest.raises(ValueError, match="swing >= 0"):
        exp.one_run_sentence(-1.0, 0.0, -1.0, 1.0)
    with pytest.raises(ValueError, match="finite"):
        exp.one_run_sentence(float("nan"), 0.0, -1.0, 1.0)


def test_setup_comparison_rows():
    table = exp.setup_comparison(exp.NLIConfig.quick(), 6000, 51_003)
    assert list(table.columns) == ["Parikh et al. 2016", "this page"]
    assert table.loc["parameters besides embeddings", "this page"] == "51,003"
    assert table.loc["data", "this page"].startswith("generated, 6,000")


def test_pad_sum_figure_draws_both_panels_and_refuses_bad_tables():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnbook.plotting import pad_sum_figure

    table = _table().assign(**{label: 1 / 3 for label in LABELS}, v2_pads=1.0)
    fig = pad_sum_figure(table, LABELS, reference=10)
    left, right = fig.axes
    assert len(left.get_lines()) == 3 + 1 and len(right.get_lines()) == 3 + 1   # curves and the dotted line
    plt.close(fig)
    with pytest.raises(ValueError, match="side 'both'"):
        pad_sum_figure(table[table.side != "both"], LABELS, reference=10)
    with pytest.raises(ValueError, match="missing \\['neutral'\\]"):
        pad_sum_figure(table.drop(columns="neutral"), LABELS, reference=10)


LABELS3 = ("entailment", "neutral", "contradiction")


def test_error_sentence_names_the_largest_off_diagonal_cell():
    # the chapter's case: 90 entailment pairs taken for neutral, 58 neutral pairs taken for entailment
    confusion = np.array([[407, 90, 0], [58, 443, 3], [2, 3, 494]])
    text = exp.error_sentence(confusion, LABELS3)
    assert text.startswith("The most frequent error is entailment taken for neutral (90 pairs, 0.181 of the "
                           "entailment pairs)")
    assert "the reverse, neutral taken for entailment, happens to 58 pairs, 0.115 of the neutral pairs." in text


def test_error_sentence_at_edge_values():
    assert exp.error_sentence(np.diag([5, 5, 5]), LABELS3) == "The model makes no error on the test pairs."
    assert "never happens" in exp.error_sentence(np.array([[5, 2, 0], [0, 5, 0], [0, 0, 5]]), LABELS3)
    tied = exp.error_sentence(np.array([[5, 2, 0], [2, 5, 0], [0, 0, 5]]), LABELS3)
    assert tied == ("The most frequent errors are tied at 2 pairs each: entailment taken for neutral; neutral "
                    "taken for entailment.")
    for bad, message in ((np.zeros((2, 3)), "square"), (np.zeros((2, 2)), "one row per label"),
                         (-np.eye(3), "non-negative whole"), (np.eye(3) * 0.5, "non-negative whole")):
        with pytest.raises(ValueError, match=message):
            exp.error_sentence(bad, LABELS3)


def test_hypernym_alignment_words():
    # 0.208 against 0.203 over 500 tokens: within two standard errors (0.036)
    assert exp.hypernym_alignment_words(0.208, 0.203, 500, 0.489).startswith("at chance (0.208 of the time")
    assert exp.hypernym_alignment_words(0.35, 0.203, 500, 0.489).startswith("only 0.350")
    assert exp.hypernym_alignment_words(0.60, 0.203, 500, 0.489).startswith("0.600 of the time")
    assert exp.hypernym_alignment_words(0.05, 0.203, 500, 0.489).startswith("below chance")
    assert exp.hypernym_alignment_words(0.0, 0.0, 1, 0.0).startswith("at chance")   # zero everywhere
    for args, message in (((1.2, 0.2, 5, 0.5), "accuracy must be"), ((0.2, -0.1, 5, 0.5), "chance must be"),
                          ((0.2, 0.2, 0, 0.5), "tokens must be")):
        with pytest.raises(ValueError, match=message):
            exp.hypernym_alignment_words(*args)
