"""What the sections are made of: the choices a setting may take (and their `Literal` types, which `from_dict`
checks a value against where it is read, naming the key and the closest choice), and the field markers that say
where a setting is written in the YAML (`inline`, `key`) and which ones `tunelab plan` takes as flags (`cli`)."""

from __future__ import annotations

from dataclasses import field
from typing import Any, Literal

from .. import methods, objectives, optimizers
from ..data.formats import TEMPLATES

METHODS = methods.NAMES
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
FORMATS = ("alpaca", "chat", "sharegpt", "completion", "text")
SCHEDULERS = ("cosine", "linear", "constant")
TARGET_PRESETS = ("attn", "mlp", "all-linear")
BASE_QUANTS = ("none", "int8", "nf4")
ATTENTIONS = ("auto", "flex", "slots", "sdpa")
REPORT_TO = ("none", "tensorboard", "wandb")
OBJECTIVES = objectives.NAMES
REFERENCES = ("auto", "adapter-disabled", "frozen-copy")
# GRPO's loss aggregations and reward scalings, as TRL 1.16 names them (train/grpo.py).
GRPO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
SCALE_REWARDS = ("group", "batch", "none")
OPTIMIZERS = optimizers.NAMES
WEIGHTS = ("fp32", "bf16")
BF16_UPDATES = ("stochastic", "kahan", "nearest")
# Formats that render a preference pair's text fields (message lists always go through the chat template).
PAIR_FORMATS = ("alpaca", "completion", "chat")
# The choice fields' types: `from_dict` checks a value against its field's choices where it is read, naming the
# key (and the closest choice).
Method = Literal[METHODS]
Precision = Literal[PRECISIONS]
Format = Literal[FORMATS]
Template = Literal[tuple(TEMPLATES)]
Scheduler = Literal[SCHEDULERS]
BaseQuant = Literal[BASE_QUANTS]
Attention = Literal[ATTENTIONS]
ReportTo = Literal[REPORT_TO]
ObjectiveName = Literal[OBJECTIVES]
Reference = Literal[REFERENCES]
GrpoLossType = Literal[GRPO_LOSS_TYPES]
ScaleRewards = Literal[SCALE_REWARDS]
OptimizerName = Literal[OPTIMIZERS]
Weights = Literal[WEIGHTS]
Bf16Update = Literal[BF16_UPDATES]


def inline(**kwargs) -> Any:
    """A section whose fields are top-level keys of the YAML (`seq_len`, not `batch.seq_len`)."""
    return field(metadata={"inline": True}, **kwargs)


def key(name: str, default: Any) -> Any:
    """A field written under another key than its attribute (ObjectiveConfig.name is the YAML's `objective`)."""
    return field(default=default, metadata={"key": name})


def cli(default: Any, help: str = "") -> Any:
    """A setting `tunelab plan` also takes as a flag (`--seq-len`), declared here and nowhere else; `help` is the
    flag's help text where the key alone does not say enough."""
    return field(default=default, metadata={"cli": help or True})
