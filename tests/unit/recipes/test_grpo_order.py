"""recipes/grpo.py's prompt order: a fresh permutation per epoch, and with grpo.balance_by every generation batch
holds each stratum in proportion to its share of the prompts."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from tunelab.data.prompts import PromptData
from tunelab.errors import TunelabError
from tunelab.recipes import grpo


def test_an_epoch_visits_every_prompt_once_and_the_next_epoch_reorders():
    first = [i for g in range(5) for i in grpo.prompt_order(40, 8, g, seed=3)]
    second = [i for g in range(5, 10) for i in grpo.prompt_order(40, 8, g, seed=3)]
    assert sorted(first) == list(range(40)) and sorted(second) == list(range(40))
    assert first != second


def test_balanced_batches_hold_each_stratum_in_proportion():
    # 60 prompts: 30 of "a", 20 of "b", 10 of "c"; batches of 6 hold 3, 2 and 1.
    strata = ["a"] * 30 + ["b"] * 20 + ["c"] * 10
    strata = [strata[i] for i in np.random.default_rng(0).permutation(60)]
    batches = [grpo.prompt_order(60, 6, g, seed=1, strata=strata) for g in range(10)]
    assert sorted(i for b in batches for i in b) == list(range(60))
    for b in batches:
        counts = Counter(strata[i] for i in b)
        assert abs(counts["a"] - 3) <= 1 and abs(counts["b"] - 2) <= 1 and counts["c"] <= 2, counts
    # A random draw of the same sizes misses that: some batch is off by 2 or more.
    drawn = [grpo.prompt_order(60, 6, g, seed=1) for g in range(10)]
    assert any(abs(Counter(strata[i] for i in b)["a"] - 3) >= 2 for b in drawn)


def test_balanced_order_repeats_for_a_seed_and_differs_between_seeds():
    strata = [i % 4 for i in range(32)]
    assert grpo.prompt_order(32, 8, 2, 5, strata) == grpo.prompt_order(32, 8, 2, 5, strata)
    assert grpo.prompt_order(32, 8, 2, 5, strata) != grpo.prompt_order(32, 8, 2, 6, strata)


def prompts(rows):
    return PromptData(ids=[[1]] * len(rows), texts=["p"] * len(rows), rows=rows, rows_read=len(rows), dropped=0)


def test_balance_values_reads_the_field_and_names_a_row_without_it():
    assert grpo.balance_values(prompts([{"digits": 3}, {"digits": 5}]), "digits", "p.jsonl") == [3, 5]
    assert grpo.balance_values(prompts([{"digits": 3}]), None, "p.jsonl") is None
    with pytest.raises(TunelabError, match=r"p.jsonl: prompt 2 has no 'digits' to balance by \(grpo.balance_by\)"):
        grpo.balance_values(prompts([{"digits": 3}, {"answer": "7"}]), "digits", "p.jsonl")
    with pytest.raises(TunelabError, match="prompt 1 has no 'digits'"):
        grpo.balance_values(prompts([{"digits": [3]}]), "digits", "p.jsonl")
