"""data/pairs.py: pairs as two examples each (chosen at 2i), in text and message forms; cutting and errors."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import write_jsonl

from tunelab.data import arithmetic
from tunelab.data.examples import IGNORE
from tunelab.data.pipeline import DataSpec, prepare
from tunelab.errors import TunelabError


def spec(path, fmt="completion", seq_len=128) -> DataSpec:
    return DataSpec(str(path), fmt, "compact", False, seq_len, builder="data.pairs:prepare_pairs")


def decoded(tokenizer, data, i) -> tuple[str, str]:
    """(the whole sequence, the tokens with a target) of example i."""
    s, e = data.offsets[i], data.offsets[i + 1]
    ids, targets = data.ids[s:e], data.targets[s:e]
    return tokenizer.decode(ids), tokenizer.decode(targets[targets != IGNORE])


def test_text_and_ultrafeedback_message_layouts(tokenizer, tmp_path):
    text = [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}, {"prompt": "2+2=", "chosen": "4", "rejected": "5"}]
    data = prepare(spec(write_jsonl(tmp_path / "p.jsonl", text)), tokenizer)
    assert len(data) == 4 and list(data.rows) == [0, 0, 1, 1]
    assert decoded(tokenizer, data, 0) == ("1+1=2</s>", "2</s>")
    assert decoded(tokenizer, data, 3)[1] == "5</s>"
    messages = [
        {
            "prompt": "Hi",  # binarized UltraFeedback: each side is the whole conversation
            "chosen": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
            "rejected": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Go away"}],
        }
    ]
    data = prepare(spec(write_jsonl(tmp_path / "m.jsonl", messages)), tokenizer)
    whole, trained = decoded(tokenizer, data, 0)
    assert whole.startswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert trained.startswith("Hello") and "Hi" not in trained
    assert decoded(tokenizer, data, 1)[1].startswith("Go away")


def test_a_pair_cut_empty_is_dropped_and_none_left_is_an_error(tokenizer, tmp_path):
    rows = [{"prompt": "x" * 40, "chosen": "a", "rejected": "b"}, {"prompt": "1+1=", "chosen": "2", "rejected": "3"}]
    data = prepare(spec(write_jsonl(tmp_path / "p.jsonl", rows), seq_len=64), tokenizer)  # 32 tokens a side
    assert (len(data), data.stats.dropped, data.stats.rows) == (2, 1, 2)
    with pytest.raises(TunelabError, match=r"no pair keeps a response token .* raise seq_len"):
        prepare(spec(write_jsonl(tmp_path / "q.jsonl", rows[:1]), seq_len=64), tokenizer)


def test_arithmetic_pairs_are_a_near_miss():
    rows = arithmetic.sample(arithmetic.grid(["add"], (1, 3), (1, 3)), 50, ("plain",), 0, "expression")
    pairs = arithmetic.preference_pairs(rows, seed=0)
    for row, pair in zip(rows, pairs):
        assert pair["chosen"] == row["output"] and pair["answer"] == row["answer"]
        wrong = pair["rejected"].rsplit(" ", 1)[1]
        assert 1 <= abs(int(wrong) - int(row["answer"])) <= 10
        assert pair["rejected"].rsplit(" ", 1)[0] == row["output"].rsplit(" ", 1)[0]
    assert np.mean([p["prompt"] == r["instruction"] for p, r in zip(pairs, rows)]) == 1.0
