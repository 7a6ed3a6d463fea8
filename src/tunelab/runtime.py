"""Facts of tunelab's own forward that plan models, torch-free: training code and plan's formulas read them from
here, so a prediction and the run it predicts cannot drift apart (and `tunelab plan` never imports torch).
"""

from __future__ import annotations

from dataclasses import dataclass

# Tokens per chunk of the fused head+loss (train/loss.py): 256 x 49k fp32 logits is 50 MB, small enough to stay
# hot in cache between the passes over it (max, exp, gradient), large enough for an efficient matmul.
LOGIT_CHUNK = 256

# Longest attention slot a CPU runs as explicit products (model/attention._SlotAttention, which writes its L x L
# scores) rather than SDPA's flash kernel, by (compiled block, 16-bit products): the crossovers measured over head
# widths 32-128 (benchmarks/attention/slot-crossover_epyc-avx512bf16-2c_2026-12-07.md). Compiled, inductor fuses
# the products' softmax and its gradient into the score passes; eager, each is a pass of its own over the scores,
# so the flash kernel wins at shorter slots, and in fp32 (where it needs no bf16 conversions) shorter still.
SLOT_MAX_LEN = {(True, True): 256, (True, False): 128, (False, True): 64, (False, False): 32}

# Values of a bf16 weight stepped at once (train/optim.PerParameter): each piece goes through an fp32 copy of the
# weight and of its gradient, so a 525M-value embedding costs 2 x 32 MiB of temporaries, not 2 x 2 GiB. A multiple
# of 256, bitsandbytes' quantization block, so chunked 8-bit states quantize exactly as one tensor's would.
STEP_CHUNK = 1 << 23

# Rows from which the CPU sampler reorders fp32 (or bf16) weights once for the few-row decode products
# (model/prepack.py): one more copy of every linear weight, the LM head's included, while a generation lasts
# (plan/generation.py counts it).
PREPACK_MIN_ROWS = 8
# CPU capabilities the reordered product runs on (torch.backends.cpu.get_cpu_capability prefixes).
PREPACK_CAPABILITIES = ("AVX2", "AVX512")

# torch.compile's activation memory budget (AOTAutograd's partitioner; 1.0 keeps whatever is cheapest to
# keep; recipes/finetune.compile_blocks sets it). 0.9 recomputes norm outputs and one MLP tensor per layer, which
# lowered the quickstart's peak memory at no clear speed cost, where 0.5 saved more but cost speed
# (benchmarks/design-decisions_cpu_2026-11-22.md#activation-memory-budget).
ACTIVATION_MEMORY_BUDGET = 0.9


def slot_max_len(compiled: bool, half: bool) -> int:
    """The longest slot run as explicit products in a compiled (or eager) block whose products are 16-bit
    (`half`) or fp32 (SLOT_MAX_LEN)."""
    return SLOT_MAX_LEN[(bool(compiled), bool(half))]


def slot_products(device_type: str, length: int, dropout: float, compiled: bool, half: bool) -> bool:
    """Whether slots of `length` run as explicit products (`_SlotAttention`, which keeps its bf16
    probabilities for backward) rather than SDPA (which keeps a log-sum-exp); plan's memory model asks too."""
    return device_type == "cpu" and length <= slot_max_len(compiled, half) and not dropout


def attention_path(choice: str, device_type: str, flash_attn: bool = False, sinks: bool = False) -> str:
    """What the `attention` setting (config.ATTENTIONS) runs on a device: flex | slots | sdpa | flash
    (flash-attn's varlen kernels). `auto` keeps the slot path on CPU, where it is tuned and where
    FlexAttention has no backward; a model with attention `sinks` (gpt-oss) takes flex on CUDA, since
    flash-attn 2 has no sinks. plan's memory model asks too."""
    if choice != "auto":
        return choice
    if device_type != "cuda":
        return "slots"
    return "flash" if flash_attn and not sinks else "flex"


def hashed_dropout(device_type: str, compiled: bool) -> bool:
    """Whether LoRA dropout draws its keep mask from an index hash, which backward draws again, rather than
    from torch.rand, whose mask backward keeps (model/lora_linear.py): compiled on CPU, where inductor's
    random numbers are slow. plan's memory model asks too."""
    return device_type == "cpu" and compiled


COMPILE_MODES = ("auto", "true", "false")


def compile_mode(setting: bool | str) -> str:
    """The `compile` setting as one of COMPILE_MODES: booleans (YAML true/false) force it, `auto` decides."""
    if isinstance(setting, bool):
        return "true" if setting else "false"
    return str(setting)


@dataclass(frozen=True)
class CompileChoice:
    """Whether a run compiles its decoder blocks (`chosen`), the setting it came from (`mode`: true, false, auto)
    and why, as a line plan, bench and train print; `as_dict` is its form in summary.json and plan's JSON."""

    mode: str
    chosen: bool
    why: str

    def as_dict(self) -> dict:
        return {"mode": self.mode, "chosen": self.chosen, "why": self.why}


def compile_choice(
    setting: bool | str, device_type: str, eager_train_s: float | None, compile_s: float, speedup: float
) -> CompileChoice:
    """Whether a run compiles its decoder blocks, and why. `true`/`false` force it; `auto` compiles when the time
    compiled blocks save over the run's predicted eager training time (eager_train_s x (1 - 1/speedup)) exceeds
    torch.compile's one-off cost `compile_s`, both the catalog's for `device_type` (plan/catalog/gpus.yaml).
    plan, bench and train all decide through this function."""
    mode = compile_mode(setting)
    if mode != "auto":
        return CompileChoice(mode, mode == "true", f"compile: {mode} in the config")
    if eager_train_s is None:
        return CompileChoice(mode, False, "compile auto: no time prediction for this run, eager blocks")
    saved = eager_train_s * (1.0 - 1.0 / speedup)
    chosen = saved > compile_s
    verdict = "compiled blocks" if chosen else "eager blocks"
    relation = ">" if chosen else "<="
    return CompileChoice(
        mode,
        chosen,
        f"compile auto: {verdict} on {device_type}: compiling would save ~{saved:.0f} s of a predicted "
        f"{eager_train_s:.0f} s eager run ({speedup:.2f}x) {relation} its one-off cost of ~{compile_s:.0f} s",
    )
