"""plan's preference terms: DPO's reference forward (FLOPs and its transient memory), a frozen reference copy for
full fine-tuning, none of either for ORPO or a precomputed reference; pairs packed as units."""

import numpy as np
from test_plan import setup, small_arch

from tunelab import objectives
from tunelab.config import BatchConfig
from tunelab.plan import memory, workload
from tunelab.plan.flops import attention_forward, reference_flops_per_token


def test_reference_forward_flops():
    a = small_arch()
    forward = 2.0 * a.matmul_params + attention_forward(a, 64)
    dpo, orpo = objectives.get("dpo"), objectives.get("orpo")
    assert reference_flops_per_token(a, dpo, 64, precompute=False, epochs=3) == forward
    assert reference_flops_per_token(a, dpo, 64, precompute=True, epochs=3) == forward / 3  # once, not per epoch
    assert reference_flops_per_token(a, orpo, 64, precompute=False, epochs=1) == 0.0


def test_reference_memory():
    a = small_arch()
    plain = memory.breakdown(a, *setup())
    forward = memory.breakdown(a, *setup(reference_forward=True))
    per_layer = memory.row_bytes_per_token_layer(a, *setup())
    assert forward.activations == plain.activations + round(per_layer * 2 * 10)
    assert forward.weights == plain.weights  # the adapter disabled: no second copy
    full = memory.breakdown(a, *setup(method="full", reference_copy=True, reference_forward=True))
    full_sft = memory.breakdown(a, *setup(method="full"))
    assert full.weights == full_sft.weights + a.total_params * 4


def test_pairs_pack_as_units():
    """Counted as train batches them: a pair's two sequences never straddle rows, so rows hold even counts."""
    lengths = np.array([30, 20] * 8)
    b = workload.Batching(BatchConfig(seq_len=64, micro_batch=2, grad_accum=1, packing=True), group=2)
    held = workload.Lengths(16, 25.0, 5.0, "test", lengths)
    grouped = workload.epoch_counts(held, b)
    assert grouped.rows == 8  # one 50-token pair per 64-token row
    assert grouped.tokens_nonpad == 400 and grouped.tokens_padded == 8 * 64


def test_shorter_seq_len_suggestion_keeps_both_sides_of_a_pair():
    """Each side of a pair is cut to seq_len // 2, so the suggested seq_len holds twice the longest side."""
    from tunelab.plan.estimate import shortest_seq_len

    lengths = workload.Lengths(40, 95.0, 50.0, "test", np.array([100, 90] * 20))
    assert shortest_seq_len(lengths, 1) == (104, "longest example: 100 tokens, nothing truncated")
    assert shortest_seq_len(lengths, 2) == (200, "longest side of a pair: 100 tokens, nothing truncated")
    assert shortest_seq_len(lengths, objectives.get("orpo").sequences)[0] == 200
