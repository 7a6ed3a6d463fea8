"""Bytes sent per GPU per optimizer step (plan/comm.py), counted by hand on the toy architecture."""

import pytest
from test_plan import LLAMA2, plan_json, setup, small_arch

from tunelab.plan import comm, memory


def test_hand_count_per_sharding():
    a = small_arch()
    adapters = 2 * 8 * ((64 + 64) + (64 + 32))  # LoRA r=8 on q_proj, v_proj of 2 layers
    g = adapters * 4  # fp32 gradients of the trainable weights
    w = a.total_params * 2 + adapters * 2  # bf16 frozen base + the adapters, gathered in bf16 as FSDP2 does
    share = 3 / 4
    assert comm.step_bytes(a, *setup(sharding="ddp", world=4), grad_accum=8) == pytest.approx(2 * share * g)
    assert comm.step_bytes(a, *setup(sharding="zero2", world=4), grad_accum=8) == pytest.approx(
        8 * share * g + share * g
    )
    assert comm.step_bytes(a, *setup(sharding="zero3", world=4), 8) == pytest.approx(8 * (2 * share * w + share * g))
    assert comm.step_bytes(a, *setup(sharding="ddp", world=1), 8) == 0.0
    full = setup(method="full", targets=(), sharding="ddp", world=2)
    assert comm.step_bytes(a, *full, 1) == pytest.approx(2 * 0.5 * a.total_params * 4)
    assert memory.trainable_params(a, *full) == a.total_params
    # FSDP2 gathers full fine-tuning's fp32 master weights in the compute dtype; gradients reduce in fp32.
    full3 = setup(method="full", targets=(), sharding="zero3", world=2)
    assert comm.step_bytes(a, *full3, 1) == pytest.approx(2 * 0.5 * a.total_params * 2 + 0.5 * a.total_params * 4)


def test_plan_prints_what_each_strategy_sends(capsys):
    recs = plan_json(capsys, "--model", LLAMA2, "--method", "full", "--examples", "1000", "--gpus", "4")
    multi = {m["sharding"]: m for m in recs[0]["multi_gpu"]}
    fp32_grads = multi["ddp"]["comm_bytes_per_step"] / (2 * 3 / 4)
    assert fp32_grads == pytest.approx(4 * 6.74e9, rel=0.01)  # Llama-2-7B's 6.74B parameters, fp32
    # FSDP2 gathers bf16 weights twice (2 x 2 B) and reduce-scatters fp32 gradients (4 B): DDP's fp32 all-reduce.
    assert multi["zero3"]["comm_bytes_per_step"] == pytest.approx(multi["ddp"]["comm_bytes_per_step"])
    assert recs[0]["comm_bytes_per_step"] == 0.0
