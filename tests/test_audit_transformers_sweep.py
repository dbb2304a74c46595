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
    assert record["triage"] == []  # a whole run triages its flagged entries too (here none is flagged)
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


# --- classification at its edges, on planted records (no model) ---------------------------------------------------

def _record(fail=None, *, positions="from_mask", missing=(), raised=()):
    """A planted record: every condition and check passes except ``fail`` ({(condition, check): (rel, detail)})."""
    fail = fail or {}
    rows = []
    for condition in sweep.CONDITIONS:
        if condition in missing:
            continue
        if condition in raised:
            rows.append({"condition": condition, "kind": "", "position_ids": positions, "dtype": "",
                         "check": "forward", "mode": "no_grad", "passed": False, "max_abs_diff": float("nan"),
                         "max_rel_diff": float("nan"), "detail": "RuntimeError: boom"})
            continue
        for check in (*sweep.PADDING_CHECKS, "empty_row"):
            rel, detail = fail.get((condition, check), (0.0, ""))
            rows.append({"condition": condition, "kind": "decoder", "dtype": "float32",
                         "position_ids": positions if condition == "left_positions" else "none",
                         "check": check, "mode": "no_grad", "passed": (condition, check) not in fail,
                         "max_abs_diff": rel, "max_rel_diff": rel, "detail": detail})
    return {"entry": "causal-lm:planted", "mapping": "causal-lm", "model_type": "planted", "class": "Planted",
            "status": "audited", "reason": "", "rows": rows}


def test_only_an_entry_whose_every_condition_ran_and_passed_counts_as_passed():
    assert sweep.classify(_record())["cause"] == "none"
    assert sweep.classify(_record())["half"] == "pass"
    # one condition missing, or raising, is never a pass
    assert sweep.classify(_record(missing=("bf16",)))["cause"] == "unclassified"
    assert sweep.classify(_record(raised=("bf16",)))["cause"] == "half precision: fails"


def test_an_entry_whose_forward_raised_in_every_condition_is_not_a_pass():
    row = sweep.classify(_record(raised=tuple(sweep.CONDITIONS)))
    assert row["cause"] == "forward raised an error" and row["right"] == "error"
    assert row["half"] == "fp16, bf16" and "right: forward" in row["failed"]
    # a padding check whose forward raised (the Funnel case) is an error as well
    funnel = _record({(c, "batch_equivalence"): (float("nan"), "forward raised RuntimeError: index 4")
                      for c in sweep.CONDITIONS})
    assert sweep.classify(funnel)["cause"] == "forward raised an error"
    # a failure under right padding is flagged whatever another condition raised (the masked-LM Reformer case)
    reformer = _record({("right", "extra_padding"): (1e-3, "x")}, raised=("left_positions",))
    assert sweep.classify(reformer)["cause"] == "flagged: right padding"
    assert sweep.classify(_record(raised=("left_positions",)))["cause"] == "forward raised an error"


def test_half_precision_failures_get_their_own_causes_at_the_dtype_tolerance():
    fp16_tol = 8 * torch.finfo(torch.float16).eps  # 7.8e-3
    within = sweep.classify(_record({("fp16", "batch_equivalence"): (fp16_tol, "rows 0 differ")}))
    assert within["cause"] == "half precision: within its rounding" and within["half"] == "fp16"
    beyond = sweep.classify(_record({("fp16", "batch_equivalence"): (fp16_tol * 1.01, "rows 0 differ")}))
    assert beyond["cause"] == "half precision: fails"
    nan = sweep.classify(_record({("bf16", "extra_padding"): (float("nan"), "rows 0: NaN or infinite outputs")}))
    assert nan["cause"] == "half precision: fails" and nan["bf16"] == "NaN"
    # an fp32 cause comes first; the half-precision failure stays visible in ``half``
    both = sweep.classify(_record({("left", "batch_equivalence"): (1.0, "x"),
                                   ("fp16", "batch_equivalence"): (1.0, "x")}))
    assert both["cause"] == "positions count the pads (pass position_ids)" and both["half"] == "fp16"


def test_left_padding_causes_are_told_apart_by_the_failing_checks():
    left = ("left", "batch_equivalence"), ("left", "extra_padding")
    no_positions = {**{k: (1.0, "x") for k in left}, **{("left_positions", c): (1.0, "x") for c in
                                                       ("batch_equivalence", "extra_padding")}}
    assert sweep.classify(_record(no_positions, positions="not taken"))["cause"] == \
        "positions cannot follow left padding"
    rwkv = {**no_positions, ("left", "pad_content"): (1.0, "x")}
    assert sweep.classify(_record(rwkv, positions="not taken"))["cause"] == \
        "pads reach real tokens under left padding"
    assert sweep.classify(_record({("left", "pad_content"): (1.0, "x")}))["cause"] == "reads the pad ids"
    mobilebert = {("right", "pad_content"): (0.2, "x"), ("left_positions", "pad_content"): (0.1, "x")}
    assert sweep.classify(_record(mobilebert))["cause"] == "reads the pad ids"
    assert sweep.classify(_record({("right", "extra_padding"): (1e-3, "x")}))["cause"] == \
        "flagged: right padding"
    assert sweep.classify(_record({("left_positions", "batch_equivalence"): (0.4, "x")}))["cause"] == \
        "flagged: left padding with position_ids"


def test_cause_counts_add_up_and_refuse_an_unknown_cause():
    records = [_record(), _record(raised=tuple(sweep.CONDITIONS)),
               _record({("fp16", "batch_equivalence"): (1.0, "x")})]
    table = sweep.summary(records)
    counts = sweep.cause_counts(table)
    main = counts[counts["side"] != ""]
    assert main["entries"].sum() == len(table) and counts.iloc[-1]["entries"] == 2
    assert list(main["side"]) == ["none", "half precision", "not audited"]  # CAUSES order
    with pytest.raises(ValueError, match="CAUSES does not know: \\['unclassified'\\]"):
        sweep.cause_counts(sweep.summary([_record(missing=("fp16",))]))


def test_the_csv_rebuilds_records_that_classify_the_same():
    records = [_record(), _record({("left", "pad_content"): (1.0, "x")}, positions="not taken"),
               {"entry": "masked-lm:x", "mapping": "masked-lm", "model_type": "x", "class": "X",
                "status": "not built", "reason": "planted", "rows": []}]
    records[1]["entry"] = "causal-lm:other"
    long = pd.read_csv(__import__("io").StringIO(sweep.long_table(records).to_csv(index=False)))
    assert sweep.summary(sweep.records_from_table(long)).to_dict("records") == \
        sweep.summary(records).to_dict("records")


def test_triage_counts_as_unexplained_only_what_the_direct_check_reproduces_without_a_note():
    table = pd.DataFrame({"entry": ["causal-lm:a", "causal-lm:b", "masked-lm:fnet", "causal-lm:c", "causal-lm:d"],
                          "model_type": ["a", "b", "fnet", "c", "d"],
                          "cause": ["flagged: right padding",
                                    "flagged: left padding with position_ids",
                                    "flagged: right padding",
                                    "flagged: right padding", "none"],
                          "failed": ["right: pad_content", "left_positions: batch_equivalence",
                                     "right: extra_padding", "right: extra_padding", ""]})
    long = pd.DataFrame({"entry": ["causal-lm:a", "causal-lm:b"], "condition": ["right", "left_positions"],
                         "passed": [False, False], "max_rel_diff": [0.5, 0.2]})
    direct = {"causal-lm:a": {"right": 0.3, "left": 0.0, "attention_mask": True, "position_ids": False},
              "causal-lm:b": {"right": 0.0, "left": sweep.DIRECT_TOLERANCE},  # at the bound: not reproduced
              "masked-lm:fnet": {"right": 1.0, "left": 1.0, "attention_mask": False, "position_ids": True},
              "causal-lm:c": {"right": "RuntimeError", "left": "RuntimeError"}}
    t = sweep.triage(table, long, direct).set_index("entry")
    assert list(t.index) == ["causal-lm:a", "causal-lm:b", "masked-lm:fnet", "causal-lm:c"]
    assert t["unexplained"].tolist() == [True, False, False, False]
    assert t.loc["causal-lm:a", "audit"] == "5.0e-01" and t.loc["causal-lm:a", "direct"] == "3.0e-01"
    assert t.loc["causal-lm:b", "reading"] == "not reproduced directly (passes)"
    assert t.loc["causal-lm:c", "reading"] == "not reproduced directly (the direct call raised)"
    assert t.loc["causal-lm:c", "audit"] == "NaN"
    assert t.loc["masked-lm:fnet", "described in"].startswith("[FNet's usage tips](https://huggingface.co/")
    assert t.loc["masked-lm:fnet", "attention_mask in signature"] == "no"
    assert t.loc["masked-lm:fnet", "basis"] == "documentation" and t.loc["causal-lm:a", "basis"] == "the direct check"
    with pytest.raises(KeyError):
        sweep.triage(table, long, {})


def _triaged(unexplained, readings=None):
    readings = readings or ["unexplained: a candidate upstream bug" if u else "chunked attention by design"
                            for u in unexplained]
    return pd.DataFrame({"entry": [f"causal-lm:m{i}" for i in range(len(unexplained))],
                         "reading": readings, "unexplained": unexplained})


def test_the_headline_counts_only_the_unexplained_entries_at_its_edges():
    table = pd.DataFrame({"cause": ["none"] * 9 + ["not built"]})
    assert sweep.headline(table, _triaged([])) == ("none of the 9 audited entries differs in a way that neither "
                                                   "the documentation nor the design explains.")
    assert sweep.headline(table, _triaged([False, False])).startswith("none of the 9")
    one = sweep.headline(table, _triaged([True, False]))
    assert one.startswith("1 of the 9 audited entries differs") and one.endswith(
        "reproduces it: a candidate upstream bug.")
    three = sweep.headline(table, _triaged([True, True, True]))
    assert three.startswith("3 of the 9 audited entries differ ") and three.endswith("each: candidate upstream bugs.")
    with pytest.raises(ValueError, match="no entry of the sweep was audited"):
        sweep.headline(pd.DataFrame({"cause": ["not built"]}), _triaged([]))


def test_the_triage_sentence_agrees_in_number():
    assert sweep.triage_sentence(_triaged([])) == ""
    assert sweep.triage_sentence(_triaged([True])) == "Of the 1 entry the audit flagged, 1 remains unexplained."
    two = sweep.triage_sentence(_triaged([False, False, True, True]))
    assert two == ("Of the 4 entries the audit flagged, 2 mix positions outside masked attention by design and 2 "
                   "remain unexplained.")
    missed = _triaged([False], ["not reproduced directly (passes)"])
    assert sweep.triage_sentence(missed).endswith("1 is not reproduced by the direct check.")


def test_a_model_that_builds_its_own_mask_is_not_read_as_mixing_positions():
    """CPM-Ant ignores its attention_mask and builds its own from the ids, for left padding: the triage reads it from
    NOTES, and the sentence words it as what it is, not as attention mixing positions by design."""
    reading = sweep.NOTES["cpmant"][0]
    assert "own mask" in reading and "by design" not in reading
    text = sweep.triage_sentence(_triaged([False, False], [reading, "chunked attention by design"]))
    assert text == ("Of the 2 entries the audit flagged, 1 mixes positions outside masked attention by design and 1 "
                    "builds its own mask from the token ids, for left padding.")


def test_the_sweep_table_counts_flagged_entries_by_what_the_triage_read():
    """Every row of the chapter's table is a root cause: the flagged entries are split by their triage reading
    (caller, design, unexplained), and the rows still add up to the audited entries."""
    table = pd.DataFrame({"entry": ["causal-lm:a", "causal-lm:b", "causal-lm:c", "causal-lm:d"],
                          "model_type": ["a", "b", "c", "d"],
                          "cause": ["flagged: right padding", "flagged: right padding",
                                    "flagged: left padding with position_ids", "none"],
                          "half": ["pass"] * 4})
    triaged = _triaged([False, False, True], [sweep.NOTES["cpmant"][0], "chunked attention by design",
                                              "unexplained: a candidate upstream bug, reported upstream"])
    triaged["entry"] = ["causal-lm:a", "causal-lm:b", "causal-lm:c"]
    counts = sweep.cause_counts(table, triaged).set_index("cause")
    assert counts.loc[sweep.READINGS["own mask"][0], "side"] == "design"  # read in its source, not documented
    assert counts.loc[sweep.READINGS["by design"][0], "entries"] == 1
    assert counts.loc[sweep.READINGS["unexplained"][0], "side"] == "library"
    assert counts.drop(index="of these, failed in fp16 or bf16 (any cause)").entries.sum() == 4
    assert not any(c.startswith("differs") for c in counts.index)   # no symptom row left
    with pytest.raises(ValueError, match="without a triage reading"):
        sweep.cause_counts(table, triaged.iloc[:1])
    # without the triage, the flags stay one row each (the chapter's table before the triage ran)
    assert "flagged, triaged below" in set(sweep.cause_counts(table).side)


def test_a_reported_candidate_says_so_and_a_crashed_direct_check_confirms_nothing():
    reported = _triaged([True], ["unexplained: a candidate upstream bug, reported upstream"])
    table = pd.DataFrame({"cause": ["none", "x"]})
    assert sweep.headline(table, reported).endswith("a candidate upstream bug, matching an earlier upstream report.")
    reported["described in"] = "[transformers#24289 (closed)](https://github.com/x)"
    assert sweep.headline(table, reported).endswith("matching an earlier upstream report that is now closed.")
    two = _triaged([True, True], ["unexplained: a candidate upstream bug, reported upstream"] * 2)
    two["described in"] = ["[a (closed)](u)", "[b](v)"]
    assert sweep.headline(table, two).endswith("candidate upstream bugs, matching earlier upstream reports (1 of "
                                               "them now closed).")
    # a model page's design, with a direct check that raised, is unconfirmed: counted apart from "by design"
    raised = "chunked attention by design (the direct check raised RuntimeError, so it confirms nothing)"
    assert sweep._reading_key(raised) == "confirms nothing"
    assert sweep.READINGS["confirms nothing"][1] == "unconfirmed"
    text = sweep.triage_sentence(_triaged([False, False], [raised, "chunked attention by design"]))
    assert text == ("Of the 2 entries the audit flagged, 1 mixes positions outside masked attention by design and 1 "
                    "is unconfirmed (its direct check raised).")
    assert "prophetnet" in sweep.REPORTS and sweep.REPORTS["prophetnet"][1].startswith("https://github.com/")
