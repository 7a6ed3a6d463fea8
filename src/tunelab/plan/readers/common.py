"""What every reader of another tool's config shares (readers/__init__.py holds the registry and `read`): the
Reading a reader fills (tunelab settings, HF stack switches, each key not modeled and why, assumptions), the
Reader row, and the helpers for values, datasets, models and LoRA targets. Torch-free."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import TunelabError


@dataclass
class Reading:
    """What a reader made of a tool's config."""

    tool: str  # READERS key
    path: str
    label: str = ""  # the reader's label
    settings: dict = field(default_factory=dict)  # tunelab config key -> value
    stack: str = "hf-peft"  # plan.job.STACKS: the stack whose step models the tool's
    hf: dict = field(default_factory=dict)  # HfStack fields (stack hf-peft)
    parts: dict = field(default_factory=dict)  # plan.job.Parts fields: the tool's memory parts (loss kernel, ...)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (the tool's key, why plan does not model it)
    notes: list[str] = field(default_factory=list)  # what the reader assumed
    doc: dict = field(default_factory=dict, repr=False)  # the tool's whole mapping, for keys read together
    tokenizer: str | None = None  # the hub id the tool names, where plan reads its shapes from a catalog row

    def set(self, key: str, value) -> None:
        self.settings[key] = value

    def skip(self, key: str, why: str) -> None:
        self.skipped.append((key, why))

    @property
    def overrides(self) -> list[str]:
        """The settings as `key=value` overrides (values in JSON, which config/'s YAML parser reads)."""
        return [f"{k}={json.dumps(v)}" for k, v in self.settings.items()]

    def lines(self) -> list[str]:
        """What `--from` prints under the prediction: the assumptions, then each key not modeled, one a line."""
        out = [f"read {self.path} as {self.label}; plan models it as stack {self.stack}"]
        if self.parts:
            out.append("  memory parts: " + ", ".join(f"{k}={v}" for k, v in self.parts.items()))
        out += [f"  assumed: {n}" for n in self.notes]
        out += [f"  not modeled: {k}: {why}" for k, why in self.skipped]
        return out


# Keys that change neither time nor memory (logging, hub, naming): still listed, with this reason.
NO_EFFECT = "no effect on time or memory"


@dataclass(frozen=True)
class Reader:
    name: str
    label: str  # the tool and what of it is read
    detect: Callable[[dict], bool]  # whether a config mapping is this tool's
    read: Callable[[dict, Reading], None]  # fills the reading from the mapping


def bool_of(where: str, key: str, value) -> bool:
    """A tool's boolean (`true`, `auto`-less), or a one-line error naming the file and key."""
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    text = str(value).lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", "none", "null"):
        return False
    raise TunelabError(f"{where}: {key}: expected true or false, got {value!r}")


def number(where: str, key: str, value, kind=int):
    try:
        out = kind(float(value)) if kind is int else kind(value)
    except (TypeError, ValueError):
        raise TunelabError(f"{where}: {key}: expected a number, got {value!r}") from None
    return out


def dataset_path(value: str, config_path: str, reading: Reading, key: str) -> str:
    """A dataset a tool names: a local file (relative to the config's folder or the working directory) as it is,
    else a hub id as tunelab's `hf://owner/name` (read from the cache offline, data/read.py)."""
    for base in (Path(config_path).parent, Path.cwd()):
        candidate = (base / value).expanduser()
        if candidate.is_file():
            return str(candidate)
    if value.startswith("hf://"):
        return value
    if value.count("/") == 1 and not value.startswith((".", "/")):
        return "hf://" + value
    reading.notes.append(f"{key} {value!r} is neither a file nor a hub id; the prediction needs --examples instead")
    return ""


def model_ref(name: str, reading: Reading) -> str:
    """A model the tool names, as plan resolves it: its own name where plan's catalog knows it; else the catalog
    row of the same name under another owner (NousResearch/Llama-3.2-1B -> meta-llama/Llama-3.2-1B's short id),
    said so; else the name as it is (a local directory or a cached hub id)."""
    from ..arch import from_registry, short_id

    if from_registry(name) is not None or "/" not in name:
        return name
    last = name.rsplit("/", 1)[1].lower()
    for candidate in (last, last.removesuffix("-instruct"), last.removeprefix("meta-").removesuffix("-instruct")):
        found = from_registry(candidate)
        if found is not None:
            reading.notes.append(f"model {name} read as plan's catalog row {found.name} (the same architecture)")
            reading.tokenizer = (
                name  # the catalog row has shapes, not a tokenizer: the data is measured with the tool's
            )
            return short_id(found.name) if found.name != candidate else candidate
    return name


def targets(modules: list[str], reading: Reading, key: str) -> list[str]:
    """LoRA target modules in HF's names; others (an LM head, embeddings) are listed as not modeled."""
    linear = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    kept = [m for m in modules if m in linear]
    dropped = [m for m in modules if m not in linear]
    if dropped:
        reading.skip(f"{key} {', '.join(dropped)}", "plan adapts the decoder's linear layers only")
    return kept or list(linear)


# Keys of Hugging Face's TrainingArguments (and the tools' own logging and output keys) that change neither the
# step's time nor its memory.
QUIET = {
    "report_to",
    "run_name",
    "logging_dir",
    "logging_strategy",
    "logging_first_step",
    "save_strategy",
    "push_to_hub",
    "hub_model_id",
    "hub_strategy",
    "hub_private_repo",
    "overwrite_output_dir",
    "do_train",
    "do_eval",
    "do_predict",
    "ddp_timeout",
    "plot_loss",
    "dataloader_num_workers",
    "preprocessing_num_workers",
    "overwrite_cache",
    "tf32",
    "disable_tqdm",
    "remove_unused_columns",
    "trust_remote_code",
    "resume_from_checkpoint",
    "save_only_model",
    "save_safetensors",
    "dataloader_pin_memory",
    "include_num_input_tokens_seen",
    "ddp_find_unused_parameters",
    "env",
    "dataset_num_proc",
    "seed",
    "data_seed",
    "log_level",
    "logging_nan_inf_filter",
    "model_revision",
}
# Evaluation: its passes take time plan models for tunelab's own held-out split only.
EVAL_KEYS = {"eval_strategy", "evaluation_strategy", "eval_steps", "per_device_eval_batch_size", "eval_on_start"}
PRECISIONS = {"bf16": "bf16", "fp16": "fp16"}
SCHEDULES = ("cosine", "linear", "constant")


# A key's handler: (the key, its value, the reading) -> None, filling the reading.
Handler = Callable[[str, object, Reading], None]


def setting(name: str, kind: type | None = None) -> Handler:
    """The key sets tunelab's `name` (as a number of `kind`, or as it is); an empty value sets nothing."""

    def handle(key: str, value, reading: Reading) -> None:
        if value is not None:
            reading.set(name, number(reading.path, key, value, kind) if kind else value)

    return handle


def switch(name: str, when_true=True) -> Handler:
    """A boolean key that, true, sets tunelab's `name` to `when_true`."""

    def handle(key: str, value, reading: Reading) -> None:
        if bool_of(reading.path, key, value):
            reading.set(name, when_true)

    return handle


def hf_switch(name: str) -> Handler:
    """A boolean key onto the HF stack's switch `name`."""

    def handle(key: str, value, reading: Reading) -> None:
        reading.hf[name] = bool_of(reading.path, key, value)

    return handle


def unmodeled(why: str, unless=(None, False, "", "no", 0)) -> Handler:
    """A key plan does not model: listed with `why` unless its value is one that changes nothing."""

    def handle(key: str, value, reading: Reading) -> None:
        if value not in unless:
            reading.skip(key, why)

    return handle


def ignored(key: str, value, reading: Reading) -> None:
    """A key read with another (its handler reads this one too)."""


def apply(doc: dict, reading: Reading, handlers: dict[str, Handler], quiet: set[str], tool: str) -> None:
    """Each key of `doc` through its handler; a quiet key (no effect on time or memory) or an unknown one, when
    set, is listed as not modeled."""
    for key, value in doc.items():
        handler = handlers.get(key)
        if handler is not None:
            handler(key, value, reading)
        elif key in quiet or key in QUIET:
            if value not in (None, False, "", []):
                reading.skip(key, NO_EFFECT)
        elif value not in (None, ""):
            reading.skip(key, f"not a key plan reads of {tool}'s")


def _precision(key: str, value, reading: Reading) -> None:
    if value == "auto" or bool_of(reading.path, key, value):
        reading.set("precision", PRECISIONS[key])


def _max_steps(key: str, value, reading: Reading) -> None:
    if value is not None and number(reading.path, key, value) > 0:
        reading.set("max_steps", number(reading.path, key, value))


def _save_steps(key: str, value, reading: Reading) -> None:
    steps = number(reading.path, key, value, float) if value is not None else 0
    if steps >= 1:
        reading.set("save_steps", int(steps))
    elif steps:
        reading.skip(key, "a fraction of the run's steps: plan takes whole steps")


def _schedule(key: str, value, reading: Reading) -> None:
    if str(value) in SCHEDULES:
        reading.set("lr_scheduler", str(value))
    else:
        reading.skip(key, f"{value}: a schedule changes neither time nor memory (tunelab runs cosine)")


def optim(key: str, value, reading: Reading) -> None:
    """An HF optimizer name onto the HF stack's `optim` (hfstack.OPTIMS); another is listed, priced as the default."""
    from ..hfstack import OPTIMS

    name = {"adamw_bnb_8bit": "adamw_bnb_8bit"}.get(str(value), str(value))
    if name in OPTIMS:
        reading.hf["optim"] = name
    else:
        reading.skip(key, f"{value}: plan knows {', '.join(OPTIMS)}; priced as adamw_torch_fused")


def checkpointing(key: str, value, reading: Reading) -> None:
    """`gradient_checkpointing`: true, false, or (Axolotl) `offload`: checkpointed layer inputs on the host."""
    if value == "offload":
        reading.set("grad_ckpt", True)
        reading.set("activation_offload", True)
    else:
        reading.set("grad_ckpt", bool_of(reading.path, key, value))


def deepspeed(key: str, value, reading: Reading) -> None:
    """A DeepSpeed config (a local JSON file, or a name like Axolotl's `deepspeed_configs/zero2.json`): its ZeRO
    stage's buffers on one GPU (memory.zero_buffer_bytes). Sharding across GPUs is `plan --gpus`'s, not read here;
    offloading to the host is listed."""
    if not value:
        return
    spec = value if isinstance(value, dict) else {}
    path = Path(reading.path).parent / str(value) if isinstance(value, str) else None
    if path is not None and path.is_file():
        try:
            spec = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            spec = {}
    zero = spec.get("zero_optimization") or {}
    stage = zero.get("stage")
    if stage is None and isinstance(value, str):
        found = re.search(r"zero[_-]?([0-3])", value.lower())
        stage = int(found[1]) if found else None
    if stage not in (0, 1, 2, 3):
        reading.skip(key, f"{value}: its ZeRO stage is not readable here; no DeepSpeed buffers counted")
        return
    reading.parts["zero_stage"] = int(stage)
    reading.notes.append(f"DeepSpeed ZeRO stage {stage} on one GPU: its buffers counted (sharding: plan --gpus)")
    for name in ("offload_optimizer", "offload_param"):
        if (zero.get(name) or {}).get("device") not in (None, "none") or ("offload" in str(value) and not zero):
            reading.skip(f"{key} {name}", "ZeRO's offload to the host is not modeled: the device holds it in plan")
            break


# Hugging Face TrainingArguments' keys (TRL's and LLaMA-Factory's configs hold them as they are).
TRAINING_ARGUMENTS: dict[str, Handler] = {
    "per_device_train_batch_size": setting("micro_batch", int),
    "gradient_accumulation_steps": setting("grad_accum", int),
    "num_train_epochs": setting("epochs", float),
    "learning_rate": setting("lr", float),
    "warmup_ratio": setting("warmup_ratio", float),
    "weight_decay": setting("weight_decay", float),
    "max_grad_norm": setting("max_grad_norm", float),
    "save_total_limit": setting("save_total_limit", int),
    "logging_steps": setting("log_steps", int),
    "output_dir": setting("output_dir"),
    "max_steps": _max_steps,
    "save_steps": _save_steps,
    "bf16": _precision,
    "fp16": _precision,
    "gradient_checkpointing": checkpointing,
    "gradient_checkpointing_kwargs": unmodeled("reentrant or not: the same recomputation and saved layer inputs"),
    "lr_scheduler_type": _schedule,
    "warmup_steps": unmodeled("warm-up changes neither time nor memory"),
    "optim": optim,
    "group_by_length": hf_switch("group_by_length"),
    "use_liger_kernel": hf_switch("use_liger_kernel"),
    "torch_compile": unmodeled("plan models an HF script's eager blocks only"),
    "deepspeed": deepspeed,
    "fsdp": unmodeled("FSDP across GPUs is not modeled for a tool's run; one process assumed"),
    "fsdp_config": unmodeled("FSDP across GPUs is not modeled for a tool's run; one process assumed"),
    **{k: unmodeled("evaluation passes of a tool's run are not timed") for k in EVAL_KEYS},
}


def method_of(value) -> str | None:
    """A tool's adapter or fine-tuning type that is a tunelab method by the same name (methods.py), else None."""
    from ... import methods

    return str(value) if str(value) in methods.NAMES else None


def objective_of(value) -> str | None:
    """A tool's stage or loss that is a tunelab objective by the same name and trains on rows or pairs
    (objectives.py; a generating one, GRPO, is planned from tunelab's own config), else None."""
    from ... import objectives

    name = str(value)
    return name if name in objectives.NAMES and not objectives.get(name).generates else None


def trains_base(reading: Reading) -> bool:
    """Whether the method read so far trains every weight (methods.py's row)."""
    from ... import methods

    return methods.get(reading.settings.get("method", "lora")).trains_base
