import pytest
import torch
import torch.nn.functional as F

from tunelab.train.loss import score_tokens, token_loss_sum


@pytest.mark.parametrize("softcap", [None, 30.0])
@pytest.mark.parametrize("train_weight", [False, True])
def test_fused_linear_cross_entropy_matches_reference(softcap, train_weight):
    torch.manual_seed(0)
    hidden = torch.randn(3, 50, 16, requires_grad=True)
    weight = (torch.randn(97, 16) * 3).requires_grad_(train_weight)
    index = torch.tensor([0, 5, 7, 49, 60, 99, 149])
    targets = torch.randint(0, 97, (7,))

    got = token_loss_sum(hidden, weight, index, targets, softcap, chunk=3)  # chunks of 3: 7 = 3 + 3 + 1
    got.backward()
    got_grads = (hidden.grad.clone(), None if not train_weight else weight.grad.clone())
    hidden.grad = None
    if train_weight:
        weight.grad = None

    logits = hidden.reshape(-1, 16)[index] @ weight.T
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    want = F.cross_entropy(logits, targets, reduction="sum")
    want.backward()
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    assert torch.allclose(got_grads[0], hidden.grad, atol=1e-5)
    if train_weight:
        assert torch.allclose(got_grads[1], weight.grad, atol=1e-4)


def test_fused_loss_under_bf16_autocast_is_close_to_fp32():
    torch.manual_seed(0)
    hidden = torch.randn(2, 40, 32)
    weight = torch.randn(500, 32) * 0.2
    index = torch.arange(0, 80, 3)
    targets = torch.randint(0, 500, (len(index),))
    exact = token_loss_sum(hidden, weight, index, targets).item()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        approx = token_loss_sum(hidden, weight, index, targets).item()
    # bf16 logits (8-bit mantissa) over a 32-wide dot product: ~0.5% on the summed loss
    assert approx == pytest.approx(exact, rel=1e-2)


@pytest.mark.parametrize("softcap", [None, 30.0])
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logps_and_entropy_match_full_logits(softcap, grad, temperature):
    """The per-token face of the same chunked head (preference objectives, objectives scoring sampled tokens):
    log-probs with gradients for hidden and a trained head, and each position's entropy, in one pass; at a
    sampling temperature, those of the soft-capped logits divided by it (TRL's GRPO scoring)."""
    torch.manual_seed(0)
    hidden = torch.randn(2, 30, 16, requires_grad=True)
    weight = (torch.randn(97, 16) * 3).requires_grad_(True)
    index = torch.tensor([0, 4, 9, 29, 31, 40, 59])
    targets = torch.randint(0, 97, (7,))
    scale = torch.linspace(-1.0, 2.0, 7)

    with torch.set_grad_enabled(grad):
        logps, entropy = score_tokens(
            hidden, weight, index, targets, softcap, chunk=3, entropy=True, temperature=temperature
        )
        alone = score_tokens(hidden, weight, index, targets, softcap, chunk=3, temperature=temperature)
    assert torch.equal(logps, alone.logps) and alone.entropy is None
    logits = hidden.reshape(-1, 16)[index] @ weight.T
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    log_probs = F.log_softmax(logits / temperature, dim=-1)
    want = log_probs.gather(1, targets[:, None]).squeeze(1)
    assert torch.allclose(logps, want, atol=1e-5)
    assert torch.allclose(entropy, -(log_probs.exp() * log_probs).sum(-1), atol=1e-5)
    assert not entropy.requires_grad
    if grad:
        got = torch.autograd.grad((logps * scale).sum(), (hidden, weight))
        expected = torch.autograd.grad((want * scale).sum(), (hidden, weight))
        assert torch.allclose(got[0], expected[0], atol=1e-5) and torch.allclose(got[1], expected[1], atol=1e-4)
