"""Reading a config: the YAML file (a key given twice refused, with its line), `key=value` overrides, and each
value coerced to its field's type where it is read, naming the key and where it was set; Hugging Face's names
answered with tunelab's. The YAML users write is flat where it always was: an *inline* section's fields are
top-level keys (`seq_len`, `lr`, `method`), a nested one's are under its name (`lora.r`, `data.path`). `published`
maps every key a user writes to its section and field, and `to_dict` writes the same layout back."""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from ..errors import TunelabError
from ..io import read_text
from .origins import Origins, _choice
from .sections import TrainConfig

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
