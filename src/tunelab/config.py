"""The training configuration: typed dataclasses, loaded from YAML plus dotted overrides, validated once.

This module is the single source of truth for every setting. Components never see a `TrainConfig`;
the command entry points read it and pass typed arguments down.
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

from . import hub, methods, objectives
from .data.formats import TEMPLATES
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
# Formats that render a preference pair's text fields (message lists always go through the chat template).
PAIR_FORMATS = ("alpaca", "completion", "chat")
# The choice fields' types: `from_dict` checks a value against its field's choices where it is read, naming the
# key (and the closest choice) as validate() did.
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
# Keys that configs once had, with why they went: an old config fails naming the key and what to do.
REMOVED = {"data.shuffle": "batches are always shuffled, by `seed`"}


@dataclass
class MixSource:
    """One source of data.mix: a file or hub dataset, its relative weight, its own format/template if any."""

    path: str | None = None
    weight: float = 1.0
    format: Format | None = None
    template: Template | None = None


@dataclass
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


@dataclass
class LoraConfig:
    r: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    # A list of module names, or one of TARGET_PRESETS.
    targets: Union[list[str], str] = "all-linear"


@dataclass
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


@dataclass
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


@dataclass
class TrainConfig:
    model: str = EMBEDDED
    # Let transformers import Python files shipped with the model (custom architectures). That code runs with
    # the user's permissions, so only a config that names a model it trusts turns this on.
    trust_remote_code: bool = False
    method: Method = "lora"
    # What a step trains: sft (the response tokens' cross-entropy), dpo or orpo (preference pairs).
    objective: ObjectiveName = "sft"
    preference: PreferenceConfig = field(default_factory=PreferenceConfig)
    data: DataConfig = field(default_factory=DataConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # Quantization of the frozen base: qlora implies nf4; goat-style recipes use int8 under plain LoRA.
    base_quant: BaseQuant = "none"
    seq_len: int = 512
    micro_batch: int = 8
    grad_accum: int = 1
    epochs: float = 1.0
    max_steps: int | None = None
    lr: float = 2e-4
    lr_scheduler: Scheduler = "cosine"
    warmup_ratio: float = 0.03
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    precision: Precision = "auto"
    packing: bool = True
    grad_ckpt: bool = False
    # torch.compile each decoder block (recipes/train.py: compile_blocks): fused element-wise passes. `auto`
    # compiles when plan predicts the one-off compile is paid back within the run (runtime.compile_choice).
    compile: Union[bool, str] = "auto"
    # Keep the activations saved for backward in pinned host memory instead of the device's (model/offload.py):
    # long sequences on one GPU, at the cost of a copy each way per layer.
    activation_offload: bool = False
    # Packed-row attention (model/attention.py): auto is flex on CUDA (flash-attn's varlen kernels where
    # installed) and per-sequence slots on CPU; sdpa is transformers' own, with a block-diagonal mask.
    attention: Attention = "auto"
    save_steps: int = 0
    save_total_limit: int = 2
    log_steps: int = 10
    # Also send metrics.jsonl's records to an experiment tracker (train/trackers.py).
    report_to: ReportTo = "none"
    output_dir: str = "runs/default"
    resume: Union[bool, str] = False
    seed: int = 42
    device: str = "auto"


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
    cfg = from_dict(TrainConfig, raw, source=origins, prefix="")
    validate(cfg, origins)
    return cfg


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
    names where each key came from."""
    if not isinstance(raw, dict):
        raise TunelabError(f"{source(prefix.rstrip('.'))}: {prefix.rstrip('.') or 'config'} must be a mapping")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in raw.items():
        if f"{prefix}{key}" in REMOVED:
            raise TunelabError(
                f"{source(f'{prefix}{key}')}: key '{prefix}{key}' was removed ({REMOVED[f'{prefix}{key}']}); delete it"
            )
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.4)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; known keys: {', '.join(names)}"
            raise TunelabError(f"{source(f'{prefix}{key}')}: unknown key '{prefix}{key}'{hint}")
        kwargs[key] = _coerce(hints[key], value, source, f"{prefix}{key}")
    return cls(**kwargs)


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


def validate(cfg: TrainConfig, source: Origins | str = "config") -> None:
    """Every check that needs no model or data: impossible values and combinations fail here, each error named by
    the origin of the setting it is about (`source`, or a file name for all settings)."""
    if isinstance(source, str):
        source = Origins(source)
    # compile is a bool (YAML true/false force it) or auto: one field of two types, checked here.
    _choice(source, "compile", compile_mode(cfg.compile), COMPILE_MODES)
    cfg.compile = {"true": True, "false": False}.get(compile_mode(cfg.compile), "auto")
    if isinstance(cfg.lora.targets, str):
        _choice(source, "lora.targets", cfg.lora.targets, TARGET_PRESETS)
    elif not cfg.lora.targets:
        raise TunelabError(
            f"{source('lora.targets')}: lora.targets is empty; name modules (e.g. [q_proj, v_proj]) or a preset"
        )
    _validate_ranges(cfg, source)
    _validate_eval(cfg, source)
    method = methods.get(cfg.method)
    if cfg.base_quant in method.refused_base_quants:
        raise TunelabError(f"{source('base_quant', 'method')}: {method.refusal}")
    if cfg.model.startswith(RANDOM) and effective_base_quant(cfg) != "none":
        raise TunelabError(
            f"{source('model', 'method', 'base_quant')}: model {cfg.model} has random weights, built unquantized; "
            f"{effective_base_quant(cfg)} needs a real checkpoint, or use method lora with base_quant none"
        )
    if cfg.data.format != "alpaca" and cfg.data.template != "alpaca":
        raise TunelabError(
            f"{source('data.template', 'data.format')}: data.template applies to the alpaca format only; "
            f"drop it for {cfg.data.format!r}"
        )
    _validate_data(cfg, source)
    _validate_preference(cfg, source)


def _validate_preference(cfg: TrainConfig, source: Origins) -> None:
    """The objective's needs (objectives.py) against the rest of the config."""
    objective = objectives.get(cfg.objective)
    p = cfg.preference
    if not objective.pairs:
        if p != PreferenceConfig():
            raise TunelabError(
                f"{source('preference', 'objective')}: the preference section applies to objective dpo or orpo; "
                f"drop it for objective {cfg.objective}"
            )
        return
    if p.beta <= 0:
        raise TunelabError(f"{source('preference.beta')}: preference.beta must be positive, got {p.beta}")
    if not 0 <= p.label_smoothing < 0.5:
        raise TunelabError(
            f"{source('preference.label_smoothing')}: preference.label_smoothing must be in [0, 0.5), "
            f"got {p.label_smoothing}"
        )
    if not objective.reference:
        for key, value, default in (
            ("preference.reference", p.reference, "auto"),
            ("preference.precompute_reference", p.precompute_reference, False),
            ("preference.label_smoothing", p.label_smoothing, 0.0),
        ):
            if value != default:
                raise TunelabError(f"{source(key)}: objective {cfg.objective} uses no reference model; drop {key}")
    elif p.reference not in ("auto", method_reference(cfg.method)):
        raise TunelabError(
            f"{source('preference.reference', 'method')}: method {cfg.method} takes reference "
            f"{method_reference(cfg.method)}, not {p.reference}; drop preference.reference"
        )
    checks = (
        ("packing", not cfg.packing, "packs chosen and rejected as two documents of one row; set packing: true"),
        ("data.mix", bool(cfg.data.mix), "reads one source of pairs; set data.path"),
        ("data.format", cfg.data.format not in PAIR_FORMATS, f"renders pairs as {', '.join(PAIR_FORMATS)}"),
        ("data.train_on_inputs", cfg.data.train_on_inputs, "scores the responses only; drop data.train_on_inputs"),
    )
    for key, bad, why in checks:
        if bad:
            raise TunelabError(f"{source(key, 'objective')}: objective {cfg.objective} {why}")
    if eval_enabled(cfg) and not objective.held_out_loss:
        raise TunelabError(
            f"{source('eval.split', 'eval.path', 'objective')}: objective {cfg.objective} has no held-out loss; "
            "drop eval.split/eval.path and score the result with `tunelab eval`"
        )


def reference_kind(cfg: TrainConfig) -> str:
    """The reference model a DPO run uses: the adapter disabled over the same base, or a frozen copy of a fully
    trained model."""
    if cfg.preference.reference != "auto":
        return cfg.preference.reference
    return method_reference(cfg.method)


def method_reference(method: str) -> str:
    """An adapter's reference is its base with the adapter disabled; full fine-tuning keeps a frozen copy."""
    return "frozen-copy" if methods.get(method).trains_base else "adapter-disabled"


def _validate_ranges(cfg: TrainConfig, source: Origins) -> None:
    """Each number within its range (one field at a time)."""
    positive = {
        "micro_batch": cfg.micro_batch,
        "grad_accum": cfg.grad_accum,
        "lora.r": cfg.lora.r,
        "save_total_limit": cfg.save_total_limit,
        "log_steps": cfg.log_steps,
    }
    for key, value in positive.items():
        if value < 1:
            raise TunelabError(f"{source(key)}: {key} must be at least 1, got {value}")
    if cfg.seq_len < 8:
        raise TunelabError(f"{source('seq_len')}: seq_len must be at least 8, got {cfg.seq_len}")
    if cfg.epochs <= 0:
        raise TunelabError(f"{source('epochs')}: epochs must be positive, got {cfg.epochs}")
    if cfg.max_steps is not None and cfg.max_steps < 1:
        raise TunelabError(
            f"{source('max_steps')}: max_steps must be at least 1 (or null for a full run), got {cfg.max_steps}"
        )
    if cfg.lr <= 0:
        raise TunelabError(f"{source('lr')}: lr must be positive, got {cfg.lr}")
    if cfg.lora.alpha <= 0:
        raise TunelabError(
            f"{source('lora.alpha')}: lora.alpha must be positive (the adapter's scale is alpha / r), "
            f"got {cfg.lora.alpha}"
        )
    if cfg.weight_decay < 0:
        raise TunelabError(f"{source('weight_decay')}: weight_decay must be 0 or positive, got {cfg.weight_decay}")
    if cfg.max_grad_norm < 0:
        raise TunelabError(
            f"{source('max_grad_norm')}: max_grad_norm must be positive, or 0 for no clipping; got {cfg.max_grad_norm}"
        )
    _validate_more_ranges(cfg, source)


def _validate_more_ranges(cfg: TrainConfig, source: Origins) -> None:
    if not 0 <= cfg.seed < 2**32:
        raise TunelabError(f"{source('seed')}: seed must be in [0, 2**32), as numpy's generators need; got {cfg.seed}")
    if not cfg.output_dir.strip():
        raise TunelabError(f"{source('output_dir')}: output_dir is empty; name the folder the run writes to")
    if not 0 <= cfg.lora.dropout < 1:
        raise TunelabError(f"{source('lora.dropout')}: lora.dropout must be in [0, 1), got {cfg.lora.dropout}")
    if not 0 <= cfg.warmup_ratio < 1:
        raise TunelabError(f"{source('warmup_ratio')}: warmup_ratio must be in [0, 1), got {cfg.warmup_ratio}")
    if cfg.save_steps < 0:
        raise TunelabError(f"{source('save_steps')}: save_steps must be 0 (only the final save) or positive")
    if cfg.data.max_examples is not None and cfg.data.max_examples < 1:
        raise TunelabError(f"{source('data.max_examples')}: data.max_examples must be at least 1")


def _validate_data(cfg: TrainConfig, source: Origins) -> None:
    d = cfg.data
    if d.path is not None and d.mix:
        raise TunelabError(
            f"{source('data.path', 'data.mix')}: data.path and data.mix are exclusive; "
            "train on one source or list them all under data.mix"
        )
    for key, path in (("data.path", d.path), ("eval.path", cfg.eval.path)):
        if hub.is_hub_data(path):
            hub.parse_data(path, f"{source(key)}: {key}")
    for i, part in enumerate(d.mix):
        key = f"data.mix[{i}]"
        if not part.path:
            raise TunelabError(
                f"{source(f'{key}.path')}: {key}.path is missing; each source needs a file or hf://owner/name"
            )
        if hub.is_hub_data(part.path):
            hub.parse_data(part.path, f"{source(f'{key}.path')}: {key}.path")
        if part.weight <= 0:
            raise TunelabError(f"{source(f'{key}.weight')}: {key}.weight must be positive, got {part.weight:g}")
        fmt = part.format or d.format
        if part.template is not None:
            # `alpaca`, data.template's default, is accepted with any format, as at the top level.
            if fmt != "alpaca" and part.template != "alpaca":
                where = source(f"{key}.template", f"{key}.format", "data.format")
                raise TunelabError(f"{where}: {key}.template applies to the alpaca format only; drop it for {fmt!r}")


def has_data(cfg: TrainConfig) -> bool:
    """Whether the config names training data: data.path or data.mix."""
    return cfg.data.path is not None or bool(cfg.data.mix)


def data_label(cfg: TrainConfig) -> str:
    """The training data in a message: its path, or the mixture's sources and weights."""
    if not cfg.data.mix:
        return str(cfg.data.path)
    return "mix of " + ", ".join(f"{m.path} (weight {m.weight:g})" for m in cfg.data.mix)


def _validate_eval(cfg: TrainConfig, source: Origins) -> None:
    e = cfg.eval
    if e.split is not None and e.path is not None:
        raise TunelabError(
            f"{source('eval.split', 'eval.path')}: eval.split and eval.path are exclusive; "
            "hold out a fraction or name a file, not both"
        )
    if e.split is not None and not 0 < e.split <= 0.5:
        raise TunelabError(
            f"{source('eval.split')}: eval.split must be in (0, 0.5] (the fraction of data.path held out), "
            f"got {e.split}"
        )
    for key, value in (
        ("eval.steps", e.steps),
        ("eval.max_rows", e.max_rows),
        ("eval.early_stopping_patience", e.early_stopping_patience),
    ):
        if value is not None and value < 1:
            raise TunelabError(f"{source(key)}: {key} must be at least 1 (or null), got {value}")
    if not eval_enabled(cfg):
        for key, value in (
            ("eval.steps", e.steps),
            ("eval.max_rows", e.max_rows),
            ("eval.early_stopping_patience", e.early_stopping_patience),
        ):
            if value is not None:
                raise TunelabError(f"{source(key)}: {key} needs held-out data; set eval.split (e.g. 0.1) or eval.path")
    elif e.steps is None and cfg.save_steps == 0 and e.early_stopping_patience is not None:
        raise TunelabError(
            f"{source('eval.early_stopping_patience', 'eval.steps', 'save_steps')}: eval.early_stopping_patience "
            "needs evaluations during the run; set eval.steps (or save_steps)"
        )


def eval_enabled(cfg: TrainConfig) -> bool:
    return cfg.eval.split is not None or cfg.eval.path is not None


def eval_every(cfg: TrainConfig) -> int:
    """Optimizer steps between evaluations: eval.steps, else save_steps (0: only at the end)."""
    return cfg.eval.steps if cfg.eval.steps is not None else cfg.save_steps


def effective_base_quant(cfg: TrainConfig) -> str:
    """qlora means an nf4 base whatever base_quant says; other methods use base_quant as given."""
    return methods.effective_base_quant(cfg.method, cfg.base_quant)


def to_dict(cfg: TrainConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def dump_yaml(cfg: TrainConfig) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
