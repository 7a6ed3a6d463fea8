"""The rules across TrainConfig's sections, as one table (RULES): each a setting that another section's choice
refuses, checked in order after every section's own `validate`, its error written once and prefixed with the origin
of the settings it names.

An objective that reads examples other than plain rows, preference pairs or prompts to sample from (EXAMPLES),
puts the same four requirements on its data; each is one rule, worded by the kind of example. What an objective's
recipe can do (objectives.CAPABILITIES) is one rule per setting that needs a capability.

A rule takes the whole TrainConfig (`cfg`); this module imports none of the sections, which import it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import objectives
from ..data.formats import PROMPT_FORMATS
from ..errors import TunelabError
from ..modelref import RANDOM
from .fields import PAIR_FORMATS
from .origins import Origins


@dataclass(frozen=True)
class Rule:
    """A cross-section rule: when `broken(cfg)`, the error is `why(cfg)` after the origin of `keys`' first set one."""

    keys: tuple[str, ...]
    broken: Callable[[Any], bool]
    why: Callable[[Any], str]


@dataclass(frozen=True)
class Examples:
    """What an objective's data rows are, in the words of the rules on them: `one source of {noun}`, `packs
    {packs} documents of one row`, `{renders} {formats}`, `scores the {scored} only; {drop}`."""

    noun: str
    packs: str
    formats: tuple[str, ...]
    renders: str
    scored: str
    drop: str


EXAMPLES = {
    "pairs": Examples(
        "pairs",
        "chosen and rejected as two",
        PAIR_FORMATS,
        "renders pairs as",
        "responses",
        "drop data.train_on_inputs",
    ),
    "prompts": Examples(
        "prompts", "each prompt's completions as", PROMPT_FORMATS, "reads prompts in format", "completions", "drop it"
    ),
}


def examples(cfg) -> Examples | None:
    """The kind of example the config's objective reads: prompts (it generates), pairs, or None (plain rows)."""
    row = cfg.objective.row
    return EXAMPLES["prompts"] if row.generates else EXAMPLES["pairs"] if row.pairs else None


def _data_rule(key: str, broken: Callable[[Any, Examples], bool], why: Callable[[Examples], str]) -> Rule:
    """A requirement of an objective that reads pairs or prompts on its data: `objective NAME {why}`."""
    return Rule(
        (key, "objective"),
        lambda cfg: (kind := examples(cfg)) is not None and broken(cfg, kind),
        lambda cfg: f"objective {cfg.objective.name} {why(examples(cfg))}",
    )


def _capability(capability: str, key: str, asked: Callable[[Any], bool], fix: str) -> Rule:
    """A setting that needs a capability of the objective's recipe, refused where the objective's row lacks it."""

    def refusal(cfg) -> str | None:
        return objectives.lacking(cfg.objective.row, capability, f"{key} needs it; {fix}") if asked(cfg) else None

    return Rule((key, "objective"), lambda cfg: refusal(cfg) is not None, refusal)


def _in_backward(key: str, broken: Callable[[Any], bool], fix: str) -> Rule:
    """A setting that optimizer_in_backward (each parameter updated as its gradient is made) cannot run with."""
    return Rule(
        (key, "optimizer_in_backward"),
        lambda cfg: cfg.optimizer.optimizer_in_backward and broken(cfg),
        lambda cfg: f"optimizer_in_backward updates each parameter as its gradient is made; {fix}",
    )


def _method_reference(cfg) -> str:
    return cfg.adapter.row.reference


RULES = (
    Rule(
        ("model", "method", "base_quant"),
        lambda cfg: cfg.model.startswith(RANDOM) and cfg.adapter.quant != "none",
        lambda cfg: (
            f"model {cfg.model} has random weights, built unquantized; {cfg.adapter.quant} needs a real "
            "checkpoint, or use method lora with base_quant none"
        ),
    ),
    Rule(
        ("eval.early_stopping_patience", "eval.steps", "save_steps"),
        lambda cfg: (
            cfg.eval.enabled
            and cfg.eval.steps is None
            and cfg.run.save_steps == 0
            and cfg.eval.early_stopping_patience is not None
        ),
        lambda cfg: "eval.early_stopping_patience needs evaluations during the run; set eval.steps (or save_steps)",
    ),
    _capability("trains_base", "method", lambda cfg: cfg.adapter.row.trains_base, "use method lora, dora or qlora"),
    _capability("compiled_blocks", "compile", lambda cfg: cfg.compute.compile is True, "set compile: auto or false"),
    _capability("attention_choice", "attention", lambda cfg: cfg.compute.attention != "auto", "set attention: auto"),
    _capability("activation_checkpointing", "grad_ckpt", lambda cfg: cfg.compute.grad_ckpt, "set grad_ckpt: false"),
    _capability("activation_offload", "activation_offload", lambda cfg: cfg.compute.activation_offload, "drop it"),
    _capability("trackers", "report_to", lambda cfg: cfg.run.report_to != "none", "set report_to: none"),
    Rule(
        ("preference.reference", "method"),
        lambda cfg: (
            cfg.objective.row.pairs
            and cfg.objective.row.reference
            and cfg.objective.preference.reference not in ("auto", _method_reference(cfg))
        ),
        lambda cfg: (
            f"method {cfg.adapter.method} takes reference {_method_reference(cfg)}, not "
            f"{cfg.objective.preference.reference}; drop preference.reference"
        ),
    ),
    _data_rule(
        "packing",
        lambda cfg, kind: not cfg.batch.packing,
        lambda kind: f"packs {kind.packs} documents of one row; set packing: true",
    ),
    _data_rule(
        "data.mix", lambda cfg, kind: bool(cfg.data.mix), lambda kind: f"reads one source of {kind.noun}; set data.path"
    ),
    _data_rule(
        "data.format",
        lambda cfg, kind: cfg.data.format not in kind.formats,
        lambda kind: f"{kind.renders} {', '.join(kind.formats)}",
    ),
    _data_rule(
        "data.train_on_inputs",
        lambda cfg, kind: cfg.data.train_on_inputs,
        lambda kind: f"scores the {kind.scored} only; {kind.drop}",
    ),
    Rule(
        ("grpo.schedule_within_limit", "max_minutes"),
        lambda cfg: (
            cfg.objective.row.generates and cfg.objective.grpo.schedule_within_limit and not cfg.run.max_minutes
        ),
        lambda cfg: (
            "grpo.schedule_within_limit fits the schedule to max_minutes, which is not set; set max_minutes or drop it"
        ),
    ),
    Rule(
        ("grpo.max_completion_length", "seq_len"),
        lambda cfg: cfg.objective.row.generates and cfg.objective.grpo.max_completion_length >= cfg.batch.seq_len,
        lambda cfg: (
            f"grpo.max_completion_length {cfg.objective.grpo.max_completion_length} leaves no room for a "
            f"prompt in seq_len {cfg.batch.seq_len}; raise seq_len"
        ),
    ),
    Rule(
        ("eval.split", "eval.path", "objective"),
        lambda cfg: cfg.eval.enabled and not cfg.objective.row.held_out_loss,
        lambda cfg: (
            f"objective {cfg.objective.name} has no held-out loss; drop eval.split/eval.path and score the "
            "result with `tunelab eval`"
        ),
    ),
    _in_backward("grad_accum", lambda cfg: cfg.batch.grad_accum > 1, "set grad_accum: 1 (raise micro_batch instead)"),
    _in_backward(
        "max_grad_norm",
        lambda cfg: cfg.optimizer.max_grad_norm > 0,
        "set max_grad_norm: 0 (the whole gradient's norm never exists to clip by)",
    ),
    _in_backward(
        "precision",
        lambda cfg: cfg.compute.precision == "fp16",
        "set precision: bf16 (fp16's loss scale unscales at the step)",
    ),
    Rule(
        ("optimizer", "optimizer_in_backward"),
        lambda cfg: cfg.optimizer.optimizer_in_backward and not cfg.optimizer.row.in_backward,
        lambda cfg: (
            f"optimizer {cfg.optimizer.optimizer} cannot step one parameter at a time; set optimizer: "
            f"{cfg.optimizer.row.instead} or optimizer_in_backward: false"
        ),
    ),
    Rule(
        ("bf16_update", "weights"),
        lambda cfg: cfg.adapter.weights == "fp32" and cfg.optimizer.bf16_update != "stochastic",
        lambda cfg: "bf16_update applies to weights: bf16; drop it or set weights: bf16",
    ),
    Rule(
        ("precision", "weights"),
        lambda cfg: cfg.adapter.weights == "bf16" and cfg.compute.precision in ("fp16", "fp32"),
        lambda cfg: "weights: bf16 computes in bf16; set precision: bf16 or auto",
    ),
)


def check(cfg, where: Origins) -> None:
    """Raise the error of the first rule `cfg` (a TrainConfig) breaks, in RULES' order."""
    for rule in RULES:
        if rule.broken(cfg):
            raise TunelabError(f"{where(*rule.keys)}: {rule.why(cfg)}")
