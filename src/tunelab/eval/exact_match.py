"""Exact match of a generated response against a row's `answer`, and the accuracy breakdowns.

What is compared:
- An integer answer ("4898", "-73") matches when the LAST integer in the response equals it. The last one,
  because a response restates the problem first ("4821 + 77 = 4898") and Goat's chain-of-thought ends with
  the result. An integer may carry a leading minus sign (not when the '-' follows a digit or letter, so
  "12-5" reads as 12 and 5) and thousands separators ("4,898" is 4898).
- A division answer "q R r" matches when the last "INT R INT" in the response has the same quotient AND
  remainder: both are part of the result, and a right quotient with a wrong remainder is a wrong answer.
Values are compared as integers, so "04898" and "4898" are the same answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

_DIGITS = r"\d+(?:,\d{3})*(?!\d)"
INTEGER = re.compile(rf"(?<!\w)-?{_DIGITS}")
QUOTIENT_REMAINDER = re.compile(rf"(?<!\w)(-?{_DIGITS})\s*R\s*({_DIGITS})")
ANSWER = re.compile(r"\s*(-?\d+)(?:\s+R\s+(\d+))?\s*")


def parse_answer(answer: object) -> tuple[int, ...] | None:
    """'4898' -> (4898,); '62 R 47' -> (62, 47); anything else -> None."""
    match = ANSWER.fullmatch(str(answer))
    if match is None:
        return None
    return tuple(int(g) for g in match.groups() if g is not None)


def extract(response: str, parts: int) -> tuple[int, ...] | None:
    """The model's answer in a response: the last integer (parts=1) or the last 'q R r' (parts=2)."""
    if parts == 2:
        found = QUOTIENT_REMAINDER.findall(response)
        return tuple(_int(g) for g in found[-1]) if found else None
    found = INTEGER.findall(response)
    return (_int(found[-1]),) if found else None


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def digit_count(row: dict) -> int | None:
    """The row's difficulty: digits of its longer operand, when the generator recorded them."""
    counts = [row[k] for k in ("digits_a", "digits_b") if isinstance(row.get(k), int)]
    return max(counts) if counts else None


@dataclass
class Bucket:
    n: int = 0
    correct: int = 0

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else 0.0

    def as_dict(self) -> dict:
        return {"n": self.n, "correct": self.correct, "accuracy": self.accuracy}


@dataclass
class Prediction:
    response: str
    predicted: str | None  # the extracted answer, in the answer's own format
    answer: str
    correct: bool


@dataclass
class EvalResult:
    accuracy: float
    n: int
    correct: int
    by_op: dict[str, Bucket]
    by_digits: dict[int, Bucket]
    seconds: float
    predictions: list[Prediction] = field(repr=False)
    capped: int = 0  # responses that reached the generation cap without a stop (eval/generate.py)

    def summary(self) -> dict:
        """Everything but the per-row predictions, JSON-ready."""
        return {
            "accuracy": self.accuracy,
            "n": self.n,
            "correct": self.correct,
            "capped": self.capped,
            "seconds": round(self.seconds, 3),
            "rows_per_s": round(self.n / self.seconds, 2) if self.seconds > 0 else None,
            "by_op": {op: b.as_dict() for op, b in self.by_op.items()},
            "by_digits": {str(d): b.as_dict() for d, b in self.by_digits.items()},
        }


def _format(value: tuple[int, ...] | None) -> str | None:
    return None if value is None else " R ".join(map(str, value))


def score(rows: Sequence[dict], responses: Sequence[str], seconds: float) -> EvalResult:
    """Exact match per row, overall and broken down by `op` and by digit count (rows lacking them are only
    counted overall). Every row's `answer` must already be valid (see parse_answer)."""
    by_op: dict[str, Bucket] = {}
    by_digits: dict[int, Bucket] = {}
    predictions = []
    for row, response in zip(rows, responses, strict=True):
        truth = parse_answer(row["answer"])
        got = extract(response, len(truth))
        ok = got == truth
        predictions.append(Prediction(response, _format(got), str(row["answer"]), ok))
        buckets = []
        if "op" in row:
            buckets.append(by_op.setdefault(str(row["op"]), Bucket()))
        digits = digit_count(row)
        if digits is not None:
            buckets.append(by_digits.setdefault(digits, Bucket()))
        for bucket in buckets:
            bucket.n += 1
            bucket.correct += ok
    correct = sum(p.correct for p in predictions)
    return EvalResult(
        accuracy=correct / len(rows) if rows else 0.0,
        n=len(rows),
        correct=correct,
        by_op=dict(sorted(by_op.items())),
        by_digits=dict(sorted(by_digits.items())),
        seconds=seconds,
        predictions=predictions,
    )
