"""The batch plan's data-parallel split (train/batches.Schedule with rank/world), without processes."""

import numpy as np
import pytest
import torch
from conftest import make_tiny_llama, write_jsonl

from tunelab.config import BatchConfig
from tunelab.data.pipeline import DataSpec, prepare
from tunelab.train.batches import BatchSpec, EvalBatches, Schedule, shard
from tunelab.train.loop import forward
from tunelab.train.loss import CausalLMLoss


@pytest.fixture
def data(tokenizer, tmp_path, addition_rows):
    # 59 examples = 7 unpacked micro-batches of 8 rows and one of 3: rank 1 of 2 (rows 4-7) gets none of it.
    path = write_jsonl(tmp_path / "a.jsonl", addition_rows[:59])
    return prepare(DataSpec(str(path), "alpaca", "compact", False, 64), tokenizer)


@pytest.mark.parametrize("packing", [True, False])
def test_ranks_split_the_steps_of_one_process_with_world_times_the_micro_batch(data, tokenizer, packing):
    one = Schedule(
        data,
        BatchSpec(BatchConfig(seq_len=64, micro_batch=8, grad_accum=2, packing=packing), 0, tokenizer.pad_token_id),
        1.0,
        None,
    )
    ranks = [
        Schedule(
            data,
            BatchSpec(BatchConfig(seq_len=64, micro_batch=4, grad_accum=2, packing=packing), 0, tokenizer.pad_token_id),
            1.0,
            None,
            r,
            2,
        )
        for r in (0, 1)
    ]
    assert all(s.total_steps == one.total_steps for s in ranks)
    for step in range(one.total_steps):
        joined = [a + b for a, b in zip(ranks[0].step_rows(step), ranks[1].step_rows(step))]
        assert joined == one.step_rows(step)
        assert ranks[0].step_tokens(step) == ranks[1].step_tokens(step)
        assert ranks[0].step_loss_tokens(step) == sum(b.tokens_loss for b in one.step_batches(step))
        assert sum(b.tokens_loss for r in ranks for b in r.step_batches(step)) == ranks[0].step_loss_tokens(step)
        # Same number of passes on every rank, whatever its share holds.
        assert len(ranks[0].step_batches(step)) == len(ranks[1].step_batches(step))


def test_an_empty_share_runs_a_pass_that_adds_nothing(data, tokenizer):
    last = Schedule(
        data,
        BatchSpec(BatchConfig(seq_len=64, micro_batch=4, grad_accum=2, packing=False), 0, tokenizer.pad_token_id),
        1.0,
        None,
        1,
        2,
    )
    [(step, at)] = [(s, i) for s in range(last.total_steps) for i, rows in enumerate(last.step_rows(s)) if not rows]
    empty = last.step_batches(step)[at]
    assert (empty.tokens_loss, empty.tokens_padded, empty.tokens_nonpad) == (0, 0, 0)
    model = CausalLMLoss(make_tiny_llama(len(tokenizer)))
    loss = forward(model, empty, torch.device("cpu"))
    loss.backward()
    assert loss.item() == 0.0
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def test_evaluation_shards_cover_every_batch_once(data, tokenizer):
    spec = BatchSpec(BatchConfig(seq_len=64, micro_batch=4, grad_accum=1, packing=True), 0, tokenizer.pad_token_id)
    whole = EvalBatches(data, spec)
    parts = [list(EvalBatches(data, spec, 0, r, 3)) for r in range(3)]
    assert len({len(p) for p in parts}) == 1
    assert sum(b.tokens_loss for p in parts for b in p) == sum(b.tokens_loss for b in whole)
    assert shard([1, 2, 3, 4], 1, 3) == [2, None] and shard([1, 2, 3, 4], 0, 3) == [1, 4]
    assert np.array_equal(parts[0][0].input_ids, next(iter(whole)).input_ids)
