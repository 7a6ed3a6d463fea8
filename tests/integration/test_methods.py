"""A few real steps of every method on the embedded SmolLM2-135M-Instruct."""

import json
from pathlib import Path

import pytest

from conftest import write_jsonl
from tunelab.cli import main

pytestmark = pytest.mark.integration
QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory):
    import random

    r = random.Random(0)
    rows = [
        {"instruction": f"{a} + {b}", "output": f"{a} + {b} = {a + b}", "answer": str(a + b)}
        for a, b in ((r.randint(0, 99999), r.randint(0, 99999)) for _ in range(64))
    ]
    return write_jsonl(tmp_path_factory.mktemp("data") / "add.jsonl", rows)


@pytest.mark.parametrize("method", ["lora", "dora", "qlora", "full"])
def test_method_trains_from_the_cli(method, rows_file, tmp_path):
    out = tmp_path / method
    code = main(
        [
            "train",
            "--config",
            str(QUICKSTART),
            f"data.path={rows_file}",
            f"output_dir={out}",
            f"method={method}",
            "max_steps=3",
            "micro_batch=4",
            "seq_len=128",
            "log_steps=1",
            "lr=1e-3",
            "--quiet",
        ]
    )
    assert code == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["loss"] == m["loss"] and 0 < m["loss"] < 20 for m in metrics)  # finite, sane
    summary = json.loads((out / "summary.json").read_text())
    assert summary["precision"] in ("bf16", "fp32") and summary["finished"]
    assert (out / ("model" if method == "full" else "adapter")).is_dir()
