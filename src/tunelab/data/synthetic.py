"""Synthetic alpaca rows (or preference pairs) of English words at chosen token lengths, for benchmarks at
realistic lengths.

Each row is `{"instruction": ..., "input": "", "output": ...}`, or with pairs `{"prompt": ..., "chosen": ...,
"rejected": ...}` (two responses of independently drawn lengths; the objective needs them to differ, not to
mean anything). The instruction's and the output's token
counts, by the tokenizer passed in (the command uses the embedded SmolLM2's, which `random:` models use too),
are drawn from a distribution over an inclusive range; the counts are of the field text alone, without the
template around it or the EOS token.

How a text hits its count exactly: the byte-level BPE tokenizer splits text into words (with their leading
space) and punctuation before merging, so a text's token count is the sum of its words' counts. Every word's
count is measured once; words are drawn until the budget is spent, a word that would overshoot it
replaced by a single-token one.
The finished texts are tokenized again and any mismatch fails loudly.

Distributions over [low, high] (a draw is rounded to the nearest integer):
- triangular: peak and mean at the middle of the range;
- lognormal: median at sqrt(low * high) and sigma = ln(high / low) / 4, so the range spans +-2 sigma; draws
  outside it are drawn again. Right-skewed, like the lengths of real prompts and answers.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from ..errors import TunelabError
from . import ranges

DISTS = ("triangular", "lognormal")
# Bounds a typo (1-1000000) before it builds rows no model context holds.
MAX_TOKENS = 131_072
# One sentence-ending period per this many words, on average.
WORDS_PER_SENTENCE = 12
# Common English words plus a few long ones that take several tokens.
WORDS = (
    "the of and to in is was for on that with as by at from it his an were are which this be has had not "
    "but or their its one all new first more after two they also been who have other into time over most "
    "only some would years when can there about made these her than used him out during many world under "
    "while city people between both before such then three through well later school state work found "
    "part called known water house small large great place where government system number history series "
    "family company early music often story power light river market night point order change "
    "public second course figure field model problem result study value answer question simple color "
    "garden window morning evening winter summer mountain forest village bridge letter paper table "
    "animal plant language science reason energy journey season travel follow build write read learn "
    "teach open close begin carry bring hold keep leave turn move show tell ask call try need feel "
    "become seem mean help start play run walk talk grow lose pay meet include continue set understand "
    "watch stop create speak allow offer remember consider appear wait serve die send expect stay fall "
    "cut reach kill remain suggest raise pass sell require report decide pull quickly quietly together "
    "always never sometimes already almost enough however perhaps usually probably certainly "
    "extraordinary infrastructure photosynthesis thermodynamics unbelievable responsibility "
    "characteristically misunderstanding interdisciplinary approximately"
).split()


@dataclass(frozen=True)
class Vocabulary:
    """Each word's token count at the start of a text and after a space; the period's count after a word."""

    words: tuple[str, ...]
    first: tuple[int, ...]
    spaced: tuple[int, ...]
    single: tuple[int, ...]  # indices of words that are one token after a space
    period: int


def vocabulary(tokenizer) -> Vocabulary:
    words = tuple(dict.fromkeys(WORDS))
    first, spaced = token_lengths(tokenizer, list(words)), token_lengths(tokenizer, [" " + w for w in words])
    single = tuple(i for i, n in enumerate(spaced) if n == 1)
    # "word." must split as "word" + "." for counts to add up; the final re-tokenization checks that too.
    period = token_lengths(tokenizer, ["a."])[0] - token_lengths(tokenizer, ["a"])[0]
    if not single or min(first) != 1 or period != 1:
        raise TunelabError(
            "this tokenizer splits common English words into several tokens; synthetic lengths need "
            "a byte-level BPE tokenizer like SmolLM2's"
        )
    return Vocabulary(words, tuple(first), tuple(spaced), single, period)


def parse_range(text: str, what: str) -> tuple[int, int]:
    """'64-512' -> (64, 512); '128' -> (128, 128)."""
    return ranges.parse_range(text, what, "token", MAX_TOKENS, "64-512")


def lognormal_params(lo: int, hi: int) -> tuple[float, float]:
    """(mu, sigma) of the log-length: median at the geometric middle, the range at +-2 sigma."""
    return (math.log(lo) + math.log(hi)) / 2, (math.log(hi) - math.log(lo)) / 4


def draw_length(rng: random.Random, dist: str, lo: int, hi: int) -> int:
    if lo == hi:
        return lo
    if dist == "triangular":
        return min(hi, max(lo, round(rng.triangular(lo, hi))))
    mu, sigma = lognormal_params(lo, hi)
    while True:
        x = round(rng.lognormvariate(mu, sigma))
        if lo <= x <= hi:
            return x


def expected_mean(dist: str, lo: int, hi: int) -> float:
    """The mean length `draw_length` aims at (before rounding)."""
    if dist == "triangular" or lo == hi:
        return (lo + hi) / 2
    mu, sigma = lognormal_params(lo, hi)
    # The mean of a lognormal truncated to mu +- 2 sigma in log space.
    return math.exp(mu + sigma**2 / 2) * (_phi(2 - sigma) - _phi(-2 - sigma)) / (_phi(2) - _phi(-2))


def _phi(z: float) -> float:
    """The standard normal distribution function."""
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def text_of(rng: random.Random, tokens: int, vocab: Vocabulary) -> str:
    """Words (and periods) whose token counts add up to exactly `tokens`."""
    n = len(vocab.words)
    i = rng.randrange(n)
    while vocab.first[i] > tokens:
        i = rng.randrange(n)
    parts, left = [vocab.words[i]], tokens - vocab.first[i]
    while left > 0:
        if left >= vocab.period and rng.random() < 1 / WORDS_PER_SENTENCE and parts[-1] != ".":
            parts.append(".")
            left -= vocab.period
            continue
        i = rng.randrange(n)
        if vocab.spaced[i] > left:
            i = rng.choice(vocab.single)
        parts.append(" " + vocab.words[i])
        left -= vocab.spaced[i]
    return "".join(parts)


def check(n: int, dist: str) -> None:
    if n < 1:
        raise TunelabError(f"--rows {n}: need at least one row")
    if dist not in DISTS:
        raise TunelabError(f"--dist {dist!r}: choose from {', '.join(DISTS)}")


def generate(
    n: int, prompt: tuple[int, int], response: tuple[int, int], dist: str, seed: int, tokenizer, pairs: bool = False
) -> list[dict]:
    """`n` alpaca rows, or with `pairs` `n` preference rows {prompt, chosen, rejected} whose two responses are
    drawn independently from the response range; the same arguments and tokenizer always give the same rows."""
    check(n, dist)
    vocab = vocabulary(tokenizer)
    rng = random.Random(seed)
    fields = ("prompt", "chosen", "rejected") if pairs else ("instruction", "output")
    rows, targets = [], []
    for _ in range(n):
        lengths = [draw_length(rng, dist, *prompt)] + [draw_length(rng, dist, *response) for _ in fields[1:]]
        row = {field: text_of(rng, k, vocab) for field, k in zip(fields, lengths)}
        rows.append(row if pairs else {"instruction": row["instruction"], "input": "", "output": row["output"]})
        targets.extend(lengths)
    measured = token_lengths(tokenizer, [row[field] for row in rows for field in fields])
    if measured != targets:
        bad = next(k for k, (m, t) in enumerate(zip(measured, targets)) if m != t)
        raise RuntimeError(
            f"synthetic row {bad // len(fields)}: {measured[bad]} tokens where {targets[bad]} were built"
        )
    return rows


def token_lengths(tokenizer, texts: list[str]) -> list[int]:
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
