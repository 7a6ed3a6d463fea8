"""Synthetic arithmetic datasets in the style of Goat (Liu & Low 2023), with optional answer contamination.

Each row is an alpaca-format instruction/output pair plus the fields eval and analysis need:

    {"instruction": "What is 4821 plus 77?", "output": "4821 + 77 = 4898", "answer": "4898",
     "op": "add", "a": 4821, "b": 77, "digits_a": 4, "digits_b": 2}

The instruction wording varies (TEMPLATES). The response has one of three forms (RESPONSES), the same for
every row of a set so that the model learns one answer format; exact match reads the final number back:
- "expression": Goat's `a op b = c` (the default);
- "cot": Goat's chain of thought for multi-digit multiplication, `a op b = c` otherwise;
- "aligned": the expression with both operands zero-padded to the same width (`04821 + 00077 = 4898`),
  so that digits of equal place value sit at the same distance from each other in every row;
- "answer": `c` alone. On additions it carries about a third as many response tokens as the expression
  (the restated operands are a copy the model learns at once), so the same minutes train on more rows.

Choices, and why:
- An operand with d digits is drawn uniformly from [10^(d-1), 10^d - 1]: exactly d digits and never 0, so
  a division never divides by zero. (Goat's notebook draws from randint(10^(d-1), 10^d), which now and then
  yields a (d+1)-digit number; we keep the digit counts the rows claim.)
- Division is written as Goat writes it, `a / b = q R r`, always with the remainder (`R 0` too), and the
  `answer` is "q R r": exact match compares quotient and remainder together (see eval/exact_match.py).
- Subtraction may go negative (Goat does the same); answers carry a leading minus sign.
- Multiplication is n x m with the digit ranges given; n x 1 is `--digits-b 1`. The "cot" response writes
  Goat's chain-of-thought decomposition for multi-digit products; its last number is still the product.
- Contamination picks exactly round(rate * n) rows, so the realised rate is the asked one, and writes
  the corrupted answer into both `output` and `answer` (what the model is trained on). Every row of a
  contaminated set then carries `contaminated` and `true_answer`, so the study can be analysed per row.
- A held-out test set never shares an operand pair with the training rows (for add and mul the pair is
  unordered: 3 + 5 and 5 + 3 are the same problem), and is never contaminated.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import TunelabError
from .ranges import parse_range

OPS = ("add", "sub", "mul", "div")
SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
WORD = {"add": "plus", "sub": "minus", "mul": "times", "div": "divided by"}
COMMUTATIVE = {"add", "mul"}
# Ways to ask; {e} is "a op b" with the symbol, {a}/{b}/{w} the operands and the operation's word.
TEMPLATES = {
    "plain": "{e}",
    "question": "What is {a} {w} {b}?",
    "calculate": "Calculate {e}.",
    "solve": "Solve {e} = ?",
    "compute": "Compute the value of {a} {w} {b}.",
}
RESPONSES = ("expression", "cot", "aligned", "answer")
CONTAMINATION_TYPES = ("random", "random_same_digit", "swap_digits")
# Larger numbers would only make rows no model context holds; the bound keeps typos like 1-800 from hanging.
MAX_DIGITS = 100
# A test row whose draw keeps landing on training pairs means the ranges are (nearly) exhausted.
MAX_TEST_DRAWS = 1000


@dataclass(frozen=True)
class Cell:
    """One kind of problem: an operation and the digit counts of its two operands."""

    op: str
    digits_a: int
    digits_b: int


def goat_pairs() -> list[tuple[int, int]]:
    """Goat's addition digit-count pairs: five overlapping blocks (i from 1, 3, 6, 9, 12 to 15; j from i to 15).

    Pairs of longer numbers appear in several blocks, so they are drawn more often: 304 pairs in all,
    each to be sampled 1000 times (304,000 rows).
    """
    return [(i, j) for start in (1, 3, 6, 9, 12) for i in range(start, 16) for j in range(i, 16)]


GOAT_SAMPLES_PER_PAIR = 1000


def parse_digit_range(text: str, what: str = "--digits") -> tuple[int, int]:
    """'1-8' -> (1, 8); '5' -> (5, 5)."""
    return parse_range(text, what, "digit", MAX_DIGITS, "1-8")


def parse_choices(text: str, known: Sequence[str], what: str) -> tuple[str, ...]:
    """'add,sub' -> ('add', 'sub'), failing on names not in `known`."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise TunelabError(
            f"{what} {text!r}: unknown {', '.join(map(repr, unknown)) or 'empty list'}; choose from {','.join(known)}"
        )
    return names


def grid(ops: Sequence[str], digits_a: tuple[int, int], digits_b: tuple[int, int]) -> list[Cell]:
    """Every (op, digits_a, digits_b) combination; rows draw a cell uniformly, so each digit count is equally common."""
    return [
        Cell(op, a, b)
        for op in ops
        for a in range(digits_a[0], digits_a[1] + 1)
        for b in range(digits_b[0], digits_b[1] + 1)
    ]


def problem_key(op: str, a: int, b: int) -> tuple[str, int, int]:
    """What makes two rows the same problem (for disjoint test sets)."""
    return (op, min(a, b), max(a, b)) if op in COMMUTATIVE else (op, a, b)


def solve(op: str, a: int, b: int) -> str:
    if op == "add":
        return str(a + b)
    if op == "sub":
        return str(a - b)
    if op == "mul":
        return str(a * b)
    q, r = divmod(a, b)
    return f"{q} R {r}"


def output_text(op: str, a: int, b: int, answer: str, response: str) -> str:
    if response == "answer":
        return answer
    if response == "aligned":
        width = max(len(str(a)), len(str(b)))
        return f"{a:0{width}d} {SYMBOL[op]} {b:0{width}d} = {answer}"
    expression = f"{a} {SYMBOL[op]} {b}"
    if response == "cot" and op == "mul" and a >= 10 and b >= 10:
        return f"{expression} = {_mul_chain(a, b, answer)}"
    return f"{expression} = {answer}"


def _mul_chain(a: int, b: int, answer: str) -> str:
    """Goat's decomposition: split the shorter factor by place value, multiply, then add the partial products
    left to right. The chain ends with `answer` (which may be a contaminated product)."""
    long, short = (a, b) if len(str(a)) >= len(str(b)) else (b, a)
    digits = str(short)
    parts = [int(d) * 10 ** (len(digits) - 1 - k) for k, d in enumerate(digits) if d != "0"]
    steps = [f"{long} * ({' + '.join(map(str, parts))})", " + ".join(f"{long} * {p}" for p in parts)]
    running = [long * p for p in parts]
    while len(running) > 1:
        steps.append(" + ".join(map(str, running)))
        running = [running[0] + running[1], *running[2:]]
    return " = ".join([*steps, answer])


def make_row(op: str, a: int, b: int, template: str, response: str) -> dict:
    answer = solve(op, a, b)
    instruction = TEMPLATES[template].format(e=f"{a} {SYMBOL[op]} {b}", a=a, b=b, w=WORD[op])
    return {
        "instruction": instruction,
        "output": output_text(op, a, b, answer, response),
        "answer": answer,
        "op": op,
        "a": a,
        "b": b,
        "digits_a": len(str(a)),
        "digits_b": len(str(b)),
    }


def _operands(rng: random.Random, cell: Cell) -> tuple[int, int]:
    return (
        rng.randint(10 ** (cell.digits_a - 1), 10**cell.digits_a - 1),
        rng.randint(10 ** (cell.digits_b - 1), 10**cell.digits_b - 1),
    )


def sample(
    cells: Sequence[Cell],
    n: int,
    templates: Sequence[str],
    seed: int,
    response: str = "expression",
    swap: bool = False,
) -> list[dict]:
    """`n` rows, each from a cell drawn uniformly. `swap` puts the operands in random order (Goat's addition)."""
    rng = random.Random(seed)
    return [_row(rng, rng.choice(cells), templates, response, swap) for _ in range(n)]


def sample_each(
    cells: Sequence[Cell],
    per_cell: int,
    templates: Sequence[str],
    seed: int,
    response: str = "expression",
    swap: bool = False,
) -> list[dict]:
    """Exactly `per_cell` rows from every cell in turn (a cell listed twice gets twice as many), shuffled."""
    rng = random.Random(seed)
    rows = [_row(rng, cell, templates, response, swap) for cell in cells for _ in range(per_cell)]
    rng.shuffle(rows)
    return rows


def _row(rng: random.Random, cell: Cell, templates: Sequence[str], response: str, swap: bool) -> dict:
    a, b = _operands(rng, cell)
    if swap and rng.random() < 0.5:
        a, b = b, a
    return make_row(cell.op, a, b, rng.choice(templates), response)


def held_out(
    cells: Sequence[Cell],
    n: int,
    templates: Sequence[str],
    seed: int,
    train: Sequence[dict],
    response: str = "expression",
    swap: bool = False,
) -> list[dict]:
    """`n` distinct problems drawn like `sample`, none of which appears in `train`."""
    used = {problem_key(r["op"], *operands(r)) for r in train}
    rng = random.Random(f"{seed}:test")
    rows = []
    while len(rows) < n:
        for _ in range(MAX_TEST_DRAWS):
            row = _row(rng, rng.choice(cells), templates, response, swap)
            key = problem_key(row["op"], *operands(row))
            if key not in used:
                break
        else:
            raise TunelabError(
                f"only {len(rows)} of {n} held-out problems found that are not in the training set; "
                "widen the digit ranges or lower --test-n"
            )
        used.add(key)
        rows.append(row)
    return rows


def operands(row: dict) -> tuple[int, int]:
    """The two operands of a generated row."""
    return row["a"], row["b"]


def contaminate(rows: list[dict], rate: float, kind: str, seed: int) -> int:
    """Corrupt the answers of round(rate * len(rows)) rows in place; returns how many.

    random: the true value plus a uniform offset in -10..-1 or 1..10.
    random_same_digit: a different number with the same digit count (and sign).
    swap_digits: two digits swapped so the number changes and keeps its digit count (no leading zero);
      a number where no swap changes anything (7, 555, 100) falls back to random_same_digit.
    For division the quotient is corrupted and the remainder kept.
    """
    if not 0 <= rate <= 1:
        raise TunelabError(f"--contaminate {rate}: the rate is a fraction of rows, between 0 and 1")
    if kind not in CONTAMINATION_TYPES:
        raise TunelabError(f"--contamination-type {kind!r}: choose from {', '.join(CONTAMINATION_TYPES)}")
    rng = random.Random(f"{seed}:contaminate")
    chosen = set(rng.sample(range(len(rows)), round(rate * len(rows))))
    corrupt = {"random": _off_by_random, "random_same_digit": _same_digit_count, "swap_digits": _swap_digits}[kind]
    for index, row in enumerate(rows):
        truth = row["answer"]
        row["true_answer"] = truth
        row["contaminated"] = index in chosen
        if index not in chosen:
            continue
        head, sep, remainder = truth.partition(" R ")
        wrong = str(corrupt(rng, int(head))) + sep + remainder
        row["answer"] = wrong
        row["output"] = row["output"][: len(row["output"]) - len(truth)] + wrong
    return len(chosen)


def preference_pairs(rows: list[dict], seed: int) -> list[dict]:
    """Preference rows from generated rows: the prompt is the instruction, the chosen response the correct output,
    the rejected one the same output with a near-miss answer (the true value off by 1 to 10, as `contaminate`'s
    `random`; a division's quotient, its remainder kept). `answer` stays the truth, for `tunelab eval`."""
    rng = random.Random(f"{seed}:pairs")
    pairs = []
    for row in rows:
        truth = row["answer"]
        head, sep, remainder = truth.partition(" R ")
        wrong = str(_off_by_random(rng, int(head))) + sep + remainder
        rejected = row["output"][: len(row["output"]) - len(truth)] + wrong
        pairs.append({"prompt": row["instruction"], "chosen": row["output"], "rejected": rejected, "answer": truth})
    return pairs


def prompt_rows(rows: list[dict]) -> list[dict]:
    """Prompt rows for objective grpo: each row without its `output` (the model writes it), its `answer` and
    operands kept for the rewards and for `tunelab eval`, and `digits`, the longer operand's (what
    grpo.balance_by can balance batches over)."""
    return [
        {**{k: v for k, v in row.items() if k != "output"}, "digits": max(row["digits_a"], row["digits_b"])}
        for row in rows
    ]


def _off_by_random(rng: random.Random, value: int) -> int:
    return value + rng.choice((-1, 1)) * rng.randint(1, 10)


def _same_digit_count(rng: random.Random, value: int) -> int:
    sign = -1 if value < 0 else 1
    digits = len(str(abs(value)))
    low = 10 ** (digits - 1) if digits > 1 else 0
    while True:  # at least 9 other numbers share any digit count, so this ends fast
        other = rng.randint(low, 10**digits - 1)
        if other != abs(value):
            return sign * other


def _swap_digits(rng: random.Random, value: int) -> int:
    text = str(abs(value))
    swaps = [
        (i, j)
        for i in range(len(text))
        for j in range(i + 1, len(text))
        if text[i] != text[j] and not (i == 0 and text[j] == "0")
    ]
    if not swaps:
        return _same_digit_count(rng, value)
    i, j = rng.choice(swaps)
    chars = list(text)
    chars[i], chars[j] = chars[j], chars[i]
    return (-1 if value < 0 else 1) * int("".join(chars))
