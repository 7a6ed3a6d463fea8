"""plan's peak with the step inside backward: the largest of the moments whose transients coexist
(memory.backward_moments), not the sum of every transient; every other mode's peak unchanged."""

import json

import pytest
from conftest import plan_setup

from tunelab.cli import main
from tunelab.plan import memory
from tunelab.runtime import STEP_CHUNK
from tunelab.sources import resolve_arch

GiB = 1 << 30


@pytest.fixture(scope="module")
def llama():
    return resolve_arch("meta-llama/Llama-2-7b-hf")  # untied head


@pytest.fixture(scope="module")
def smol():
    return resolve_arch("HuggingFaceTB/SmolLM2-135M-Instruct")  # tied head


def in_backward(**kw):
    kw = {"method": "full", "targets": (), "optimizer_in_backward": True, "max_grad_norm": 0.0, **kw}
    return plan_setup(**kw)


def moments(arch, job, s):
    return {m.name: m for m in memory.backward_moments(arch, job, s, memory.trainable_params(arch, job, s))}


def test_an_untied_heads_moments_under_checkpointing(llama):
    """The loss's moment: no layer recomputed yet, the head's gradient and its step; a block's: one layer
    recomputed, the block gradient, only the loss's kept scratch; the embedding's: its gradient at backward's end."""
    job, s = in_backward(weights="bf16", grad_ckpt=True, row_len=2048, loss_rows=1024)
    m = moments(llama, job, s)
    assert list(m) == ["loss", "block", "embedding"]
    head = llama.vocab * llama.hidden
    before_recompute = memory.activation_bytes(llama, job, s, recomputed=False)
    assert m["loss"].activations == before_recompute < memory.activation_bytes(llama, job, s)
    assert m["loss"].gradients == memory.step_temporary_bytes(job, head) == memory.STOCHASTIC_BYTES * STEP_CHUNK
    assert m["loss"].logits_loss == memory.logits_bytes(llama, job, s)
    assert m["block"].activations == memory.activation_bytes(llama, job, s)
    assert m["block"].gradients == 11008 * 4096 * 2 + memory.STOCHASTIC_BYTES * STEP_CHUNK
    assert m["block"].logits_loss == s.loss_chunk * llama.vocab * (4 + 2)  # the scratch, not the head's gradient
    assert m["embedding"].gradients == head * 2 + memory.STOCHASTIC_BYTES * STEP_CHUNK


def test_the_peak_is_the_largest_moment_not_the_sum(llama):
    """Fails if the sum of every transient comes back for the step inside backward."""
    job, s = in_backward(weights="bf16", grad_ckpt=True, row_len=2048, loss_rows=1024)
    b = memory.breakdown(llama, job, s)
    largest = max(moments(llama, job, s).values(), key=lambda m: m.total)
    fixed = b.weights + b.optimizer_states + b.runtime_overhead
    assert b.total == pytest.approx(fixed + largest.total, abs=3)
    assert (b.activations, b.gradients, b.logits_loss) == (
        round(largest.activations),
        round(largest.gradients),
        round(largest.logits_loss),
    )
    trainable = memory.trainable_params(llama, job, s)
    summed = (
        memory.activation_bytes(llama, job, s)
        + memory.gradient_bytes(llama, job, s, trainable)
        + memory.logits_bytes(llama, job, s)
    )
    assert b.total < fixed + summed - 0.1 * GiB


def test_a_tied_heads_gradient_is_held_through_backward_and_counted_once(smol):
    """A tied head's gradient waits for the embedding's share: in the loss's moment it is the loss's, in a block's
    the gradients' (not both), and at backward's end the two shares exist together."""
    job, s = in_backward(weights="bf16", grad_ckpt=True, row_len=128, loss_rows=200)
    m = moments(smol, job, s)
    head = smol.vocab * smol.hidden
    assert m["loss"].gradients == 0
    # only block weights step at a block's moment: the largest block matrix's temporaries, not the head's
    block = smol.intermediate * smol.hidden
    assert m["block"].gradients == (head + block) * 2 + memory.STOCHASTIC_BYTES * min(block, STEP_CHUNK)
    assert m["block"].logits_loss == memory.loss_scratch_bytes(smol, s)
    assert m["embedding"].gradients == 2 * head * 2 + memory.STOCHASTIC_BYTES * min(head, STEP_CHUNK)


def test_without_checkpointing_every_moment_before_the_embedding_keeps_every_activation(llama):
    job, s = in_backward(row_len=512, loss_rows=256)
    m = moments(llama, job, s)
    assert m["loss"].activations == m["block"].activations == memory.activation_bytes(llama, job, s)


def test_lora_in_backward_has_no_embedding_moment(llama):
    job, s = plan_setup(optimizer_in_backward=True, max_grad_norm=0.0)
    assert list(moments(llama, job, s)) == ["loss", "block"]


# breakdown(...).total at main 9fff630, before the moments (tests/unit/plan/test_plan_moments.py's cases); the
# single-process cases at two micro-batches a step, where the first's gradients are alive through the second's
# backward and every transient coexists
BEFORE = {
    "lora": ("llama", {"grad_accum": 2}, 14027124736),
    "full-adamw": ("llama", {"method": "full", "targets": (), "grad_accum": 2}, 122360209408),
    "full-bf16-8bit-ckpt": (
        "llama",
        {
            "method": "full",
            "targets": (),
            "weights": "bf16",
            "optimizer": "adamw_8bit",
            "grad_ckpt": True,
            "row_len": 2048,
            "loss_rows": 1024,
            "grad_accum": 2,
        },
        43318608000,
    ),
    "full-tied-adamw": (
        "smol",
        {"method": "full", "targets": (), "row_len": 128, "loss_rows": 200, "grad_accum": 2},
        3438274176,
    ),
    "qlora-ckpt": (
        "llama",
        {"method": "qlora", "grad_ckpt": True, "row_len": 2048, "loss_rows": 1024, "grad_accum": 2},
        6056722432 + 11008 * 4096 * 2,  # and the 4-bit base's dequantized MLP weight (memory.dequant_scratch_bytes)
    ),
    "full-in-backward-zero2": (
        "llama",
        {
            "method": "full",
            "targets": (),
            "optimizer_in_backward": True,
            "max_grad_norm": 0.0,
            "sharding": "zero2",
            "world": 2,
        },
        68543062016,
    ),
}


@pytest.mark.parametrize("case", sorted(BEFORE))
def test_every_other_mode_keeps_its_peak(case, llama, smol):
    name, kw, total = BEFORE[case]
    arch = {"llama": llama, "smol": smol}[name]
    assert memory.breakdown(arch, *plan_setup(**kw)).total == total


EIGHT_B = ["plan", "--model", "meta-llama/Llama-3.1-8B", "--method", "full", "--gpu", "rtx-4090", "--json"]
EIGHT_B += ["--seq-len", "2048", "--micro-batch", "2", "--examples", "10000", "--mean-tokens", "2048"]
EIGHT_B += ["optimizer=paged_adamw_8bit", "optimizer_in_backward=true", "weights=bf16", "grad_ckpt=true"]
EIGHT_B += ["max_grad_norm=0"]


def plan_8b(capsys) -> dict:
    assert main(EIGHT_B) == 0
    (result,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return result


def test_the_8b_full_fine_tune_is_the_loss_moment_below_torchtunes_18_9_gib(capsys, monkeypatch):
    """Llama-3.1-8B on an RTX 4090 (issue 47): the loss's moment is the peak: 32 saved layer inputs of 2 x 2048
    bf16 positions and the final norm's fp32 input, no layer recomputed, the head's step temporaries (one piece of
    STEP_CHUNK values), the loss with the head's bf16 gradient. The sum of every transient was 18.90 GiB."""
    result = plan_8b(capsys)
    b = result["memory_breakdown"]
    tokens, h, vocab = 2 * 2048, 4096, 128256
    assert b["activations"] == 32 * tokens * h * 2 + tokens * h * 4
    assert b["gradients"] == (memory.STOCHASTIC_BYTES + 18) * STEP_CHUNK  # paged 8-bit AdamW's scratch: 18 B
    head_and_scratch = vocab * h * 2 + 256 * vocab * (4 + 2)
    assert 0 < b["logits_loss"] - head_and_scratch < 0.05 * GiB  # the gathered rows, their gradient, a slice cast
    assert b["optimizer_states"] == 0 and b["runtime_overhead"] == GiB
    assert result["peak_memory_bytes"] == sum(b.values())
    assert result["peak_memory_bytes"] < 18.9 * GiB - 0.4 * GiB
    monkeypatch.setattr(memory, "moments_apply", lambda job, s: False)
    assert plan_8b(capsys)["peak_memory_bytes"] == 20295098368  # the sum, as before


def fresh(arch, **kw):
    """One micro-batch a step, the step after backward."""
    job, s = plan_setup(**kw)
    return {m.name: m for m in memory.fresh_gradient_moments(arch, job, s, memory.trainable_params(arch, job, s))}


def test_one_micro_batch_a_step_makes_the_gradients_as_backward_frees_the_activations(smol):
    """No gradient is alive at backward's start (the loop frees them): the loss's moment holds every activation and
    the loss with the head's gradient; backward's end every gradient, one hidden-sized tensor and the step's
    temporaries; the peak is the larger, not the sum."""
    kw = {"method": "full", "targets": (), "row_len": 128, "loss_rows": 200}
    job, s = plan_setup(**kw)
    m = fresh(smol, **kw)
    assert m["loss"].gradients == 0
    assert m["loss"].activations == memory.activation_bytes(smol, job, s, recomputed=False)
    assert m["loss"].logits_loss == memory.logits_bytes(smol, job, s)
    assert m["gradients"].gradients == smol.total_params * 4  # fp32 AdamW on CPU: fused, no scratch
    assert m["gradients"].activations == 2 * 128 * smol.hidden * 4  # the fp32 residual stream's gradient
    b = memory.breakdown(smol, job, s)
    assert b.total - b.runtime_overhead - b.weights - b.optimizer_states == round(max(x.total for x in m.values()))
    assert b.total < BEFORE["full-tied-adamw"][2]  # the sum of every transient, two micro-batches a step


def test_one_micro_batch_a_step_under_lora_drops_only_the_adapters_gradients(llama):
    one = memory.breakdown(llama, *plan_setup())
    two = memory.breakdown(llama, *plan_setup(grad_accum=2))
    job, s = plan_setup()
    assert two.total - one.total == memory.trainable_params(llama, job, s) * 4
    assert one.gradients == 0 and (one.activations, one.logits_loss) == (two.activations, two.logits_loss)


def test_a_checkpointed_first_block_holds_the_heads_gradient_beside_one_recomputed_layer(llama):
    kw = {"method": "full", "targets": (), "weights": "bf16", "grad_ckpt": True, "row_len": 2048, "loss_rows": 1024}
    job, s = plan_setup(**kw)
    m = fresh(llama, **kw)
    assert m["block"].activations == memory.activation_bytes(llama, job, s)
    assert m["block"].activations > m["loss"].activations  # the recomputed layer
    assert m["block"].gradients == llama.vocab * llama.hidden * 2


def test_bf16_weights_make_bf16_activations_whatever_the_precision():
    """`weights: bf16` casts the model to bf16 (model/adapters.apply_adapter), so a run whose precision is fp32 (the
    fp32-only CPU class's auto) saves bf16 activations; fp32 weights at fp32 precision save fp32 ones."""
    from tunelab.plan import catalog
    from tunelab.plan.estimate import Device, compute_bytes

    device = Device(catalog.gpu("h100-sxm"), 0)
    job, _ = plan_setup(method="full", targets=(), precision="fp32")
    assert compute_bytes(job, device) == 4
    assert compute_bytes(job.but(weights="bf16"), device) == 2
    lora, _ = plan_setup(precision="fp32", weights="bf16")  # LoRA keeps its base in the compute dtype
    assert compute_bytes(lora, device) == 4
