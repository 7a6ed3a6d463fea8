"""GRPO on the shared loop (train/loop.run): its steps are the ones the recipe's own loop took before the move, at
the same seed in fp32 (the literals below were printed by the recipe of b2424b0, its own loop, from this test's
runs: `RECORD=1 pytest -s tests/unit/recipes/test_grpo_engine.py`)."""

from __future__ import annotations

import json
import os

import pytest
from conftest import compile_without_inductor, tiny_train_config, write_jsonl

from tunelab.recipes.entry import train
from tunelab.train.loop import Measurement

pytestmark = pytest.mark.slow

COMMON = (
    "objective=grpo",
    # The recipe's attention at b2424b0; `auto` now runs the rows as causal slots on a CPU (attention.rows_attention,
    # SDPA's to fp32 rounding: tests/unit/model/test_attention.py), which these bit-for-bit literals would not hold.
    "attention=sdpa",
    "grpo.num_generations=3",
    "grpo.max_completion_length=6",
    "grpo.log_completions_steps=0",
    "lr=5e-2",
)
CASES = {
    # The KL term against the adapter disabled, two updates on each generation batch, two micro-batches a step.
    "kl_iterations": ("micro_batch=1", "grad_accum=2", "max_steps=4", "grpo.beta=0.1", "grpo.num_iterations=2"),
    # β = 0: completions of equal-reward groups left out; the per-completion aggregation.
    "per_completion": ("micro_batch=2", "grad_accum=1", "max_steps=3", "grpo.beta=0.0", "grpo.loss_type=grpo"),
}
# (step, loss, reward, kl, entropy, lr) of each logged step.
RECORDED: dict[str, list[tuple]] = {
    "kl_iterations": [
        (1, 4.635916894812908e-08, 2.5, 0.0, 4.640555487738715, 0.05),
        (2, 0.024976921267807484, 2.5, 0.01866253548198276, 4.642127354939778, 0.04267766952966369),
        (3, 0.0024815715150907636, 2.6666667461395264, 0.024816370672649808, 4.634057998657227, 0.025),
        (4, -0.04422106221318245, 2.6666667461395264, 0.02054733369085524, 4.635614818996853, 0.0073223304703363135),
    ],
    "per_completion": [
        (1, 3.973643103449831e-08, 2.5, None, 4.640555063883464, 0.05),
        (2, -1.4901161193847656e-08, 3.1666667461395264, None, 4.641971588134766, 0.037500000000000006),
        (3, 0.0, 4.0, None, 4.637808481852214, 0.012500000000000006),
    ],
}


def prompt_rows():
    return [{"instruction": f"{a} + {b}", "answer": str(a + b)} for a, b in [(1, 2), (3, 4), (5, 6), (7, 8)]]


def run_case(tmp_path, model_dir, name, *extra, stop_at=None):
    data = write_jsonl(tmp_path / "prompts.jsonl", prompt_rows())
    # Rewards that differ within every group (the tiny random model never writes the answer): a hash of the text.
    (tmp_path / "r.py").write_text(
        "def r(prompts, completions, **row):\n    return [float(sum(map(ord, c)) % 7) for c in completions]\n"
    )
    rewards = f"grpo.rewards=[{{name: '{tmp_path}/r.py:r'}}, {{name: length, weight: 0.5, args: {{max_tokens: 3}}}}]"
    out = tmp_path / name
    cfg = tiny_train_config(model_dir, data, out, *COMMON, rewards, *CASES[name], *extra)
    summary = train(cfg, show_progress=False, measure=Measurement(stop_at=stop_at))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return summary, rows


@pytest.mark.parametrize("name", sorted(CASES))
def test_grpo_losses_on_the_shared_loop_are_the_recipes_own(tmp_path, tiny_model_dir, name):
    _, rows = run_case(tmp_path, tiny_model_dir, name)
    got = [(r["step"], r["loss"], r["reward"], r.get("kl"), r.get("entropy"), r["lr"]) for r in rows]
    if os.environ.get("RECORD"):
        print(f"\n{name!r}: {got!r},")
        return
    want = RECORDED[name]
    assert [g[0] for g in got] == [w[0] for w in want]
    for g, w in zip(got, want):
        assert g[2] == w[2]  # the same completions and rewards
        assert g[5] == w[5]  # the same learning rates
        # The same weights after every step (entropy and KL at steps 2-4 are of the updated policy) and the same
        # losses: bit for bit on the class that recorded them (AVX-512), to the fp32 rounding of another class's
        # kernels elsewhere (under the AVX2 cap at most 2.1e-6 relative, the KL 5.3e-7); the logged loss also sums
        # a step's micro-batch losses in fp32 on the device, where the recipe's own loop summed Python floats.
        assert (g[3] is None) == (w[3] is None), g[0]  # a KL term logged only where there is one
        assert [x for x in g[3:5] if x is not None] == pytest.approx([x for x in w[3:5] if x is not None], rel=1e-5)
        assert g[1] == pytest.approx(w[1], rel=1e-5, abs=1e-9), g[0]


def test_a_grpo_run_with_checkpointed_layers_takes_the_same_steps(tmp_path, tiny_model_dir):
    """grad_ckpt: the update recomputes each decoder layer in backward (sampling and scoring run without autograd,
    where the layers run plain); in fp32 its steps are the ones without it."""
    summary, rows = run_case(tmp_path, tiny_model_dir, "kl_iterations", "grad_ckpt=true")
    assert summary.grad_ckpt and summary.finished
    for r, w in zip(rows, RECORDED["kl_iterations"], strict=True):
        assert r["reward"] == w[2]
        got = (r["loss"], r["kl"], r["entropy"], r["lr"])
        assert got == pytest.approx((w[1], *w[3:]), rel=0, abs=1e-5), r["step"]


def test_a_compiled_grpo_run_compiles_nothing_after_its_first_steps(tmp_path, tiny_model_dir, monkeypatch):
    """`compile: true`: the update runs the compiled blocks over rollouts whose widths change every micro-batch;
    dynamo builds the training graphs in the first steps (a width seen second makes it dynamic) and none after,
    while sampling and scoring run the blocks eager. Dynamo's guards decide what recompiles, so the blocks compile
    with the aot_eager backend; in fp32 its steps are the eager run's."""
    import torch
    from torch._dynamo.utils import counters

    from tunelab.recipes import grpo

    compile_without_inductor(monkeypatch)
    graphs: list[int] = []
    real_forward = grpo.GrpoSource.forward

    def counting_forward(source, loss_fn, micro, device):
        out = real_forward(source, loss_fn, micro, device)
        graphs.append(counters["stats"]["unique_graphs"])
        return out

    monkeypatch.setattr(grpo.GrpoSource, "forward", counting_forward)
    torch._dynamo.reset()
    counters.clear()
    try:
        summary, rows = run_case(tmp_path, tiny_model_dir, "kl_iterations", "compile=true")
    finally:
        torch._dynamo.reset()
    assert summary.compile["chosen"] and len(graphs) == 8  # 4 steps of 2 micro-batches
    assert graphs[0] > 0 and len(set(graphs[4:])) == 1, graphs  # nothing compiled in steps 3 and 4
    for r, w in zip(rows, RECORDED["kl_iterations"], strict=True):
        assert r["reward"] == w[2]
        got = (r["loss"], r["kl"], r["entropy"], r["lr"])
        assert got == pytest.approx((w[1], *w[3:]), rel=0, abs=1e-5), r["step"]


def test_full_fine_tuning_keeps_a_frozen_copy_of_the_starting_policy_only_under_a_kl_term(
    tmp_path, tiny_model_dir, monkeypatch
):
    """method full: β > 0 scores the reference on a frozen copy of the starting weights (the one DPO takes,
    train/loss.frozen_copy), so the KL is 0 at the first step and positive once the policy has moved; β = 0 takes
    none. Either saves the whole model."""
    from tunelab.train import loss

    copies = []
    real = loss.frozen_copy
    monkeypatch.setattr(loss, "frozen_copy", lambda model: copies.append(model) or real(model))
    summary, rows = run_case(tmp_path, tiny_model_dir, "kl_iterations", "method=full", "max_steps=2", "lr=1e-2")
    assert summary.finished and (tmp_path / "kl_iterations" / "model" / "config.json").is_file()
    assert len(copies) == 1
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6) and rows[1]["kl"] > 1e-4
    summary, rows = run_case(tmp_path, tiny_model_dir, "per_completion", "method=full", "max_steps=1")
    assert summary.finished and len(copies) == 1 and "kl" not in rows[0]
    assert (tmp_path / "per_completion" / "model" / "config.json").is_file()


@pytest.mark.parametrize(
    "extra", [("attention=slots",), ("activation_offload=true", "grad_ckpt=true")], ids=["slots", "offload"]
)
def test_another_attention_path_or_offloaded_activations_take_the_same_steps(
    tmp_path, tiny_model_dir, monkeypatch, extra
):
    """`attention`: the update runs the path chosen (sampling keeps SDPA, which masks the prompts' left padding);
    `activation_offload` with grad_ckpt: the checkpointed layers' inputs go through the offloader's copies (on a
    CPU only when asked, `copy_on_cpu`). In fp32 either takes the recorded steps."""
    from tunelab.model import attention, offload
    from tunelab.model import load as mload

    made, implementations = [], []
    apply, load_model = offload.apply, mload.load_model
    monkeypatch.setattr(
        offload, "apply", lambda model, on, ckpt: made.append(apply(model, on, ckpt, copy_on_cpu=True)) or made[-1]
    )
    monkeypatch.setattr(mload, "load_model", lambda *a, **k: implementations.append(k["attn"]) or load_model(*a, **k))
    summary, rows = run_case(tmp_path, tiny_model_dir, "kl_iterations", *extra, stop_at=2)
    assert summary.steps == 2
    if "attention=slots" in extra:
        assert implementations == [attention.NAME]
    else:
        assert made[0] is not None and made[0].copy_on_cpu
    for r, w in zip(rows, RECORDED["kl_iterations"][:2], strict=True):
        assert r["reward"] == w[2]  # the same completions
        got = (r["loss"], r["kl"], r["entropy"], r["lr"])
        assert got == pytest.approx((w[1], *w[3:]), rel=0, abs=1e-5), r["step"]
