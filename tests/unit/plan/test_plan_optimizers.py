"""plan's terms for the optimizer section: state bytes per optimizer row, no gradient buffer with the step in
backward, bf16 weights, paged states off the device's peak; and the cheapest combination of levers that fits."""

import json
from dataclasses import replace

import pytest
from conftest import plan_setup

from tunelab.cli import main
from tunelab.plan import memory
from tunelab.runtime import STEP_CHUNK
from tunelab.sources import resolve_arch

LLAMA2 = "meta-llama/Llama-2-7b-hf"


@pytest.fixture(scope="module")
def arch():
    return resolve_arch(LLAMA2)


def full(**kw):
    """Full fine-tuning at two micro-batches a step, where the whole gradient buffer is at the peak."""
    return plan_setup(**{"method": "full", "targets": (), "grad_accum": 2, **kw})


def block_gradients(arch, setup) -> float:
    """The gradients alive at a block's moment of backward (memory.backward_moments), the step inside backward."""
    job, s = setup
    return memory.gradient_bytes(arch, job, s, memory.trainable_params(arch, job, s))


def test_8bit_states_are_blockwise_bytes_and_adafactor_factored(arch):
    adamw = memory.breakdown(arch, *full())
    eight = memory.breakdown(arch, *full(optimizer="adamw_8bit"))
    assert eight.optimizer_states == round(arch.total_params * 2 * (1 + 4 / 256))
    assert adamw.optimizer_states == arch.total_params * 8
    factored = memory.breakdown(arch, *full(optimizer="adafactor"))
    assert 0 < factored.optimizer_states < arch.total_params * 0.01  # rows + cols per matrix
    assert (eight.weights, eight.gradients) == (adamw.weights, adamw.gradients)


def test_the_step_in_backward_keeps_only_the_largest_block_gradient(arch):
    f = block_gradients(arch, full(optimizer_in_backward=True, max_grad_norm=0.0))
    # Llama-2's untied head: its gradient is the loss's (logits), stepped first; the embedding's comes last, once
    # the activations are freed. At a block's moment: one MLP matrix's fp32 gradient.
    assert f == 11008 * 4096 * 4
    tied = resolve_arch("HuggingFaceTB/SmolLM2-135M-Instruct")
    t = block_gradients(tied, full(optimizer_in_backward=True, max_grad_norm=0.0))
    # a tied embedding's gradient waits for the embedding's share at the end of backward, beside the block's
    assert t == (tied.vocab * tied.hidden + tied.intermediate * tied.hidden) * 4


def test_bf16_weights_halve_weights_and_gradients_and_drop_the_autocast_copies(arch):
    b = memory.breakdown(arch, *full(weights="bf16"))
    assert b.weights == arch.total_params * 2 and b.gradients == arch.total_params * 2
    kahan = memory.breakdown(arch, *full(weights="bf16", bf16_update="kahan"))
    assert kahan.optimizer_states == b.optimizer_states + arch.total_params * 2
    # in backward: the block's bf16 gradient, and the fp32 temporaries of one piece of the largest weight's step
    ib = block_gradients(arch, full(weights="bf16", optimizer_in_backward=True, max_grad_norm=0.0))
    assert ib == 11008 * 4096 * 2 + memory.STOCHASTIC_BYTES * STEP_CHUNK
    eight = block_gradients(
        arch, full(weights="bf16", optimizer="adamw_8bit", optimizer_in_backward=True, max_grad_norm=0.0)
    )
    assert eight == 11008 * 4096 * 2 + (memory.STOCHASTIC_BYTES + 18) * STEP_CHUNK
    # Adafactor's factored moment spans the matrix: the head steps whole, its temporaries at its full size
    af = block_gradients(
        arch, full(weights="bf16", optimizer="adafactor", optimizer_in_backward=True, max_grad_norm=0.0)
    )
    assert af == 11008 * 4096 * 2 + (memory.STOCHASTIC_BYTES + 6) * 32000 * 4096


def test_the_loss_holds_a_trained_heads_gradient_in_the_weights_dtype_and_no_fp32_sum(arch):
    """The head's gradient is made in the loss's backward, a vocabulary slice at a time, straight into the weights'
    dtype: 2 B a head weight for bf16 weights computed in bf16, no fp32 sum (the replaced path held 4 B more). For
    fp32 master weights, 4 B and a slice's bf16 cast and product; with 5 target rows (plan_setup) one slice is the
    whole head, with 64 chunks of rows a 64th of it."""
    chunk = memory.breakdown(arch, *plan_setup(targets=())).logits_loss  # LoRA: the head frozen
    bf16 = memory.breakdown(arch, *full(weights="bf16")).logits_loss
    fp32 = memory.breakdown(arch, *full()).logits_loss
    head = 32000 * 4096
    assert bf16 - chunk == head * 2
    assert fp32 - chunk == head * (4 + 2 + 2)
    job, s = full()
    rows = 64 * s.loss_chunk
    many = memory.head_gradient_bytes(arch, job, replace(s, loss_rows=rows))
    assert many == head * 4 + head / 64 * (2 + 2)


def test_the_forwards_cast_of_the_head_counts_when_it_is_the_larger_moment(arch):
    """bf16 weights computed in fp32 (a CPU without bf16 units): the forward's fp32 cast of the head (4 B) is freed
    before backward's bf16 gradient (2 B) and its slices exist; the larger of the two moments counts, not both."""
    job, s = full(weights="bf16")
    s = replace(s, compute_bytes=4, loss_rows=64 * s.loss_chunk)
    head = 32000 * 4096
    assert memory.head_gradient_bytes(arch, job, s) == head * 4


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


def test_no_suggestion_is_a_combination_the_config_refuses(monkeypatch, capsys):
    """With the step in backward (grad_accum must stay 1) and a peak that does not fit, every variant plan
    estimates for a suggestion passes config validation: no micro-batch split into accumulation."""
    from tunelab.config import TrainConfig
    from tunelab.plan import estimate

    tried = []
    real = estimate.estimate

    def recording(arch, lengths, job, *args, **kwargs):
        tried.append(job)
        return real(arch, lengths, job, *args, **kwargs)

    monkeypatch.setattr(estimate, "estimate", recording)
    argv = ["plan", "--model", "meta-llama/Llama-3.1-8B", "--method", "full", "--gpu", "rtx-4090", "--json"]
    argv += ["--seq-len", "4096", "--micro-batch", "6", "--examples", "1000", "--weights", "bf16", "--grad-ckpt"]
    argv += ["--optimizer", "paged_adamw_8bit", "--optimizer-in-backward", "--max-grad-norm", "0"]
    assert main(argv) == 0
    (result,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert not result["fits"] and result["max_micro_batch"] >= 1  # a smaller micro-batch would fit
    assert tried, "plan suggested nothing for a job that does not fit"
    for job in tried:
        sections = ("adapter", "objective", "batch", "compute", "optimizer", "run")
        TrainConfig(**{name: getattr(job, name) for name in sections}).validate()
    assert not any("grad_accum" in s["change"] for s in result["suggestions"]), result["suggestions"]


def test_a_peak_in_a_step_after_the_return_of_freed_pages_has_the_overhead_less_those_pages():
    """A full fine-tune on a CPU with a step that allocates scratch returns the pages backward freed before the
    step: where plan's peak is that step (the gradients' moment), the overhead is less the catalog's freed pages;
    at a peak inside backward, or without the return, it is the whole overhead."""
    from tunelab.plan import catalog, estimate

    tied = resolve_arch("HuggingFaceTB/SmolLM2-135M-Instruct")
    held = catalog.freed_pages_held("cpu")
    assert 0.1 * 2**30 < held < catalog.runtime_overhead("cpu")
    step = full(grad_accum=1, optimizer="adafactor", weights="bf16", runtime_overhead=2**30)
    assert memory.breakdown(tied, *step.but(pages_returned_before_step=held)).runtime_overhead == 2**30 - held
    assert memory.breakdown(tied, *step).runtime_overhead == 2**30
    # two micro-batches a step: every transient at once, no moment is the step's alone
    two = step.but(grad_accum=2, pages_returned_before_step=held)
    assert memory.breakdown(tied, *two).runtime_overhead == 2**30
    # fp32 weights and long rows: the peak is the loss's moment, inside backward
    loss = full(grad_accum=1, optimizer="adafactor", row_len=4096, loss_rows=4096, runtime_overhead=2**30)
    assert memory.breakdown(tied, *loss.but(pages_returned_before_step=held)).runtime_overhead == 2**30

    def returned(device="cpu", **kw):
        return estimate.pages_returned_before_step(full(**kw).job, device)

    assert returned(optimizer="adafactor") == returned(optimizer="adamw_8bit") == held
    assert returned(optimizer="adamw") == returned(optimizer="adafactor", optimizer_in_backward=True) == 0
    assert returned("cuda", optimizer="adafactor") == 0
    assert estimate.pages_returned_before_step(plan_setup(optimizer="adafactor").job, "cpu") == 0  # LoRA


@pytest.mark.parametrize("fast_bf16", [False, True])
def test_plan_local_says_when_the_overhead_is_less_and_when_bf16_weights_lack_bf16_units(
    fast_bf16, monkeypatch, capsys
):
    """On a CPU: a full fine-tune with Adafactor peaks in the step after the return of freed pages, and plan says
    the overhead there is less; with bf16 weights on a CPU without bf16 units it says the step time is fp32's."""
    monkeypatch.setattr("tunelab.plan.calibration.load_calibration", lambda key: None)
    monkeypatch.setattr("tunelab.probe.matmul_peak", lambda dtype, dev: (1e11, 256))
    monkeypatch.setattr("tunelab.probe.copy_bandwidth", lambda dev: 1e10)
    monkeypatch.setattr("tunelab.device.cpu_has_fast_bf16", lambda: fast_bf16)
    args = ["plan", "--model", "smollm2-135m", "--examples", "100", "--gpu", "local", "--method", "full"]
    shape = ["--seq-len", "128", "--micro-batch", "4", "--grad-accum", "1", "--max-grad-norm", "0", "compile=false"]
    assert main([*args, *shape, "--optimizer", "adafactor", "--weights", "bf16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    said = " ".join(out["assumptions"])
    assert "less at this peak, the optimizer step, before which the run returns the pages backward freed" in said
    assert out["memory_breakdown"]["runtime_overhead"] < 0.3 * 2**30
    assert ("without bf16 units" in said) is not fast_bf16
