"""torchtune's recipe config (`tune run <recipe> --config FILE`) -> plan: torchtune's single-device recipes run
their own loop, not the HF Trainer, so plan models the run as tunelab's own step with the same settings (packed
rows with a document mask under FlexAttention, compiled blocks where `compile: true`, a chunked loss).

Read: the model component (`torchtune.models.<family>.[q]lora_<name>`) onto plan's catalog, its LoRA modules
(output_proj is o_proj; apply_lora_to_mlp adds gate, up and down), the dataset component (alpaca_cleaned_dataset,
alpaca_dataset, or a local `source: json` file), `packed`, `tokenizer.max_seq_len`, the optimizer component,
`optimizer_in_bwd`, activation checkpointing (selective: `ac_mode`, `ac_option`) and offloading, dtype, compile and
the loss component (its memory by its kernel: Reading.parts). A full fine-tune in torchtune is
pure bf16 (`dtype: bf16` keeps the weights and AdamW's states in bf16): tunelab's `weights: bf16`.
"""

from __future__ import annotations

import re

from ...errors import TunelabError
from .common import (
    Handler,
    Reader,
    Reading,
    apply,
    bool_of,
    dataset_path,
    ignored,
    number,
    setting,
    switch,
    trains_base,
)

MODEL = re.compile(
    r"^(?P<kind>q?lora_)?(?P<family>llama3_2|llama3_1|llama3|qwen2_5|qwen3|gemma2|mistral)_(?P<size>\d+(?:_\d+)?b)"
)
FAMILIES = {
    "llama3_2": "llama-3.2-",
    "llama3_1": "llama-3.1-",
    "llama3": "meta-llama-3-",
    "qwen2_5": "qwen2.5-",
    "qwen3": "qwen3-",
    "gemma2": "gemma-2-",
    "mistral": "mistral-",
}
SUFFIX = {"mistral": "-v0.1"}
DATASETS = {"alpaca_cleaned_dataset": "yahma/alpaca-cleaned", "alpaca_dataset": "tatsu-lab/alpaca"}
OPTIMIZERS = {
    "torch.optim.AdamW": "adamw",
    "bitsandbytes.optim.PagedAdamW8bit": "paged_adamw_8bit",
    "bitsandbytes.optim.PagedAdamW": "adamw",
    "bitsandbytes.optim.AdamW8bit": "adamw_8bit",
    "torchao.optim.AdamW8bit": "adamw_8bit",
    "torchao.prototype.low_bit_optim.AdamW8bit": "adamw_8bit",
}
# torchtune's loss components: how much of the whole logits each keeps (memory.loss_kernel_bytes names them).
LOSSES = {
    "torchtune.modules.loss.LinearCrossEntropyLoss": "chunked",
    "torchtune.modules.loss.CEWithChunkedOutputLoss": "chunked_output",
    "torch.nn.CrossEntropyLoss": "native",
}
ATTN_MODULES = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}
QUIET_HERE = {
    "checkpointer",
    "metric_logger",
    "profiler",
    "log_every_n_steps",
    "log_peak_memory_stats",
    "log_level",
    "device",
    "seed",
    "shuffle",
    "resume_from_checkpoint",
    "save_adapter_weights_only",
    "save_last_epoch_only",
    "output_dir",
    "lr_scheduler",
    "log_grad_norm",
    "run_val_every_n_steps",
}


def _model(spec: dict, reading: Reading) -> None:
    component = str(spec.get("_component_", ""))
    name = component.rsplit(".", 1)[-1]
    found = MODEL.match(name)
    if not found:
        raise TunelabError(
            f"{reading.path}: model._component_ {component}: not a torchtune model plan knows; its families are "
            f"{', '.join(FAMILIES)}"
        )
    family, size = found["family"], found["size"].replace("_", ".")
    reading.set("model", FAMILIES[family] + size + SUFFIX.get(family, ""))
    kind = found["kind"] or ""
    reading.set("method", "qlora" if kind == "qlora_" else "lora" if kind == "lora_" else "full")
    modules = [ATTN_MODULES.get(m, m) for m in spec.get("lora_attn_modules") or []]
    if bool_of(reading.path, "model.apply_lora_to_mlp", spec.get("apply_lora_to_mlp", False)):
        modules += ["gate_proj", "up_proj", "down_proj"]
    if kind:
        reading.set("lora.targets", modules or ["q_proj", "v_proj"])
    for key, value in spec.items():
        if key in ("_component_", "lora_attn_modules", "apply_lora_to_mlp"):
            continue
        if key == "lora_rank":
            reading.set("lora.r", number(reading.path, f"model.{key}", value))
        elif key == "lora_alpha":
            reading.set("lora.alpha", number(reading.path, f"model.{key}", value, float))
        elif key == "lora_dropout":
            reading.set("lora.dropout", number(reading.path, f"model.{key}", value, float))
        elif key == "use_dora":
            if bool_of(reading.path, f"model.{key}", value):
                reading.set("method", "dora")
        elif key == "apply_lora_to_output":
            if bool_of(reading.path, f"model.{key}", value):
                reading.skip(f"model.{key}", "LoRA on the LM head: plan adapts the decoder's linears only")
        else:
            reading.skip(f"model.{key}", "not a model argument plan reads")


def _dataset(spec, reading: Reading) -> None:
    specs = spec if isinstance(spec, list) else [spec]
    first = specs[0] if specs and isinstance(specs[0], dict) else {}
    name = str(first.get("_component_", "")).rsplit(".", 1)[-1]
    if name in DATASETS:
        reading.set("data.path", "hf://" + DATASETS[name])
        reading.set("data.format", "alpaca")
    elif first.get("data_files") or first.get("source"):
        source = str(first.get("data_files") or first.get("source"))
        path = dataset_path(source, reading.path, reading, "dataset.data_files")
        if path:
            reading.set("data.path", path)
        reading.set("data.format", "chat" if "chat" in name else "alpaca")
    else:
        reading.notes.append(f"dataset {name or '?'}: not a dataset plan can read; give --examples")
    reading.set("packing", bool_of(reading.path, "dataset.packed", first.get("packed", False)))
    for key in first:
        if key not in ("_component_", "packed", "source", "data_files", "split", "column_map", "train_on_input"):
            reading.skip(f"dataset.{key}", "not a dataset argument plan reads")
    for i in range(1, len(specs)):
        reading.skip(f"dataset[{i}]", "only the first dataset's rows are counted")


def _tokenizer(key: str, value, reading: Reading) -> None:
    seq = (value or {}).get("max_seq_len")
    if seq:
        reading.set("seq_len", number(reading.path, "tokenizer.max_seq_len", seq))


def _max_steps(key: str, value, reading: Reading) -> None:
    if value:
        epochs = number(reading.path, "epochs", reading.doc.get("epochs", 1))
        reading.notes.append("max_steps_per_epoch read as max_steps = it x epochs")
        reading.set("max_steps", number(reading.path, key, value) * epochs)


def _optimizer(key: str, value, reading: Reading) -> None:
    spec = value or {}
    component = str(spec.get("_component_", ""))
    if component in OPTIMIZERS:
        reading.set("optimizer", OPTIMIZERS[component])
    else:
        reading.skip("optimizer._component_", f"{component}: priced as AdamW")
    for name, kind in (("lr", float), ("weight_decay", float)):
        if name in spec:
            reading.set(name, number(reading.path, f"optimizer.{name}", spec[name], kind))
    for name in spec:
        if name not in ("_component_", "lr", "weight_decay", "fused", "betas", "eps"):
            reading.skip(f"optimizer.{name}", "not an optimizer argument plan reads")


def _loss(key: str, value, reading: Reading) -> None:
    component = str((value or {}).get("_component_", ""))
    if component in LOSSES:  # its memory by its kernel (memory.loss_kernel_bytes); its time as tunelab's head
        reading.parts["loss_kernel"] = LOSSES[component]
    else:
        reading.skip("loss._component_", f"{component}: priced as a chunked cross-entropy")


def _ac_mode(key: str, value, reading: Reading) -> None:
    """`ac_mode: selective` with `ac_option: N` checkpoints one layer in every N (memory.checkpointed_bytes)."""
    if str(value) == "selective":
        option = reading.doc.get("ac_option")
        if isinstance(option, int) and option >= 1:
            reading.parts["ckpt_every"] = option
        else:
            reading.skip("ac_option", f"{option}: selective checkpointing by op is not modeled; every layer assumed")


def _dtype(key: str, value, reading: Reading) -> None:
    if value in ("bf16", "fp32"):
        reading.set("precision", str(value))
    else:
        reading.skip(key, f"{value}: plan reads bf16 and fp32")


HANDLERS: dict[str, Handler] = {
    "model": lambda k, v, r: _model(v or {}, r),
    "tokenizer": _tokenizer,
    "dataset": lambda k, v, r: _dataset(v, r),
    "batch_size": setting("micro_batch", int),
    "gradient_accumulation_steps": setting("grad_accum", int),
    "epochs": setting("epochs", float),
    "max_steps_per_epoch": _max_steps,
    "optimizer": _optimizer,
    "optimizer_in_bwd": switch("optimizer_in_backward"),
    "loss": _loss,
    "clip_grad_norm": lambda k, v, r: r.set("max_grad_norm", float(v) if v else 0.0),
    "compile": lambda k, v, r: r.set("compile", bool_of(r.path, k, v)),
    "enable_activation_checkpointing": lambda k, v, r: r.set("grad_ckpt", bool_of(r.path, k, v)),
    "enable_activation_offloading": lambda k, v, r: r.set("activation_offload", bool_of(r.path, k, v)),
    "dtype": _dtype,
    "ac_mode": _ac_mode,
    "ac_option": ignored,  # read with ac_mode
}


def read(doc: dict, reading: Reading) -> None:
    reading.stack = "tunelab"
    reading.set("compile", False)
    reading.set("max_grad_norm", 0.0)
    apply(doc, reading, HANDLERS, QUIET_HERE, "torchtune")
    if reading.settings.get("precision", "bf16") == "bf16":
        reading.parts["pure_bf16"] = True  # the model, its adapters and torch.optim's states in bf16
        if trains_base(reading):
            reading.set("weights", "bf16")
            reading.notes.append("full fine-tuning in torchtune's pure bf16: weights: bf16")
    if "seq_len" not in reading.settings:
        reading.set("seq_len", 2048)
        reading.notes.append("tokenizer.max_seq_len null (torchtune cuts nothing): seq_len 2048 assumed")
    reading.notes.append(
        "torchtune's step timed as tunelab's own (packed rows document-masked, chunked head); its loss's memory by "
        "its own kernel"
    )


def detect(doc: dict) -> bool:
    model = doc.get("model")
    return isinstance(model, dict) and str(model.get("_component_", "")).startswith("torchtune.")


READER = Reader("torchtune", "a torchtune recipe config", detect, read)
