"""Held-out evaluation data: eval.split's examples are drawn by the seed, disjoint from training, formatted as
training examples are; eval.path reads a file of its own."""

import numpy as np
import pytest
from conftest import write_jsonl

from tunelab.data.pipeline import DataSpec, HeldOutSpec, prepare, prepare_split
from tunelab.errors import TunelabError


def spec(path):
    return DataSpec(str(path), "alpaca", "compact", False, 64)


def example(data, i):
    start, end = data.offsets[i], data.offsets[i + 1]
    return data.ids[start:end].tolist(), data.targets[start:end].tolist()


@pytest.fixture
def data_file(tmp_path, addition_rows):
    return write_jsonl(tmp_path / "add.jsonl", addition_rows)


def test_split_is_disjoint_complete_and_seeded(data_file, tokenizer):
    whole = prepare(spec(data_file), tokenizer)
    train, held = prepare_split(spec(data_file), HeldOutSpec(fraction=0.25, seed=7), tokenizer)
    assert len(held) == 16 and len(train) == 48  # round(0.25 x 64)
    assert not set(train.rows.tolist()) & set(held.rows.tolist())
    assert sorted(train.rows.tolist() + held.rows.tolist()) == list(range(64))
    assert train.stats.rows + held.stats.rows == whole.stats.rows
    assert train.stats.tokens_loss + held.stats.tokens_loss == whole.stats.tokens_loss
    assert train.stats.tokens_nonpad + held.stats.tokens_nonpad == whole.stats.tokens_nonpad
    # Each side's example is the whole file's example of the same row: same template, masking, truncation.
    for part in (train, held):
        for i, row in enumerate(part.rows):
            assert example(part, i) == example(whole, int(row))
    _, again = prepare_split(spec(data_file), HeldOutSpec(fraction=0.25, seed=7), tokenizer)
    _, other = prepare_split(spec(data_file), HeldOutSpec(fraction=0.25, seed=8), tokenizer)
    assert np.array_equal(again.rows, held.rows)
    assert not np.array_equal(other.rows, held.rows)


def test_max_rows_caps_evaluation_not_the_holdout(data_file, tokenizer):
    train, held = prepare_split(spec(data_file), HeldOutSpec(fraction=0.25, max_rows=5, seed=7), tokenizer)
    _, uncapped = prepare_split(spec(data_file), HeldOutSpec(fraction=0.25, seed=7), tokenizer)
    assert len(train) == 48 and len(held) == 5
    assert held.rows.tolist() == uncapped.rows[:5].tolist()


def test_eval_path_is_its_own_file(data_file, tmp_path, tokenizer):
    other = write_jsonl(tmp_path / "eval.jsonl", [{"instruction": "1 + 1", "output": "1 + 1 = 2"}] * 3)
    train, held = prepare_split(spec(data_file), HeldOutSpec(path=str(other), max_rows=2), tokenizer)
    assert len(train) == 64 and len(held) == 2
    assert example(held, 0) == example(prepare(spec(other), tokenizer), 0)


def test_a_split_that_leaves_a_side_empty_fails(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "one.jsonl", [{"instruction": "1 + 1", "output": "2"}])
    with pytest.raises(TunelabError, match=r"one.jsonl: eval.split 0.5 of 1 examples holds out 0"):
        prepare_split(spec(path), HeldOutSpec(fraction=0.5), tokenizer)
