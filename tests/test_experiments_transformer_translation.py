"""Tests of chapter 8's translation comparison (:mod:`attnbook.experiments.transformer_translation`) on a tiny
synthetic word-for-word language: the presets (chapter 4's quick data and Bahdanau model), the models, the shared
batches, the warm-up and label smoothing, training that learns, the Bahdanau runs being chapter 4's, the evaluation
against sacreBLEU on the decoded outputs, the resumable command line with seeds, and the stored comparison with its
paired verdict."""

import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from attnbook.data.translation import prepare_translation
from attnbook.experiments import seq2seq as ch4
from attnbook.experiments import transformer_translation as ex
from attnbook.experiments.seq2seq import Seq2SeqConfig, corpus_bleu, held_out_sources
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
                                                                "n_test", "min_freq", "covered_only")},
                               seed=TINY.split_seed, df=_pairs())


@pytest.fixture(scope="module")
def trained(data):
    torch.set_num_threads(1)
    return {kind: ex.train_model(kind, data, TINY) for kind in ex.MODELS}


def test_presets_take_chapter_4s_quick_data_and_bahdanau_model():
    quick, full, ch4q = ex.TranslationConfig.quick(), ex.TranslationConfig.full(), Seq2SeqConfig.quick()
    for name in ex.SHARED_FIELDS:
        if name != "seeds":
            assert getattr(quick, name) == getattr(ch4q, name), name
    assert (quick.n_train, quick.max_src_vocab, quick.max_tgt_vocab, quick.epochs) == (35_000, 1000, 1500, 2)
    # the Bahdanau runs are chapter 4's quick runs: the same configuration, up to the entries that choose runs
    differences = {k for k, v in asdict(quick.baseline_config()).items() if asdict(ch4q)[k] != v}
    assert differences <= set(ch4.LAYOUT.not_configuration)
    assert quick.baseline_epochs == quick.epochs == ch4q.epochs
    assert (quick.norm_first, quick.models, quick.seeds) == (True, ("transformer", "bahdanau"), (0,))
    assert (quick.d_model, quick.dim_feedforward, quick.lr, quick.warmup_steps, quick.label_smoothing) == \
        (64, 256, 3e-3, 200, 0.0)
    assert (full.n_train, full.max_src_len, full.d_model, full.covered_only, full.seeds) == \
        (None, 50, 256, False, (0, 1, 2))
    assert full.baseline_config().hidden_size == ch4.Seq2SeqConfig.full().hidden_size
    assert ex.TranslationConfig.for_mode("full") == full


def test_cpu_preset_shares_chapter_4s_cpu_runs():
    cpu, ch4cpu = ex.TranslationConfig.cpu(), Seq2SeqConfig.cpu()
    for name in ex.SHARED_FIELDS:
        assert getattr(cpu, name) == getattr(ch4cpu, name), name
    # its Bahdanau runs are chapter 4's CPU-mode runs: the same configuration, up to the entries that choose runs
    differences = {k for k, v in asdict(cpu.baseline_config()).items() if asdict(ch4cpu)[k] != v}
    assert differences <= set(ch4.LAYOUT.not_configuration)
    assert (cpu.d_model, cpu.nhead, cpu.num_layers, cpu.dim_feedforward, cpu.dropout) == (128, 4, 3, 512, 0.1)
    assert (cpu.lr, cpu.warmup_steps, cpu.label_smoothing, cpu.epochs) == (2e-3, 400, 0.1, 3)
    assert ex.TranslationConfig.for_mode("cpu") == cpu and "extra_presets" not in asdict(cpu)


@pytest.mark.parametrize("change, message", [
    ({"models": ()}, r"models must be a non-empty selection of \['transformer', 'bahdanau'\], got \(\)"),
    ({"models": ("transformer", "gru")}, r"models must be a non-empty selection .* got \('transformer', 'gru'\)"),
    ({"seeds": (0, 0)}, r"seeds must be distinct non-negative ints, at least one, got \(0, 0\)"),
    ({"seeds": (-1,)}, r"seeds must be .* got \(-1,\)"),
    ({"label_smoothing": 1.0}, r"label_smoothing must be in \[0, 1\), got 1.0"),
])
def test_config_refuses_bad_values(change, message):
    with pytest.raises(ValueError, match=message):
        replace(TINY, **change)


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
    real_smoothed, real_ch4 = ex._smoothed_loss, ch4._loss

    def recording(model, batch, *args):
        seen.setdefault(type(model).__name__, []).append(batch[0].clone())
        return (real_smoothed if args else real_ch4)(model, batch, *args)

    monkeypatch.setattr(ex, "_smoothed_loss", recording)
    monkeypatch.setattr(ch4, "_loss", recording)
    cfg = replace(TINY, epochs=2, baseline_epochs=2)
    for kind in ex.MODELS:
        ex.train_model(kind, data, cfg, seed=3)
    a, b = seen["Transformer"], seen["Seq2Seq"]
    assert len(a) == len(b) > 4 and all(torch.equal(x, y) for x, y in zip(a, b))


def test_the_transformer_loss_is_label_smoothed_cross_entropy(data):
    """Against the definition (Szegedy et al. 2016; Vaswani et al. 2017, 5.4): (1 - eps) * NLL + eps * the mean over
    the vocabulary of -log p, per real target token, summed."""
    torch.manual_seed(0)
    model = ex.build_model("transformer", len(data.src_vocab), len(data.tgt_vocab), TINY).double()
    batch = ch4.make_batches(data.train, 8)[0]
    eps = 0.2
    loss, n = ex._smoothed_loss(model, batch, eps)
    logits, _ = model(*batch[:3])
    logp = torch.log_softmax(logits, -1)
    real = batch[3] != 0
    nll = -logp.gather(-1, batch[3].unsqueeze(-1)).squeeze(-1)
    expected = ((1 - eps) * nll + eps * -logp.mean(-1))[real].sum()
    assert n == int(real.sum())
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-10)
    plain, _ = ex._smoothed_loss(model, batch, 0.0)
    torch.testing.assert_close(plain, nll[real].sum(), rtol=1e-10, atol=1e-10)


def test_a_bahdanau_run_is_chapter_4s_run_with_the_same_seed(data):
    cfg = replace(TINY, baseline_epochs=1)
    ours, history = ex.train_model("bahdanau", data, cfg, seed=2)
    theirs, their_history = ch4.train_model("bahdanau", data, cfg.baseline_config(), show_progress=False, seed=2)
    assert all(torch.equal(v, theirs.state_dict()[k]) for k, v in ours.state_dict().items())
    pd.testing.assert_frame_equal(history.drop(columns="seconds"), their_history.drop(columns="seconds"))


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
    other, _ = ex.train_model("transformer", data, TINY, seed=1)
    assert not all(torch.equal(v, other.state_dict()[k]) for k, v in first.items())


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


def test_run_experiment_returns_a_row_per_run(data):
    cfg = replace(TINY, epochs=1, baseline_epochs=1, seeds=(0, 1))
    results = ex.run_experiment(cfg, data, device="cpu", show_progress=False)
    assert list(zip(results.summary["model"], results.summary["seed"])) == \
        [("transformer", 0), ("bahdanau", 0), ("transformer", 1), ("bahdanau", 1)]
    assert list(results.summary.columns) == list(ex.LAYOUT.columns)
    assert set(results.models) == set(ex.MODELS) and set(results.decoded["bahdanau"]) == {"greedy", "beam"}
    assert results.summary["epochs"].tolist() == [1, 1, 1, 1]
    assert (results.summary[["train_s", "train_cpu_s", "parameters"]] > 0).all().all()
    assert set(results.history["seed"]) == {0, 1} and len(results.by_length) == 4 * 3
    with pytest.raises(ValueError, match="workers must be an int >= 1, got 0"):
        ex.run_experiment(cfg, data, workers=0)


def test_main_stores_the_runs_with_provenance_and_resumes(tmp_path, data, monkeypatch):
    cfg = replace(TINY, epochs=1, baseline_epochs=1)
    monkeypatch.setattr(ex.TranslationConfig, "quick", classmethod(lambda cls: cfg))
    monkeypatch.setattr(ex.TranslationConfig, "data", lambda self: data)
    out = tmp_path / "tt.csv"
    ex.main(["--mode", "quick", "--out", str(out), "--device", "cpu", "--models", "transformer", "--seeds", "2"])
    assert pd.read_csv(out)[["model", "seed"]].values.tolist() == [["transformer", 0], ["transformer", 1]]
    assert set(pd.read_csv(tmp_path / "tt_by_length.csv")["model"]) == {"transformer"}
    assert len(pd.read_csv(tmp_path / "tt_history.csv")) == 2
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["config"]["d_model"] == 16 and meta["data_sizes"]["train_pairs"] == len(data.train)
    assert meta["overrides"] == {"models": ["transformer"], "seeds": [0, 1]}
    ex.main(["--mode", "quick", "--out", str(out), "--device", "cpu"])       # adds only the missing run
    assert pd.read_csv(out)[["model", "seed"]].values.tolist() == \
        [["transformer", 0], ["transformer", 1], ["bahdanau", 0]]
    sessions = json.loads(out.with_suffix(".json").read_text())["sessions"]
    assert [s["runs_added"] for s in sessions] == [2, 1]


def _runs(model, bleus, **extra):
    return pd.DataFrame({"model": model, "seed": range(len(bleus)), "bleu_greedy": bleus, "bleu_beam": bleus,
                         "token_acc": 0.5, "valid_loss": 1.0, "train_s": 1.0, **extra})


def _stored(runs, config):
    by_length = pd.DataFrame([{"length": "1-3", "sentences": 2, "bleu_greedy": r.bleu_greedy, "token_acc": 0.5,
                               "model": r.model, "seed": r.seed} for r in runs.itertuples()])
    return ex.StoredRuns(runs, by_length, pd.DataFrame(), {"config": config})


def test_comparison_runs_takes_chapter_4s_bahdanau_runs_only_with_the_same_configuration():
    cfg = replace(ex.TranslationConfig.quick(), seeds=(0, 1, 2))
    ours = _stored(_runs("transformer", [40.0, 41.0, 42.0]), ex.store_config(replace(cfg, seeds=(0,))))
    chapter4 = _stored(pd.concat([_runs("bahdanau", [38.0, 39.0, 40.0]), _runs("none", [30.0, 30.0, 30.0])]),
                       asdict(replace(Seq2SeqConfig.quick(), seeds=(0, 1, 2))))
    runs, by_length, sources = ex.comparison_runs(cfg, ours, chapter4)
    assert sources == {"stored": "used", "chapter4": "used"}
    assert runs.groupby("model").source.first().to_dict() == {"bahdanau": "chapter 4", "transformer": "this store"}
    assert len(runs) == 6 and set(by_length.model) == {"transformer", "bahdanau"} and by_length.bleu_beam.isna().all()
    changed = _stored(chapter4.runs, asdict(replace(Seq2SeqConfig.quick(), hidden_size=96)))
    runs, _, sources = ex.comparison_runs(cfg, ours, changed)
    assert sources["chapter4"] == "differs in ['hidden_size']" and set(runs.model) == {"transformer"}
    _, _, sources = ex.comparison_runs(replace(cfg, d_model=32), ours, None)
    assert sources == {"stored": "differs in ['d_model']", "chapter4": "missing"}


def test_read_runs_reads_a_store_from_a_results_folder(tmp_path):
    (tmp_path / "results").mkdir()
    assert ex.read_runs("x", start=tmp_path) is None
    _runs("transformer", [1.0, 2.0]).to_csv(tmp_path / "results" / "x.csv", index=False)
    pd.DataFrame({"length": ["1-3"]}).to_csv(tmp_path / "results" / "x_by_length.csv", index=False)
    assert ex.read_runs("x", start=tmp_path) is None                       # no provenance yet
    (tmp_path / "results" / "x.json").write_text(json.dumps({"config": {"d_model": 1}}))
    stored = ex.read_runs("x", start=tmp_path / "sub")
    assert stored.runs["bleu_greedy"].tolist() == [1.0, 2.0] and stored.history.empty
    assert stored.provenance == {"config": {"d_model": 1}}


@pytest.mark.parametrize("transformer, expected", [
    ([41.0, 42.5, 40.2], "higher"), ([37.0, 38.0, 39.0], "lower"), ([39.0, 38.0, 40.5], "within seed noise"),
])
def test_compare_models_chooses_the_verdict_from_paired_seeds(transformer, expected):
    bahdanau = [39.0, 39.5, 39.9]
    runs = pd.concat([_runs("bahdanau", bahdanau), _runs("transformer", transformer)])
    row = ex.compare_models(runs, n_resamples=999)
    assert row["verdict"] == expected and row["n_pairs"] == 3
    assert row["mean_diff"] == pytest.approx(np.mean(np.subtract(transformer, bahdanau)))
    assert row["mean_condition"] == pytest.approx(np.mean(transformer))
    assert row["ci_low"] <= row["mean_diff"] <= row["ci_high"]
    assert ex.compare_models(runs[runs.seed < 2], n_resamples=99)["verdict"] == "not yet answered"
    with pytest.raises(ValueError, match=r"frame lacks the columns \['bleu_beam2'\]"):
        ex.compare_models(runs, value="bleu_beam2")


def test_the_committed_quick_seeds_are_of_the_quick_configuration():
    """Chapter 8 reads them: a changed quick preset needs new stored runs (the module's docstring has the command)."""
    repo = Path(__file__).resolve().parents[1]
    cfg = ex.TranslationConfig.quick()
    runs, by_length, sources = ex.comparison_runs(cfg, ex.read_runs("transformer_translation_quick", repo),
                                                  ex.read_runs("seq2seq_quick", repo))
    assert sources == {"stored": "used", "chapter4": "used"}
    assert runs.groupby("model").seed.apply(sorted).to_dict() == {"bahdanau": [0, 1, 2], "transformer": [0, 1, 2]}
    assert set(by_length.model) == {"transformer", "bahdanau"}
    assert ex.compare_models(runs, n_resamples=99)["n_pairs"] == 3


def test_verdict_phrase_gives_the_effect_and_its_interval():
    from attnbook.experiments.transformer_translation import verdict_phrase

    row = pd.Series({"verdict": "higher", "n_pairs": 3, "mean_diff": 7.05, "ci_low": 6.27, "ci_high": 8.26})
    assert verdict_phrase(row) == "higher than Bahdanau's model's, by +7.0 points (95% interval +6.3 to +8.3)"
    lower = row.copy()
    lower[["verdict", "mean_diff", "ci_low", "ci_high"]] = ["lower", -1.0, -1.5, -1.5]          # equal bounds
    assert verdict_phrase(lower, "its baseline's") == "lower than its baseline's, by -1.0 points (95% interval -1.5 to -1.5)"
    zero = row.copy()
    zero[["verdict", "mean_diff", "ci_low", "ci_high"]] = ["within seed noise", 0.0, -0.4, 0.4]
    assert verdict_phrase(zero) == ("indistinguishable from Bahdanau's model's, by +0.0 points (95% interval -0.4 "
                                    "to +0.4)")
    one = pd.Series({"verdict": "not yet answered", "n_pairs": 1, "mean_diff": np.nan, "ci_low": np.nan,
                     "ci_high": np.nan})
    assert verdict_phrase(one) == "not yet compared (1 paired run, too few for a verdict)"
    with pytest.raises(ValueError, match="verdict must be one of"):
        verdict_phrase(row.replace("higher", "better"))


def test_results_table_gives_each_model_and_decoding_its_mean_interval_and_runs():
    runs = pd.concat([_runs("bahdanau", [39.0, 39.5, 39.9]), _runs("transformer", [41.0, 42.5, 40.2])])
    runs["bleu_beam"] = runs["bleu_greedy"] + 1.0
    table = ex.results_table(runs)
    assert list(table.columns) == ["condition", "BLEU", "95% interval", "runs"]
    assert table["condition"].tolist() == ["Transformer, greedy", "Bahdanau (chapter 4), greedy",
                                           "Transformer, beam search", "Bahdanau (chapter 4), beam search"]
    assert table.loc[0, "BLEU"] == f"{np.mean([41.0, 42.5, 40.2]):.1f}" and (table["runs"] == 3).all()
    one = ex.results_table(runs[(runs.seed == 0) & (runs.model == "transformer")])      # one run, one model
    assert one["condition"].tolist() == ["Transformer, greedy", "Transformer, beam search"]
    assert (one["95% interval"] == "–").all()
    with pytest.raises(ValueError, match=r"runs lacks the columns \['bleu_beam'\]"):
        ex.results_table(runs.drop(columns="bleu_beam"))
