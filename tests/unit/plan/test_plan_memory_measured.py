"""plan's memory model against peak memory measured on this CPU, for small random-init models.

The CPU process carries a fixed cost the memory model cannot derive (allocator and oneDNN arenas,
load-time copies): the plan helper measured a near-constant ~330 MB gap across lora/qlora/full. That
constant is calibrated per device, as `tunelab bench calibrate` does: measure it from ONE run of a
different shape, then every method's prediction (model + that overhead) must be within 20% of its
measured peak. Each run is a fresh process (bench.points.measure_point), as a real `tunelab train`.

The runs use eager blocks: a process of ~10 s each where compiled blocks take 15-45 s (the compiler), and what
compiled blocks save is counted exactly in-process by test_plan_memory_saved.py. Measured on the AMX class
(benchmarks/test-suite/make-test_xeon-amx-2c_2026-11-26.md): lora / qlora / full within -5 / -11 / +1% eager
and -3 / -5 / +13% compiled (before the head's gradient moved into the loss's backward). Full fine-tuning's
prediction holds the LM head's gradient in the weights' dtype, or the forward's cast of the head where that is
larger (plan/memory.head_gradient_bytes).
"""

import random

import pytest
from conftest import make_tiny_llama, make_tokenizer, write_jsonl

from tunelab.bench import points as command
from tunelab.config import load_config
from tunelab.device import cpu_has_fast_bf16
from tunelab.recipes.predict import local_prediction

pytestmark = pytest.mark.slow  # trains and measures the tiny model

SHAPE = dict(
    hidden_size=512,
    intermediate_size=1408,  # a multiple of 64: bitsandbytes 0.50.2 dequantizes CPU NF4 rows of 1376 wrongly
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=8,
    max_position_embeddings=512,
)
VOCAB = 16384
# The precision `auto` picks here: on a CPU without bf16 units a bf16 run measures the emulation (minutes a step).
PRECISION = "bf16" if cpu_has_fast_bf16() else "fp32"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("memory")
    tok = make_tokenizer()
    # The overhead is calibrated on a model of half the depth: another shape than the runs checked.
    for name, layers in (("model", SHAPE["num_hidden_layers"]), ("half-depth", SHAPE["num_hidden_layers"] // 2)):
        make_tiny_llama(VOCAB, **{**SHAPE, "num_hidden_layers": layers}).save_pretrained(root / name)
        tok.save_pretrained(root / name)
    r = random.Random(0)
    rows = []
    for _ in range(1500):
        a, b = r.randint(0, 10**6), r.randint(0, 10**6)
        rows.append({"instruction": f"{a} + {b}", "output": f"{a} + {b} = {a + b}"})
    return root, write_jsonl(root / "add.jsonl", rows)


def measured_and_model(setup, name, *extra):
    root, data = setup
    cfg = load_config(
        None,
        [
            f"model={root / 'model'}",  # an `extra` model= replaces it
            f"data.path={data}",
            "data.template=compact",
            f"precision={PRECISION}",
            "compile=false",
            "log_steps=1",
            f"output_dir={root / name}",
            *extra,
        ],
    )
    prediction = local_prediction(cfg)
    # Two steps: the first allocates the optimizer's state in its update, the second runs whole with it resident.
    summary = command.measure_point(cfg, stop_at=2, warmup=1)
    return summary["peak_memory_bytes"], prediction.memory.total - prediction.memory.runtime_overhead


def test_memory_model_within_20_percent_with_a_calibrated_overhead(setup):
    # The overhead comes from a run of another shape (half the layers), not from the runs checked.
    half = setup[0] / "half-depth"
    measured, model = measured_and_model(setup, "calib", "method=lora", f"model={half}", "seq_len=256", "micro_batch=8")
    overhead = measured - model
    report = {}
    for method in ("lora", "qlora", "full"):
        got, predicted = measured_and_model(setup, method, f"method={method}", "seq_len=256", "micro_batch=8")
        report[method] = (got / 2**20, (predicted + overhead) / 2**20)
    print(
        {m: f"measured {a:.0f} MiB, predicted {b:.0f} MiB" for m, (a, b) in report.items()},
        f"overhead {overhead / 2**20:.0f} MiB",
    )
    for method, (got, predicted) in report.items():
        if method == "qlora" and PRECISION == "fp32":
            # plan's QLoRA terms follow a 16-bit compute dtype; in fp32 it measured 713 MiB against 546 (-23%).
            assert predicted < got, "fp32 QLoRA now within plan's bound: check it like the others"
            continue
        assert predicted == pytest.approx(got, rel=0.20), method
