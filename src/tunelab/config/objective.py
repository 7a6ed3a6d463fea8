"""The objective's sections: which objective a step optimizes (objectives.py's registry) and the settings of the
preference objectives (dpo, orpo) and of grpo, each checked in its own `validate`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import decoding, methods, objectives
from ..errors import TunelabError
from .fields import GrpoLossType, ObjectiveName, Reference, ScaleRewards, key
from .origins import Origins, _check, _choice


@dataclass(kw_only=True)
class PreferenceConfig:
    """Settings of the preference objectives (dpo, orpo), named as TRL names them."""

    # DPO: the KL penalty's strength (β of the implicit reward β·log π/π_ref); ORPO: the odds-ratio term's weight (λ).
    beta: float = 0.1
    # DPO only: the assumed probability that a pair's labels are flipped (conservative DPO).
    label_smoothing: float = 0.0
    # DPO's reference model: auto is adapter-disabled for adapter methods (the same base with the adapter off, no
    # second copy of the weights) and frozen-copy for full fine-tuning.
    reference: Reference = "auto"
    # Compute the reference log-probabilities of every pair once before training instead of in every step.
    precompute_reference: bool = False


@dataclass(kw_only=True)
class RewardConfig:
    """One reward of grpo.rewards: a built-in (train/rewards.py) or `path/to/file.py:function`, its weight in the
    summed reward, and the keyword arguments it is called with."""

    name: str = ""
    weight: float = 1.0
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class GrpoConfig:
    """Settings of objective grpo (group relative policy optimization), named as TRL's GRPOConfig names them."""

    # Completions sampled per prompt (G): the group whose rewards are normalised against each other.
    num_generations: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    # A completion stops at EOS or after this many tokens (counted as clipped).
    max_completion_length: int = 64
    # The KL penalty's weight against the reference (the base with the adapter disabled); 0 runs no reference.
    beta: float = 0.0
    # The ratio's clip range [1 - epsilon, 1 + epsilon_high]; epsilon_high null is epsilon (DAPO's clip-higher
    # sets it above).
    epsilon: float = 0.2
    epsilon_high: float | None = None
    # Optimizer steps on each generated batch (μ); above 1 the ratio is taken against the log-probs at generation.
    num_iterations: int = 1
    # How the per-token losses are averaged: grpo (per completion, then over completions), bnpo (over the
    # micro-batch's tokens), dr_grpo (over completions x max_completion_length), dapo (over the step's tokens).
    loss_type: GrpoLossType = "dapo"
    # The advantage's scale: the group's reward std, the batch's, or none (Dr. GRPO).
    scale_rewards: ScaleRewards = "group"
    rewards: list[RewardConfig] = field(default_factory=list)
    # Steps between the sampled completions written to completions.jsonl; 0 writes none.
    log_completions_steps: int = 10
    # How the sampler's decode loop runs (decoding.py): auto is compiled (a static cache, CUDA graphs) on CUDA and
    # dynamic (eager, a growing cache) elsewhere.
    decode: str = decoding.AUTO
    # The run's schedule_within_limit under its earlier name (train/loop.ScheduleToLimit fits the schedule at generation-batch
    # boundaries); either turns the fit on.
    schedule_within_limit: bool = False
    # A prompt row field (e.g. `digits` of `tunelab data arithmetic --prompts`): each generation batch then holds
    # its values in proportion to the whole set (stratified), not as a random draw happens to; null draws at random.
    balance_by: str | None = None

    @property
    def clip_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    def validate(self, where: Origins) -> None:
        _check(where, "grpo.num_generations", self.num_generations >= 2, "must be at least 2 (a group to compare)")
        _check(where, "grpo.temperature", self.temperature > 0, f"must be positive, got {self.temperature}")
        _check(where, "grpo.top_p", 0 < self.top_p <= 1, f"must be in (0, 1], got {self.top_p}")
        _check(where, "grpo.max_completion_length", self.max_completion_length >= 1, "must be at least 1")
        _check(where, "grpo.beta", self.beta >= 0, f"must be 0 or positive, got {self.beta}")
        _check(where, "grpo.epsilon", 0 <= self.epsilon < 1, f"must be in [0, 1), got {self.epsilon}")
        if self.epsilon_high is not None:
            _check(
                where, "grpo.epsilon_high", self.epsilon_high >= 0, f"must be 0 or positive, got {self.epsilon_high}"
            )
        _check(where, "grpo.num_iterations", self.num_iterations >= 1, "must be at least 1")
        _check(where, "grpo.log_completions_steps", self.log_completions_steps >= 0, "must be 0 or positive")
        _choice(where, "grpo.decode", self.decode, decoding.NAMES)
        if self.balance_by is not None:
            _check(
                where, "grpo.balance_by", bool(self.balance_by.strip()), "is empty; name a prompt row field or unset it"
            )
        if not self.rewards:
            raise TunelabError(
                f"{where('grpo.rewards', 'objective')}: objective grpo needs grpo.rewards, e.g. "
                "[{name: exact_answer}] or [{name: path/to/file.py:function}]"
            )
        for i, reward in enumerate(self.rewards):
            _check(where, f"grpo.rewards[{i}].name", bool(reward.name.strip()), "is empty; name a reward")


@dataclass(kw_only=True)
class ObjectiveConfig:
    """What a step optimizes: the objective (objectives.py's registry) and its own settings."""

    # sft (the response tokens' cross-entropy), dpo or orpo (preference pairs), grpo (sampled completions scored
    # by rewards).
    name: ObjectiveName = key("objective", "sft")
    preference: PreferenceConfig = field(default_factory=PreferenceConfig)
    grpo: GrpoConfig = field(default_factory=GrpoConfig)

    @property
    def uses_reference(self) -> bool:
        """Whether a step scores its sequences under a reference model too: the row's own need, or GRPO's KL term."""
        return self.row.reference or (self.row.generates and self.grpo.beta > 0)

    @property
    def row(self) -> objectives.Objective:
        return objectives.get(self.name)

    def reference_kind(self, method: str) -> str:
        """The reference model a run uses: the adapter disabled over the same base, or a frozen copy of a fully
        trained model (methods.Method.reference)."""
        if self.preference.reference != "auto":
            return self.preference.reference
        return methods.get(method).reference

    def validate(self, where: Origins) -> None:
        p = self.preference
        if self.row.generates:
            self.grpo.validate(where)
        elif self.grpo != GrpoConfig():
            raise TunelabError(
                f"{where('grpo', 'objective')}: the grpo section applies to objective grpo; drop it for objective "
                f"{self.name}"
            )
        if not self.row.pairs:
            if p != PreferenceConfig():
                raise TunelabError(
                    f"{where('preference', 'objective')}: the preference section applies to objective dpo or orpo; "
                    f"drop it for objective {self.name}"
                )
            return
        _check(where, "preference.beta", p.beta > 0, f"must be positive, got {p.beta}")
        _check(
            where,
            "preference.label_smoothing",
            0 <= p.label_smoothing < 0.5,
            f"must be in [0, 0.5), got {p.label_smoothing}",
        )
        if not self.row.reference:
            for name, value, default in (
                ("preference.reference", p.reference, "auto"),
                ("preference.precompute_reference", p.precompute_reference, False),
                ("preference.label_smoothing", p.label_smoothing, 0.0),
            ):
                if value != default:
                    raise TunelabError(f"{where(name)}: objective {self.name} uses no reference model; drop {name}")
