"""The model as one module that returns the summed token loss, with the LM head applied only where needed.

Why not `model(input_ids, labels=...)`: that computes logits for every position (B·T·V, 49k vocab here)
and upcasts them all to fp32 for the loss. With prompt masking most positions have no target. We gather
the hidden states at the target positions first (indices computed on the host: no sync), then run the
head and the cross-entropy in chunks under activation checkpointing, so at most one chunk of fp32 logits
exists at a time, in the forward and in the backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..data.packing import SeqLayout
from ..model import attention

LOGIT_CHUNK = 2048


def _chunk_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, softcap: float | None) -> torch.Tensor:
    logits = F.linear(hidden, weight).float()
    if softcap:  # Gemma-2 style final-logit soft-capping
        logits = torch.tanh(logits / softcap) * softcap
    return F.cross_entropy(logits, targets, reduction="sum")


def token_loss_sum(
    hidden: torch.Tensor, weight: torch.Tensor, loss_index: torch.Tensor, loss_targets: torch.Tensor,
    softcap: float | None = None, chunk: int = LOGIT_CHUNK,
) -> torch.Tensor:
    """Sum of cross-entropy over the positions in `loss_index` (flat indices into hidden's B·T)."""
    selected = hidden.reshape(-1, hidden.shape[-1]).index_select(0, loss_index)
    if selected.shape[0] <= chunk:
        return _chunk_loss(selected, weight, loss_targets, softcap)
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, selected.shape[0], chunk):
        part = slice(start, start + chunk)
        total = total + checkpoint(
            _chunk_loss, selected[part], weight, loss_targets[part], softcap, use_reentrant=False
        )
    return total


class CausalLMLoss(torch.nn.Module):
    """Wraps a (peft-wrapped) causal LM; forward returns the summed loss, so DDP/autocast wrap it as usual."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        self.packed_attention = getattr(model.config, "_attn_implementation", None) == attention.NAME

    def forward(self, input_ids, position_ids, loss_index, loss_targets, layout: SeqLayout | None = None) -> torch.Tensor:
        decoder = self.model.get_decoder()
        extra = attention.layout_tensors(layout, input_ids.device) if layout is not None and self.packed_attention else {}
        out = decoder(input_ids=input_ids, position_ids=position_ids, use_cache=False, **extra)
        head = self.model.get_output_embeddings()
        return token_loss_sum(out.last_hidden_state, head.weight, loss_index, loss_targets, self.softcap)
