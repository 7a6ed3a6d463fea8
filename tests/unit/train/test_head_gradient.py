"""The trained LM head's gradient, made in backward one vocabulary slice at a time (train/loss.head_weight_grad),
against the forward-summed path it replaced and against whole-logits autograd: tied and untied heads, fp32
weights, bf16 weights and fp32 weights under bf16 autocast; and the fp32 sum the size of the head neither saved
for backward nor allocated at all."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from tunelab.train.loss import score_tokens, token_loss_sum

VOCAB, HIDDEN = 97, 16


def _forward_summed_grad(hidden, weight, targets, softcap, chunk):
    """The replaced path, as it was: each chunk's softmax - onehot (through the soft cap) rounded to the compute
    dtype, its product with the rows added into one fp32 sum of the head's shape."""
    w = weight.detach().to(hidden.dtype)
    total = torch.zeros_like(weight, dtype=torch.float32)
    for start in range(0, hidden.shape[0], chunk):
        h, t = hidden[start : start + chunk].detach(), targets[start : start + chunk]
        raw = (h @ w.T).float()
        logits = torch.tanh(raw / softcap) * softcap if softcap else raw
        grad = torch.softmax(logits, dim=-1)
        grad[torch.arange(len(t)), t] -= 1.0
        if softcap:
            grad = grad * (1.0 - torch.tanh(raw / softcap).square())
        total += grad.to(hidden.dtype).T @ h
    return total


class _Model(torch.nn.Module):
    """An embedding, one mixing matrix and a head that is the embedding (tied) or its own matrix."""

    def __init__(self, tied: bool, dtype: torch.dtype):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.embed = torch.nn.Parameter((torch.randn(VOCAB, HIDDEN, generator=g) * 2).to(dtype))
        self.mix = torch.nn.Parameter(torch.randn(HIDDEN, HIDDEN, generator=g).to(dtype) / 4)
        self.head = self.embed if tied else torch.nn.Parameter((torch.randn(VOCAB, HIDDEN, generator=g) * 2).to(dtype))

    def hidden(self, ids):
        return torch.tanh(self.embed[ids].float() @ self.mix.float().T)


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, 40), generator=g)
    index = torch.tensor([0, 3, 7, 8, 20, 39, 41, 50, 66, 79])
    # targets on both sides of the slice boundaries of chunk=3 (slices of 3 * 97 // 10 = 29 rows of the head)
    targets = torch.tensor([0, 28, 29, 57, 58, 86, 87, 96, 5, 29])
    return ids, index, targets


def _grads(model, loss):
    params = [model.embed, model.mix] + ([] if model.head is model.embed else [model.head])
    return [g.float() for g in torch.autograd.grad(loss, params)]


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("softcap", [None, 30.0])
def test_fp32_head_gradient_matches_whole_logits_and_the_forward_summed_path(tied, softcap):
    """fp32 weights and compute: the loss and the gradients of every parameter (the hidden states' through the
    mixing matrix, the head's, a tied head's summed with the embedding's) equal whole-logits autograd to 1e-5 of
    their scale, and the head's equals the replaced forward-summed path's to the same tolerance."""
    model = _Model(tied, torch.float32)
    ids, index, targets = _batch()
    got = token_loss_sum(model.hidden(ids), model.head, index, targets, softcap, chunk=3)
    got_grads = _grads(model, got)

    logits = model.hidden(ids).reshape(-1, HIDDEN)[index] @ model.head.T
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    want = F.cross_entropy(logits, targets, reduction="sum")
    want_grads = _grads(model, want)
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    for g, w in zip(got_grads, want_grads):
        assert torch.allclose(g, w, rtol=0, atol=1e-5 * w.abs().max().item())

    hidden = model.hidden(ids).reshape(-1, HIDDEN)[index].detach()  # the head's own part, without a tied input's
    old = _forward_summed_grad(hidden, model.head, targets, softcap, 3)
    new = torch.autograd.grad(
        token_loss_sum(hidden, model.head, torch.arange(len(index)), targets, softcap, 3), model.head
    )
    assert torch.allclose(new[0], old, rtol=0, atol=1e-5 * old.abs().max().item())


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("mode", ["bf16-weights", "fp32-weights-bf16-autocast"])
def test_low_precision_head_gradient_matches_the_forward_summed_path(tied, mode):
    """bf16 weights (this CPU class computes in fp32: the gradient is rounded to bf16 once) and fp32 weights under
    bf16 autocast (each slice's bf16 product widened into the fp32 gradient): the head's gradient, in the weight's
    dtype, within 1% of the replaced path's largest value (bf16's 8-bit mantissa: 0.4% a rounding)."""
    bf16_weights = mode == "bf16-weights"
    model = _Model(tied, torch.bfloat16 if bf16_weights else torch.float32)
    ids, index, targets = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not bf16_weights):
        hidden = model.hidden(ids).detach()  # bf16 under autocast, fp32 otherwise
        loss = token_loss_sum(hidden, model.head, index, targets, chunk=3)
    (grad,) = torch.autograd.grad(loss, model.head)
    assert grad.dtype == model.head.dtype
    old = _forward_summed_grad(hidden.reshape(-1, HIDDEN)[index], model.head, targets, None, 3)
    assert torch.allclose(grad.float(), old, rtol=0, atol=1e-2 * old.abs().max().item())


def test_score_tokens_head_gradient_with_per_token_factors():
    """The per-token face (preference objectives, GRPO) makes the head's gradient the same way, each row's incoming
    factor inside the sum: equal to whole-logits autograd, tempered and soft-capped."""
    torch.manual_seed(0)
    hidden = torch.randn(2, 30, HIDDEN, requires_grad=True)
    weight = (torch.randn(VOCAB, HIDDEN) * 3).requires_grad_(True)
    index = torch.tensor([0, 4, 9, 29, 31, 40, 59])
    targets = torch.tensor([0, 40, 41, 96, 13, 82, 83])
    scale = torch.linspace(-1.0, 2.0, 7)
    logps = score_tokens(hidden, weight, index, targets, 30.0, chunk=2, temperature=0.7).logps
    logits = torch.tanh((hidden.reshape(-1, HIDDEN)[index] @ weight.T) / 30.0) * 30.0
    want = F.log_softmax(logits / 0.7, dim=-1).gather(1, targets[:, None]).squeeze(1)
    got = torch.autograd.grad((logps * scale).sum(), weight)[0]
    expected = torch.autograd.grad((want * scale).sum(), weight)[0]
    assert torch.allclose(got, expected, rtol=0, atol=1e-5 * expected.abs().max().item())


def test_more_rows_than_a_chunk_of_logits_holds():
    """A vocabulary so small that the rows outnumber a chunk's logits (60 rows, 5 x 2): slices of one head row."""
    torch.manual_seed(0)
    hidden = torch.randn(60, HIDDEN, requires_grad=True)
    weight = torch.randn(5, HIDDEN, requires_grad=True)
    targets = torch.randint(0, 5, (60,))
    got = torch.autograd.grad(token_loss_sum(hidden, weight, torch.arange(60), targets, chunk=2), weight)[0]
    want = torch.autograd.grad(F.cross_entropy(hidden @ weight.T, targets, reduction="sum"), weight)[0]
    assert torch.allclose(got, want, rtol=0, atol=1e-5 * want.abs().max().item())


class _Fp32HeadSized(TorchDispatchMode):
    """The distinct fp32 storages of at least `numel` values that any operation returns."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.storages = numel, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.numel() >= self.numel:
                self.storages.add(t.untyped_storage().data_ptr())
        return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_no_fp32_head_sized_sum_is_saved_or_made(dtype):
    """The forward saves nothing the size of the head but the head itself, and no fp32 tensor the size of the head
    is made in forward or backward beyond the gradient itself (fp32 weights) or at all (bf16 weights, computed in
    bf16). The replaced path saved an fp32 sum of the head's shape and, for fp32 weights, made a second for the
    result."""
    weight = (torch.randn(VOCAB, HIDDEN) * 3).to(dtype).requires_grad_(True)
    hidden = torch.randn(10, HIDDEN, dtype=dtype, requires_grad=True)  # no cast of the head in the forward
    targets = torch.randint(0, VOCAB, (10,))
    with _Fp32HeadSized(weight.numel()) as made:
        loss = token_loss_sum(hidden, weight, torch.arange(10), targets, chunk=3)
        saved = [t for t in loss.grad_fn.saved_tensors if t is not None]
        torch.autograd.grad(loss, (hidden, weight))
    others = [t for t in saved if t.untyped_storage().data_ptr() != weight.untyped_storage().data_ptr()]
    assert all(t.numel() < weight.numel() for t in others)
    made.storages.discard(weight.untyped_storage().data_ptr())
    assert len(made.storages) == (1 if dtype == torch.float32 else 0)
