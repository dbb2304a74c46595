"""Tests of chapter 8's translation comparison (:mod:`attnbook.experiments.transformer_translation`) on a tiny
synthetic word-for-word language: the models, the shared batches, the warm-up, training that learns, the
evaluation against sacreBLEU on the decoded outputs, and the resumable command line."""

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from attnbook.data.translation import prepare_translation
from attnbook.experiments import transformer_translation as ex
from attnbook.experiments.seq2seq import corpus_bleu, held_out_sources
from attnbook.seq2seq import AttentionDecoder
from attnbook.text import detokenize
from attnbook.transformer import Transformer

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = {"red": "rojo", "cat": "gato", "dog": "perro", "big": "grande", "sees": "ve", "eats": "come",
         "the": "el", "a": "un"}
TINY = replace(ex.TranslationConfig.quick(), max_src_len=6, max_tgt_len=6, n_train=None, n_valid=None, n_test=None,
               max_src_vocab=None, max_tgt_vocab=None, d_model=16, nhead=2, num_layers=1, dim_feedforward=32,
               warmup_steps=5, epochs=3, embed_size=8, hidden_size=16, baseline_epochs=2, batch_size=16,
               beam_size=2, max_decode_len=8, length_edges=(3, 5))


def _pairs(n=400, seed=0):
    rng = np.random.default_rng(seed)
    english = list(WORDS)
    rows = set()
    while len(rows) < n:
        rows.add(" ".join(rng.choice(english, rng.integers(2, 7))))
    return pd.DataFrame({"en": sorted(rows), "es": [" ".join(WORDS[w] for w in s.split()) for s in sorted(rows)]})


@pytest.fixture(scope="module")
def data():
    return prepare_translation(**{k: getattr(TINY, k) for k in ("max_src_len", "max_tgt_len", "n_train", "n_valid",
                                                                "n_test", "min_freq", "covered_only", "seed")},
                               df=_pairs())


@pytest.fixture(scope="module")
def trained(data):
    torch.set_num_threads(1)
    return {kind: ex.train_model(kind, data, TINY) for kind in ex.MODELS}


def test_presets():
    quick, full = ex.TranslationConfig.quick(), ex.TranslationConfig.full()
    assert (quick.max_src_len, quick.n_train, quick.max_src_vocab, quick.max_tgt_vocab, quick.covered_only) == \
        (12, 6000, 1000, 1500, True)
    assert (quick.d_model, quick.nhead, quick.num_layers, quick.norm_first, quick.models) == \
        (64, 4, 2, True, ("transformer", "bahdanau"))
    assert (full.n_train, full.max_src_len, full.d_model, full.covered_only) == (None, 50, 256, False)
    assert quick.baseline_epochs == quick.epochs == 3                       # chapter 4 trains Bahdanau for 3
    assert ex.TranslationConfig.for_mode("full") == full


def test_build_model_makes_the_two_kinds_and_refuses_others():
    torch.manual_seed(0)
    transformer = ex.build_model("transformer", 20, 30, TINY)
    assert isinstance(transformer, Transformer) and transformer.decoder.out.out_features == 30
    assert len(transformer.encoder.stack.layers) == TINY.num_layers and transformer.encoder.stack.layers[0].norm_first
    bahdanau = ex.build_model("bahdanau", 20, 30, TINY)
    assert isinstance(bahdanau.decoder, AttentionDecoder) and bahdanau.decoder.out.out_features == 30
    with pytest.raises(ValueError, match=r"kind must be one of \['transformer', 'bahdanau'\], got 'luong'"):
        ex.build_model("luong", 20, 30, TINY)
    with pytest.raises(ValueError, match=r"kind must be one of"):
        ex.train_model("gru", None, TINY)


def test_warm_up_rises_linearly_then_stays(monkeypatch, data):
    """The learning rate of every Transformer step, read from the optimizer: ``lr * min(1, step / warmup)``."""
    seen = []
    real_step = torch.optim.Adam.step

    def step(self, *args, **kwargs):
        seen.append(self.param_groups[0]["lr"])
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", step)
    cfg = replace(TINY, epochs=1)
    ex.train_model("transformer", data, cfg)
    expected = [cfg.lr * min(1.0, k / cfg.warmup_steps) for k in range(1, len(seen) + 1)]
    np.testing.assert_allclose(seen, expected, rtol=1e-12)
    seen.clear()
    ex.train_model("bahdanau", data, replace(cfg, baseline_epochs=1))
    assert seen and set(seen) == {cfg.baseline_lr}


def test_both_models_see_the_same_batches_in_the_same_order(monkeypatch, data):
    seen = {}
    real = ex._loss

    def recording(model, batch):
        seen.setdefault(type(model).__name__, []).append(batch[0].clone())
        return real(model, batch)

    monkeypatch.setattr(ex, "_loss", recording)
    cfg = replace(TINY, epochs=2, baseline_epochs=2)
    for kind in ex.MODELS:
        ex.train_model(kind, data, cfg)
    a, b = seen["Transformer"], seen["Seq2Seq"]
    assert len(a) == len(b) > 4 and all(torch.equal(x, y) for x, y in zip(a, b))


def test_training_learns_and_is_seeded(trained, data):
    for kind, (model, history) in trained.items():
        assert not model.training
        assert list(history.columns) == ["epoch", "train_loss", "valid_loss", "seconds"]
        epochs = TINY.epochs if kind == "transformer" else TINY.baseline_epochs
        assert history["epoch"].tolist() == list(range(1, epochs + 1))
        assert history["valid_loss"].iloc[-1] < history["valid_loss"].iloc[0], kind
        assert np.all(np.diff(history["seconds"]) > 0)
    again, _ = ex.train_model("transformer", data, TINY)
    first = trained["transformer"][0].state_dict()
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in first.items())


def test_evaluate_scores_the_decoded_outputs(trained, data):
    model = trained["transformer"][0]
    summary, by_length, decoded = ex.evaluate(model, data, TINY)
    sources = held_out_sources(data.test)
    refs = list(sources["refs"])
    for method in ("greedy", "beam"):
        assert len(decoded[method].tokens) == len(sources)
        hyps = [detokenize(data.tgt_vocab.decode(t)) for t in decoded[method].tokens]
        assert summary[f"bleu_{method}"] == pytest.approx(corpus_bleu(hyps, refs))
    assert 0 <= summary["token_acc"] <= 1
    assert by_length["length"].tolist() == ["1-3", "4-5", "6+"]
    assert by_length["sentences"].sum() == len(sources)
    assert list(by_length.columns) == ["length", "sentences", "bleu_greedy", "bleu_beam", "token_acc"]


def test_run_experiment_returns_a_row_per_model(data):
    cfg = replace(TINY, epochs=1, baseline_epochs=1)
    results = ex.run_experiment(cfg, data, device="cpu", show_progress=False)
    assert results.summary["model"].tolist() == list(ex.MODELS)
    assert list(results.summary.columns) == list(ex.LAYOUT.columns)
    assert set(results.models) == set(ex.MODELS) and set(results.decoded["bahdanau"]) == {"greedy", "beam"}
    assert results.summary["epochs"].tolist() == [1, 1]
    assert (results.summary["train_s"] > 0).all() and (results.summary["parameters"] > 0).all()
    with pytest.raises(ValueError, match="workers must be an int >= 1, got 0"):
        ex.run_experiment(cfg, data, workers=0)
    with pytest.raises(ValueError, match="kind must be one of"):
        ex.run_experiment(replace(cfg, models=("transformer", "gru")), data)


def test_main_stores_the_models_with_provenance_and_resumes(tmp_path, data, monkeypatch):
    cfg = replace(TINY, epochs=1, baseline_epochs=1)
    monkeypatch.setattr(ex.TranslationConfig, "quick", classmethod(lambda cls: cfg))
    monkeypatch.setattr(ex.TranslationConfig, "data", lambda self: data)
    out = tmp_path / "tt.csv"
    ex.main(["--mode", "quick", "--out", str(out), "--device", "cpu", "--models", "transformer"])
    assert pd.read_csv(out)["model"].tolist() == ["transformer"]
    assert set(pd.read_csv(tmp_path / "tt_by_length.csv")["model"]) == {"transformer"}
    assert len(pd.read_csv(tmp_path / "tt_history.csv")) == 1
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["config"]["d_model"] == 16 and meta["data_sizes"]["train_pairs"] == len(data.train)
    ex.main(["--mode", "quick", "--out", str(out), "--device", "cpu"])       # adds only the missing model
    assert pd.read_csv(out)["model"].tolist() == ["transformer", "bahdanau"]
    sessions = json.loads(out.with_suffix(".json").read_text())["sessions"]
    assert [s["runs_added"] for s in sessions] == [1, 1]
