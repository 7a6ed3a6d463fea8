"""train/grpo.py: GRPO's loss and gradients equal TRL 1.16's GRPOTrainer._compute_loss on the same completions,
advantages and old/reference log-probs (fp32), for each loss_type, with and without the KL term and old log-probs;
the advantages follow TRL's group/batch/none scaling."""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from test_pair_loss import lora_model

from tunelab.config import GrpoConfig, RewardConfig
from tunelab.train.grpo import GrpoLoss, Rollout, advantages

trl = pytest.importorskip("trl")

# Two prompts of equal length (TRL left-pads prompts; equal lengths keep its positions equal to ours), G = 3.
PROMPTS = [[5, 6, 7, 8], [11, 12, 13, 14]]
COMPLETIONS = [[20, 21, 2], [22, 2], [23, 24, 25, 26], [30, 2], [31, 32, 33], [34, 35, 2]]
GROUP = 3


def padded_completions():
    width = max(len(c) for c in COMPLETIONS)
    ids = torch.zeros(len(COMPLETIONS), width, dtype=torch.long)
    mask = torch.zeros(len(COMPLETIONS), width, dtype=torch.long)
    for i, c in enumerate(COMPLETIONS):
        ids[i, : len(c)] = torch.tensor(c)
        mask[i, : len(c)] = 1
    return ids, mask


def flat_to_padded(flat: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(len(COMPLETIONS), max(len(c) for c in COMPLETIONS))
    k = 0
    for i, c in enumerate(COMPLETIONS):
        out[i, : len(c)] = flat[k : k + len(c)]
        k += len(c)
    return out


def trl_loss(model, settings: GrpoConfig, adv, old, ref):
    """TRL's GRPOTrainer._compute_loss itself on a stub trainer, log-probs by TRL's own helpers."""
    from trl.trainer.grpo_trainer import GRPOTrainer
    from trl.trainer.utils import entropy_from_logits, selective_log_softmax

    prompts = [PROMPTS[i // GROUP] for i in range(len(COMPLETIONS))]
    completion_ids, completion_mask = padded_completions()

    def logps_and_entropies(m, input_ids, attention_mask, logits_to_keep, **kw):
        logits = m(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1][:, -logits_to_keep:]
        logits = logits / settings.temperature  # TRL's fused head divides by it: add_fused_lm_head(temperature=...)
        return selective_log_softmax(logits, input_ids[:, -logits_to_keep:]), entropy_from_logits(logits), None

    accelerator = SimpleNamespace(
        num_processes=1, reduce=lambda t, reduction: t, gather=lambda t: t, gather_for_metrics=lambda t: t
    )
    stub = SimpleNamespace(
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=settings.beta,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        loss_type=settings.loss_type,
        epsilon_low=settings.epsilon,
        epsilon_high=settings.clip_high,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=model,
        current_gradient_accumulation_steps=1,
        max_completion_length=settings.max_completion_length,
        accelerator=accelerator,
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _get_per_token_logps_and_entropies=lambda *a, **kw: logps_and_entropies(*a, **kw),
    )
    inputs = {
        "prompt_ids": torch.tensor(prompts),
        "prompt_mask": torch.ones(len(prompts), len(PROMPTS[0]), dtype=torch.long),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": adv,
        "num_items_in_batch": completion_mask.sum().float(),
    }
    if old is not None:
        inputs["old_per_token_logps"] = flat_to_padded(old)
    if ref is not None:
        inputs["ref_per_token_logps"] = flat_to_padded(ref)
    return GRPOTrainer._compute_loss(stub, model, inputs), stub._metrics["train"]


def grads(model) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("beta,iterations", [(0.0, 1), (0.1, 2)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_loss_and_gradients_equal_trl(loss_type, beta, iterations, temperature):
    settings = GrpoConfig(
        temperature=temperature,
        loss_type=loss_type,
        beta=beta,
        num_iterations=iterations,
        epsilon=0.2,
        epsilon_high=0.28,
        max_completion_length=6,
        rewards=[RewardConfig(name="exact_answer")],
    )
    model = lora_model()
    adv = torch.tensor([1.2, -0.3, -0.9, 0.7, 0.0, -0.7])
    rollout = Rollout.build([PROMPTS[i // GROUP] for i in range(len(COMPLETIONS))], COMPLETIONS, pad_id=0)
    root = GrpoLoss(model, settings)
    with torch.no_grad():
        now = root.score(rollout).logps
        ref = root.score(rollout, reference=True).logps if beta else None
    gen = torch.Generator().manual_seed(0)
    # Old log-probs off the current ones by up to ±0.4: some ratios leave the clip range on both sides.
    old = now + (torch.rand(now.shape, generator=gen) - 0.5) * 0.8 if iterations > 1 else None

    theirs, their_metrics = trl_loss(model, settings, adv, old, ref)
    theirs.backward()
    their_grads = grads(model)

    out = root(rollout, old, ref, adv[rollout.seq], micro_batches=1, step_tokens=len(rollout.loss_targets))
    out.loss.backward()
    our_grads = grads(model)

    assert out.loss.item() == pytest.approx(theirs.item(), abs=1e-5)
    assert their_grads.keys() == our_grads.keys() and their_grads
    for name, g in their_grads.items():
        torch.testing.assert_close(our_grads[name], g, atol=1e-5, rtol=1e-4, msg=name)
    tokens = out.metrics["tokens"].item()
    for key in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "entropy") + (
        ("kl",) if beta else ()
    ):
        assert out.metrics[key].item() / tokens == pytest.approx(their_metrics[key][0], abs=1e-5), key
    if iterations > 1:  # the perturbation must exercise the clipping
        assert their_metrics["clip_ratio/region_mean"][0] > 0


def trl_advantages(per_func, weights, group, scale):
    """TRL 1.16's sum_then_normalize branch of _generate_and_score_completions, restated."""
    from trl.trainer.utils import nanstd

    unscorable = torch.isnan(per_func).all(dim=1)
    rewards = (per_func * weights.unsqueeze(0)).nansum(dim=1)
    rewards[unscorable] = torch.nan
    mean = torch.nanmean(rewards.view(-1, group), dim=1).repeat_interleave(group)
    if scale == "batch":
        std = nanstd(rewards).expand_as(rewards)
    else:
        std = nanstd(rewards.view(-1, group), dim=1).repeat_interleave(group)
    adv = rewards - mean
    if scale != "none":
        adv = adv / (std + 1e-4)
    return torch.nan_to_num(adv, nan=0.0)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_advantages_equal_trl(scale):
    nan = math.nan
    per_func = torch.tensor([[1.0, 0.5], [0.0, nan], [1.0, 0.0], [0.0, 0.2], [0.0, 0.2], [nan, nan]])
    weights = torch.tensor([1.0, 0.1])
    got = advantages(per_func, weights, 3, scale)
    torch.testing.assert_close(got.advantages, trl_advantages(per_func, weights, 3, scale))
    assert got.advantages[5] == 0  # unscorable: no signal


def test_equal_rewards_give_zero_advantage_and_zero_std_flag():
    got = advantages(torch.ones(6, 1), torch.ones(1), 3, "group")
    assert torch.all(got.advantages == 0) and got.zero_std.all()


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("iterations", [1, 2])
def test_leaving_out_zero_advantage_completions_keeps_loss_gradients_and_clip_ratios(loss_type, iterations):
    """β = 0: the completions of a group whose rewards are equal (advantage 0) are left out of the forward, and the
    loss, its gradients and the clip ratios over all tokens are those of the full micro-batch."""
    from tunelab.train.grpo import trains_on

    settings = GrpoConfig(
        loss_type=loss_type,
        num_iterations=iterations,
        epsilon_high=0.28,
        max_completion_length=6,
        rewards=[RewardConfig(name="exact_answer")],
    )
    model = lora_model()
    root = GrpoLoss(model, settings)
    adv = torch.tensor([1.2, -0.3, -0.9, 0.0, 0.0, 0.0])  # the second group's rewards all equal
    prompts = [PROMPTS[i // GROUP] for i in range(len(COMPLETIONS))]
    full = Rollout.build(prompts, COMPLETIONS, pad_id=0)
    keep = trains_on(adv, settings)
    assert keep.tolist() == [True, True, True, False, False, False]
    part = Rollout.build(prompts, COMPLETIONS, pad_id=0, keep=keep.tolist())
    assert (part.rows, part.sequences, part.tokens) == (3, full.sequences, full.tokens)
    gen = torch.Generator().manual_seed(1)

    def run(rollout):
        with torch.no_grad():
            now = root.score(rollout).logps
        old = now + (torch.rand(now.shape, generator=gen) - 0.5) * 0.8 if iterations > 1 else None
        out = root(rollout, old, None, adv[keep][rollout.seq] if rollout is part else adv[rollout.seq], 1, full.tokens)
        out.loss.backward()
        return out, grads(model)

    gen.manual_seed(1)
    whole, whole_grads = run(full)
    gen.manual_seed(1)  # the same perturbation of the kept rows' old log-probs: they come first in both
    left, left_grads = run(part)
    assert left.loss.item() == pytest.approx(whole.loss.item(), abs=1e-6)
    for name, g in whole_grads.items():
        torch.testing.assert_close(left_grads[name], g, atol=1e-6, rtol=1e-5, msg=name)
    for key in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
        assert left.metrics[key].item() == whole.metrics[key].item(), key
    assert left.metrics["tokens"].item() == len(part.loss_targets) < full.tokens


def test_a_kl_term_trains_on_every_completion():
    from tunelab.train.grpo import trains_on

    settings = GrpoConfig(beta=0.04, rewards=[RewardConfig(name="exact_answer")])
    assert trains_on(torch.tensor([0.0, 1.0, 0.0]), settings).all()
