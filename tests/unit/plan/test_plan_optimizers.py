"""plan's terms for the optimizer section: state bytes per optimizer row, no gradient buffer with the step in
backward, bf16 weights, paged states off the device's peak; and the cheapest combination of levers that fits."""

import json

import pytest
from conftest import plan_setup

from tunelab.cli import main
from tunelab.plan import memory
from tunelab.sources import resolve_arch

LLAMA2 = "meta-llama/Llama-2-7b-hf"


@pytest.fixture(scope="module")
def arch():
    return resolve_arch(LLAMA2)


def full(**kw):
    return plan_setup(method="full", targets=(), **kw)


def test_8bit_states_are_blockwise_bytes_and_adafactor_factored(arch):
    adamw = memory.breakdown(arch, *full())
    eight = memory.breakdown(arch, *full(optimizer="adamw_8bit"))
    assert eight.optimizer_states == round(arch.total_params * 2 * (1 + 4 / 256))
    assert adamw.optimizer_states == arch.total_params * 8
    factored = memory.breakdown(arch, *full(optimizer="adafactor"))
    assert 0 < factored.optimizer_states < arch.total_params * 0.01  # rows + cols per matrix
    assert (eight.weights, eight.gradients) == (adamw.weights, adamw.gradients)


def test_the_step_in_backward_keeps_only_the_largest_gradient(arch):
    f = memory.breakdown(arch, *full(optimizer_in_backward=True, max_grad_norm=0.0))
    assert f.gradients == 32000 * 4096 * 4  # the embedding's (and head's) fp32 gradient, one at a time


def test_bf16_weights_halve_weights_and_gradients_and_drop_the_autocast_copies(arch):
    b = memory.breakdown(arch, *full(weights="bf16"))
    assert b.weights == arch.total_params * 2 and b.gradients == arch.total_params * 2
    kahan = memory.breakdown(arch, *full(weights="bf16", bf16_update="kahan"))
    assert kahan.optimizer_states == b.optimizer_states + arch.total_params * 2
    # in backward: the largest tensor's bf16 gradient, and the fp32 shadow weight and gradient it steps through
    ib = memory.breakdown(arch, *full(weights="bf16", optimizer_in_backward=True, max_grad_norm=0.0))
    assert ib.gradients == 32000 * 4096 * (2 + 8)


def test_paged_states_are_off_the_cuda_peak_only(arch):
    cuda = memory.breakdown(arch, *full(optimizer="paged_adamw_8bit", offload_capable=True))
    cpu = memory.breakdown(arch, *full(optimizer="paged_adamw_8bit"))
    assert cuda.optimizer_states == 0 and cpu.optimizer_states > 0


def test_plan_names_the_cheapest_combination_that_fits(capsys):
    argv = ["plan", "--model", "meta-llama/Llama-3.1-8B", "--method", "full", "--gpu", "rtx-5090"]
    argv += ["--seq-len", "2048", "--micro-batch", "2", "--examples", "1000", "--json"]
    assert main(argv) == 0
    (result,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    changes = [s["change"] for s in result["suggestions"] if "paged_adamw_8bit" in s["change"]]
    assert len(changes) == 1 and ": fits, longest seq_len" in changes[0], result["suggestions"]
