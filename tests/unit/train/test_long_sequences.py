"""Long rows on the path a CPU trains (per-sequence slots, SDPA for slots over MATH_MAX_LEN, the chunked loss):
no tensor grows with T² or holds the whole row's logits, and what the forward saves grows linearly in T."""

import pytest
import torch
from conftest import make_tiny_llama
from torch.utils._python_dispatch import TorchDispatchMode

from tunelab.data.packing import layout_from_lengths
from tunelab.model import attention
from tunelab.runtime import LOGIT_CHUNK
from tunelab.train.loss import CausalLMLoss

VOCAB = 4096


class Largest(TorchDispatchMode):
    """The largest tensor any operation returns."""

    def __init__(self):
        super().__init__()
        self.bytes = 0
        self.shape = ()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.numel() * t.element_size() > self.bytes:
                self.bytes, self.shape = t.numel() * t.element_size(), tuple(t.shape)
        return out


def _step(model, width: int) -> tuple[int, tuple, int]:
    """(largest tensor's bytes, its shape, bytes saved for backward) of one training step over a row of two
    documents of width/2 tokens each."""
    half = width // 2
    ids = torch.randint(3, VOCAB, (1, width), generator=torch.Generator().manual_seed(width))
    positions = torch.cat([torch.arange(half), torch.arange(half)])[None]
    loss_index = torch.arange(width)
    layout = layout_from_lengths([[half, half]], width)
    saved = []

    def keep(t):
        saved.append(t.untyped_storage().nbytes())
        return t

    largest = Largest()
    with largest, torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        loss = model(ids, positions, loss_index, ids.view(-1), layout)
        loss.backward()
    return largest.bytes, largest.shape, sum(saved)


@pytest.mark.slow
def test_memory_grows_linearly_to_8192_tokens():
    torch.manual_seed(0)
    model = make_tiny_llama(VOCAB, max_position_embeddings=16384)
    model.set_attn_implementation(attention.register("slots"))
    model = CausalLMLoss(model).train()
    small, _, saved_small = _step(model, 2048)
    big, shape, saved_big = _step(model, 8192)
    # 4x the tokens: linear buffers grow 4x, a T x T one 16x; the logits only ever as a chunk of LOGIT_CHUNK rows
    assert big <= 4.5 * small, shape
    assert big < 8192 * VOCAB * 4 / 4, shape  # far under one fp32 logits row per token
    assert big < 8192 * 8192 * 2, shape  # no T x T buffer, even in bf16
    assert max(LOGIT_CHUNK * VOCAB * 4, 8192 * 128 * 4) >= big, shape
    assert 3.5 * saved_small <= saved_big <= 4.5 * saved_small
