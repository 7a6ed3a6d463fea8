"""benchmarks/scripts/optimizers_table.py: the results file's tables from its JSON (issue 47's quickstart proof)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).parents[3] / "benchmarks" / "scripts" / "optimizers_table.py"


def load():
    spec = importlib.util.spec_from_file_location("optimizers_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def row(run: str, curve: list[float], exact: float | None, measured: int, plan: int) -> dict:
    return {
        "run": run,
        "settings": "optimizer=adamw optimizer_in_backward=false weights=fp32",
        "loss_curve": curve,
        "loss_last": curve[-1],
        "exact_match": exact,
        "exact_match_n": None if exact is None else 100,
        "peak_measured_bytes": measured,
        "peak_plan_bytes": plan,
        "plan_error": plan / measured - 1,
    }


def test_the_tables_show_loss_at_fixed_steps_exact_match_and_plan_error():
    rows = [
        row("base", [1.5, 1.2, 1.0, 0.9], 0.03, 4 << 30, 3 << 30),
        row("other", [1.5, 1.4, 1.3, 1.25], None, 2 << 30, 2 << 30),
    ]
    rows[0]["peak_curve_bytes"] = [2 << 30, 3 << 30, 3 << 30, 4 << 30]
    lines = load().markdown(rows, "base")
    assert lines[0] == "| run | settings | step 1 | step 2 | step 4 |"
    assert lines[2].endswith("| 1.500 | 1.200 | 0.900 |")
    results = [line for line in lines if line.startswith("| other |")][-1]
    assert "| 1.250 | +0.350 | n/a | 2.00 | 2.00 | +0% |" in results
    base = [line for line in lines if line.startswith("| base |")]
    assert "| 3% of 100 | 4.00 | 3.00 | -25% |" in base[1]
    # the peak so far at the shown steps, then plan's, for runs that logged it
    assert base[2] == "| base | 2.00 | 3.00 | 4.00 | 3.00 |"
    assert len([line for line in lines if line.startswith("| other |")]) == 2


def test_settings_name_bf16_update_only_for_bf16_weights(tmp_path):
    table = load()
    config = tmp_path / "config.yaml"
    config.write_text("optimizer: adamw\noptimizer_in_backward: false\nweights: fp32\nbf16_update: stochastic\n")
    assert table.settings(config) == "optimizer=adamw optimizer_in_backward=false weights=fp32"
    config.write_text("optimizer: adamw_8bit\noptimizer_in_backward: true\nweights: bf16\nbf16_update: nearest\n")
    assert table.settings(config) == "optimizer=adamw_8bit optimizer_in_backward=true weights=bf16 bf16_update=nearest"
