"""End-to-end test of ``benchmarks/bench_packing.py`` at tiny sizes (Rotten Tomatoes sentences, a tiny encoder, one
step and one round): the three files it writes, their columns, and the numbers that do not depend on the clock."""

import importlib.util
import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from attnbook.batching import document_offsets
from attnbook.experiments import packing as ex

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_packing", ROOT / "benchmarks" / "bench_packing.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def written(bench, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench_packing.md"
    table = bench.main(["--quick", "--steps", "1", "--rounds", "1", "--attention-steps", "1", "--n-train", "64",
                        "--out", str(out)])
    return out, table


def test_writes_three_files_with_the_columns(bench, written):
    out, table = written
    csv = pd.read_csv(out.with_suffix(".csv"))
    assert list(csv.columns) == bench.COLUMNS
    assert list(csv["layout"]) == ["padded/random", "padded/bucketed", "packed", "packed/nested"]
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["threads"] == 1 and record["steps"] == 1 and record["rounds"] == 1 and record["quick"] is True
    assert [row["layout"] for row in record["table"]] == list(csv["layout"])
    assert len(record["step_times_s"]["packed"]) == 1 and "nested_step" in record
    text = out.read_text()
    assert "| layout" in text and "## Notes" in text and "## Provenance" in text
    assert any(line.startswith("- Packing is faster") or line.startswith("- Packing is slower")
               for line in text.splitlines())


def test_numbers_that_do_not_depend_on_the_clock(written):
    _, table = written
    row = table.set_index("layout")
    assert row.loc["padded/random", "ratio"] == 1.0 and row.loc["padded/random", "attn_ratio"] == 1.0
    assert row.loc["packed/nested", "pad_fraction"] == 0.0 and row.loc["packed/nested", "score_fraction"] == 1.0
    assert math.isnan(row.loc["packed/nested", "tokens_per_s"])            # only the attention op is in the rounds
    # packing the same reviews leaves fewer pads than padding them to the batch's longest review
    assert row.loc["packed", "pad_fraction"] < row.loc["padded/random", "pad_fraction"]
    assert row.loc["packed", "real_tokens_per_step"] == row.loc["padded/random", "real_tokens_per_step"]
    assert row.loc["packed", "rows_per_step"] < row.loc["padded/random", "rows_per_step"]
    assert (table["tokens_per_s"].dropna() > 0).all() and (table["attn_ms"] > 0).all()
    # the layouts compute the same logits for the same reviews (no review sees another or a pad)
    assert row.loc["packed", "max_abs_logit_diff"] < 1e-5 and row.loc["packed/nested", "max_abs_logit_diff"] < 1e-5


def test_nested_forward_matches_forward_packed_and_torch_sdpa_per_review(bench):
    """The nested layout against two references: the model's own packed forward, and each review alone."""
    cfg = bench.quick_config()
    torch.manual_seed(0)
    model = ex._build(cfg, 50, ex._MODEL).eval()
    lengths = torch.tensor([5, 12, 3, 30, 7])
    ids = torch.zeros(5, cfg.max_len, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(1, 50, (int(n),))
    part = {"ids": ids.numpy(), "lengths": lengths.numpy(), "labels": lengths.numpy() % 2}
    batch = ex._packed_batch(part, list(range(5)), cfg.max_len)
    real = batch.doc_ids >= 0
    with torch.no_grad():
        nested = bench.nested_forward(model, batch.ids[real], batch.positions[real], document_offsets(batch.doc_ids)[0])
        packed = model.forward_packed(batch.ids, batch.doc_ids)[0]
        alone = torch.cat([model(ids[i: i + 1, :n], n[None])[0] for i, n in zip(batch.order.tolist(),
                                                                                 lengths[batch.order])])
    torch.testing.assert_close(nested, packed, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(nested, alone, atol=1e-5, rtol=1e-5)


def test_nested_forward_refuses_another_model(bench):
    cfg = bench.quick_config()
    model = ex._build(cfg, 50, {**ex._MODEL, "readout": "first"})
    with pytest.raises(ValueError, match="readout='first'"):
        bench.nested_forward(model, torch.tensor([1, 2]), torch.tensor([0, 1]), torch.tensor([0, 2]))


def test_steps_larger_than_an_epoch_are_refused(bench):
    cfg = bench.quick_config()
    train = {"ids": torch.ones(10, cfg.max_len, dtype=torch.int32).numpy(), "lengths": torch.full((10,), 3).numpy(),
             "labels": torch.zeros(10, dtype=torch.long).numpy()}
    with pytest.raises(ValueError, match=r"steps must be at most the batches of an epoch \(1\), got 2"):
        bench.make_steps(train, cfg, 2)


@pytest.mark.parametrize("flag", ["--steps", "--rounds", "--attention-steps"])
def test_command_line_refuses_a_count_below_one(bench, flag, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--quick", flag, "0"])
    assert f"{flag} must be >= 1, got 0" in capsys.readouterr().err
