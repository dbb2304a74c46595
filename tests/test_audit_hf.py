"""attnbook.audit.hf.audit_hf: the padding audit of transformers models, built from tiny configs with random
weights (offline), checked against direct computations with the model (chapter 10, "Padding bugs in the wild")."""

import os
import warnings
from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")
os.environ["HF_HUB_OFFLINE"] = "1"

from attnbook.audit.hf import NO_PAD_TOKEN, audit_hf, model_kind, positions_from_mask  # noqa: E402

SMALL = dict(lengths=(5, 2, 8, 1), modes=("no_grad",))


def tiny_roberta():
    torch.manual_seed(0)
    config = transformers.RobertaConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=37, max_position_embeddings=40)
    return transformers.RobertaModel(config, add_pooling_layer=False)


def tiny_gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=60, n_embd=32, n_layer=2, n_head=4, n_positions=40)
    return transformers.GPT2LMHeadModel(config)


def checks(report):
    return {str(c): bool(g.all()) for c, g in report.checks.groupby("check", sort=False)["passed"]}


@pytest.mark.parametrize("side", ["right", "left"])
def test_roberta_passes_with_its_pad_id_one_and_positions_from_the_mask(side):
    model = tiny_roberta()
    assert model.config.pad_token_id == 1
    report = audit_hf(model, padding_side=side, position_ids="from_mask")
    assert report.passed, str(report)
    assert report.settings["pad_id"] == 1 and report.settings["output"] == "token"
    assert report.settings["kind"] == "encoder" and report.settings["position_ids"] == "from_mask"
    assert set(report.checks["mode"]) == {"grad", "no_grad", "inference_mode"}


def test_roberta_left_padding_without_positions_reads_its_pad_ids():
    """RoBERTa counts positions from the tokens that are not the pad id, so its own positions survive left padding
    while the pads hold the pad id, and move when other ids fill the pads."""
    report = audit_hf(tiny_roberta(), padding_side="left", position_ids="none", **SMALL)
    assert checks(report) == {"batch_equivalence": True, "extra_padding": True, "pad_content": False,
                              "empty_row": True}


def test_gpt2_left_padding_fails_without_position_ids_and_passes_with_them():
    model = tiny_gpt2()
    with pytest.warns(UserWarning, match="pad_token_id is None"):
        bad = audit_hf(model, padding_side="left", position_ids="none", **SMALL)
    assert not bad.passed and {"batch_equivalence", "causal_left_padding"} <= set(bad.failed)
    good = audit_hf(model, padding_side="left", position_ids="from_mask", pad_id=0, **SMALL)
    assert good.passed, str(good)
    assert good.settings["kind"] == "decoder" and good.settings["causal"]
    assert "causal_left_padding" in set(good.checks["check"])


def test_gpt2_verdicts_agree_with_a_direct_comparison():
    """Independent of the audit: the last token's logits of a left-padded row, with and without positions counted
    from the mask, against the row run alone."""
    model = tiny_gpt2().eval()
    ids = torch.tensor([[7, 8, 9]])
    padded = torch.tensor([[0, 0, 7, 8, 9]])
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    with torch.no_grad():
        alone = model(ids).logits[0, -1]
        plain = model(padded, attention_mask=mask).logits[0, -1]
        positioned = model(padded, attention_mask=mask, position_ids=positions_from_mask(mask)).logits[0, -1]
    assert torch.allclose(positioned, alone, atol=1e-5)
    assert not torch.allclose(plain, alone, atol=1e-3)


def test_a_missing_pad_token_id_warns_and_pads_with_zero_unless_pad_id_is_passed():
    model = tiny_gpt2()
    with pytest.warns(UserWarning) as caught:
        report = audit_hf(model, **SMALL)
    assert str(caught[0].message) == NO_PAD_TOKEN and report.settings["pad_id"] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert audit_hf(model, pad_id=5, **SMALL).settings["pad_id"] == 5


def test_t5_passes_on_both_sides_and_bart_fails_left_padding_its_positions_cannot_follow():
    torch.manual_seed(0)
    t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=60, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4))
    for side in ("right", "left"):
        report = audit_hf(t5, padding_side=side, **SMALL)
        assert report.passed, str(report)
        assert report.settings["kind"] == "encoder-decoder" and report.settings["output"] == "sequence"
        assert report.settings["position_ids"] == "not taken"
    bart = transformers.BartModel(transformers.BartConfig(
        vocab_size=60, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=40))
    assert audit_hf(bart, padding_side="right", **SMALL).passed
    assert "batch_equivalence" in audit_hf(bart, padding_side="left", **SMALL).failed


def test_the_model_kind_and_its_training_mode_are_kept():
    model = tiny_gpt2().train()
    audit_hf(model, pad_id=0, **SMALL)
    assert model.training
    assert model_kind(model) == "decoder" and model_kind(tiny_roberta()) == "encoder"


def test_positions_from_mask_count_from_the_first_real_token():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    expected = torch.tensor([[0, 0, 0, 1, 2], [0, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
    assert torch.equal(positions_from_mask(mask), expected)


def test_bad_arguments():
    with pytest.raises(TypeError, match="model must be a transformers PreTrainedModel"):
        audit_hf(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"position_ids must be one of \['from_mask', 'none'\], got 'arange'"):
        audit_hf(tiny_roberta(), position_ids="arange")
    with pytest.raises(TypeError, match="audit_hf builds the forward itself"):
        audit_hf(tiny_roberta(), forward=lambda i, m: i.float())
    bare = torch.nn.Embedding(4, 2)
    bare.config = SimpleNamespace(model_type="bare", pad_token_id=0)
    with pytest.raises(ValueError, match=r"model.config \(SimpleNamespace\) has no vocab_size; pass vocab_size"):
        audit_hf(bare)


def test_a_vocab_size_above_the_embedding_is_named():
    with pytest.raises(ValueError, match="lower vocab_size"):
        audit_hf(tiny_roberta(), vocab_size=200, **SMALL)
