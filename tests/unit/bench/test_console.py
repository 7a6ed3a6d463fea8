"""bench/console.py: the two peer tables (training peers, GRPO's peer) share one layout: peer, its columns, both peaks."""

from pathlib import Path

from tunelab.bench import console

PEAKS = {"peak_memory_bytes": 3 * 2**30, "tunelab_peak_memory_bytes": 2**30}


def printed(capsys, monkeypatch, show, row) -> list[str]:
    monkeypatch.setenv("COLUMNS", "300")
    show([row], Path("/runs/bench/peers.jsonl"))
    return capsys.readouterr().out.splitlines()


def cells(lines: list[str], first: str) -> list[str]:
    (line,) = [x for x in lines if x.startswith("│") and first in x]
    return [c.strip() for c in line.strip("│").split("│")]


def test_the_training_peer_table(capsys, monkeypatch):
    row = {
        "kind": "hf-peft", "tokens_nonpad_per_s": 1234.5, "tunelab_tokens_nonpad_per_s": 2469.0,
        "tokens_nonpad_ratio": 2.0, "tokens_padded_ratio": 1.5, "tokens_loss_ratio": 2.25, **PEAKS,
    }  # fmt: skip
    lines = printed(capsys, monkeypatch, console.show_comparison, row)
    assert cells(lines, "hf-peft") == [
        "hf-peft", "1,234.5", "2,469.0", "2.00x", "1.50x", "2.25x", "3.00 GiB", "1.00 GiB",
    ]  # fmt: skip
    assert lines[-1] == "stored in /runs/bench/peers.jsonl"


def test_the_grpo_peer_table(capsys, monkeypatch):
    row = {
        "kind": "trl-grpo", "completions_per_s": 0.5, "tunelab_completions_per_s": 1.25, "completions_per_s_ratio": 2.5,
        "completion_tokens_per_s_ratio": 2.4, "completion_mean_length": 8.0, "tunelab_completion_mean_length": 7.5,
        **PEAKS,
    }  # fmt: skip
    lines = printed(capsys, monkeypatch, console.show_grpo_comparison, row)
    assert cells(lines, "trl-grpo") == [
        "trl-grpo",
        "0.500",
        "1.250",
        "2.50x",
        "2.40x",
        "8.0, 7.5",
        "3.00 GiB",
        "1.00 GiB",
    ]
    assert lines[-1] == "stored in /runs/bench/peers.jsonl"
