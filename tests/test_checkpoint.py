"""attnbook.checkpoint and the resumable training of chapters 4 and 8's translation experiments: a run stopped
after an epoch, or inside one, and resumed from its checkpoint ends with bitwise the same parameters and history as
one trained in a single go (on the CPU); the command lines resume, record it in their provenance and delete the
checkpoint once the run is stored; bad checkpoints and arguments are refused with clear messages."""

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from attnbook import checkpoint as ck
from attnbook.data.translation import prepare_translation
from attnbook.experiments import seq2seq as s2s
from attnbook.experiments import transformer_translation as tt

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = {"red": "rojo", "cat": "gato", "dog": "perro", "big": "grande", "sees": "ve", "eats": "come",
         "the": "el", "a": "un"}


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    rows = set()
    while len(rows) < 300:
        rows.add(" ".join(rng.choice(list(WORDS), rng.integers(2, 7))))
    pairs = pd.DataFrame({"en": sorted(rows), "es": [" ".join(WORDS[w] for w in s.split()) for s in sorted(rows)]})
    return prepare_translation(max_src_len=6, max_tgt_len=6, min_freq=1, df=pairs)


# Dropout and a linear schedule make the random generators and the scheduler part of what must be restored.
S2S = s2s.Seq2SeqConfig(models=("bahdanau",), epochs=2, embed_size=8, hidden_size=16, dropout=0.3, batch_size=32,
                        lr_schedule="linear", max_decode_len=8, beam_size=2, n_train=None, n_valid=None,
                        n_test=None, length_edges=(3, 5))
TT = replace(tt.TranslationConfig.quick(), max_src_len=6, max_tgt_len=6, n_train=None, n_valid=None, n_test=None,
             max_src_vocab=None, max_tgt_vocab=None, d_model=16, nhead=2, num_layers=1, dim_feedforward=32,
             dropout=0.2, warmup_steps=5, epochs=2, embed_size=8, hidden_size=16, baseline_epochs=2,
             baseline_dropout=0.3, batch_size=32, beam_size=2, max_decode_len=8, length_edges=(3, 5))


class Stop(KeyboardInterrupt):
    pass


class Killed(ck.Checkpointer):
    """Saves like a Checkpointer, but "kills" the run (raises) right after its ``kill_after``-th save; with
    ``due_at``, a save inside an epoch is due after that many batches of each epoch."""

    def __init__(self, *args, kill_after: int, due_at: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.kill_after, self.due_at, self.saves, self.calls = kill_after, due_at, [], 0

    def due(self) -> bool:
        self.calls += 1
        return self.due_at is not None and self.calls % self.due_at == 0

    def save(self, **kw):
        path = super().save(**kw)
        self.saves.append((kw["epoch"], kw["step"]))
        if len(self.saves) == self.kill_after:
            raise Stop
        return path


def _assert_same(a, b):
    (model_a, hist_a), (model_b, hist_b) = a, b
    sa, sb = model_a.state_dict(), model_b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    pd.testing.assert_frame_equal(hist_a.drop(columns="seconds"), hist_b.drop(columns="seconds"))


def _seq2seq_run(data, tmp_path, **killed):
    config = {k: v for k, v in vars(S2S).items() if k not in s2s.LAYOUT.not_configuration}
    first = Killed(tmp_path, "seq2seq", {"model": "bahdanau", "seed": 0}, config, **killed)
    with pytest.raises(Stop):
        s2s.train_model("bahdanau", data, S2S, show_progress=False, checkpoint=first)
    again = s2s._checkpointer(tmp_path, "bahdanau", 0, S2S, None)
    result = s2s.train_model("bahdanau", data, S2S, show_progress=False, checkpoint=again)
    return first, again, result


@pytest.mark.parametrize("killed", [{"kill_after": 1}, {"kill_after": 2, "due_at": 3}],
                         ids=["after-epoch-1", "inside-epoch-1"])
def test_seq2seq_resumed_run_equals_the_uninterrupted_one(data, tmp_path, killed):
    straight = s2s.train_model("bahdanau", data, S2S, show_progress=False)
    first, again, resumed = _seq2seq_run(data, tmp_path, **killed)
    _assert_same(straight, resumed)
    assert first.saves[-1] == ((2, 0) if "due_at" not in killed else (1, 6))
    assert [(r["from_epoch"], r["from_step"]) for r in again.resumes] == [first.saves[-1]]
    assert ck.load_checkpoint(again.path)["epoch"] == S2S.epochs + 1          # complete, left for the caller
    done = s2s.train_model("bahdanau", data, S2S, show_progress=False, checkpoint=again)   # nothing left to train
    _assert_same(straight, done)


@pytest.mark.parametrize("kind", tt.MODELS)
def test_transformer_translation_resumed_run_equals_the_uninterrupted_one(data, tmp_path, kind):
    straight = tt.train_model(kind, data, TT)
    for killed in ({"kill_after": 1}, {"kill_after": 1, "due_at": 4}):
        config = {k: v for k, v in tt.store_config(TT).items() if k not in tt.LAYOUT.not_configuration}
        first = Killed(tmp_path / str(len(killed)), "transformer_translation", {"model": kind, "seed": 0}, config,
                       **killed)
        with pytest.raises(Stop):
            tt.train_model(kind, data, TT, checkpoint=first)
        assert first.saves == ([(2, 0)] if len(killed) == 1 else [(1, 4)])
        again = tt._checkpointer(tmp_path / str(len(killed)), kind, 0, TT, None)
        assert again.path.name == f"transformer_translation-model={kind}-seed=0.pt"
        _assert_same(straight, tt.train_model(kind, data, TT, checkpoint=again))
        assert len(again.resumes) == 1


def test_checkpoint_files_rng_and_errors(tmp_path, data):
    assert ck.checkpoint_file(tmp_path, "seq2seq", {"model": "luong-general", "seed": 2}).name == \
        "seq2seq-model=luong-general-seed=2.pt"
    with pytest.raises(ValueError, match="identity entries must be letters, digits, '.', '_' or '-', got 'model': "
                                         "'a/b'"):
        ck.checkpoint_file(tmp_path, "seq2seq", {"model": "a/b"})
    with pytest.raises(ValueError, match="identity must name the run"):
        ck.checkpoint_file(tmp_path, "seq2seq", {})
    with pytest.raises(ValueError, match="every_s must be positive seconds or None, got 0"):
        ck.Checkpointer(tmp_path, "seq2seq", {"seed": 0}, {}, every_s=0)
    states = ck.rng_states()
    expected = (np.random.rand(), torch.rand(3))
    ck.set_rng_states(states)
    again = (np.random.rand(), torch.rand(3))
    assert expected[0] == again[0] and torch.equal(expected[1], again[1])
    # another configuration, another run, a file that is no checkpoint, a file of another format
    config = {k: v for k, v in vars(S2S).items() if k not in s2s.LAYOUT.not_configuration}
    first = Killed(tmp_path, "seq2seq", {"model": "bahdanau", "seed": 0}, config, kill_after=1)
    with pytest.raises(Stop):
        s2s.train_model("bahdanau", data, S2S, show_progress=False, checkpoint=first)
    with pytest.raises(ValueError, match=r"was made with another configuration \(entries \['hidden_size', 'lr'\] "
                                         r"differ\); delete it"):
        s2s.train_model("bahdanau", data, replace(S2S, lr=0.5, hidden_size=8), show_progress=False,
                        checkpoint=s2s._checkpointer(tmp_path, "bahdanau", 0, replace(S2S, lr=0.5, hidden_size=8),
                                                     None))
    other = tmp_path / "seq2seq-model=none-seed=0.pt"
    other.write_bytes(first.path.read_bytes())
    with pytest.raises(ValueError, match=r"holds the run seq2seq \{'model': 'bahdanau', 'seed': 0\}, not seq2seq "
                                         r"\{'model': 'none', 'seed': 0\}"):
        s2s._checkpointer(tmp_path, "none", 0, S2S, None).load()
    other.write_text("not a checkpoint")
    with pytest.raises(ValueError, match="seq2seq-model=none-seed=0.pt is not a readable checkpoint"):
        ck.load_checkpoint(other)
    torch.save({"format": 99}, other)
    with pytest.raises(ValueError, match="is not a checkpoint of format 1 \\(found 99\\)"):
        ck.load_checkpoint(other)
    assert ck.load_checkpoint(tmp_path / "absent.pt") is None
    listed = ck.describe(tmp_path)
    assert [e["file"] for e in listed] == [first.path.name, other.name] and "error" in listed[1]
    assert listed[0]["epoch"] == 2 and listed[0]["done"] == pytest.approx(0.5)
    assert not list(tmp_path.glob(".*.tmp"))                                   # no temporary file left behind


def _cli(module, monkeypatch, cfg_class, cfg, data):
    monkeypatch.setattr(cfg_class, "quick", classmethod(lambda cls: cfg))
    monkeypatch.setattr(cfg_class, "data", lambda self: data)
    return module.main


@pytest.mark.parametrize("which", ["seq2seq", "transformer_translation"])
def test_cli_resumes_from_a_checkpoint_records_it_and_deletes_it(which, tmp_path, monkeypatch, data):
    module, cls, cfg = (s2s, s2s.Seq2SeqConfig, S2S) if which == "seq2seq" else (tt, tt.TranslationConfig,
                                                                               replace(TT, models=("bahdanau",)))
    main = _cli(module, monkeypatch, cls, cfg, data)
    args = ["--mode", "quick", "--device", "cpu"]
    main([*args, "--out", str(tmp_path / "straight" / "r.csv")])
    real_save, saves = ck.Checkpointer.save, []

    def save_then_stop(self, **kw):                      # the process is "killed" after its first checkpoint
        real_save(self, **kw)
        saves.append(kw["epoch"])
        if len(saves) == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(ck.Checkpointer, "save", save_then_stop)
    out, checkpoints = tmp_path / "resumed" / "r.csv", tmp_path / "checkpoints"
    with pytest.raises(SystemExit) as stopped:
        main([*args, "--out", str(out), "--checkpoint-dir", str(checkpoints)])
    assert stopped.value.code == 130 and len(list(checkpoints.glob("*.pt"))) == 1
    main([*args, "--out", str(out), "--checkpoint-dir", str(checkpoints), "--checkpoint-minutes", "30"])
    assert not list(checkpoints.glob("*.pt"))                                      # deleted once stored
    straight, resumed = pd.read_csv(tmp_path / "straight" / "r.csv"), pd.read_csv(out)
    columns = ["model", "valid_loss", "bleu_greedy", "bleu_beam", "token_acc"]
    pd.testing.assert_frame_equal(straight[columns], resumed[columns])
    sessions = json.loads(out.with_suffix(".json").read_text())["sessions"]
    assert [s["status"] for s in sessions] == ["interrupted", "finished"]
    assert sessions[1]["checkpoint_dir"] == str(checkpoints)
    (entry,) = sessions[1]["resumed_runs"]
    assert entry["model"] == "bahdanau" and entry["seed"] == 0 and entry["sessions"] == 2
    assert (entry["resumes"][0]["from_epoch"], entry["resumes"][0]["from_step"]) == (2, 0)



def test_translation_cli_checkpoints_each_run_by_model_and_seed(tmp_path, monkeypatch, data):
    """Chapter 8's store is keyed by (model, seed): a Transformer run with seed 1 is stopped inside its first epoch,
    its checkpoint is named by model and seed, and the resumed store equals one trained in one go."""
    main = _cli(tt, monkeypatch, tt.TranslationConfig, replace(TT, models=("transformer",)), data)
    args = ["--mode", "quick", "--device", "cpu", "--seeds", "2"]
    main([*args, "--out", str(tmp_path / "straight" / "r.csv")])
    real_save, saves = ck.Checkpointer.save, []

    def save_then_stop(self, **kw):                      # seed 0 is stored; seed 1 is "killed" at its first save
        real_save(self, **kw)
        saves.append((self.identity["seed"], kw["epoch"], kw["step"]))
        if self.identity["seed"] == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(ck.Checkpointer, "save", save_then_stop)
    monkeypatch.setattr(ck.Checkpointer, "due", lambda self: self.identity["seed"] == 1)   # seed 1: after a batch
    out, checkpoints = tmp_path / "resumed" / "r.csv", tmp_path / "checkpoints"
    with pytest.raises(SystemExit):
        main([*args, "--out", str(out), "--checkpoint-dir", str(checkpoints), "--checkpoint-minutes", "1"])
    assert saves[-1] == (1, 1, 1) and [p.name for p in checkpoints.glob("*.pt")] == \
        ["transformer_translation-model=transformer-seed=1.pt"]                     # seed 0's was deleted once stored
    monkeypatch.setattr(ck.Checkpointer, "save", real_save)
    main([*args, "--out", str(out), "--checkpoint-dir", str(checkpoints)])
    assert not list(checkpoints.glob("*.pt"))
    columns = ["model", "seed", "valid_loss", "bleu_greedy", "bleu_beam", "token_acc"]
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "straight" / "r.csv")[columns], pd.read_csv(out)[columns])
    history = [pd.read_csv(d / "r_history.csv").drop(columns="seconds") for d in (tmp_path / "straight", out.parent)]
    pd.testing.assert_frame_equal(*history)
    (entry,) = json.loads(out.with_suffix(".json").read_text())["sessions"][1]["resumed_runs"]
    assert (entry["model"], entry["seed"], entry["sessions"]) == ("transformer", 1, 2)
    assert (entry["resumes"][0]["from_epoch"], entry["resumes"][0]["from_step"]) == (1, 1)

@pytest.mark.parametrize("module", [s2s, tt])
def test_cli_refuses_checkpoint_minutes_without_a_folder(module, tmp_path, capsys):
    for bad, message in ((["--checkpoint-minutes", "2"], "--checkpoint-minutes 2 needs --checkpoint-dir"),
                         (["--checkpoint-dir", str(tmp_path), "--checkpoint-minutes", "0"],
                          "must be a positive number of minutes, got '0'")):
        with pytest.raises(SystemExit) as exit_:
            module.main(["--out", str(tmp_path / "x.csv"), "--device", "cpu", *bad])
        assert exit_.value.code == 2 and message in capsys.readouterr().err
