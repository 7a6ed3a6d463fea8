import json
from collections import Counter

import pytest

from tunelab.cli import main
from tunelab.data import arithmetic as ar
from tunelab.errors import TunelabError


def test_goat_pairs_match_the_seed_formula():
    pairs = ar.goat_pairs()
    # The seed notebook's five blocks, written out independently of the implementation.
    expected = Counter((i, j) for start in (1, 3, 6, 9, 12) for i in range(start, 16) for j in range(i, 16))
    assert Counter(pairs) == expected
    assert len(pairs) == 120 + 91 + 55 + 28 + 10 == 304
    # Longer pairs sit in more blocks: (1, 15) once, (12, 12) in all five.
    assert Counter(pairs)[(1, 15)] == 1 and Counter(pairs)[(12, 12)] == 5 and Counter(pairs)[(9, 10)] == 4


@pytest.mark.slow
def test_goat_preset_writes_exactly_304000_rows_with_the_formula_histogram(tmp_path):
    out = tmp_path / "goat.jsonl"
    assert main(["data", "arithmetic", "--preset", "goat", "--out", str(out), "--seed", "7"]) == 0
    rows = [json.loads(line) for line in out.open()]
    assert len(rows) == 304_000
    # Operands are put in random order as Goat did, so the histogram is over the unordered digit pair.
    histogram = Counter((min(r["digits_a"], r["digits_b"]), max(r["digits_a"], r["digits_b"])) for r in rows)
    assert histogram == Counter({pair: 1000 * n for pair, n in Counter(ar.goat_pairs()).items()})
    assert {r["op"] for r in rows} == {"add"}
    swapped = sum(r["digits_a"] > r["digits_b"] for r in rows)
    assert 0.4 < swapped / len(rows) < 0.5  # half of the unequal pairs are swapped
    for r in rows[:2000]:
        a, b = ar.operands(r)
        assert len(str(a)) == r["digits_a"] and len(str(b)) == r["digits_b"]
        assert r["answer"] == str(a + b) and r["output"] == f"{a} + {b} = {a + b}"


def test_rows_are_correct_for_every_op():
    rows = ar.sample(ar.grid(ar.OPS, (1, 6), (1, 4)), 2000, tuple(ar.TEMPLATES), seed=1)
    assert {r["op"] for r in rows} == set(ar.OPS)
    for r in rows:
        a, b = ar.operands(r)
        expected = {"add": a + b, "sub": a - b, "mul": a * b}.get(r["op"])
        if r["op"] == "div":
            q, rem = divmod(a, b)
            assert r["answer"] == f"{q} R {rem}"
        else:
            assert r["answer"] == str(expected)
        assert r["output"] == f"{a} {ar.SYMBOL[r['op']]} {b} = {r['answer']}"
        assert str(a) in r["instruction"] and str(b) in r["instruction"]
        assert 1 <= r["digits_a"] <= 6 and 1 <= r["digits_b"] <= 4
    assert any(r["answer"].startswith("-") for r in rows if r["op"] == "sub")
    assert len({r["instruction"].replace(r["output"].split(" = ")[0], "E") for r in rows}) > 5  # wordings vary


def test_instruction_templates():
    row = ar.make_row("add", 4821, 77, "plain", "expression")
    assert row == {
        "instruction": "4821 + 77",
        "output": "4821 + 77 = 4898",
        "answer": "4898",
        "op": "add",
        "a": 4821,
        "b": 77,
        "digits_a": 4,
        "digits_b": 2,
    }
    assert ar.make_row("add", 4821, 77, "question", "expression")["instruction"] == "What is 4821 plus 77?"
    assert ar.make_row("add", 4821, 77, "calculate", "expression")["instruction"] == "Calculate 4821 + 77."
    assert ar.make_row("div", 4821, 77, "plain", "expression")["answer"] == "62 R 47"
    assert ar.make_row("div", 10, 5, "plain", "expression")["output"] == "10 / 5 = 2 R 0"


def test_answer_only_response_holds_the_result_and_keeps_test_sets_disjoint():
    assert ar.make_row("add", 4821, 77, "plain", "answer")["output"] == "4898"
    assert ar.make_row("div", 4821, 77, "plain", "answer")["output"] == "62 R 47"
    assert ar.make_row("add", 4821, 77, "plain", "aligned")["output"] == "4821 + 0077 = 4898"
    assert ar.make_row("add", 5, 77, "plain", "aligned")["output"] == "05 + 77 = 82"
    cells = ar.grid(("add",), (1, 2), (1, 2))
    train = ar.sample(cells, 3000, ("plain",), 0, "answer")
    test = ar.held_out(cells, 200, ("plain",), 0, train, "answer")
    assert all(r["output"] == r["answer"] == str(r["a"] + r["b"]) for r in train + test)
    seen = {ar.problem_key("add", *ar.operands(r)) for r in train}
    assert not seen & {ar.problem_key("add", *ar.operands(r)) for r in test}
    ar.contaminate(train, 0.5, "random", 0)
    assert all(r["output"] == r["answer"] for r in train)
    assert sum(r["contaminated"] for r in train) == 1500


def test_same_seed_same_rows_other_seed_other_rows():
    cells = ar.grid(("add",), (1, 8), (1, 8))
    assert ar.sample(cells, 50, ("plain",), 3) == ar.sample(cells, 50, ("plain",), 3)
    assert ar.sample(cells, 50, ("plain",), 3) != ar.sample(cells, 50, ("plain",), 4)


def test_multiplication_chain_of_thought_ends_with_the_product():
    assert ar.output_text("mul", 397, 4429, "1758313", "cot") == (
        "397 * 4429 = 4429 * (300 + 90 + 7) = 4429 * 300 + 4429 * 90 + 4429 * 7 "
        "= 1328700 + 398610 + 31003 = 1727310 + 31003 = 1758313"
    )
    assert ar.output_text("mul", 4429, 7, "31003", "cot") == "4429 * 7 = 31003"  # n x 1 stays plain
    rows = ar.sample(ar.grid(("mul",), (2, 5), (2, 5)), 200, ("plain",), 0, "cot")
    for r in rows:
        a, b = ar.operands(r)
        assert r["output"].endswith(f" = {a * b}")
        assert r["output"].count(" = ") >= 2


@pytest.mark.parametrize("kind", ar.CONTAMINATION_TYPES)
def test_contamination_corrupts_exactly_the_rate_and_records_the_truth(kind):
    rows = ar.sample(ar.grid(("add", "sub", "div"), (1, 6), (1, 6)), 1000, ("plain",), 5)
    clean = [dict(r) for r in rows]
    assert ar.contaminate(rows, 0.25, kind, seed=5) == 250
    assert sum(r["contaminated"] for r in rows) == 250
    for before, r in zip(clean, rows):
        assert r["true_answer"] == before["answer"]
        if not r["contaminated"]:
            assert r["answer"] == before["answer"] and r["output"] == before["output"]
            continue
        assert r["answer"] != before["answer"]
        assert r["output"] == before["output"][: -len(before["answer"])] + r["answer"]  # trained on the lie
        true_head, wrong_head = before["answer"].split(" R ")[0], r["answer"].split(" R ")[0]
        if r["op"] == "div":
            assert r["answer"].split(" R ")[1] == before["answer"].split(" R ")[1]
        delta = int(wrong_head) - int(true_head)
        if kind == "random":
            assert 1 <= abs(delta) <= 10
        else:
            assert len(wrong_head.lstrip("-")) == len(true_head.lstrip("-"))
            assert wrong_head.startswith("-") == true_head.startswith("-")
        if kind == "swap_digits" and len(set(true_head.lstrip("-"))) > 1 and not _only_zero_swaps(true_head):
            assert sorted(wrong_head) == sorted(true_head)  # same digits, two of them swapped
            assert sum(x != y for x, y in zip(wrong_head, true_head)) == 2


def _only_zero_swaps(text: str) -> bool:
    digits = text.lstrip("-")
    return all(
        digits[i] == digits[j] or (i == 0 and digits[j] == "0")
        for i in range(len(digits))
        for j in range(i + 1, len(digits))
    )


def test_swap_digits_fallback_still_changes_numbers_with_no_useful_swap():
    import random

    rng = random.Random(0)
    for value in (7, 0, 555, 100, -3, 9000):
        for _ in range(50):
            wrong = ar._swap_digits(rng, value)
            assert wrong != value and len(str(abs(wrong))) == len(str(abs(value)))
    assert sorted(str(ar._swap_digits(rng, 4821))) == sorted("4821")


def test_contamination_rejects_a_bad_rate():
    with pytest.raises(TunelabError, match="between 0 and 1"):
        ar.contaminate([], 1.5, "random", 0)


def test_held_out_set_shares_no_problem_with_training(tmp_path):
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    # 2-digit add and mul: small enough (8100 ordered pairs) that a careless sampler would collide.
    args = [
        "data",
        "arithmetic",
        "--ops",
        "add,mul,sub",
        "--digits",
        "1-2",
        "--n",
        "3000",
        "--seed",
        "3",
        "--out",
        str(train),
        "--test-out",
        str(test),
        "--test-n",
        "500",
        "--contaminate",
        "0.1",
    ]
    assert main(args) == 0
    train_rows = [json.loads(line) for line in train.open()]
    test_rows = [json.loads(line) for line in test.open()]
    assert len(train_rows) == 3000 and len(test_rows) == 500

    def key(r):
        a, b = ar.operands(r)
        return (r["op"], *sorted((a, b))) if r["op"] != "sub" else (r["op"], a, b)

    train_keys = {key(r) for r in train_rows}
    test_keys = [key(r) for r in test_rows]
    assert not train_keys & set(test_keys)
    assert len(set(test_keys)) == len(test_keys)
    assert all("contaminated" not in r for r in test_rows)  # the held-out truth is never corrupted
    assert sum(r["contaminated"] for r in train_rows) == 300


def test_held_out_set_fails_clearly_when_the_ranges_are_exhausted(tmp_path):
    with pytest.raises(TunelabError, match="widen the digit ranges or lower --test-n"):
        ar.held_out(
            ar.grid(("add",), (1, 1), (1, 1)),
            10,
            ("plain",),
            0,
            ar.sample(ar.grid(("add",), (1, 1), (1, 1)), 2000, ("plain",), 0),
        )


def test_per_operand_digit_ranges(tmp_path):
    out = tmp_path / "mul.jsonl"
    assert (
        main(
            [
                "data",
                "arithmetic",
                "--ops",
                "mul",
                "--digits-a",
                "3-5",
                "--digits-b",
                "1",
                "--n",
                "300",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in out.open()]
    assert {r["digits_b"] for r in rows} == {1}
    assert {r["digits_a"] for r in rows} == {3, 4, 5}


@pytest.mark.parametrize("text, expected", [("1-8", (1, 8)), ("5", (5, 5)), ("3-3", (3, 3))])
def test_parse_digit_range(text, expected):
    assert ar.parse_digit_range(text) == expected


@pytest.mark.parametrize("text", ["0-3", "8-1", "a-b", "", "1-", "1-101"])
def test_parse_digit_range_rejects(text):
    with pytest.raises(TunelabError, match="--digits"):
        ar.parse_digit_range(text)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ops", "add,pow"], "unknown 'pow'"),
        (["--digits", "0-4"], "1 <= low <= high"),
        (["--digits-b", "9-2"], "--digits-b"),
        (["--templates", "plain,poem"], "unknown 'poem'"),
        (["--preset", "goat", "--n", "10"], "drop --n"),
        (["--preset", "goat", "--ops", "sub"], "drop --ops"),
        (["--n", "0"], "at least one row"),
        (["--contaminate", "2"], "between 0 and 1"),
    ],
)
def test_bad_input_is_one_line_error_and_writes_nothing(tmp_path, capsys, args, message):
    out = tmp_path / "rows.jsonl"
    assert main(["data", "arithmetic", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
