"""train/rewards.py: the built-in rewards, user functions from a file with TRL's signature, and the one-line errors
for a missing file or function, an exception, a wrong count, NaN."""

from __future__ import annotations

import math

import pytest

from tunelab.errors import TunelabError
from tunelab.train import rewards

ROWS = [{"answer": "579"}, {"answer": "579"}, {"answer": "12 R 3"}]
TEXTS = ["123 + 456 = 579", "123 + 456 = 578", "75 / 6 = 12 R 3"]
IDS = [[1] * 5, [1] * 2, [1] * 9]


def score(*loaded, rows=ROWS, texts=TEXTS):
    return rewards.score(loaded, ["p"] * len(texts), texts, IDS[: len(texts)], rows, [1, 1, 2][: len(texts)])


def test_exact_answer_regex_and_length():
    got = score(
        rewards.load("exact_answer"),
        rewards.load("regex", args={"pattern": r"=\s*\d+$"}),
        rewards.load("length", args={"max_tokens": 4}),
    )
    assert got[:, 0].tolist() == [1.0, 0.0, 1.0]
    assert got[:, 1].tolist() == [1.0, 1.0, 0.0]
    assert got[:, 2].tolist() == [-0.25, 0.0, -1.25]


def test_answer_digits_gives_partial_credit_from_the_units():
    rows = [{"answer": "12345"}] * 6 + [{"answer": "12 R 3"}, {"answer": "-40"}, {"answer": "n/a"}]
    texts = [
        "12000 + 345 = 12345",  # exact: 1, as exact_answer
        "12000 + 345 = 12355",  # one carry wrong: 4 of 5
        "12000 + 345 = 2345",  # a digit dropped: 4 of the longer 5
        "12000 + 345 = 112345",  # a digit added: 5 of the longer 6
        "12000 + 345 = 54321",  # reversed: only the middle digit
        "no number",
        "75 / 6 = 12 R 4",  # quotient right, remainder wrong: half
        "= 40",  # wrong sign
        "= 7",  # the row's answer is not a number: does not apply
    ]
    got = rewards.score(
        [rewards.load("answer_digits"), rewards.load("exact_answer")],
        ["p"] * len(texts),
        texts,
        [[1]] * len(texts),
        rows,
        list(range(1, len(texts) + 1)),
    )
    assert got[:8, 0].tolist() == pytest.approx([1.0, 0.8, 0.8, 5 / 6, 0.2, 0.0, 0.5, 0.0])
    assert math.isnan(got[8, 0])
    # Full credit exactly where the exact answer is right.
    assert ((got[:8, 0] == 1.0) == (got[:8, 1] == 1.0)).all()


def test_none_is_nan_and_user_function_gets_row_fields(tmp_path):
    file = tmp_path / "my_rewards.py"
    file.write_text(
        "def sure(prompts, completions, answer, **kw):\n"
        "    return [None if a.endswith('3') else float(len(c) > 10) for c, a in zip(completions, answer)]\n"
    )
    got = score(rewards.load(f"{file}:sure", weight=2.0))
    assert got[0, 0] == 1.0 and got[1, 0] == 1.0 and math.isnan(got[2, 0])


@pytest.mark.parametrize(
    "body,message",
    [
        (
            "    raise KeyError('x')",
            r"reward bad: raised KeyError: 'x' \(on completion 0 of the batch, of data row 1\)",
        ),
        # Raised on the batch: the completion it raises on alone, and its data row.
        (
            "    if any(c.endswith('R 3') for c in completions): raise ValueError('no remainders')\n"
            "    return [1.0] * len(completions)",
            r"raised ValueError: no remainders \(on completion 2 of the batch, of data row 2\)",
        ),
        ("    return [1.0]", r"reward bad: returned 1 values for 3 completions \(of data rows 1, 2\)"),
        ("    return [1.0, float('nan'), 0.0]", "reward bad: returned nan for a completion of data row 1"),
        ("    return [1.0, 'yes', 0.0]", "reward bad: returned 'yes'"),
    ],
)
def test_bad_function_is_one_line_naming_it(tmp_path, body, message):
    file = tmp_path / "r.py"
    file.write_text(f"def bad(prompts, completions, **kw):\n{body}\n")
    with pytest.raises(TunelabError, match=message) as e:
        score(rewards.load(f"{file}:bad"))
    assert "\n" not in str(e.value)


def test_missing_file_or_function(tmp_path):
    with pytest.raises(TunelabError, match="reward file .*nope.py not found"):
        rewards.load(f"{tmp_path}/nope.py:f")
    (tmp_path / "r.py").write_text("x = 1\n")
    with pytest.raises(TunelabError, match="has no function 'f'"):
        rewards.load(f"{tmp_path}/r.py:f")
    with pytest.raises(TunelabError, match="neither a built-in"):
        rewards.load("exact")
