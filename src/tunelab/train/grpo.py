"""GRPO (Shao et al. 2024, DeepSeekMath §4.1) as TRL 1.16's GRPOTrainer computes it, on sampled completions laid
out as right-padded rows (prompt + completion; under the causal mask no real token sees the padding after it).

Per completion i of a prompt's group of G, with summed reward r_i (each reward function's value times its weight):
    A_i = r_i - mean(r_group)                     (scale_rewards none)
        = (r_i - mean(r_group)) / (std + 1e-4)    (group: the group's std; batch: the whole generation batch's)
Per completion token t, with the policy's log-prob l, the log-prob at generation l_old and the reference's l_ref:
    ρ = exp(l - l_old);  loss_t = -min(ρ·A, clip(ρ, 1 - ε_low, 1 + ε_high)·A) + β·(exp(l_ref - l) - (l_ref - l) - 1)
The KL term is Schulman's k3 estimator. With num_iterations 1, l_old is l detached (ρ = 1, its gradient A·∇l).
Aggregation (`loss_type`): grpo, each completion's token mean, then the mean over completions; bnpo, the mean over
the micro-batch's tokens; dr_grpo, the sum over completions x max_completion_length; dapo, the sum over the tokens
of the whole step. grpo, bnpo and dr_grpo are then divided by the step's micro-batches, as TRL divides by its
gradient accumulation steps.

With β = 0 a completion whose advantage is 0 (its group's rewards all equal) has a zero loss and gradient, so the
update leaves it out of the forward and backward (`trains_on`) while every denominator above still counts it: the
loss and gradients are TRL's, at the cost of the completions that carry a signal. Clip ratios are over every
completion token, as TRL's; entropy is over the tokens of the completions the update ran.

Per-token log-probs and entropies come from the shared chunked head (train/loss.py: score_tokens).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from ..config import GrpoConfig, ObjectiveConfig
from .loss import CausalLMLoss, score_tokens

STD_EPS = 1e-4  # TRL's: the advantage's denominator is std + 1e-4


def nanstd(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The std of x's non-NaN values with Bessel's correction (NaN for fewer than two), as TRL's `nanstd`."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=True)
    variance = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True) * count / (count - 1)
    variance = torch.where(count > 1, variance, torch.full_like(variance, math.nan))
    std = variance.sqrt()
    return std.squeeze() if dim is None else std.squeeze(dim)


@dataclass
class Advantages:
    advantages: torch.Tensor  # (N,)
    rewards: torch.Tensor  # (N,) summed weighted rewards, NaN where every function returned None
    zero_std: torch.Tensor  # (N,) bool: the group's (or batch's) rewards are all equal


def advantages(per_func: torch.Tensor, weights: torch.Tensor, group: int, scale: str) -> Advantages:
    """Group-normalised advantages from (N, R) rewards (NaN: the function did not apply), TRL's
    `sum_then_normalize`: a completion no function scored has advantage 0."""
    unscorable = torch.isnan(per_func).all(dim=1)
    rewards = (per_func * weights[None, :]).nansum(dim=1)
    rewards[unscorable] = math.nan
    grouped = rewards.view(-1, group)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(group)
    if scale == "batch":
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    else:
        std = nanstd(grouped, dim=1).repeat_interleave(group)
    adv = rewards - mean
    if scale != "none":
        adv = adv / (std + STD_EPS)
    return Advantages(torch.nan_to_num(adv, nan=0.0), rewards, torch.isclose(std, torch.zeros_like(std)))


def trains_on(adv: torch.Tensor, settings: GrpoConfig) -> torch.Tensor:
    """The completions whose gradient can be nonzero: all of them under a KL term (β > 0), else those with a
    nonzero advantage (a zero one zeroes both sides of the clipped min, whatever the ratio)."""
    if settings.beta != 0.0:
        return torch.ones_like(adv, dtype=torch.bool)
    return adv != 0


@dataclass
class TokenLoss:
    loss: torch.Tensor  # the micro-batch's share of the step's loss (its gradient is the step's, summed)
    metrics: dict[str, torch.Tensor]  # sums over tokens (kl, entropy, clip ratios) and their count, detached


def token_loss(
    logps: torch.Tensor,
    old: torch.Tensor | None,
    ref: torch.Tensor | None,
    adv: torch.Tensor,
    seq: torch.Tensor,
    sequences: int,
    settings: GrpoConfig,
    micro_batches: int,
    step_tokens: int,
    entropy: torch.Tensor | None = None,
    micro_tokens: int | None = None,
) -> TokenLoss:
    """The loss over K completion tokens (flat): `logps` (K,) with gradients, `old`/`ref` (K,) or None, `adv` (K,)
    each token's completion's advantage, `seq` (K,) its completion's index among `sequences`. `micro_tokens` is
    the micro-batch's completion tokens, the left-out completions' included (default K)."""
    old = logps.detach() if old is None else old
    coef_1 = torch.exp(logps - old)
    coef_2 = torch.clamp(coef_1, 1 - settings.epsilon, 1 + settings.clip_high)
    per_token = -torch.min(coef_1 * adv, coef_2 * adv)
    kl = None
    if settings.beta != 0.0:
        kl = torch.exp(ref - logps) - (ref - logps) - 1
        per_token = per_token + settings.beta * kl
    tokens = per_token.shape[0]
    micro_tokens = tokens if micro_tokens is None else micro_tokens
    loss = AGGREGATIONS[settings.loss_type](
        per_token, seq, sequences, micro_tokens, settings, micro_batches, step_tokens
    )
    low = (coef_1 < 1 - settings.epsilon) & (adv < 0)
    high = (coef_1 > 1 + settings.clip_high) & (adv > 0)
    # TRL's clip_ratio/low_min and high_max: each completion's share of clipped tokens, the micro-batch's least and
    # most (a left-out completion's is 0: its advantage is 0), averaged over the window's micro-batches.
    zeros = torch.zeros(sequences, dtype=torch.float32, device=per_token.device)
    counts = zeros.index_add(0, seq, torch.ones_like(per_token, dtype=torch.float32)).clamp(min=1.0)
    metrics = {
        "clip_ratio/low_mean": low.float().sum(),
        "clip_ratio/high_mean": high.float().sum(),
        "clip_ratio/region_mean": (low | high).float().sum(),
        "clip_ratio/low_min": (zeros.index_add(0, seq, low.float()) / counts).min().detach(),
        "clip_ratio/high_max": (zeros.index_add(0, seq, high.float()) / counts).max().detach(),
        "micro_batches": torch.tensor(1.0),
        "tokens": torch.tensor(float(tokens)),
    }
    if kl is not None:
        metrics["kl"] = kl.detach().sum()
    if entropy is not None:
        metrics["entropy"] = entropy.detach().sum()
    return TokenLoss(loss, metrics)


def _per_completion(per_token, seq, sequences, micro_tokens, settings, micro_batches, step_tokens):
    """grpo: each completion's token mean, then the mean over the micro-batch's completions (a left-out one's is 0)."""
    zeros = torch.zeros(sequences, dtype=per_token.dtype, device=per_token.device)
    counts = zeros.index_add(0, seq, torch.ones_like(per_token))
    sums = zeros.index_add(0, seq, per_token)
    return (sums / counts.clamp(min=1.0)).mean() / micro_batches


def _per_micro_batch_token(per_token, seq, sequences, micro_tokens, settings, micro_batches, step_tokens):
    """bnpo: the mean over the micro-batch's tokens."""
    return per_token.sum() / max(micro_tokens, 1) / micro_batches


def _per_budget(per_token, seq, sequences, micro_tokens, settings, micro_batches, step_tokens):
    """dr_grpo: the sum over completions x max_completion_length (no length bias)."""
    return per_token.sum() / (sequences * settings.max_completion_length) / micro_batches


def _per_step_token(per_token, seq, sequences, micro_tokens, settings, micro_batches, step_tokens):
    """dapo: the sum over the whole step's completion tokens."""
    return per_token.sum() / max(step_tokens, 1)


# The loss aggregations by config.GRPO_LOSS_TYPES' names (TRL's loss_type).
AGGREGATIONS = {
    "grpo": _per_completion,
    "bnpo": _per_micro_batch_token,
    "dr_grpo": _per_budget,
    "dapo": _per_step_token,
}


@dataclass
class Rollout:
    """One micro-batch of completions as right-padded rows, the flat completion-token positions and their tokens.
    Completions left out (`keep`) have no row but count in `sequences` and `tokens`, the loss's denominators."""

    input_ids: torch.Tensor  # (N, T), N the rows kept
    position_ids: torch.Tensor  # (N, T)
    loss_index: torch.Tensor  # (K,) flat indices into N·T: the positions that predict a completion token
    loss_targets: torch.Tensor  # (K,)
    seq: torch.Tensor  # (K,) the row each token belongs to
    sequences: int  # the micro-batch's completions, left-out ones included
    tokens: int  # their completion tokens

    @property
    def rows(self) -> int:
        return self.input_ids.shape[0]

    @classmethod
    def build(
        cls, prompts: list[list[int]], completions: list[list[int]], pad_id: int, keep: list[bool] | None = None
    ) -> Rollout:
        sequences, tokens = len(prompts), sum(len(c) for c in completions)
        if keep is not None:
            prompts = [p for p, k in zip(prompts, keep) if k]
            completions = [c for c, k in zip(completions, keep) if k]
        width = max((len(p) + len(c) for p, c in zip(prompts, completions)), default=0)
        ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        index, targets, seq = [], [], []
        for i, (p, c) in enumerate(zip(prompts, completions)):
            row = list(p) + list(c)
            ids[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
            # Position t predicts token t + 1: the completion's tokens are predicted from len(p) - 1 on.
            index.extend(i * width + len(p) - 1 + k for k in range(len(c)))
            targets.extend(c)
            seq.extend([i] * len(c))
        positions = torch.arange(width).expand(len(prompts), width).contiguous()
        as_long = lambda x: torch.as_tensor(x, dtype=torch.long)  # noqa: E731
        return cls(ids, positions, as_long(index), as_long(targets), as_long(seq), sequences, tokens)

    def real_tokens(self) -> torch.Tensor:
        """(N, T) True on each row's prompt and completion, False on its right padding: each row ends one past the
        position that predicts its last completion token."""
        width = self.input_ids.shape[1]
        last = torch.zeros(self.rows, dtype=torch.long, device=self.loss_index.device)
        last = last.scatter_reduce(0, self.seq, self.loss_index % width, "amax", include_self=True)
        return torch.arange(width, device=last.device) < (last + 2).unsqueeze(1)

    def to(self, device: torch.device) -> Rollout:
        moved = {
            k: getattr(self, k).to(device) for k in ("input_ids", "position_ids", "loss_index", "loss_targets", "seq")
        }
        return Rollout(**moved, sequences=self.sequences, tokens=self.tokens)


class GrpoLoss(CausalLMLoss):
    """The policy as one module: `score` gives per-token log-probs (and entropies) of a rollout under the policy or
    the reference (the adapter disabled); `forward` the micro-batch's loss from them."""

    @classmethod
    def build(cls, model: torch.nn.Module, objective: ObjectiveConfig, trains_base: bool = False) -> GrpoLoss:
        return cls(model, objective.grpo, trains_base)

    def __init__(self, model: torch.nn.Module, settings: GrpoConfig, trains_base: bool = False):
        super().__init__(model)
        self.settings = settings
        # The KL term's reference (β > 0): the base with the adapter disabled, or full fine-tuning's frozen copy of
        # the starting policy (CausalLMLoss.keep_reference); β = 0 keeps none.
        self.keep_reference(settings.beta > 0 and trains_base)

    def score(self, rollout: Rollout, entropy: bool = False, reference: bool = False):
        """score_tokens over the rollout's completion tokens, under the reference when `reference`."""
        with self.reference_model() if reference else nullcontext(self.model) as model:
            hidden = self.hidden_states(
                rollout.input_ids,
                rollout.position_ids,
                None,
                model=model if reference else None,
                real=rollout.real_tokens() if self.router is not None else None,
            )
            head = model.get_output_embeddings()
            # At the sampling temperature, as TRL's GRPOTrainer scores: the log-probs of the distribution sampled from.
            return score_tokens(
                hidden,
                head.weight,
                rollout.loss_index,
                rollout.loss_targets,
                self.softcap,
                entropy=entropy,
                temperature=self.settings.temperature,
            )

    def forward(self, rollout: Rollout, old, ref, adv, micro_batches: int, step_tokens: int) -> TokenLoss:
        scores = self.score(rollout, entropy=True)
        out = token_loss(
            scores.logps,
            old,
            ref,
            adv,
            rollout.seq,
            rollout.sequences,
            self.settings,
            micro_batches,
            step_tokens,
            scores.entropy,
            rollout.tokens,
        )
        if self.router is not None:  # MoE: the router loss, 1 / micro_batches of it a micro-batch (loss.router_term)
            out.loss = out.loss + self.router_term(1 / micro_batches)
        return out
