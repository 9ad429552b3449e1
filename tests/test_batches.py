"""The data module: non-overlapping windows, seeded epoch orders, bounds, the three file forms."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from gptcore.data.batches import BatchLoader, StepPlan, epoch_order, open_examples, unigram_loss
from gptcore.data.tokenfile import TokenFileManifest, write_manifest
from gptcore.errors import DataError


def _bin(path: Path, tokens: np.ndarray) -> Path:
    tokens.astype("<u2").tofile(path)
    return path


def test_examples_are_non_overlapping_windows_of_block_plus_one(tmp_path: Path) -> None:
    tokens = np.arange(100, dtype=np.uint16)
    examples = open_examples(_bin(tmp_path / "t.bin", tokens), block_size=9, vocab_size=300)
    assert examples.count == 10  # 100 // (9 + 1)
    window = examples.gather(np.array([0, 3]))
    assert window.dtype is torch.int64 and window.shape == (2, 10)
    assert window[0].tolist() == list(range(10)) and window[1].tolist() == list(range(30, 40))


def test_limits_bound_the_example_count(tmp_path: Path) -> None:
    path = _bin(tmp_path / "t.bin", np.arange(100, dtype=np.uint16))
    assert open_examples(path, 9, 300, limit=4).count == 4
    assert open_examples(path, 9, 300, limit=1000).count == 10


def test_token_ids_at_or_past_the_vocabulary_are_refused(tmp_path: Path) -> None:
    path = _bin(tmp_path / "t.bin", np.array([1, 2, 300, 4] * 10, dtype=np.uint16))
    with pytest.raises(DataError, match="token id 300 is outside the model's vocabulary"):
        open_examples(path, 4, 300)


def test_a_stream_shorter_than_one_example_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="hold no example"):
        open_examples(_bin(tmp_path / "t.bin", np.arange(5, dtype=np.uint16)), 8, 300)


def test_pt_tensors_and_project_files_with_manifest_are_read(tmp_path: Path) -> None:
    tokens = np.arange(60, dtype=np.int64) % 280
    torch.save(torch.from_numpy(tokens), tmp_path / "t.pt")
    from_pt = open_examples(tmp_path / "t.pt", 5, 300)
    project = tmp_path / "train.bin"
    tokens.astype("<u4").tofile(project)
    write_manifest(project, TokenFileManifest("uint32", 60, 1, 300, "tok", "corpus", "train", "sha"))
    from_project = open_examples(project, 5, 300)
    assert from_pt.count == from_project.count == 10
    assert torch.equal(from_pt.gather(np.arange(10)), from_project.gather(np.arange(10)))


def test_a_manifest_with_a_larger_vocabulary_is_refused(tmp_path: Path) -> None:
    project = _bin(tmp_path / "train.bin", np.arange(60, dtype=np.uint16))
    write_manifest(project, TokenFileManifest("uint16", 60, 1, 500, "tok", "corpus", "train", "sha"))
    with pytest.raises(DataError, match="exceeds the model's vocab_size 300"):
        open_examples(project, 5, 300)


def test_epoch_orders_are_seeded_permutations_that_differ_between_epochs() -> None:
    first = epoch_order(50, seed=7, epoch=0)
    assert sorted(first.tolist()) == list(range(50))
    assert np.array_equal(first, epoch_order(50, seed=7, epoch=0))
    assert not np.array_equal(first, epoch_order(50, seed=7, epoch=1))
    assert not np.array_equal(first, epoch_order(50, seed=8, epoch=0))


def test_a_step_takes_the_next_global_batch_and_ranks_share_it_disjointly() -> None:
    order = epoch_order(40, seed=1, epoch=0)
    single = StepPlan(batch_size=2, grad_accum_steps=2)
    assert single.steps_per_epoch(40) == 10
    step3 = np.concatenate(single.micro_batches(order, 3))
    assert np.array_equal(step3, order[12:16])
    ranks = [StepPlan(1, 2, world_size=2, rank=r) for r in (0, 1)]
    union = np.concatenate([np.concatenate(plan.micro_batches(order, 3)) for plan in ranks])
    assert np.array_equal(np.sort(union), np.sort(order[12:16]))


def test_worker_threads_deliver_the_same_batches_in_order(tmp_path: Path) -> None:
    examples = open_examples(_bin(tmp_path / "t.bin", np.arange(2000, dtype=np.uint16) % 300), 9, 300)
    plan = [np.array([i, (i * 7) % examples.count]) for i in range(examples.count)]
    plain = list(BatchLoader(examples, "cpu", False, 0).batches(iter(plan)))
    threaded_loader = BatchLoader(examples, "cpu", False, 2)
    threaded = list(threaded_loader.batches(iter(plan)))
    threaded_loader.close()
    assert len(plain) == len(threaded) == examples.count
    for (x, y), (tx, ty) in zip(plain, threaded, strict=True):
        assert torch.equal(x, tx) and torch.equal(y, ty)
        assert x.shape == (2, 9) and torch.equal(x[:, 1:], y[:, :-1])


def test_unigram_loss_is_the_cross_entropy_of_training_frequencies(tmp_path: Path) -> None:
    # Targets are tokens 1..3 of each 4-token window: training targets all 5, validation targets all 5.
    train = open_examples(_bin(tmp_path / "a.bin", np.array([9, 5, 5, 5] * 4, dtype=np.uint16)), 3, 300)
    validation = open_examples(_bin(tmp_path / "b.bin", np.array([9, 5, 5, 5], dtype=np.uint16)), 3, 300)
    expected = -math.log((12 + 1) / (12 + 300))  # add-one smoothing over the vocabulary
    assert unigram_loss(train, validation, 300) == pytest.approx(expected)
