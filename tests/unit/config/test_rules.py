"""config/rules.py: the rules across sections are one table, every row of it reachable, and the four requirements
that pair and prompt objectives put on their data are one rule each, worded by the kind of example."""

import dataclasses

import pytest

from tunelab import objectives, optimizers
from tunelab.config import apply_override, from_raw, load_config
from tunelab.config.origins import Origins
from tunelab.config.rules import RULES
from tunelab.errors import TunelabError

GRPO = ["objective=grpo", "grpo.rewards=[{name: exact_answer}]"]
IN_BACKWARD = ["optimizer_in_backward=true", "max_grad_norm=0"]
# One config breaking each rule first, by the rule's keys.
BREAKS = {
    ("model", "method", "base_quant"): ["model=random:llama-3.1-8b", "base_quant=int8"],
    ("eval.early_stopping_patience", "eval.steps", "save_steps"): ["eval.split=0.1", "eval.early_stopping_patience=2"],
    ("preference.reference", "method"): ["objective=dpo", "method=full", "preference.reference=adapter-disabled"],
    ("packing", "objective"): ["objective=dpo", "packing=false"],
    ("data.mix", "objective"): [*GRPO, "data.mix=[{path: a.jsonl}]"],
    ("data.format", "objective"): ["objective=orpo", "data.format=text"],
    ("data.train_on_inputs", "objective"): [*GRPO, "data.train_on_inputs=true"],
    ("grpo.schedule_within_limit", "max_minutes"): [*GRPO, "grpo.schedule_within_limit=true"],
    ("grpo.max_completion_length", "seq_len"): [*GRPO, "grpo.max_completion_length=600"],
    ("eval.split", "eval.path", "objective"): ["objective=dpo", "eval.path=held.jsonl"],
    ("grad_accum", "optimizer_in_backward"): [*IN_BACKWARD, "grad_accum=2"],
    ("max_grad_norm", "optimizer_in_backward"): ["optimizer_in_backward=true"],
    ("precision", "optimizer_in_backward"): [*IN_BACKWARD, "precision=fp16"],
    ("optimizer", "optimizer_in_backward"): [*IN_BACKWARD, "optimizer=adafactor"],  # made to lack it (below)
    ("bf16_update", "weights"): ["bf16_update=kahan"],
    ("precision", "weights"): ["method=full", "weights=bf16", "precision=fp32"],
}
# The capability rules, under an sft row that lacks every capability (below).
ASKING = {
    ("method", "objective"): ["method=full"],
    ("compile", "objective"): ["compile=true"],
    ("attention", "objective"): ["attention=sdpa"],
    ("grad_ckpt", "objective"): ["grad_ckpt=true"],
    ("activation_offload", "objective"): ["activation_offload=true"],
    ("report_to", "objective"): ["report_to=wandb"],
}
BREAKS |= ASKING


def unchecked(overrides: list[str]):
    """The TrainConfig of `overrides` over the defaults, built but not validated."""
    raw: dict = {}
    for item in overrides:
        apply_override(raw, item)
    return from_raw(raw, Origins("defaults"))


def test_every_rule_is_broken_by_one_config_here():
    assert sorted(BREAKS) == sorted(rule.keys for rule in RULES)


@pytest.mark.parametrize("keys", list(BREAKS), ids=lambda keys: "+".join(keys))
def test_each_rule_fails_a_config_that_breaks_it_first(keys, monkeypatch):
    # Rules every registry row may pass: rows that fail them.
    if keys in ASKING:
        lacking = dataclasses.replace(objectives.get("sft"), capabilities=frozenset())
        monkeypatch.setitem(objectives.REGISTRY, "sft", lacking)
    monkeypatch.setitem(
        optimizers.REGISTRY, "adafactor", dataclasses.replace(optimizers.get("adafactor"), in_backward=False)
    )
    cfg = unchecked(BREAKS[keys])
    rule = next(r for r in RULES if r.broken(cfg))
    assert rule.keys == keys
    with pytest.raises(TunelabError) as e:
        load_config(None, BREAKS[keys])
    assert str(e.value).startswith("override ") and str(e.value).endswith(f": {rule.why(cfg)}")


@pytest.mark.parametrize(
    "objective, override, why",
    [
        ("dpo", "packing=false", "packs chosen and rejected as two documents of one row; set packing: true"),
        ("grpo", "packing=false", "packs each prompt's completions as documents of one row; set packing: true"),
        ("orpo", "data.mix=[{path: a.jsonl}]", "reads one source of pairs; set data.path"),
        ("grpo", "data.mix=[{path: a.jsonl}]", "reads one source of prompts; set data.path"),
        ("dpo", "data.format=text", "renders pairs as alpaca, completion, chat"),
        ("grpo", "data.format=text", "reads prompts in format alpaca, completion, chat"),
        ("dpo", "data.train_on_inputs=true", "scores the responses only; drop data.train_on_inputs"),
        ("grpo", "data.train_on_inputs=true", "scores the completions only; drop it"),
        ("dpo", "eval.split=0.1", "has no held-out loss; drop eval.split/eval.path"),
        ("grpo", "eval.split=0.1", "has no held-out loss; drop eval.split/eval.path"),
    ],
)
def test_pair_and_prompt_objectives_share_the_data_rules_in_their_words(objective, override, why):
    overrides = [f"objective={objective}", override]
    if objective == "grpo":
        overrides.insert(1, "grpo.rewards=[{name: exact_answer}]")
    with pytest.raises(TunelabError) as e:
        load_config(None, overrides)
    assert str(e.value).startswith(f"override {override}: objective {objective} ") and why in str(e.value)


def test_plain_rows_have_no_data_rules():
    load_config(None, ["packing=false", "data.format=text", "data.train_on_inputs=true", "eval.split=0.1"])
