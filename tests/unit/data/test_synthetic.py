"""`tunelab data synthetic`: alpaca rows whose SmolLM2 token lengths follow a distribution within a range."""

import json
import math
import statistics

import pytest

from tunelab import sources
from tunelab.cli import main
from tunelab.data import synthetic as sy
from tunelab.errors import TunelabError

PROMPT, RESPONSE = (20, 120), (5, 60)


@pytest.fixture(scope="module")
def tokenizer():

    return sources.load_tokenizer(sources.resolve(sources.EMBEDDED))


@pytest.mark.parametrize("dist", sy.DISTS)
def test_lengths_stay_in_range_and_average_the_distributions_mean(tokenizer, dist):
    """The sample mean is within 4 standard errors of the distribution's mean (a 1-in-15,000 miss by chance)."""
    rows = sy.generate(1500, PROMPT, RESPONSE, dist, 0, tokenizer)
    for field, (lo, hi) in (("instruction", PROMPT), ("output", RESPONSE)):
        lengths = sy.token_lengths(tokenizer, [r[field] for r in rows])
        assert lo <= min(lengths) and max(lengths) <= hi
        tolerance = 4 * statistics.stdev(lengths) / math.sqrt(len(lengths))
        assert abs(statistics.mean(lengths) - sy.expected_mean(dist, lo, hi)) < tolerance
    assert {r["input"] for r in rows} == {""}


def test_lognormal_is_right_skewed(tokenizer):
    lengths = sy.token_lengths(
        tokenizer, [r["instruction"] for r in sy.generate(800, PROMPT, RESPONSE, "lognormal", 0, tokenizer)]
    )
    assert statistics.median(lengths) < statistics.mean(lengths) < sum(PROMPT) / 2


def test_a_single_length_is_exact(tokenizer):
    rows = sy.generate(50, (1, 1), (37, 37), "lognormal", 3, tokenizer)
    assert set(sy.token_lengths(tokenizer, [r["instruction"] for r in rows])) == {1}
    assert set(sy.token_lengths(tokenizer, [r["output"] for r in rows])) == {37}


def test_the_seed_decides_the_rows(tokenizer):
    first, again, other = (sy.generate(30, PROMPT, RESPONSE, "triangular", seed, tokenizer) for seed in (1, 1, 2))
    assert first == again and first != other


def test_command_writes_alpaca_jsonl(tmp_path, capsys):
    out = tmp_path / "syn.jsonl"
    args = [
        "data",
        "synthetic",
        "--rows",
        "40",
        "--prompt-tokens",
        "10-30",
        "--response-tokens",
        "5-9",
        "--dist",
        "lognormal",
        "--seed",
        "4",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 40 and set(rows[0]) == {"instruction", "input", "output"}
    assert "wrote 40 rows" in capsys.readouterr().out
    first = out.read_text()
    assert main(args) == 0 and out.read_text() == first


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompt-tokens", "30-10"], "--prompt-tokens '30-10': need 1 <= low <= high"),
        (["--response-tokens", "0-5"], "--response-tokens '0-5': need 1 <= low <= high"),
        (["--response-tokens", "ten"], "expected a token count or a range"),
        (["--rows", "0"], "--rows 0: need at least one row"),
        (["--dist", "uniform"], "--dist 'uniform': choose from triangular, lognormal"),
        (["--out", "/proc/nope/syn.jsonl"], "--out /proc/nope/syn.jsonl: cannot write there"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, args, message):
    out = tmp_path / "syn.jsonl"
    base = {"--rows": "5", "--prompt-tokens": "10-20", "--response-tokens": "5-10", "--out": str(out)}
    base.update(zip(args[::2], args[1::2]))
    code = main(["data", "synthetic", *[x for pair in base.items() for x in pair]])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_parse_range_reads_a_single_count():
    assert sy.parse_range("128", "--prompt-tokens") == (128, 128)
    with pytest.raises(TunelabError, match="131,072"):
        sy.parse_range("1-200000", "--prompt-tokens")


def test_pairs_are_preference_rows_that_load_as_pairs(tmp_path, tokenizer, capsys):
    """`--pairs`: {prompt, chosen, rejected} at the drawn lengths, read by the DPO data path as pairs."""
    from tunelab.data import pairs
    from tunelab.data.pipeline import DataSpec

    out = tmp_path / "pairs.jsonl"
    args = ["data", "synthetic", "--pairs", "--rows", "12", "--prompt-tokens", "4-9", "--response-tokens", "3-20"]
    assert main([*args, "--out", str(out)]) == 0
    assert "wrote 12 pairs" in capsys.readouterr().out
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 12 and all(set(r) == {"prompt", "chosen", "rejected"} for r in rows)
    for field, (lo, hi) in (("prompt", (4, 9)), ("chosen", (3, 20)), ("rejected", (3, 20))):
        lengths = sy.token_lengths(tokenizer, [r[field] for r in rows])
        assert lo <= min(lengths) and max(lengths) <= hi
    assert any(r["chosen"] != r["rejected"] for r in rows)
    spec = DataSpec(
        str(out), "alpaca", "compact", train_on_inputs=False, seq_len=128, builder="data.pairs:prepare_pairs"
    )
    data = pairs.prepare_pairs(spec, tokenizer)
    assert len(data) == 24 and data.stats.dropped == 0  # chosen and rejected of every pair
