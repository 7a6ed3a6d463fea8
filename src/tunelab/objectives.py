"""The training objectives, one row each: what a step computes, the loss module and the data builder it names,
and what it needs that supervised training does not (a reference model's log-probabilities, several sequences per
example). Config validation, the data pipeline, the recipe, plan and bench read this registry and never compare
objective names. Torch-free and import-free: a row names its code as `package.module:attribute` under tunelab,
imported only when `load` is called."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Objective:
    name: str
    # Sequences each example trains on: 1 (a prompt and its response), 2 (the chosen and the rejected response
    # to one prompt, packed as two documents of the same row).
    sequences: int = 1
    # A reference model's log-probabilities of each sequence (one forward without gradients, or a precomputed
    # table), against which the policy's are compared.
    reference: bool = False
    # The data rows are preference pairs {prompt, chosen, rejected}.
    pairs: bool = False
    # The held-out loss (eval.split, eval.path) is defined: token-mean cross-entropy.
    held_out_loss: bool = True
    # What the loop's step loss is the mean over (its normaliser): `tokens` (loss tokens) or `pairs`.
    mean_over: str = "tokens"
    # The metrics each log line adds beside the loss, as TRL names them.
    metrics: tuple[str, ...] = ()
    # The loss on each pair's sequence log-probabilities (objectives with pairs; train/preference.py PAIR_LOSSES):
    # `sigmoid`, -logσ(β·margin) of the summed log-probs' margin over the reference's (DPO); `odds_ratio`, the
    # chosen responses' NLL minus λ·logσ(log odds ratio) of the mean per-token log-probs (ORPO).
    pair_loss: str = ""
    # The module the loop calls (its `build(model, objective, trains_base)` wraps the model): the step's summed loss.
    loss_module: str = "train.loss:CausalLMLoss"
    # What turns the data spec's source into tokenized examples (`builder(spec, tokenizer)`).
    data_builder: str = "data.pipeline:prepare_rows"


_PAIR_METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
)

_PAIR_LOSS = "train.preference:PreferenceLoss"
_PAIRS = "data.preference:prepare_pairs"

REGISTRY: dict[str, Objective] = {
    o.name: o
    for o in (
        Objective("sft"),
        Objective(
            "dpo",
            sequences=2,
            reference=True,
            pairs=True,
            held_out_loss=False,
            mean_over="pairs",
            metrics=_PAIR_METRICS,
            pair_loss="sigmoid",
            loss_module=_PAIR_LOSS,
            data_builder=_PAIRS,
        ),
        Objective(
            "orpo",
            sequences=2,
            pairs=True,
            held_out_loss=False,
            mean_over="pairs",
            metrics=(*_PAIR_METRICS, "nll_loss", "log_odds_ratio", "log_odds_chosen"),
            pair_loss="odds_ratio",
            loss_module=_PAIR_LOSS,
            data_builder=_PAIRS,
        ),
    )
}
NAMES = tuple(REGISTRY)


def get(name: str) -> Objective:
    return REGISTRY[name]


def load(ref: str) -> Any:
    """The code a row names (`train.loss:CausalLMLoss` -> tunelab.train.loss.CausalLMLoss), imported now."""
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(f"tunelab.{module}"), attribute)
