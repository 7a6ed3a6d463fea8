"""The training configuration: one typed config made of component-owned sections, loaded from YAML plus dotted
overrides, validated once.

Each section (adapter, objective, data, eval, batch, optimizer, compute, run) is a `kw_only` dataclass that declares
its settings once and validates them in its own `validate`; `TrainConfig.validate` adds the rules that span
sections. Components take the sections they need (`cfg.batch`, `cfg.adapter`, ...), never the whole config.

The YAML users write is flat where it always was: an *inline* section's fields are top-level keys (`seq_len`,
`lr`, `method`), a nested one's are under its name (`lora.r`, `data.path`). `PUBLISHED` maps every key a user
writes to its section and field, and `to_dict` writes the same layout back.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from . import decoding, hub, methods, objectives, optimizers
from .data.formats import PROMPT_FORMATS, TEMPLATES
from .errors import TunelabError
from .io import read_text
from .modelref import EMBEDDED, RANDOM
from .runtime import COMPILE_MODES, compile_mode

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
# Keys that configs once had, with why they went: an old config fails naming the key and what to do.
REMOVED = {"data.shuffle": "batches are always shuffled, by `seed`"}
# Hugging Face TrainingArguments / PEFT names a user may type, and tunelab's key for each: the error says "did you
# mean" this key, not the closest string (`learning_rate` is nearer to `warmup_ratio` as text).
HF_NAMES = {
    "learning_rate": "lr",
    "per_device_train_batch_size": "micro_batch",
    "train_batch_size": "micro_batch",
    "batch_size": "micro_batch",
    "gradient_accumulation_steps": "grad_accum",
    "num_train_epochs": "epochs",
    "max_seq_length": "seq_len",
    "max_length": "seq_len",
    "gradient_checkpointing": "grad_ckpt",
    "lr_scheduler_type": "lr_scheduler",
    "max_grad_norm": "max_grad_norm",
    "logging_steps": "log_steps",
    "bf16": "precision",
    "fp16": "precision",
    "torch_compile": "compile",
    "load_in_4bit": "method",
    "load_in_8bit": "base_quant",
    "lora_r": "lora.r",
    "lora_alpha": "lora.alpha",
    "lora_dropout": "lora.dropout",
    "target_modules": "lora.targets",
    "dataset": "data.path",
    "dataset_path": "data.path",
    "output_directory": "output_dir",
}


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


def _check(where: Origins, key: str, ok: bool, why: str) -> None:
    """One range rule: `why` says what `key` must be; the error names where the key was set."""
    if not ok:
        raise TunelabError(f"{where(key)}: {key} {why}")


@dataclass(kw_only=True)
class MixSource:
    """One source of data.mix: a file or hub dataset, its relative weight, its own format/template if any."""

    path: str | None = None
    weight: float = 1.0
    format: Format | None = None
    template: Template | None = None


@dataclass(kw_only=True)
class DataConfig:
    # A file, or a hub dataset `hf://owner/name[@revision][/subset][:split]`.
    path: str | None = None
    # Several sources drawn by weight instead of one path (data/pipeline.py: mix).
    mix: list[MixSource] = field(default_factory=list)
    format: Format = "alpaca"
    # Prompt template of the alpaca format; `compact` drops Alpaca's 30-token preamble.
    template: Template = "alpaca"
    train_on_inputs: bool = False
    max_examples: int | None = None

    @property
    def given(self) -> bool:
        """Whether the config names training data: data.path or data.mix."""
        return self.path is not None or bool(self.mix)

    def spec(self, seq_len: int, seed: int, builder: str, reserve: int = 0):
        """What the data pipeline reads (data/pipeline.DataSpec): this section with each mixture source's format and
        template resolved, rows cut at `seq_len`, a mixture drawn by `seed`, examples built by `builder` (the
        objective's data builder; `reserve` tokens of seq_len kept for generated completions). data/ sits below this
        module (config names its templates), so it takes a spec."""
        from .data.pipeline import DataSpec, MixPart

        mix = tuple(MixPart(m.path, m.weight, m.format or self.format, m.template or self.template) for m in self.mix)
        return DataSpec(
            self.path,
            self.format,
            self.template,
            self.train_on_inputs,
            seq_len,
            self.max_examples,
            mix,
            seed,
            builder=builder,
            reserve=reserve,
        )

    @property
    def label(self) -> str:
        """The training data in a message: its path, or the mixture's sources and weights."""
        if not self.mix:
            return str(self.path)
        return "mix of " + ", ".join(f"{m.path} (weight {m.weight:g})" for m in self.mix)

    def validate(self, where: Origins) -> None:
        if self.format != "alpaca" and self.template != "alpaca":
            raise TunelabError(
                f"{where('data.template', 'data.format')}: data.template applies to the alpaca format only; "
                f"drop it for {self.format!r}"
            )
        if self.max_examples is not None:
            _check(where, "data.max_examples", self.max_examples >= 1, "must be at least 1")
        if self.path is not None and self.mix:
            raise TunelabError(
                f"{where('data.path', 'data.mix')}: data.path and data.mix are exclusive; "
                "train on one source or list them all under data.mix"
            )
        if hub.is_hub_data(self.path):
            hub.parse_data(self.path, f"{where('data.path')}: data.path")
        for i, part in enumerate(self.mix):
            name = f"data.mix[{i}]"
            if not part.path:
                raise TunelabError(
                    f"{where(f'{name}.path')}: {name}.path is missing; each source needs a file or hf://owner/name"
                )
            if hub.is_hub_data(part.path):
                hub.parse_data(part.path, f"{where(f'{name}.path')}: {name}.path")
            _check(where, f"{name}.weight", part.weight > 0, f"must be positive, got {part.weight:g}")
            fmt = part.format or self.format
            # `alpaca`, data.template's default, is accepted with any format, as at the top level.
            if part.template is not None and fmt != "alpaca" and part.template != "alpaca":
                at = where(f"{name}.template", f"{name}.format", "data.format")
                raise TunelabError(f"{at}: {name}.template applies to the alpaca format only; drop it for {fmt!r}")


@dataclass(kw_only=True)
class LoraConfig:
    r: int = cli(16)
    alpha: float = 32.0
    dropout: float = 0.0
    # A list of module names, or one of TARGET_PRESETS.
    targets: Union[list[str], str] = "all-linear"

    def validate(self, where: Origins) -> None:
        if isinstance(self.targets, str):
            _choice(where, "lora.targets", self.targets, TARGET_PRESETS)
        elif not self.targets:
            raise TunelabError(
                f"{where('lora.targets')}: lora.targets is empty; name modules (e.g. [q_proj, v_proj]) or a preset"
            )
        _check(where, "lora.r", self.r >= 1, f"must be at least 1, got {self.r}")
        _check(
            where,
            "lora.alpha",
            self.alpha > 0,
            f"must be positive (the adapter's scale is alpha / r), got {self.alpha}",
        )
        _check(where, "lora.dropout", 0 <= self.dropout < 1, f"must be in [0, 1), got {self.dropout}")


@dataclass(kw_only=True)
class AdapterConfig:
    """What trains: the method (methods.py's registry), the frozen base's quantization, the LoRA shape."""

    method: Method = cli("lora")
    # Quantization of the frozen base: qlora implies nf4; goat-style recipes use int8 under plain LoRA.
    base_quant: BaseQuant = "none"
    # The trained weights' dtype under full fine-tuning: fp32 master weights, or bf16 (half the bytes, and no
    # fp32 residual stream), updated as optimizer.bf16_update says.
    weights: Weights = cli("fp32")
    lora: LoraConfig = field(default_factory=LoraConfig)

    @property
    def row(self) -> methods.Method:
        return methods.get(self.method)

    @property
    def quant(self) -> str:
        """The base's quantization the run uses: the method's own (qlora: nf4), else base_quant as given."""
        return methods.effective_base_quant(self.method, self.base_quant)

    def validate(self, where: Origins) -> None:
        self.lora.validate(where)
        if self.base_quant in self.row.refused_base_quants:
            raise TunelabError(f"{where('base_quant', 'method')}: {self.row.refusal}")
        if self.weights != "fp32" and not self.row.trains_base:
            raise TunelabError(
                f"{where('weights', 'method')}: weights: {self.weights} applies to method full (adapters train in "
                "fp32 over the frozen base); drop weights"
            )


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
    # With max_minutes: after the first generation batch, and again after each from the third on (on the pace of the
    # last three batches after the first, whose time holds the warm-up), the run and its learning-rate schedule end at
    # the batches that pace says fit, so the schedule decays within the limit instead of being cut near its peak on a
    # machine slower than max_steps assumed.
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


@dataclass(kw_only=True)
class EvalConfig:
    # Held-out rows: a fraction of data.path (chosen by `seed`, never trained on) or a file of its own.
    split: float | None = None
    path: str | None = None
    # Optimizer steps between evaluations; null evaluates at each save_steps checkpoint. Always at the end.
    steps: int | None = None
    # Evaluate at most this many held-out examples; a split still holds out its whole fraction.
    max_rows: int | None = None
    early_stopping_patience: int | None = None
    keep_best: bool = True

    @property
    def enabled(self) -> bool:
        return self.split is not None or self.path is not None

    def spec(self, seed: int):
        """The held-out data the pipeline splits off or reads (data/pipeline.HeldOutSpec), or None without any."""
        from .data.pipeline import HeldOutSpec

        return HeldOutSpec(self.split, self.path, self.max_rows, seed) if self.enabled else None

    def every(self, save_steps: int) -> int:
        """Optimizer steps between evaluations: eval.steps, else the run's save_steps (0: only at the end)."""
        return self.steps if self.steps is not None else save_steps

    def validate(self, where: Origins) -> None:
        if self.split is not None and self.path is not None:
            raise TunelabError(
                f"{where('eval.split', 'eval.path')}: eval.split and eval.path are exclusive; "
                "hold out a fraction or name a file, not both"
            )
        if self.split is not None:
            _check(
                where,
                "eval.split",
                0 < self.split <= 0.5,
                f"must be in (0, 0.5] (the fraction of data.path held out), got {self.split}",
            )
        if hub.is_hub_data(self.path):
            hub.parse_data(self.path, f"{where('eval.path')}: eval.path")
        for name, value in (
            ("eval.steps", self.steps),
            ("eval.max_rows", self.max_rows),
            ("eval.early_stopping_patience", self.early_stopping_patience),
        ):
            if value is not None:
                _check(where, name, value >= 1, f"must be at least 1 (or null), got {value}")
                if not self.enabled:
                    raise TunelabError(
                        f"{where(name)}: {name} needs held-out data; set eval.split (e.g. 0.1) or eval.path"
                    )


@dataclass(kw_only=True)
class BatchConfig:
    """How the data is cut into steps: row length, rows per micro-batch and per optimizer step, how long."""

    seq_len: int = cli(512)
    micro_batch: int = cli(8)
    grad_accum: int = cli(1)
    epochs: float = cli(1.0)
    max_steps: int | None = None
    packing: bool = cli(True)

    def validate(self, where: Origins) -> None:
        _check(where, "seq_len", self.seq_len >= 8, f"must be at least 8, got {self.seq_len}")
        for name in ("micro_batch", "grad_accum"):
            value = getattr(self, name)
            _check(where, name, value >= 1, f"must be at least 1, got {value}")
        _check(where, "epochs", self.epochs > 0, f"must be positive, got {self.epochs}")
        if self.max_steps is not None:
            _check(
                where,
                "max_steps",
                self.max_steps >= 1,
                f"must be at least 1 (or null for a full run), got {self.max_steps}",
            )


@dataclass(kw_only=True)
class OptimizerConfig:
    lr: float = 2e-4
    lr_scheduler: Scheduler = "cosine"
    warmup_ratio: float = 0.03
    weight_decay: float = 0.0
    max_grad_norm: float = cli(1.0)
    # optimizers.py's registry: adamw, adamw_8bit and paged_adamw_8bit (bitsandbytes), adafactor.
    optimizer: OptimizerName = cli("adamw")
    # Update each parameter in its gradient hook and free its gradient (train/optim.py): no whole-model gradient
    # buffer. Needs grad_accum 1 and max_grad_norm 0 (no gradient norm exists before the updates).
    optimizer_in_backward: bool = cli(False)
    # How an update is written to bf16 weights (weights: bf16): stochastic rounding, a Kahan compensation buffer
    # (2 more bytes per parameter), or nearest (plain rounding: small updates are lost).
    bf16_update: Bf16Update = "stochastic"

    @property
    def row(self) -> optimizers.Optimizer:
        return optimizers.get(self.optimizer)

    def validate(self, where: Origins) -> None:
        _check(where, "lr", self.lr > 0, f"must be positive, got {self.lr}")
        _check(where, "weight_decay", self.weight_decay >= 0, f"must be 0 or positive, got {self.weight_decay}")
        _check(
            where,
            "max_grad_norm",
            self.max_grad_norm >= 0,
            f"must be positive, or 0 for no clipping; got {self.max_grad_norm}",
        )
        _check(where, "warmup_ratio", 0 <= self.warmup_ratio < 1, f"must be in [0, 1), got {self.warmup_ratio}")


@dataclass(kw_only=True)
class ComputeConfig:
    """Where and how the step computes: device, precision, and the speed/memory levers that change no result."""

    precision: Precision = cli("auto")
    device: str = "auto"
    grad_ckpt: bool = cli(False)
    # torch.compile each decoder block (recipes/finetune.py: compile_blocks): fused element-wise passes. `auto`
    # compiles when plan predicts the one-off compile is paid back within the run (runtime.compile_choice).
    compile: Union[bool, str] = "auto"
    # Keep the activations saved for backward in pinned host memory instead of the device's (model/offload.py):
    # long sequences on one GPU, at the cost of a copy each way per layer.
    activation_offload: bool = False
    # Packed-row attention (model/attention.py): auto is flex on CUDA (flash-attn's varlen kernels where
    # installed) and per-sequence slots on CPU; sdpa is transformers' own, with a block-diagonal mask.
    attention: Attention = "auto"

    def __post_init__(self) -> None:
        # compile is a bool (YAML true/false force it) or auto: the words true and false (a quoted YAML value, a
        # keyword argument) are the booleans, normalised where the section is made so that validate() only checks.
        self.compile = {"true": True, "false": False}.get(compile_mode(self.compile), self.compile)

    def validate(self, where: Origins) -> None:
        _choice(where, "compile", compile_mode(self.compile), COMPILE_MODES)


@dataclass(kw_only=True)
class RunConfig:
    """Where the run writes, how often, how long at most, and its seed."""

    output_dir: str = "runs/default"
    resume: Union[bool, str] = False
    seed: int = 42
    save_steps: int = 0
    save_total_limit: int = 2
    log_steps: int = 10
    # Training time allowed, over every resume of the run (0: none). The run ends, and saves as a finished run,
    # after the last optimizer step that its mean step time says still ends within it: a run sized by a
    # prediction keeps a wall-clock budget when the machine is slower than predicted.
    max_minutes: float = 0.0
    # With max_minutes: once the warm-up steps are done, and after every step from then on, the run and its
    # learning-rate schedule end at the last step that the measured pace says fits, so the schedule decays within
    # the limit instead of being cut mid-way (train/loop.LimitFit); give the run more data than the limit holds.
    schedule_within_limit: bool = False
    # Also send metrics.jsonl's records to an experiment tracker (train/trackers.py).
    report_to: ReportTo = "none"

    def validate(self, where: Origins) -> None:
        for name in ("save_total_limit", "log_steps"):
            value = getattr(self, name)
            _check(where, name, value >= 1, f"must be at least 1, got {value}")
        _check(
            where, "seed", 0 <= self.seed < 2**32, f"must be in [0, 2**32), as numpy's generators need; got {self.seed}"
        )
        _check(where, "output_dir", bool(self.output_dir.strip()), "is empty; name the folder the run writes to")
        _check(where, "save_steps", self.save_steps >= 0, "must be 0 (only the final save) or positive")
        _check(
            where,
            "max_minutes",
            0 <= self.max_minutes < math.inf,
            f"must be 0 (no limit) or a positive number of minutes, got {self.max_minutes}",
        )
        _check(
            where,
            "schedule_within_limit",
            not self.schedule_within_limit or self.max_minutes > 0,
            "fits the schedule to max_minutes, which is not set; set max_minutes or drop it",
        )


@dataclass(kw_only=True)
class TrainConfig:
    model: str = cli(
        EMBEDDED,
        "catalog model (meta-llama/Llama-3.1-8B or its short id llama-3.1-8b), hub id, local directory or .gguf",
    )
    # Let transformers import Python files shipped with the model (custom architectures). That code runs with
    # the user's permissions, so only a config that names a model it trusts turns this on.
    trust_remote_code: bool = False
    adapter: AdapterConfig = inline(default_factory=AdapterConfig)
    objective: ObjectiveConfig = inline(default_factory=ObjectiveConfig)
    data: DataConfig = field(default_factory=DataConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    batch: BatchConfig = inline(default_factory=BatchConfig)
    optimizer: OptimizerConfig = inline(default_factory=OptimizerConfig)
    compute: ComputeConfig = inline(default_factory=ComputeConfig)
    run: RunConfig = inline(default_factory=RunConfig)

    def data_specs(self):
        """(the training data's spec, the held-out data's or None), as data/pipeline.prepare_split takes them."""
        row = self.objective.row
        reserve = self.objective.grpo.max_completion_length if row.generates else 0
        spec = self.data.spec(self.batch.seq_len, self.run.seed, row.data_builder, reserve)
        return spec, self.eval.spec(self.run.seed)

    def validate(self, where: Origins | str = "config") -> None:
        """Every check that needs no model or data: each section's own, then the rules across sections, each
        error named by the origin of the setting it is about (`where`, or a file name for all settings)."""
        if isinstance(where, str):
            where = Origins(where)
        for f in dataclasses.fields(self):
            section = getattr(self, f.name)
            if dataclasses.is_dataclass(section):
                section.validate(where)
        if self.model.startswith(RANDOM) and self.adapter.quant != "none":
            raise TunelabError(
                f"{where('model', 'method', 'base_quant')}: model {self.model} has random weights, built unquantized; "
                f"{self.adapter.quant} needs a real checkpoint, or use method lora with base_quant none"
            )
        if (
            self.eval.enabled
            and self.eval.steps is None
            and self.run.save_steps == 0
            and self.eval.early_stopping_patience is not None
        ):
            raise TunelabError(
                f"{where('eval.early_stopping_patience', 'eval.steps', 'save_steps')}: eval.early_stopping_patience "
                "needs evaluations during the run; set eval.steps (or save_steps)"
            )
        self._validate_objective(where)
        self._validate_optimizer(where)

    def _validate_optimizer(self, where: Origins) -> None:
        """The optimizer section against the batches, the precision and the weights."""
        o = self.optimizer
        if o.optimizer_in_backward:
            for name, bad, why in (
                ("grad_accum", self.batch.grad_accum > 1, "set grad_accum: 1 (raise micro_batch instead)"),
                (
                    "max_grad_norm",
                    o.max_grad_norm > 0,
                    "set max_grad_norm: 0 (the whole gradient's norm never exists to clip by)",
                ),
                (
                    "precision",
                    self.compute.precision == "fp16",
                    "set precision: bf16 (fp16's loss scale unscales at the step)",
                ),
            ):
                if bad:
                    raise TunelabError(
                        f"{where(name, 'optimizer_in_backward')}: optimizer_in_backward updates each parameter as "
                        f"its gradient is made; {why}"
                    )
            if not o.row.in_backward:
                raise TunelabError(
                    f"{where('optimizer', 'optimizer_in_backward')}: optimizer {o.optimizer} cannot step one "
                    f"parameter at a time; set optimizer: {o.row.instead} or optimizer_in_backward: false"
                )
        if self.adapter.weights == "fp32" and o.bf16_update != "stochastic":
            raise TunelabError(
                f"{where('bf16_update', 'weights')}: bf16_update applies to weights: bf16; drop it or set weights: bf16"
            )
        if self.adapter.weights == "bf16" and self.compute.precision in ("fp16", "fp32"):
            raise TunelabError(
                f"{where('precision', 'weights')}: weights: bf16 computes in bf16; set precision: bf16 or auto"
            )

    def _validate_capabilities(self, where: Origins) -> None:
        """Each setting that needs a capability of the objective's recipe (objectives.CAPABILITIES), refused where
        the objective's row lacks it."""
        needs = (
            ("trains_base", ("method",), self.adapter.row.trains_base, "use method lora, dora or qlora"),
            ("compiled_blocks", ("compile",), self.compute.compile is True, "set compile: auto or false"),
            ("attention_choice", ("attention",), self.compute.attention != "auto", "set attention: auto"),
            ("activation_checkpointing", ("grad_ckpt",), self.compute.grad_ckpt, "set grad_ckpt: false"),
            ("activation_offload", ("activation_offload",), self.compute.activation_offload, "drop it"),
            ("trackers", ("report_to",), self.run.report_to != "none", "set report_to: none"),
        )
        for capability, keys, asked, fix in needs:
            refusal = (
                objectives.lacking(self.objective.row, capability, f"{keys[0]} needs it; {fix}") if asked else None
            )
            if refusal:
                raise TunelabError(f"{where(*keys, 'objective')}: {refusal}")

    def _validate_objective(self, where: Origins) -> None:
        """The objective's needs (objectives.py) against the method, the data and the batches."""
        self._validate_capabilities(where)
        row, p = self.objective.row, self.objective.preference
        if row.generates:
            self._validate_generation(where)
            return
        if not row.pairs:
            return
        name = self.objective.name
        if row.reference and p.reference not in ("auto", methods.get(self.adapter.method).reference):
            raise TunelabError(
                f"{where('preference.reference', 'method')}: method {self.adapter.method} takes reference "
                f"{methods.get(self.adapter.method).reference}, not {p.reference}; drop preference.reference"
            )
        checks = (
            (
                "packing",
                not self.batch.packing,
                "packs chosen and rejected as two documents of one row; set packing: true",
            ),
            ("data.mix", bool(self.data.mix), "reads one source of pairs; set data.path"),
            ("data.format", self.data.format not in PAIR_FORMATS, f"renders pairs as {', '.join(PAIR_FORMATS)}"),
            ("data.train_on_inputs", self.data.train_on_inputs, "scores the responses only; drop data.train_on_inputs"),
        )
        for name_, bad, why in checks:
            if bad:
                raise TunelabError(f"{where(name_, 'objective')}: objective {name} {why}")
        if self.eval.enabled and not row.held_out_loss:
            raise TunelabError(
                f"{where('eval.split', 'eval.path', 'objective')}: objective {name} has no held-out loss; "
                "drop eval.split/eval.path and score the result with `tunelab eval`"
            )

    def _validate_generation(self, where: Origins) -> None:
        """What objective grpo runs on: one source of prompt rows in a format with a prompt, a budget left for the
        completion (what its recipe can do beside: _validate_capabilities)."""
        g, name = self.objective.grpo, self.objective.name
        checks = (
            (
                "packing",
                not self.batch.packing,
                "packs each prompt's completions as documents of one row; set packing: true",
            ),
            ("data.mix", bool(self.data.mix), "reads one source of prompts; set data.path"),
            (
                "data.format",
                self.data.format not in PROMPT_FORMATS,
                f"reads prompts in format {', '.join(PROMPT_FORMATS)}",
            ),
            ("data.train_on_inputs", self.data.train_on_inputs, "scores the completions only; drop it"),
        )
        for name_, bad, why in checks:
            if bad:
                raise TunelabError(f"{where(name_, 'objective')}: objective {name} {why}")
        if g.schedule_within_limit and not self.run.max_minutes:
            raise TunelabError(
                f"{where('grpo.schedule_within_limit', 'max_minutes')}: grpo.schedule_within_limit fits the schedule "
                "to max_minutes, which is not set; set max_minutes or drop it"
            )
        if g.max_completion_length >= self.batch.seq_len:
            raise TunelabError(
                f"{where('grpo.max_completion_length', 'seq_len')}: grpo.max_completion_length "
                f"{g.max_completion_length} leaves no room for a prompt in seq_len {self.batch.seq_len}; raise seq_len"
            )
        if self.eval.enabled:
            raise TunelabError(
                f"{where('eval.split', 'eval.path', 'objective')}: objective {name} has no held-out loss; "
                "drop eval.split/eval.path and score the result with `tunelab eval`"
            )


def published(cls: type = None) -> dict[str, tuple[str | None, str]]:
    """Every top-level key a user writes -> (the inline section holding it, or None for TrainConfig's own field;
    the attribute). Nested sections (`data`, `lora`, ...) are one key each."""
    out: dict[str, tuple[str | None, str]] = {}
    for f in dataclasses.fields(cls or TrainConfig):
        if f.metadata.get("inline"):
            for g in dataclasses.fields(_section_type(f)):
                out[g.metadata.get("key", g.name)] = (f.name, g.name)
        else:
            out[f.metadata.get("key", f.name)] = (None, f.name)
    return out


def leaf_keys() -> set[str]:
    """Every setting as a user writes it, dotted: `lora.r`, `data.mix`, `seq_len`, `objective`."""
    out: set[str] = set()
    for top, (section, attr) in published().items():
        owner = TrainConfig if section is None else _section_type(_field(TrainConfig, section))
        tp = typing.get_type_hints(owner)[attr]
        out |= _leaves(tp, top) if dataclasses.is_dataclass(tp) else {top}
    return out


def _leaves(cls: type, prefix: str) -> set[str]:
    hints = typing.get_type_hints(cls)
    out: set[str] = set()
    for f in dataclasses.fields(cls):
        name = f"{prefix}.{f.metadata.get('key', f.name)}"
        out |= _leaves(hints[f.name], name) if dataclasses.is_dataclass(hints[f.name]) else {name}
    return out


def _section_type(f: dataclasses.Field) -> type:
    return typing.get_type_hints(TrainConfig)[f.name]


def cli_keys() -> dict[str, tuple[Any, str]]:
    """The settings `tunelab plan` takes as flags: dotted key -> (its type, its help text or ""), the `cli()`
    fields of the sections."""
    out: dict[str, tuple[Any, str]] = {}
    for top, (section, attr) in published().items():
        owner = TrainConfig if section is None else _section_type(_field(TrainConfig, section))
        f = _field(owner, attr)
        tp = typing.get_type_hints(owner)[attr]
        if f.metadata.get("cli"):
            out[top] = (tp, _help(f))
        if dataclasses.is_dataclass(tp):
            for g in dataclasses.fields(tp):
                if g.metadata.get("cli"):
                    out[f"{top}.{g.name}"] = (typing.get_type_hints(tp)[g.name], _help(g))
    return out


def _help(f: dataclasses.Field) -> str:
    text = f.metadata.get("cli")
    return text if isinstance(text, str) else ""


def _field(cls: type, name: str) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(cls) if f.name == name)


def load_config(path: str | Path | None, overrides: list[str] = ()) -> TrainConfig:
    """Read a YAML file (or the defaults when `path` is None), apply `key=value` overrides, validate."""
    raw: dict[str, Any] = {}
    origins = Origins("defaults")
    if path is not None:
        path = Path(path)
        origins = Origins(str(path))
        if path.is_dir():
            raise TunelabError(f"{path}: is a directory; pass the config's YAML file")
        if not path.is_file():
            raise TunelabError(f"{path}: config file not found")
        try:
            loaded = yaml.load(read_text(path), Loader=UniqueKeyLoader)
        except DuplicateKey as e:
            raise TunelabError(f"{path}:{e.line}: key {e.key} appears twice; keep one") from None
        except yaml.YAMLError as e:
            raise TunelabError(_yaml_error(path, e)) from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise TunelabError(f"{path}: the top level must be a mapping of keys to values")
        raw = loaded
    for item in overrides:
        origins.set(apply_override(raw, item), item)
    cfg = from_raw(raw, origins)
    cfg.validate(origins)
    return cfg


def from_raw(raw: dict[str, Any], source: Origins) -> TrainConfig:
    """A TrainConfig from the flat YAML layout: each top-level key goes to the section that declares it."""
    if not isinstance(raw, dict):
        raise TunelabError(f"{source('')}: config must be a mapping")
    keys = published()
    own: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    for name, value in raw.items():
        if name not in keys:
            raise _unknown(source, "", str(name), list(keys))
        section, attr = keys[name]
        if section is None:
            own[name] = value
        else:
            sections.setdefault(section, {})[name] = value
    kwargs = {}
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        if f.metadata.get("inline"):
            kwargs[f.name] = from_dict(hints[f.name], sections.get(f.name, {}), source, "")
        elif f.name in own:
            kwargs[f.name] = _coerce(hints[f.name], own[f.name], source, f.name)
    return TrainConfig(**kwargs)


class DuplicateKey(Exception):
    """A key given twice in one YAML mapping: `key` is its dotted path, `line` the 1-based line of the second."""

    def __init__(self, key: str, line: int):
        super().__init__(f"line {line}: key {key} appears twice")
        self.key = key
        self.line = line


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that raises DuplicateKey for a key given twice in one mapping, where PyYAML keeps the last.

    The whole document is checked before it is built, so the error names the key by its dotted path (`lora.r`,
    `data.mix[0].path`). A key that a `<<` merge brings in may be given again: that is how a merge is overridden.
    """

    def construct_document(self, node: yaml.Node) -> Any:
        self._check_unique(node, "", set())
        return super().construct_document(node)

    def _check_unique(self, node: yaml.Node, path: str, seen: set[int]) -> None:
        if id(node) in seen:  # an alias: its node was checked where its anchor is, and may contain itself
            return
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._check_unique(item, f"{path}[{i}]", seen)
        elif isinstance(node, yaml.MappingNode):
            keys: set = set()
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    self._check_unique(value_node, path, seen)
                    continue
                key = self.construct_object(key_node, deep=True)
                name = f"{path}.{key}" if path else str(key)
                if isinstance(key, typing.Hashable):
                    if key in keys:
                        raise DuplicateKey(name, key_node.start_mark.line + 1)
                    keys.add(key)
                self._check_unique(value_node, name, seen)


class Origins:
    """Where each setting came from, as the prefix of an error about it: the `key=value` override that set it
    (or a section holding it) last, else the config file, or `defaults` when there is none."""

    def __init__(self, file: str):
        self.file = file
        self.overrides: dict[str, str] = {}

    def set(self, key: str, item: str) -> None:
        """Record override `item` as the origin of `key` and of everything under it."""
        # An override replaces all that is under its key, so earlier overrides there set nothing that is left.
        self.overrides = {k: v for k, v in self.overrides.items() if key not in _ancestors(k)}
        self.overrides[key] = item

    def __call__(self, *keys: str) -> str:
        """The prefix for an error about `keys`: the override that set the first one an override set, else the file."""
        for key in keys:
            for k in _ancestors(key):
                if k in self.overrides:
                    return f"override {self.overrides[k]}"
        return self.file


def _ancestors(key: str) -> list[str]:
    """`data.mix[0].path` -> [`data.mix[0].path`, `data.mix[0]`, `data.mix`, `data`]: the key, then its sections."""
    parts = key.replace("[", ".[").split(".")
    return [".".join(parts[:n]).replace(".[", "[") for n in range(len(parts), 0, -1)]


def _yaml_error(path: Path, e: yaml.YAMLError) -> str:
    """`file:line: not valid YAML (problem at line L column C)`: the line the parser stopped at, 1-based."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    if mark is None:
        return f"{path}: not valid YAML ({problem}); fix the file"
    return f"{path}:{mark.line + 1}: not valid YAML ({problem} at line {mark.line + 1} column {mark.column + 1}); fix that line"


def apply_override(raw: dict[str, Any], item: str) -> str:
    """Set `a.b.c=value` in a nested dict and return the key `a.b.c`; the value is parsed as YAML so `1e-4`,
    `true`, `[q_proj]` work."""
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise TunelabError(f"override {item!r}: expected key=value, e.g. lora.r=16")
    parts = key.strip().split(".")
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise TunelabError(f"override {item!r}: {part!r} is not a section")
        node = child
    try:
        parsed = yaml.load(value, Loader=UniqueKeyLoader) if value != "" else None
    except DuplicateKey as e:
        nested = e.key if e.key.startswith("[") else f".{e.key}"
        raise TunelabError(f"override {item}: key {'.'.join(parts)}{nested} appears twice; keep one") from None
    except yaml.YAMLError:
        parsed = value
    # `model=random:` or `data.path=a: b` read as YAML are one-key mappings nobody means on a command line
    # (sections take dotted keys); a mapping is only what is written as one, in braces.
    if isinstance(parsed, dict) and not value.lstrip().startswith("{"):
        parsed = value
    node[parts[-1]] = parsed
    return ".".join(parts)


def from_dict(cls: type, raw: dict[str, Any], source: Origins, prefix: str) -> Any:
    """Build dataclass `cls` from `raw`, failing on unknown keys (with a suggestion) and wrong types; `source`
    names where each key came from. A field may be written under another key (`key()`)."""
    if not isinstance(raw, dict):
        raise TunelabError(f"{source(prefix.rstrip('.'))}: {prefix.rstrip('.') or 'config'} must be a mapping")
    hints = typing.get_type_hints(cls)
    names = {f.metadata.get("key", f.name): f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for name, value in raw.items():
        if f"{prefix}{name}" in REMOVED:
            raise TunelabError(
                f"{source(f'{prefix}{name}')}: key '{prefix}{name}' was removed ({REMOVED[f'{prefix}{name}']}); delete it"
            )
        if name not in names:
            raise _unknown(source, prefix, str(name), list(names))
        kwargs[names[name]] = _coerce(hints[names[name]], value, source, f"{prefix}{name}")
    return cls(**kwargs)


def _unknown(source: Origins, prefix: str, name: str, known: list[str]) -> TunelabError:
    """An unknown key: the tunelab key a Hugging Face name means, else the closest key, else the known keys."""
    dotted = f"{prefix}{name}"
    if dotted in REMOVED:
        return TunelabError(f"{source(dotted)}: key '{dotted}' was removed ({REMOVED[dotted]}); delete it")
    if dotted in HF_NAMES:
        hint = f"; did you mean '{HF_NAMES[dotted]}'? (tunelab's name for Hugging Face's {dotted})"
    elif close := difflib.get_close_matches(name, known, n=1, cutoff=0.4):
        hint = f"; did you mean '{prefix}{close[0]}'?"
    else:
        hint = f"; known keys: {', '.join(known)}"
    return TunelabError(f"{source(dotted)}: unknown key '{dotted}'{hint}")


def _coerce(tp: Any, value: Any, source: Origins, key: str) -> Any:
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value if value is not None else {}, source, f"{key}.")
    origin = typing.get_origin(tp)
    if origin is Literal:
        text = _coerce(str, value, source, key)
        _choice(source, key, text, typing.get_args(tp))
        return text
    if origin in (Union, types.UnionType):
        return _coerce_union(tp, value, source, key)
    if origin is list:
        return _coerce_list(tp, value, source, key)
    if origin is dict:  # free-form keyword arguments (grpo.rewards[i].args): a mapping with text keys
        if value is None:
            return {}
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise TunelabError(f"{source(key)}: {key} must be a mapping of names to values, got {value!r}")
        return dict(value)
    return _coerce_scalar(tp, value, source, key)


def _coerce_union(tp: Any, value: Any, source: Origins, key: str) -> Any:
    """The first of the union's types that takes `value`; an optional choice (`Format | None`) keeps its own error."""
    options = typing.get_args(tp)
    if value is None and type(None) in options:
        return None
    choices = [o for o in options if typing.get_origin(o) is Literal]
    if choices and len(options) == 2 and type(None) in options:
        return _coerce(choices[0], value, source, key)
    for option in options:
        if option is type(None):
            continue
        try:
            return _coerce(option, value, source, key)
        except TunelabError:
            continue
    raise _type_error(source, key, tp, value)


def _coerce_list(tp: Any, value: Any, source: Origins, key: str) -> list:
    (item_tp,) = typing.get_args(tp)
    if isinstance(value, str) and "," in value:  # `lora.targets=q_proj,v_proj` on the command line
        value = [v.strip() for v in value.split(",") if v.strip()]
    if dataclasses.is_dataclass(item_tp):  # a list of sections (data.mix): each named by its index
        if value is None:
            return []
        if not isinstance(value, list):
            raise TunelabError(f"{source(key)}: {key} must be a list of mappings, got {value!r}")
        return [_coerce(item_tp, v, source, f"{key}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, list):
        raise _type_error(source, key, tp, value)
    return [_coerce(item_tp, v, source, key) for v in value]


def _coerce_scalar(tp: Any, value: Any, source: Origins, key: str) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _type_error(source, key, tp, value)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise _type_error(source, key, tp, value)
    if tp is float:
        return _coerce_float(value, source, key)
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise _type_error(source, key, tp, value)
    raise TypeError(f"config type {tp} of {key} is not handled")  # a bug in this module, not user input


def _coerce_float(value: Any, source: Origins, key: str) -> float:
    number = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:  # YAML 1.1 reads `1e-4` as a string
            number = float(value)
        except ValueError:
            pass
    if number is None:
        raise _type_error(source, key, float, value)
    # nan and inf pass every range check (nan compares false) and fail deep in training instead.
    if not math.isfinite(number):
        raise TunelabError(f"{source(key)}: {key} must be a finite number, got {value!r}")
    return number


def _type_error(source: Origins, key: str, tp: Any, value: Any) -> TunelabError:
    name = getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
    return TunelabError(f"{source(key)}: {key} must be {name}, got {value!r}")


def _choice(source: Origins, key: str, value: str, choices: Collection[str]) -> None:
    if value not in choices:
        close = difflib.get_close_matches(value, choices, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TunelabError(f"{source(key)}: {key} must be one of {', '.join(choices)}; got {value!r}{hint}")


def to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """The config in the layout users write (inline sections' fields at the top level), as config.yaml stores it."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.metadata.get("inline"):
            for g in dataclasses.fields(value):
                item = getattr(value, g.name)
                out[g.metadata.get("key", g.name)] = (
                    dataclasses.asdict(item) if dataclasses.is_dataclass(item) else item
                )
        else:
            out[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return out


def dump_yaml(cfg: TrainConfig) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
