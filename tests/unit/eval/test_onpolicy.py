"""eval/onpolicy.py and `tunelab data pairs`: a model's wrong completions become the rejected side of pairs against
the row's reference response; right ones, repeats and empty ones do not; the sampler is seeded; bad input is one
line."""

from __future__ import annotations

import json

import pytest

from tests.conftest import write_jsonl
from tunelab.cli import main
from tunelab.errors import TunelabError
from tunelab.eval import onpolicy as ep
from tunelab.eval.generate import Generated

ROWS = [
    {"instruction": "12 + 30", "output": "12 + 30 = 42", "answer": "42"},
    {"instruction": "5 + 4", "output": "5 + 4 = 9", "answer": "9"},
    {"instruction": "70 + 8", "output": "70 + 08 = 78", "answer": "78"},
]


def test_wrong_completions_pair_against_the_reference_and_the_rest_are_counted():
    completions = [
        ["12 + 30 = 42", "12 + 30 = 52", "12 + 30 = 52", "12 + 30 = 41"],  # right, wrong, its repeat, wrong
        ["5 + 4 = 9", "5 + 4 = 9", "9", "5+4=9"],  # right every time: no pair
        ["", "70 + 08 = 87", "70 + 08 = 78", "70 + 08 ="],  # empty, wrong, right, wrong (no answer)
    ]
    pairs, counts = ep.build_pairs(ROWS, "alpaca", completions, capped=1)
    assert [(p["prompt"], p["chosen"], p["rejected"], p["answer"]) for p in pairs] == [
        ("12 + 30", "12 + 30 = 42", "12 + 30 = 52", "42"),
        ("12 + 30", "12 + 30 = 42", "12 + 30 = 41", "42"),
        ("70 + 8", "70 + 08 = 78", "70 + 08 = 87", "78"),
        ("70 + 8", "70 + 08 = 78", "70 + 08 =", "78"),
    ]
    assert counts == ep.PairCounts(
        prompts=3, completions=12, right=6, all_right=1, repeats=1, empty=1, capped=1, pairs=4
    )
    assert "1 of 3 prompts answered right every time (skipped)" in counts.line()


def test_pair_prompts_render_as_generation_prompted():
    completion = {"prompt": "Q: 2 + 2\nA:", "completion": " 4", "answer": "4"}
    assert ep.pair_parts("completion", completion, "f row 1") == ("Q: 2 + 2\nA:", " 4")
    chat = {
        "messages": [
            {"role": "system", "content": "Add."},
            {"role": "user", "content": "2 + 2"},
            {"role": "assistant", "content": "4"},
        ],
        "answer": "4",
    }
    prompt, reference = ep.pair_parts("chat", chat, "f row 1")
    assert prompt == chat["messages"][:2] and reference == "4"
    pairs, _ = ep.build_pairs([chat], "chat", [["5"]])
    assert pairs == [{"prompt": chat["messages"][:2], "chosen": "4", "rejected": "5", "answer": "4"}]


@pytest.mark.parametrize(
    "fmt, row, message",
    [
        ("alpaca", {"instruction": "add", "input": "2 2", "output": "4", "answer": "4"}, r"f row 1: .*'input'"),
        ("text", {"text": "2 + 2 = 4", "answer": "4"}, r"--format text: on-policy pairs are made from alpaca"),
        (
            "chat",
            {"messages": [{"role": "user", "content": "2+2"}], "answer": "4"},
            r"f row 1: on-policy pairs need one assistant turn",
        ),
    ],
)
def test_rows_a_pair_cannot_carry_are_one_line_errors(fmt, row, message):
    with pytest.raises(TunelabError, match=message):
        ep.pair_parts(fmt, row, "f row 1")


@pytest.mark.parametrize(
    "sampling, message",
    [
        (ep.Sampling(samples=0), r"--samples 0: must be at least 1"),
        (ep.Sampling(temperature=-1), r"--temperature -1"),
        (ep.Sampling(samples=2, temperature=0), r"--samples 2 at --temperature 0: greedy"),
    ],
)
def test_bad_sampling_is_one_line(sampling, message):
    with pytest.raises(TunelabError, match=message):
        ep.check_sampling(sampling)


def run_pairs(tmp_path, model_dir, out, *extra):
    data = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    args = ["data", "pairs", "--data", str(data), "--model", str(model_dir), "--format", "alpaca"]
    return main([*args, "--template", "compact", "--max-new-tokens", "6", "--out", str(out), *extra])


def test_command_samples_the_model_and_writes_pairs_reproducibly(tiny_model_dir, tmp_path, capsys):
    # A random tiny model never writes the sum: every distinct completion is a pair.
    assert run_pairs(tmp_path, tiny_model_dir, tmp_path / "a.jsonl", "--samples", "3", "--seed", "1") == 0
    assert "pairs to" in capsys.readouterr().out
    first = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert first and {p["prompt"] for p in first} <= {r["instruction"] for r in ROWS}
    assert all(p["chosen"] == next(r["output"] for r in ROWS if r["instruction"] == p["prompt"]) for p in first)
    assert all(p["rejected"] != p["chosen"] for p in first)
    run_pairs(tmp_path, tiny_model_dir, tmp_path / "b.jsonl", "--samples", "3", "--seed", "1")
    run_pairs(tmp_path, tiny_model_dir, tmp_path / "c.jsonl", "--samples", "3", "--seed", "2")
    assert (tmp_path / "b.jsonl").read_text() == (tmp_path / "a.jsonl").read_text()
    assert (tmp_path / "c.jsonl").read_text() != (tmp_path / "a.jsonl").read_text()


def test_a_model_that_is_always_right_is_an_error(tiny_model_dir, tmp_path, monkeypatch, capsys):
    def always_right(model, tokenizer, prompts, budgets, batch_size, stop=None, temperature=0.0, generator=None):
        per = len(prompts) // len(ROWS)  # a row's samples sit side by side
        return Generated([r["output"] for r in ROWS for _ in range(per)], [False] * len(prompts))

    monkeypatch.setattr(ep, "generate", always_right)
    assert run_pairs(tmp_path, tiny_model_dir, tmp_path / "x.jsonl", "--samples", "2") == 2
    assert "rows.jsonl: the model answered all 3 prompts right in every one of 2 samples" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()
