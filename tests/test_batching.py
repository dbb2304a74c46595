"""attnbook.batching: coverage and determinism of the samplers (hypothesis), padding against hand-computed values and
a plain-Python reference, the bucketing claim on long-tailed lengths, and every error path."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbook.batching import BucketBatchSampler, RandomBatchSampler, pad_to_batch, padding_fraction
from attnbook.masking import lengths_to_mask

SETTINGS = settings(max_examples=50, deadline=None)
LENGTHS = st.lists(st.integers(1, 60), min_size=1, max_size=150)


def _samplers(lengths, batch_size, pool_size, shuffle, drop_last, seed):
    return [
        BucketBatchSampler(lengths, batch_size, pool_size=pool_size, shuffle=shuffle, drop_last=drop_last, seed=seed),
        RandomBatchSampler(lengths, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed),
    ]


def _long_tailed_lengths(n=4000, seed=0):
    """Document lengths like IMDB reviews: lognormal with median ~200 tokens and a long right tail."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * 0.75 + math.log(200)).exp().round().clamp(min=1).long()


# ---------------------------------------------------------------- coverage and length (properties)
@SETTINGS
@given(LENGTHS, st.integers(1, 20), st.integers(1, 6), st.booleans(), st.integers(0, 3), st.integers(0, 100))
def test_each_epoch_covers_every_index_exactly_once(lengths, batch_size, pool_size, shuffle, epoch, seed):
    for sampler in _samplers(lengths, batch_size, pool_size, shuffle, False, seed):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
        assert all(1 <= len(b) <= batch_size and all(type(i) is int for i in b) for b in batches)
        assert len(sampler) == len(batches)


@SETTINGS
@given(LENGTHS, st.integers(1, 20), st.integers(1, 6), st.booleans(), st.integers(0, 100))
def test_drop_last_yields_only_full_batches_without_duplicates(lengths, batch_size, pool_size, shuffle, seed):
    bucket, random = _samplers(lengths, batch_size, pool_size, shuffle, True, seed)
    n_pools = math.ceil(len(lengths) / (batch_size * pool_size))
    for sampler, bound in ((bucket, batch_size * n_pools), (random, batch_size)):
        batches = list(sampler)
        seen = [i for b in batches for i in b]
        assert len(seen) == len(set(seen))
        assert all(len(b) == batch_size for b in batches)
        assert len(lengths) - len(seen) < bound
        assert len(sampler) == len(batches)
    # Pools are whole multiples of batch_size, so bucketing also drops fewer than batch_size examples.
    assert len(lengths) - sum(len(b) for b in bucket) < batch_size


@SETTINGS
@given(LENGTHS, st.integers(1, 20), st.integers(1, 6), st.integers(0, 100))
def test_bucket_batches_are_sorted_and_one_pool_gives_the_chunks_of_the_sorted_lengths(
        lengths, batch_size, pool_size, seed):
    for batch in BucketBatchSampler(lengths, batch_size, pool_size=pool_size, seed=seed):
        assert [lengths[i] for i in batch] == sorted(lengths[i] for i in batch)
    # With one pool covering the dataset, the batches (as length lists) are the chunks of sorted(lengths).
    one_pool = BucketBatchSampler(lengths, batch_size, pool_size=len(lengths), seed=seed)
    got = sorted([lengths[i] for i in b] for b in one_pool)
    ordered = sorted(lengths)
    assert got == sorted(ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size))


def test_without_shuffle_bucketing_is_one_stable_sort_and_random_is_in_order():
    lengths = [3, 1, 2, 1, 3, 2, 1]
    reference = sorted(range(len(lengths)), key=lengths.__getitem__)  # Python's sort is stable
    bucket = list(BucketBatchSampler(lengths, 3, pool_size=1, shuffle=False))
    assert bucket == [reference[0:3], reference[3:6], reference[6:]] == [[1, 3, 6], [2, 5, 0], [4]]
    assert list(RandomBatchSampler(7, 3, shuffle=False)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(BucketBatchSampler(lengths, 3, shuffle=False, drop_last=True)) == [[1, 3, 6], [2, 5, 0]]


def test_samplers_accept_lists_numpy_and_tensors_and_copy_them():
    lengths = np.array([5, 2, 9, 1, 4], dtype=np.int32)
    expected = list(BucketBatchSampler(lengths.tolist(), 2, seed=3))
    sampler = BucketBatchSampler(lengths, 2, seed=3)
    lengths[:] = 1  # must not leak into the sampler
    assert list(sampler) == expected == list(BucketBatchSampler(torch.tensor([5, 2, 9, 1, 4]), 2, seed=3))
    assert list(RandomBatchSampler(lengths, 2, seed=3)) == list(RandomBatchSampler(5, 2, seed=3))


def test_bucket_sampler_works_as_a_dataloader_batch_sampler():
    lengths = [4, 1, 3, 2, 5, 1]
    sampler = BucketBatchSampler(lengths, 2, shuffle=False)
    loader = torch.utils.data.DataLoader(lengths, batch_sampler=sampler)
    assert [b.tolist() for b in loader] == [[1, 1], [2, 3], [4, 5]]


# ---------------------------------------------------------------- determinism and set_epoch
@pytest.mark.parametrize("make", [
    lambda seed: BucketBatchSampler(_long_tailed_lengths(500), 8, pool_size=4, seed=seed),
    lambda seed: RandomBatchSampler(500, 8, seed=seed),
], ids=["bucket", "random"])
def test_same_seed_and_epoch_give_the_same_batches_and_set_epoch_changes_them(make):
    sampler = make(7)
    first = list(sampler)
    assert list(sampler) == first  # iterating twice without set_epoch
    assert list(make(7)) == first
    assert list(make(8)) != first
    sampler.set_epoch(1)
    second = list(sampler)
    assert second != first and list(sampler) == second
    sampler.set_epoch(0)
    assert list(sampler) == first


# ---------------------------------------------------------------- the bucketing claim
def test_bucketing_keeps_padding_small_on_long_tailed_lengths():
    lengths = _long_tailed_lengths()
    assert 180 <= float(lengths.median()) <= 220

    def fractions(lengths):
        bucket = list(BucketBatchSampler(lengths, 32, pool_size=50, seed=0))
        random = list(RandomBatchSampler(lengths, 32, seed=0))
        return padding_fraction(lengths, bucket), padding_fraction(lengths, random), bucket

    # Untruncated, the last (longest) batch of each pool spans the tail, e.g. 993..4335 tokens, and dominates the
    # pad count: bucketing still cuts padding by a factor > 3 (0.21 against 0.76 here), not to near zero.
    bucket_pad, random_pad, bucket = fractions(lengths)
    assert random_pad > 0.6 and bucket_pad < random_pad / 3
    spreads = torch.tensor([float(lengths[b].max() - lengths[b].min()) for b in bucket])
    assert float(spreads.median()) < 0.1 * float(lengths.median())  # a typical batch is nearly uniform
    # Truncated to 512 tokens (as a model's max_len does), the tail is gone and padding nearly vanishes.
    bucket_pad, random_pad, _ = fractions(lengths.clamp(max=512))
    assert random_pad > 0.5 and bucket_pad < 0.05


# ---------------------------------------------------------------- padding_fraction
def test_padding_fraction_hand_computed():
    assert padding_fraction([1, 2, 3, 4], [[0, 3], [1, 2]]) == pytest.approx(1 - 10 / 14)
    assert padding_fraction(torch.tensor([1, 2, 3, 4]), [[3, 0], [], [2, 1]]) == pytest.approx(1 - 10 / 14)
    assert padding_fraction([5, 5, 5], [[0, 1, 2]]) == 0.0


@SETTINGS
@given(st.lists(st.integers(1, 40), min_size=1, max_size=60), st.integers(1, 9))
def test_padding_fraction_equals_pad_count_of_pad_to_batch(lengths, batch_size):
    n = len(lengths)
    ids = torch.zeros(n, max(lengths), dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, :length] = torch.arange(1, length + 1)
    batches = list(RandomBatchSampler(n, batch_size, seed=n))
    pads = slots = 0
    for batch in batches:
        padded, _ = pad_to_batch(ids, torch.tensor(lengths), batch)
        pads, slots = pads + int((padded == 0).sum()), slots + padded.numel()
    assert padding_fraction(lengths, batches) == pytest.approx(pads / slots)


# ---------------------------------------------------------------- pad_to_batch
IDS = torch.tensor([[5, 6, 7, 0], [8, 0, 0, 0], [9, 10, 0, 0], [11, 12, 13, 14]])
LENS = torch.tensor([3, 1, 2, 4])


def test_pad_to_batch_post_trims_to_the_batch_and_matches_lengths_to_mask():
    ids, lengths = pad_to_batch(IDS, LENS, [2, 1, 0])
    assert torch.equal(ids, torch.tensor([[9, 10, 0], [8, 0, 0], [5, 6, 7]]))
    assert torch.equal(lengths, torch.tensor([2, 1, 3])) and lengths.dtype == torch.long
    mask = lengths_to_mask(lengths, ids.shape[1])
    assert torch.equal(mask, ids != 0)
    assert pad_to_batch(IDS, LENS, [1])[0].tolist() == [[8]]


def test_pad_to_batch_pre_puts_tokens_at_the_end():
    ids, lengths = pad_to_batch(IDS, LENS, torch.tensor([2, 1, 0]), side="pre")
    assert torch.equal(ids, torch.tensor([[0, 9, 10], [0, 0, 8], [5, 6, 7]]))
    assert torch.equal(lengths, torch.tensor([2, 1, 3]))
    assert torch.equal(lengths_to_mask(lengths, 3).flip(-1), ids != 0)  # valid = the last L_i positions


@pytest.mark.parametrize("side", ["post", "pre"])
def test_pad_to_batch_ignores_what_the_storage_holds_in_pads(side):
    garbage = torch.where(lengths_to_mask(LENS, 4), IDS, torch.tensor(99))
    for batch in ([0, 1, 2, 3], [1, 2], [3]):
        clean, dirty = pad_to_batch(IDS, LENS, batch, side=side)[0], pad_to_batch(garbage, LENS, batch, side=side)[0]
        assert torch.equal(dirty, clean)


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("cls", [BucketBatchSampler, RandomBatchSampler])
def test_batch_size_below_one_raises(cls):
    with pytest.raises(ValueError, match=r"batch_size must be >= 1, got 0"):
        cls([1, 2, 3], 0)


def test_pool_size_below_one_raises():
    with pytest.raises(ValueError, match=r"pool_size must be >= 1, got 0"):
        BucketBatchSampler([1, 2, 3], 2, pool_size=0)


@pytest.mark.parametrize("cls", [BucketBatchSampler, RandomBatchSampler])
def test_empty_lengths_raise(cls):
    with pytest.raises(ValueError, match=r"lengths must not be empty"):
        cls([], 2)


@pytest.mark.parametrize("cls", [BucketBatchSampler, RandomBatchSampler])
def test_two_dimensional_lengths_raise(cls):
    with pytest.raises(ValueError, match=r"one-dimensional \(n,\), got shape \(2, 2\)"):
        cls([[1, 2], [3, 4]], 2)


@pytest.mark.parametrize("cls", [BucketBatchSampler, RandomBatchSampler])
def test_length_below_one_raises(cls):
    with pytest.raises(ValueError, match=r"every length must be >= 1, got min\(lengths\) = 0 at index 2"):
        cls([3, 1, 0, 2], 2)


@pytest.mark.parametrize("cls", [BucketBatchSampler, RandomBatchSampler])
def test_float_lengths_raise(cls):
    with pytest.raises(TypeError, match=r"integer dtype, got torch.float32"):
        cls(torch.tensor([1.0, 2.0]), 2)


def test_random_sampler_with_n_below_one_raises():
    with pytest.raises(ValueError, match=r"n must be >= 1, got 0"):
        RandomBatchSampler(0, 2)


@pytest.mark.parametrize("index", [4, -1])
def test_padding_fraction_index_out_of_range_raises(index):
    with pytest.raises(ValueError, match=rf"index {index} is out of range for 4 lengths"):
        padding_fraction([1, 2, 3, 4], [[0, 1], [index]])


def test_padding_fraction_without_examples_raises():
    with pytest.raises(ValueError, match=r"batches hold no examples"):
        padding_fraction([1, 2], [[], []])


def test_pad_to_batch_unknown_side_raises():
    with pytest.raises(ValueError, match=r"side must be 'post' or 'pre', got 'left'"):
        pad_to_batch(IDS, LENS, [0], side="left")


def test_pad_to_batch_shape_mismatch_raises():
    with pytest.raises(ValueError, match=r"got ids \(4, 4\) and lengths \(3,\)"):
        pad_to_batch(IDS, LENS[:3], [0])
    with pytest.raises(ValueError, match=r"got ids \(4,\) and lengths \(4,\)"):
        pad_to_batch(IDS[0], LENS, [0])


def test_pad_to_batch_length_beyond_storage_raises():
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, max_len=4\], got min 1 and max 5"):
        pad_to_batch(IDS, torch.tensor([3, 1, 2, 5]), [0])


def test_pad_to_batch_empty_batch_raises():
    with pytest.raises(ValueError, match=r"batch must not be empty"):
        pad_to_batch(IDS, LENS, [])


@pytest.mark.parametrize("index", [4, -1])
def test_pad_to_batch_index_out_of_range_raises(index):
    with pytest.raises(ValueError, match=rf"index {index} is out of range for 4 rows"):
        pad_to_batch(IDS, LENS, [0, index])


# ---------------------------------------------------------------- no silent coercion of indices (issue 18)
@pytest.mark.parametrize("batch, message", [
    ([True, False], r"batch must hold int indices, got bools \[True, False\]"),
    ([True, 2], r"batch must hold int indices, got bools \[True, 2\]"),
    (torch.tensor([True, False, True, False]), r"batch must have an integer dtype, got torch.bool"),
    (np.array([True, False]), r"batch must have an integer dtype, got torch.bool"),
    ([0.0, 1.7], r"batch must have an integer dtype, got torch.float32 \(\[0.0, 1.7"),
])
def test_pad_to_batch_refuses_bool_and_float_indices(batch, message):
    """[True, False] was read as the row indices [1, 0], and [0.0, 1.7] as [0, 1]."""
    with pytest.raises(TypeError, match=message):
        pad_to_batch(IDS, LENS, batch)


def test_pad_to_batch_refuses_float_lengths_and_non_tensors():
    with pytest.raises(TypeError, match=r"lengths must have an integer dtype, got torch.float32"):
        pad_to_batch(IDS, LENS.float() + 0.5, [0, 1])
    with pytest.raises(TypeError, match="ids must be a torch.Tensor, got list"):
        pad_to_batch(IDS.tolist(), LENS, [0, 1])
    with pytest.raises(TypeError, match="lengths must be a torch.Tensor, got list"):
        pad_to_batch(IDS, LENS.tolist(), [0, 1])


def test_padding_fraction_refuses_bool_and_float_batches():
    with pytest.raises(TypeError, match=r"batches must hold int indices, got bools \[True, False\]"):
        padding_fraction([1, 2, 3, 4], [[0, 1], [True, False]])
    with pytest.raises(TypeError, match=r"batches must have an integer dtype, got torch.float32"):
        padding_fraction([1, 2, 3, 4], [[0.0, 2.9]])
