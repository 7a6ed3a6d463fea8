"""A few real steps of every method on the embedded SmolLM2-135M-Instruct."""

import json

import pytest
from conftest import REPO, write_jsonl
from safetensors.torch import load_file

from tunelab.cli import main
from tunelab.sources import resolve_arch

pytestmark = pytest.mark.integration
QUICKSTART = REPO / "configs" / "quickstart.yaml"


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
    # Eager blocks: every method's compiled blocks are traced whole in tests/unit/recipes/test_finetune.py, trained
    # against an fp32 reference in tests/unit/train/test_reference_loop.py and measured in
    # tests/unit/plan/test_plan_memory_saved.py; compiling the 135M model's block here cost 45 s of make test's
    # 8 minutes (LoRA), 20-30 s for each other method.
    compiled = ["compile=false"]
    code = main(
        [
            "train",
            "--config",
            str(QUICKSTART),
            f"data.path={rows_file}",
            f"output_dir={out}",
            f"method={method}",
            "max_steps=2",
            "micro_batch=2",
            "seq_len=64",
            "log_steps=1",
            "lr=1e-3",
            *compiled,
            "--quiet",
        ]
    )
    assert code == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["loss"] == m["loss"] and 0 < m["loss"] < 20 for m in metrics)  # finite, sane
    summary = json.loads((out / "summary.json").read_text())
    assert summary["precision"] in ("bf16", "fp32") and summary["finished"]
    assert summary["base_quant"] == ("nf4" if method == "qlora" else "none")
    dense = resolve_arch("embedded").total_params
    frozen = summary["params_total"] - summary["params_trainable"]
    if method == "full":
        assert summary["params_trainable"] == dense and frozen == 0
        weights = load_file(out / "model" / "model.safetensors")
        assert sum(t.numel() for t in weights.values()) == dense
        return
    # count_parameters counts an nf4 weight's values, not its packed bytes: the frozen base is the whole model.
    assert frozen == dense
    assert summary["nf4_layers"] == (7 * 30 if method == "qlora" else 0)  # every decoder linear, quantized
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 32 and config["use_dora"] == (method == "dora")
    adapter = load_file(out / "adapter" / "adapter_model.safetensors")
    a_keys = [k for k in adapter if "lora_A" in k]
    b_keys = [k for k in adapter if "lora_B" in k]
    assert len(a_keys) == len(b_keys) == 7 * 30  # all-linear: q k v o gate up down in each of 30 layers
    # B starts at zero: two steps at lr 1e-3 must have moved every one of them.
    assert all(adapter[k].abs().max() > 0 for k in b_keys)
    magnitudes = [k for k in adapter if "lora_magnitude_vector" in k]
    assert len(magnitudes) == (7 * 30 if method == "dora" else 0)
