"""train/pair_loss.py: DPO and ORPO on packed pairs equal TRL's computations on padded rows, in fp32."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_tiny_llama

from tunelab.config import AdapterConfig, LoraConfig, ObjectiveConfig, PreferenceConfig
from tunelab.data.examples import IGNORE, DatasetStats, TokenizedData
from tunelab.data.packing import collate
from tunelab.model.adapters import apply_adapter
from tunelab.train.pair_loss import PreferenceLoss, dpo_loss

pytest.importorskip("trl")

# Three pairs: (prompt tokens, chosen response tokens, rejected response tokens).
PAIRS = [
    ([5, 6, 7], [8, 9, 2], [10, 2]),
    ([11, 12], [13, 14, 15, 2], [13, 16, 2]),
    ([17, 18, 19, 20], [21, 2], [22, 23, 24, 2]),
]


def pair_data() -> TokenizedData:
    """The pairs as the pipeline lays them out: chosen at 2i, rejected at 2i + 1, targets shifted."""
    ids, targets = [], []
    for prompt, *sides in PAIRS:
        for response in sides:
            seq = prompt + response
            ids.append(seq)
            targets.append([IGNORE] * (len(prompt) - 1) + response + [IGNORE])
    lengths = np.array([len(s) for s in ids])
    stats = DatasetStats(len(PAIRS), len(ids), 0, 0, int(lengths.sum()), 0, int(lengths.max()), 0.0)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    flat = np.concatenate(ids).astype(np.int32)
    flat_t = np.concatenate(targets).astype(np.int32)
    return TokenizedData(flat, flat_t, offsets, stats, np.repeat(np.arange(len(PAIRS)), 2), np.zeros(len(ids), bool))


def lora_model(seed: int = 0):
    model = make_tiny_llama(64, seed=seed)
    model = apply_adapter(model, AdapterConfig(lora=LoraConfig(r=4, alpha=8.0)))
    torch.manual_seed(seed + 1)
    for name, p in model.named_parameters():
        if "lora_B" in name:  # a trained adapter: the policy differs from the reference
            p.data.normal_(0, 0.05)
    return model


def padded(rows):
    """(input_ids, labels) right-padded, TRL's layout: labels -100 outside the response, unshifted."""
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, (prompt, response) in enumerate(rows):
        seq = prompt + response
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, len(prompt) : len(seq)] = torch.tensor(response)
        mask[i, : len(seq)] = 1
    return ids, labels, mask


def trl_side(model, objective: str, beta: float):
    """TRL's DPOTrainer (`sigmoid`) and ORPOTrainer computations on the concatenated padded batch
    [chosen..., rejected...]: log-probs by TRL's own helpers, then TRL's loss."""
    from trl.experimental.orpo.orpo_trainer import ORPOTrainer
    from trl.trainer.utils import selective_log_softmax

    rows = [(p, c) for p, c, _ in PAIRS] + [(p, r) for p, _, r in PAIRS]
    ids, labels, mask = padded(rows)
    n = len(PAIRS)

    def logps(m, average=False):
        logits = m(input_ids=ids, attention_mask=mask).logits
        if average:
            return ORPOTrainer.get_batch_logps(logits, labels, average_log_prob=True)
        shifted = labels[:, 1:]
        per_token = selective_log_softmax(logits[:, :-1], shifted.clamp(min=0)) * (shifted != -100)
        return per_token.sum(1)

    if objective == "dpo":
        policy = logps(model)
        with torch.no_grad(), model.disable_adapter():
            ref = logps(model)
        delta = (policy[:n] - ref[:n]) - (policy[n:] - ref[n:])
        return -torch.nn.functional.logsigmoid(beta * delta).mean()  # DPOTrainer._compute_loss, loss_type sigmoid

    class Stub:  # what odds_ratio_loss reads of the trainer
        class accelerator:
            device = torch.device("cpu")

    Stub.beta = beta
    means = logps(model, average=True)
    losses, *_ = ORPOTrainer.odds_ratio_loss(Stub(), means[:n], means[n:])
    logits = model(input_ids=ids, attention_mask=mask).logits[:n, :-1]
    # tunelab's NLL is over the chosen responses (TRL's ORPOTrainer also counts the prompt tokens).
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:n, 1:].reshape(-1))
    return nll - losses.mean()


def tunelab_side(model, objective: str, beta: float, rows: list[list[int]]):
    """The loss module on packed rows, summed over micro-batches and divided by the pairs, as the loop does."""
    data = pair_data()
    root = PreferenceLoss(model, ObjectiveConfig(name=objective, preference=PreferenceConfig(beta=beta)))
    total = 0
    for batch_rows in rows:
        b = collate(data, batch_rows, 64, 0, True, sequences=True)
        total = total + root(
            torch.from_numpy(b.input_ids),
            torch.from_numpy(b.position_ids),
            torch.from_numpy(b.loss_index),
            torch.from_numpy(b.loss_targets),
            b.layout,
            seqs=b.seqs,
        )
    return total / len(PAIRS), root


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("objective", ["dpo", "orpo"])
def test_loss_and_gradients_equal_trl(objective):
    """One packed micro-batch of three pairs: the loss and every LoRA gradient equal TRL's on padded rows."""
    model = lora_model()
    theirs = trl_side(model, objective, beta=0.5)
    theirs.backward()
    expected = grads(model)
    model.zero_grad(set_to_none=True)
    ours, root = tunelab_side(model, objective, beta=0.5, rows=[[[0, 1, 2, 3], [4, 5]]])
    ours.backward()
    got = grads(model)
    assert torch.allclose(ours, theirs, rtol=1e-5, atol=0), (ours.item(), theirs.item())
    assert expected.keys() == got.keys() and expected
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-7, msg=name)
    metrics = root.window_metrics()
    assert set(root.objective.metrics) <= set(metrics)
    assert 0.0 <= metrics["rewards/accuracies"] <= 1.0


def test_dpo_packed_rows_equal_pairs_one_by_one():
    """Pairs packed into one row give the DPO loss and gradients of each pair run alone (DPO only: ORPO's NLL is a
    token mean over its micro-batch, as TRL's is)."""
    model = lora_model(1)
    together, _ = tunelab_side(model, "dpo", 0.1, rows=[[[0, 1, 2, 3, 4, 5]]])
    together.backward()
    expected = grads(model)
    model.zero_grad(set_to_none=True)
    alone, _ = tunelab_side(model, "dpo", 0.1, rows=[[[0, 1]], [[2, 3]], [[4, 5]]])
    alone.backward()
    torch.testing.assert_close(alone, together, rtol=1e-5, atol=0)
    for name, grad in grads(model).items():
        torch.testing.assert_close(grad, expected[name], rtol=1e-5, atol=1e-7, msg=name)


def test_label_smoothing_is_conservative_dpo():
    """ε > 0 mixes in the flipped pair's loss: -(1-ε)·logσ(βz) - ε·logσ(-βz)."""
    z = torch.tensor([0.3, -1.2])
    zero = torch.zeros(2)
    losses, chosen, rejected = dpo_loss(z, zero, zero, zero, beta=2.0, label_smoothing=0.2)
    expected = -0.8 * torch.nn.functional.logsigmoid(2 * z) - 0.2 * torch.nn.functional.logsigmoid(-2 * z)
    torch.testing.assert_close(losses, expected)
    torch.testing.assert_close(chosen - rejected, 2 * z)
