"""A GRPO step's time and memory by part (objective grpo, train/grpo.py): sampling (prefill and decode), the
scoring passes (log-probs at generation with num_iterations > 1, the reference's with beta > 0) and the update.

Sampling is eval/sampling.py's loop: one prefill of the distinct prompts (2·N FLOPs per token, compute-bound; the G
rows of a prompt copy its cache), then
one forward per completion token over every row, which reads the weights and the KV cache once each (decode is
memory-bound at small batch: Pope et al. 2022, §3.1), so its time is the larger of bytes over the bandwidth and
FLOPs over the peak times the fraction of it products of B rows reach (a GRPO fit's `decode_flop_efficiency`,
else 1), plus the per-op cost of one forward at batch B (plan/steptime.py's launch count times seconds per op: a
GRPO fit's `decode_op_s` where the device has one, catalog/grpo.yaml, else the step fit's launch_s). On a CPU
that per-op cost is far above a launch (dispatch and framework code around each of a decode step's ~2,000 small
ops), and a 16-row product runs well below the peak (benchmarks/grpo/). The decode runs until the batch's longest
completion stops: max_completion_length unless the caller knows better (a trial run's, plan/grpo.py), an
upper bound, as a tuned model stops at EOS earlier; on the machine a trial ran on, its measured times scale
both sampling and the rest (plan/grpo.py `trial_rates`). The KV cache holds 2 (K, V) x layers x kv_heads x head_dim values per token of every
row. A scoring pass is one forward without gradients over the rows: a third of a training step's FLOPs
(forward 2·N, backward 4·N per token), so it is taken as a third of the update's predicted time. The update
and the scoring passes are then scaled by the device's GRPO fit (`update_scale`, `scoring_scale`): plan's step
model is fitted on packed SFT rows, and GRPO's rows are right-padded prompt + completion. With beta 0 the update
runs over the completions whose advantage is not 0 only (train/grpo.py), a share the caller gives (default all).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import runtime
from .arch import Arch


@dataclass(frozen=True)
class Generation:
    rows: int  # completions sampled per generation batch (prompts x G)
    prompt_tokens: float  # their mean prompt length
    completion_tokens: float  # the decode steps: the batch's longest completion, the cap unless known
    prefill_s: float
    decode_s: float
    decode_bytes: float  # bytes read per decode step, at the mean context
    kv_cache_bytes: int  # the KV cache at the last decode step

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s


def kv_bytes_per_token(arch: Arch, compute_bytes: int) -> int:
    return 2 * arch.layers * arch.kv_heads * arch.head_dim * compute_bytes


# Bytes per vocabulary entry of a decode step's row (eval/sampling.pick): the fp32 logits, the tempered
# probabilities and the fp64 running sum the draw searches, alive at once.
DECODE_LOGIT_BYTES = 4 + 4 + 8


@dataclass(frozen=True)
class SamplingMemory:
    """What a generation batch holds beside the trained model while it samples (eval/sampling.py)."""

    kv_cache: int  # K and V of every row at its last decode step
    logits: int  # one decode step's logits, probabilities and running sums
    packed_weights: int  # the weights laid out again for decoding (model/prepack.py), on a CPU

    @property
    def total(self) -> int:
        return self.kv_cache + self.logits + self.packed_weights


def sampling_memory(
    arch: Arch, gen: Generation, compute_bytes: int, on_cpu: bool, adapter_unpacked: bool, fp32_master: bool = False
) -> SamplingMemory:
    """The sampler's memory for `gen`: its KV cache, one step's logits, and on a CPU the weights it lays out again
    for the length of the call: every linear weight reordered in the compute dtype from PREPACK_MIN_ROWS rows (the
    LM head included; fp32, or bf16 weights (a bf16 LoRA layer's [W | sB]) where the run computes in bf16, but not
    full fine-tuning's fp32 master weights under bf16 autocast, `fp32_master`), else, for a policy whose LoRA layers
    hold no packed [W | sB] (`adapter_unpacked`: compiled blocks), a copy of the block weights with sB beside them
    (model/prepack.py)."""
    packed = 0
    reordered = compute_bytes == 4 or (compute_bytes == 2 and not fp32_master)
    if on_cpu and reordered and gen.rows >= runtime.PREPACK_MIN_ROWS:
        packed = arch.matmul_params * compute_bytes
    elif on_cpu and adapter_unpacked:
        packed = arch.block_linear_params * compute_bytes
    logits = gen.rows * arch.vocab * DECODE_LOGIT_BYTES
    return SamplingMemory(gen.kv_cache_bytes, logits, packed)


def generation(
    arch: Arch,
    rows: int,
    prompt_tokens: float,
    completion_tokens: float,
    compute_bytes: int,
    peak_flops: float,
    bandwidth_bps: float,
    step_overhead_s: float = 0.0,
    distinct_prompts: int | None = None,
    decode_flop_efficiency: float = 1.0,
) -> Generation:
    """One generation batch of `rows` completions (see the module's docstring); `step_overhead_s`: the per-op
    time of one forward, paid by the prefill and by every decode step; `distinct_prompts`: the prompts the
    prefill runs over (rows / G), all rows where None."""
    params = arch.total_params
    prefilled = rows if distinct_prompts is None else distinct_prompts
    prefill_s = 2 * params * prefilled * prompt_tokens / peak_flops + step_overhead_s
    kv = kv_bytes_per_token(arch, compute_bytes)
    mean_context = prompt_tokens + completion_tokens / 2
    decode_bytes = params * compute_bytes + kv * rows * mean_context
    decode_flops_s = 2 * params * rows / (peak_flops * decode_flop_efficiency)
    per_step = max(decode_bytes / bandwidth_bps, decode_flops_s) + step_overhead_s
    return Generation(
        rows,
        prompt_tokens,
        completion_tokens,
        prefill_s,
        completion_tokens * per_step,
        decode_bytes,
        int(kv * rows * (prompt_tokens + completion_tokens)),
    )


@dataclass(frozen=True)
class GrpoStep:
    """One generation batch and the optimizer steps on it, in seconds by part."""

    generation: Generation
    scoring_passes: int  # forwards without gradients per generation batch: old log-probs, reference
    update_s: float  # one optimizer step on the batch (plan's step model, times the GRPO fit's update_scale)
    iterations: int  # num_iterations: optimizer steps per generation batch
    scoring_scale: float = 1.0  # the GRPO fit's factor on a scoring pass (a third of the update)
    signal_share: float = 1.0  # the share of completions the update runs over (already in update_s)

    @property
    def scoring_s(self) -> float:
        return self.scoring_passes * self.update_s / 3 * self.scoring_scale

    @property
    def batch_s(self) -> float:
        return self.generation.total_s + self.scoring_s + self.iterations * self.update_s

    def parts(self) -> dict[str, float]:
        return {
            "prefill": self.generation.prefill_s,
            "decode": self.generation.decode_s,
            "scoring passes": self.scoring_s,
            "update": self.iterations * self.update_s,
        }
