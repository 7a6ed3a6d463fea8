"""FLOPs per token of a training step, method-aware. Derivations (see docs/formulas.md):

- A matmul of a token through a (d_in x d_out) weight costs 2·d_in·d_out FLOPs (multiply + add).
  Summed over every weight that takes part in a matmul (N, the LM head included) the forward costs 2N.
- Backward of a linear layer is two matmuls of the same size: the input gradient (2·d_in·d_out) and the
  weight gradient (2·d_in·d_out). Full fine-tuning needs both: 6N per token in all (Kaplan et al. 2020,
  arXiv 2001.08361, Sec. 2.1). A frozen weight (LoRA/QLoRA/DoRA base) needs only the input gradient:
  4N. Evidence for 4N: LoRA (arXiv 2106.09685, Sec. 4.2 / Table 13) measured 43.1 vs 32.5 tokens/s per
  V100 for GPT-3 LoRA vs full fine-tuning with recomputation, a ratio of 1.33 = (6N+2N)/(4N+2N).
- Attention scores QKᵀ and the weighted sum AV: each 2·T·(H·Q) per token and layer in the forward,
  so 4·L·H·Q·T forward and 12·L·H·Q·T forward + backward. PaLM (arXiv 2204.02311, Appendix B) counts it
  so, without halving for the causal mask; we do the same for `mfu`. The useful attention counts only the
  keys a query needs, causal within its own document: 12·L·H·Q·k with k = Σ l(l+1)/2 / Σ l over the
  documents' lengths l (`useful`, the headline MFU). These matmuls have no weights, so frozen or
  not they cost the same: the 12·L·H·Q·T term is method-independent.
- A LoRA adapter on a (d_in x d_out) weight is two trainable matmuls, A (d_in x r) and B (r x d_out):
  6·r·(d_in + d_out) per token (forward 2, backward 4, like any trained weight).
- Gradient checkpointing recomputes the forward of every block during the backward: 2N_blocks +
  4·L·H·Q·T + the adapters' forward. It is hardware work, not model work: MFU excludes it, HFU counts it
  (docs/metrics.md; Korthikanti et al. 2022, arXiv 2205.05198, Sec. 6 define the same split).
- QLoRA's dequantization and DoRA's weight-norm are memory-bound, not matmul FLOPs, and are not counted here
  (the step model counts the dequantization's bytes: steptime.step_bytes).
- Mixture-of-Experts: a token goes through top_k of a sparse layer's experts (and its shared expert and router),
  so N, the adapters' and the recomputed forward's FLOPs count the active weights (Arch.matmul_params,
  adapter_params(active=True)); memory counts them all (plan/memory.py). Routing imbalance changes which
  expert does the work, not how much: it is the step model's (steptime.gemm_shapes), not a FLOP.
- DoRA with LoRA dropout in training: peft's layer computes the base product a second time, on the dropped
  input (its magnitude scales W·drop(x), not the W·x already computed), so each adapted matrix adds
  2·d_in·d_out forward and 2·d_in·d_out for that product's input gradient: 4·Σ d_in·d_out per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import methods
from ..objectives import Objective
from .arch import Arch


@dataclass(frozen=True)
class FlopsPerToken:
    dense: float  # weight matmuls (frozen and trained base weights, LM head)
    attention: float  # QKᵀ and AV
    adapters: float  # LoRA A and B
    recompute: float  # gradient checkpointing's second forward (hfu only)
    # Attention over the keys each query really needs: causal within its own document (0: not counted, the
    # whole-row `attention` stands in).
    attention_useful: float = 0.0
    reference: float = 0.0  # a preference objective's reference forward (reference_flops_per_token)

    @property
    def model(self) -> float:
        """model_flops_per_token (docs/metrics.md): what the method costs, recomputation excluded."""
        return self.dense + self.attention + self.adapters + self.reference

    @property
    def useful(self) -> float:
        """useful_flops_per_token (docs/metrics.md): model FLOPs with attention counted document-causal."""
        return self.dense + (self.attention_useful or self.attention) + self.adapters

    @property
    def hardware(self) -> float:
        return self.model + self.recompute


def attention_forward(arch: Arch, attn_len: int) -> float:
    return 4.0 * arch.layers * arch.heads * arch.head_dim * attn_len


def adapter_params(arch: Arch, targets: tuple[str, ...], r: int, active: bool = False) -> float:
    """Trainable LoRA parameters: r·(d_in + d_out) per adapted matrix (each expert its own); `active`: those one
    token's matmuls go through (top_k of a sparse layer's experts)."""
    return sum(r * (m.d_in + m.d_out) * (m.active if active else m.count) for m in arch.modules() if m.name in targets)


def flops_per_token(
    arch: Arch,
    method: str,
    targets: tuple[str, ...],
    r: int,
    attn_len: int,
    grad_ckpt: bool,
    lora_dropout: float = 0.0,
    doc_keys: float = 0.0,
) -> FlopsPerToken:
    """`attn_len`: the attention context length T (the fed row width: seq_len when packed). `doc_keys`: the mean
    keys a query attends to within its own document, causal (plan/steptime.attention_keys of the data's
    lengths), for the useful attention; 0 leaves it uncounted."""
    n = arch.matmul_params
    attn_fwd = attention_forward(arch, attn_len)
    if methods.get(method).trains_base:
        dense, adapters, adapter_fwd = 6.0 * n, 0.0, 0.0
    else:
        a = adapter_params(arch, targets, r, active=True)
        dense, adapters, adapter_fwd = 4.0 * n, 6.0 * a, 2.0 * a
    second_base = 0.0  # DoRA's base product on the dropped input (module docstring)
    if methods.get(method).magnitude and lora_dropout > 0:
        second_base = 2.0 * sum(m.active * m.d_in * m.d_out for m in arch.modules() if m.name in targets)
        dense += 2.0 * second_base
    # The LM head sits outside the checkpointed blocks, so its forward is not recomputed.
    recompute = 2.0 * arch.active_block_params + attn_fwd + adapter_fwd + second_base if grad_ckpt else 0.0
    useful = 3.0 * 4.0 * arch.layers * arch.heads * arch.head_dim * doc_keys
    return FlopsPerToken(
        dense=dense, attention=3.0 * attn_fwd, adapters=adapters, recompute=recompute, attention_useful=useful
    )


def forward_flops_per_token(arch: Arch, method: str, targets: tuple[str, ...], r: int, attn_len: int) -> float:
    """FLOPs of one token's forward alone: what an evaluation pass costs (no backward, no recomputation).

    Derived from the step's terms above by keeping only their forward part:
    - weight matmuls: 2N, whatever the method. Full fine-tuning's 6N is 2N forward + 4N backward, so the
      forward is 1/3 of it; LoRA's 4N (frozen base) is 2N forward + 2N input gradients, so 1/2 of it.
    - attention: the forward's 4·L·H·Q·T, 1/3 of the step's 12·L·H·Q·T.
    - adapters: 2·r·(d_in + d_out) per adapted matrix, 1/3 of their 6·r·(d_in + d_out).
    A full fine-tuning forward is therefore exactly 1/3 of its step (6N + 12·L·H·Q·T + 0); a LoRA forward
    is (2N + 4LHQT + 2A) / (4N + 12LHQT + 6A), about 1/2 of its step when the adapters A are small beside N.
    """
    adapters = 0.0 if methods.get(method).trains_base else 2.0 * adapter_params(arch, targets, r, active=True)
    return 2.0 * arch.matmul_params + attention_forward(arch, attn_len) + adapters


def reference_flops_per_token(
    arch: Arch, objective: Objective, attn_len: int, precompute: bool, epochs: float
) -> float:
    """DPO's reference log-probabilities: one forward without gradients of every fed token, 2N + 4·L·H·Q·T (the
    adapter disabled, or a frozen copy: no adapter term); precomputed, that forward runs once over the data
    instead of once per epoch. Zero for objectives without a reference (sft, orpo)."""
    if not objective.reference:
        return 0.0
    forward = 2.0 * arch.matmul_params + attention_forward(arch, attn_len)
    return forward / max(epochs, 1.0) if precompute else forward
