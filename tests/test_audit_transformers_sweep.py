"""attnbook.audit.transformers_sweep: the machinery of the sweep over transformers' architectures, on two or three
of them (the whole sweep is a command, ``python -m attnbook.audit --transformers``, not a test)."""

import json

import pandas as pd
import pytest
import torch

pytest.importorskip("transformers")

from attnbook.audit import transformers_sweep as sweep  # noqa: E402


def test_the_mappings_entries_include_both_mappings_and_bert_twice():
    keys = [e.key for e in sweep.entries()]
    assert "causal-lm:gpt2" in keys and "masked-lm:bert" in keys and "causal-lm:bert" in keys
    assert len(keys) == len(set(keys)) >= 200


@pytest.mark.parametrize("model_type", ["gpt2", "llama", "gemma3_text"])
def test_tiny_configs_are_small(model_type):
    entry = sweep.Entry("causal-lm", model_type, "")
    config = sweep.tiny_config(entry)
    width = next(getattr(config, n) for n in ("hidden_size", "n_embd") if hasattr(config, n))
    layers = next(getattr(config, n) for n in ("num_hidden_layers", "n_layer") if hasattr(config, n))
    assert width <= 64 and layers == 2 and config.vocab_size == sweep.VOCAB
    if model_type == "gemma3_text":  # one layer of each kind
        assert sorted(set(config.layer_types)) == ["full_attention", "sliding_attention"]


def test_a_bert_causal_entry_is_built_as_a_decoder():
    assert sweep.tiny_config(sweep.Entry("causal-lm", "bert", "BertLMHeadModel")).is_decoder


def test_gpt2_is_classified_as_positions_counting_the_pads():
    record = sweep.audit_entry(sweep.Entry("causal-lm", "gpt2", "GPT2LMHeadModel"))
    assert record["status"] == "audited"
    row = sweep.classify(record)
    assert (row["right"], row["left"], row["left_positions"]) == ("pass", "differs", "pass")
    assert row["cause"] == "positions count the pads (pass position_ids)" and row["kind"] == "decoder"
    assert set(pd.DataFrame(record["rows"])["condition"]) == set(sweep.CONDITIONS)


def test_an_entry_that_cannot_be_built_is_listed_with_its_reason():
    record = sweep.audit_entry(sweep.Entry("causal-lm", "gpt2", "NoSuchModelClass"))
    assert record["status"] == "not built" and "NoSuchModelClass" in record["reason"]
    assert sweep.classify(record)["cause"] == "not built"


def test_an_entry_past_its_time_limit_is_listed(monkeypatch):
    def slow(entry, seed=0):
        while True:
            pass
    monkeypatch.setattr(sweep, "build", slow)
    record = sweep.audit_entry(sweep.Entry("causal-lm", "gpt2", "GPT2LMHeadModel"), timeout=0.2)
    assert record["status"] == "not built" and record["reason"] == "ran past the time limit of 0.2 s"


def test_an_isolated_entry_past_its_time_limit_is_stopped_whatever_it_runs(monkeypatch):
    def stuck(entry, seed=0):
        import time
        time.sleep(60)
    monkeypatch.setattr(sweep, "build", stuck)
    record = sweep.audit_isolated(sweep.Entry("causal-lm", "gpt2", "GPT2LMHeadModel"), timeout=1.0)
    assert record["status"] == "not built" and record["reason"] == "ran past the time limit of 1 s"
    assert record["seconds"] < 10


def test_an_isolated_entry_returns_the_same_record_as_in_process():
    # a multi-threaded op in this process first: a forked child then inherits OpenMP's thread pool without its
    # threads, and hung until the child was made to run on one thread (found by CI)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    torch.randn(512, 512) @ torch.randn(512, 512)
    torch.set_num_threads(threads)
    entry = sweep.Entry("causal-lm", "gpt2", "GPT2LMHeadModel")
    isolated, direct = sweep.audit_isolated(entry), sweep.audit_entry(entry)
    assert sweep.classify(isolated) == sweep.classify(direct)


def test_the_command_writes_three_files_and_resumes_from_its_partial_file(tmp_path):
    out = tmp_path / "sweep.csv"
    stored = {"entry": "causal-lm:llama", "mapping": "causal-lm", "model_type": "llama",
              "class": "LlamaForCausalLM", "status": "not built", "reason": "planted", "size": {}, "rows": [],
              "seconds": 1.0}
    out.with_suffix(".partial.jsonl").write_text(json.dumps(stored) + "\n")
    assert sweep.main(["--only", "gpt2,llama", "--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert set(table["entry"]) == {"causal-lm:gpt2", "causal-lm:llama"}
    assert table.loc[table["entry"] == "causal-lm:llama", "reason"].tolist() == ["planted"]
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["n_entries"] == 2 and record["n_audited"] == 1 and record["libraries"]["transformers"]
    assert {"torch", "python", "commit", "date_utc", "wall_time_s", "device"} <= set(record)
    assert "## Entries not built small" in out.with_suffix(".md").read_text()
    assert not out.with_suffix(".partial.jsonl").exists()


def test_unknown_model_types_are_refused(tmp_path, capsys):
    assert sweep.main(["--only", "no_such_type", "--out", str(tmp_path / "x.csv")]) == 2
    assert "unknown model types: ['no_such_type']" in capsys.readouterr().err


def test_direct_check_agrees_with_the_audit_on_gpt2_and_llama():
    gpt2 = sweep.direct_check(sweep.Entry("causal-lm", "gpt2", "GPT2LMHeadModel"))
    assert gpt2["right"] < 1e-5 and gpt2["left"] < 1e-5  # position ids from the mask on both sides
    bart = sweep.direct_check(sweep.Entry("causal-lm", "bart", "BartForCausalLM"))
    assert bart["right"] < 1e-5 and bart["left"] > 1e-3  # no position_ids: left padding shifts positions
