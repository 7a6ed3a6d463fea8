"""Preference objectives (DPO, ORPO) as the loss module the loop calls, and their per-step metrics.

A micro-batch holds pairs packed as documents of its rows: the chosen sequence of a pair, then its rejected one
(data/pairs.py). Each sequence's log-probability is the sum over its response tokens, computed by the same
gather-then-chunked head as supervised training (train/loss.py, score_tokens): logits exist one chunk at a time, and
each token's gradient with respect to its hidden state is formed in the forward, so backward is a row scaling.

The reference log-probabilities (DPO) come from the same model with the adapter disabled (peft's
`disable_adapter`, no second copy of the weights), from a frozen copy for full fine-tuning, or from a table
computed once before training (`precompute`).

Losses (per pair, then averaged over the step's pairs by the loop; the objective's row names its `pair_loss`):
  DPO (Rafailov et al. 2023, eq. 7; label smoothing as conservative DPO, TRL's `sigmoid` with label_smoothing):
      z = (log πc - log πr) - (log refc - log refr);  loss = -(1-ε)·logσ(βz) - ε·logσ(-βz)
  ORPO (Hong et al. 2024, eqs. 4-7, as TRL's ORPOTrainer.odds_ratio_loss): with mean per-token log-probs pc, pr,
      log odds = (pc - pr) - (log(1-e^pc) - log(1-e^pr));  loss = NLL(chosen) - λ·logσ(log odds)
  where NLL is the chosen responses' token-mean cross-entropy over the micro-batch.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .. import objectives
from ..config import ObjectiveConfig
from ..data.packing import SeqTargets
from ..device import to_device
from .loss import CausalLMLoss, score_tokens


def dpo_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss per pair, chosen rewards, rejected rewards) from summed sequence log-probs."""
    logits = (chosen - rejected) - (ref_chosen - ref_rejected)
    losses = -F.logsigmoid(beta * logits) * (1 - label_smoothing) - F.logsigmoid(-beta * logits) * label_smoothing
    return losses, beta * (chosen - ref_chosen).detach(), beta * (rejected - ref_rejected).detach()


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - e^x) for x < 0, branching at -ln 2 to avoid cancellation (Mächler 2012)."""
    return torch.where(x < -0.6931471805599453, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def orpo_odds(chosen_mean: torch.Tensor, rejected_mean: torch.Tensor, beta: float) -> tuple[torch.Tensor, ...]:
    """(λ·logσ(log odds) per pair, log odds per pair) from mean per-token log-probs."""
    log_odds = (chosen_mean - rejected_mean) - (log1mexp(chosen_mean) - log1mexp(rejected_mean))
    return beta * F.logsigmoid(log_odds), log_odds


class PreferenceLoss(CausalLMLoss):
    """The model as one module whose forward returns the micro-batch's summed pair loss (the loop divides by the
    step's pairs), keeping the window's metrics on the device until a log line asks for them."""

    @classmethod
    def build(cls, model: torch.nn.Module, objective: ObjectiveConfig, trains_base: bool = False) -> PreferenceLoss:
        return cls(model, objective, trains_base)

    def __init__(self, model: torch.nn.Module, objective: ObjectiveConfig, trains_base: bool = False):
        super().__init__(model)
        self.settings = objective.preference
        self.objective = objective.row
        # A frozen reference copy for full fine-tuning (CausalLMLoss.keep_reference); none when the table is
        # precomputed (precompute_reference drops it after).
        self.keep_reference(self.objective.reference and trains_base)
        self.pair_loss = PAIR_LOSSES[self.objective.pair_loss]
        self.table: torch.Tensor | None = None  # per example reference log-probs (precompute)
        self._window: dict[str, torch.Tensor] = {}
        self._pairs = 0

    def forward(self, input_ids, position_ids, loss_index, loss_targets, layout=None, seqs: SeqTargets | None = None):
        hidden = self.hidden_states(input_ids, position_ids, layout)
        head = self.model.get_output_embeddings()
        if seqs is None or seqs.count == 0:  # a rank's empty share: no pairs, zero gradients
            return hidden.sum() * 0.0
        logps = score_tokens(hidden, head.weight, loss_index, loss_targets, self.softcap).logps
        seq = to_device(seqs.seq, logps.device)
        sums = torch.zeros(seqs.count, dtype=logps.dtype, device=logps.device).index_add(0, seq, logps)
        counts = torch.from_numpy(np.bincount(seqs.seq, minlength=seqs.count)).to(logps.device)
        ref = None
        if self.objective.reference:
            ref = self.reference_logps(input_ids, position_ids, loss_index, loss_targets, layout, seqs)
        loss = self.pair_loss(self, sums, counts, ref)
        if self.router is not None:  # MoE: the policy forward's router loss, weighted per pair (loss.router_term)
            loss = loss + self.router_term(seqs.count // 2)
        return loss

    def sigmoid_loss(self, sums: torch.Tensor, counts: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        """DPO's: the summed pair losses from each sequence's summed log-prob and its reference's."""
        losses, chosen_rewards, rejected_rewards = dpo_loss(
            sums[0::2], sums[1::2], ref[0::2], ref[1::2], self.settings.beta, self.settings.label_smoothing
        )
        self._note(chosen_rewards, rejected_rewards, sums[0::2], sums[1::2])
        return losses.sum()

    def odds_ratio_loss(self, sums: torch.Tensor, counts: torch.Tensor, ref: None) -> torch.Tensor:
        """ORPO's: the summed pair losses from each sequence's summed log-prob and its response tokens (no reference)."""
        means = sums / counts
        chosen, rejected = means[0::2], means[1::2]
        ratio_term, log_odds = orpo_odds(chosen, rejected, self.settings.beta)
        pairs = chosen.shape[0]
        # The chosen responses' token-mean NLL over this micro-batch, counted once per pair (the loop's mean
        # over pairs then gives it back for a micro-batch of equal pairs, as TRL's per-batch mean).
        nll = -sums[0::2].sum() / counts[0::2].sum()
        beta = self.settings.beta
        self._note(beta * chosen.detach(), beta * rejected.detach(), chosen, rejected)
        extra = {
            "nll_loss": nll.detach() * pairs,
            "log_odds_ratio": (ratio_term / beta).detach().sum(),
            "log_odds_chosen": log_odds.detach().sum(),
        }
        for k, v in extra.items():
            self._window[k] = self._window.get(k, 0) + v
        return nll * pairs - ratio_term.sum()

    def reference_logps(self, input_ids, position_ids, loss_index, loss_targets, layout, seqs) -> torch.Tensor:
        """Each sequence's summed reference log-prob: from the table, else a forward without gradients."""
        if self.table is not None:
            return self.table[to_device(seqs.examples, self.table.device)]
        with torch.no_grad(), self.reference_model() as ref:
            hidden = self.hidden_states(input_ids, position_ids, layout, model=ref)
            head = ref.get_output_embeddings()
            logps = score_tokens(hidden, head.weight, loss_index, loss_targets, self.softcap).logps
        seq = to_device(seqs.seq, logps.device)
        return torch.zeros(seqs.count, dtype=logps.dtype, device=logps.device).index_add(0, seq, logps)

    def _note(self, chosen_rewards, rejected_rewards, chosen_logps, rejected_logps) -> None:
        values = {
            "rewards/chosen": chosen_rewards.sum(),
            "rewards/rejected": rejected_rewards.sum(),
            "rewards/accuracies": (chosen_rewards > rejected_rewards).float().sum(),
            "rewards/margins": (chosen_rewards - rejected_rewards).sum(),
            "logps/chosen": chosen_logps.detach().sum(),
            "logps/rejected": rejected_logps.detach().sum(),
        }
        for k, v in values.items():
            self._window[k] = self._window.get(k, 0) + v
        self._pairs += chosen_rewards.shape[0]

    def window_metrics(self, accelerator=None) -> dict[str, float]:
        """Each metric's mean over the pairs since the last call (summed over processes when `accelerator`), and an
        MoE model's router loss (CausalLMLoss.window_metrics)."""
        router = super().window_metrics(accelerator)
        if not self._window:
            return router
        names = list(self._window)
        device = next(iter(self._window.values())).device
        both = torch.stack([torch.as_tensor(self._window[k], device=device).double() for k in names])
        both = torch.cat([both, torch.tensor([float(self._pairs)], dtype=torch.float64, device=device)])
        if accelerator is not None:
            both = accelerator.reduce(both, "sum")
        values = both.tolist()
        self._window, self._pairs = {}, 0
        pairs = max(values[-1], 1.0)
        return {**{k: v / pairs for k, v in zip(names, values)}, **router}


# The pair losses by the name an objective's row gives (objectives.Objective.pair_loss).
PAIR_LOSSES = {"sigmoid": PreferenceLoss.sigmoid_loss, "odds_ratio": PreferenceLoss.odds_ratio_loss}


def loss_module(model: torch.nn.Module, objective: ObjectiveConfig, trains_base: bool = False) -> torch.nn.Module:
    """The module the loop calls for an objective: the one its registry row names (objectives.Objective.loss_module)."""
    return objectives.load(objective.row.loss_module).build(model, objective, trains_base)


def precompute(root: torch.nn.Module, batches, device: torch.device, examples: int) -> None:
    """Fill `root`'s reference table (one summed log-prob per example) from `batches` covering every example once,
    then drop the frozen copy it came from: training reads the table instead."""
    if not isinstance(root, PreferenceLoss) or not root.objective.reference:
        return
    table = torch.zeros(examples, dtype=torch.float32, device=device)
    was_training = root.training
    root.eval()
    try:
        for batch in batches:
            if batch.seqs is None or batch.seqs.count == 0:
                continue
            ref = root.reference_logps(
                to_device(batch.input_ids, device),
                None if batch.position_ids is None else to_device(batch.position_ids, device),
                to_device(batch.loss_index, device),
                to_device(batch.loss_targets, device),
                batch.layout,
                batch.seqs,
            )
            table[to_device(batch.seqs.examples, device)] = ref.float()
    finally:
        root.train(was_training)
    root.table = table
    root.frozen = []
