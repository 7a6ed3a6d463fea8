"""Axolotl's YAML config (https://docs.axolotl.ai/docs/config-reference.html) -> plan's HF stack: Axolotl trains
with the HF Trainer and PEFT, so its step is plan's `hf-peft` one, its kernels and feeding as its keys say.

Sample packing (`sample_packing: true`) is Axolotl's multipack: examples packed into bins of `sequence_len`,
`micro_batch_size` bins a micro-batch, kept apart by position ids in flash-attention's varlen kernel (hfstack's
`multipack` feeding). Cut Cross Entropy (the plugin) and Liger's fused linear cross-entropy never materialise the
whole logits.
"""

from __future__ import annotations

from .common import (
    TRAINING_ARGUMENTS,
    Handler,
    Reader,
    Reading,
    apply,
    bool_of,
    checkpointing,
    dataset_path,
    deepspeed,
    hf_switch,
    ignored,
    method_of,
    model_ref,
    number,
    objective_of,
    optim,
    setting,
    switch,
    targets,
    unmodeled,
)

CCE_PLUGIN = "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"
LIGER_PLUGIN = "axolotl.integrations.liger.LigerPlugin"
# Axolotl's dataset `type` -> tunelab's data.format.
FORMATS = {"alpaca": "alpaca", "chat_template": "chat", "sharegpt": "sharegpt", "completion": "completion"}
QUIET_HERE = {
    "dataset_prepared_path",
    "special_tokens",
    "tokens",
    "wandb_project",
    "wandb_entity",
    "wandb_watch",
    "wandb_name",
    "wandb_log_model",
    "wandb_mode",
    "mlflow_tracking_uri",
    "mlflow_experiment_name",
    "use_mlflow",
    "use_tensorboard",
    "hub_model_id",
    "loss_watchdog_threshold",
    "loss_watchdog_patience",
    "evals_per_epoch",
    "saves_per_epoch",
    "save_first_step",
    "eval_sample_packing",
    "eval_max_new_tokens",
    "eval_table_size",
    "strict",
    "debug",
    "chat_template",
    "base_model_config",
    "tokenizer_type",
    "model_type",
    "tokenizer_config",
    "is_llama_derived_model",
    "lora_model_dir",
    "lora_fan_in_fan_out",
    "shuffle_merged_datasets",
    "dataset_processes",
    "early_stopping_patience",
    "train_on_inputs",
    "lr_scheduler",
    "warmup_steps",
    "lora_on_cpu",
}


def _datasets(key: str, value, reading: Reading) -> None:
    rows = value if isinstance(value, list) else [value]
    if not rows or not isinstance(rows[0], dict) or "path" not in rows[0]:
        from ...errors import TunelabError

        raise TunelabError(f"{reading.path}: datasets: expected a list of {{path, type}}; give at least one")
    first = rows[0]
    path = dataset_path(str(first["path"]), reading.path, reading, "datasets[0].path")
    if path:
        reading.set("data.path", path)
    kind = str(first.get("type", "alpaca"))
    if kind in FORMATS:
        reading.set("data.format", FORMATS[kind])
    else:
        reading.skip(f"datasets[0].type {kind}", "a prompt format tunelab has no renderer for; read as alpaca")
    for key in first:
        if key not in ("path", "type", "split", "ds_type", "data_files"):
            reading.skip(f"datasets[0].{key}", "the rows' fields are rendered as data.format's; tokens may differ")
    for i, extra in enumerate(rows[1:], 1):
        reading.skip(f"datasets[{i}]", "only the first dataset's rows are counted")


def _adapter(key: str, value, reading: Reading) -> None:
    if method_of(value) is not None:
        reading.set("method", method_of(value))
    elif value:
        reading.skip(key, f"{value}: plan models lora, qlora and full fine-tuning")


def _targets(key: str, value, reading: Reading) -> None:
    if value:
        reading.set("lora.targets", targets(list(value), reading, key))


def _attention(name: str) -> Handler:
    def handle(key: str, value, reading: Reading) -> None:
        if bool_of(reading.path, key, value):
            reading.hf["attn_implementation"] = name

    return handle


def _packing(key: str, value, reading: Reading) -> None:
    if bool_of(reading.path, key, value):
        reading.hf["padding"] = "multipack"


def _plugins(key: str, value, reading: Reading) -> None:
    for p in value or []:
        if p not in (CCE_PLUGIN, LIGER_PLUGIN):
            reading.skip(f"plugins {p}", "a plugin plan has no part for")


def _liger(key: str, value, reading: Reading) -> None:
    if key != "liger_fused_linear_cross_entropy" and bool_of(reading.path, key, value):
        reading.notes.append(f"{key}: counted with Liger's other kernels (fused norm, SwiGLU, RoPE)")


def _rl(key: str, value, reading: Reading) -> None:
    if objective_of(value) is not None:
        reading.set("objective", objective_of(value))
    elif value:
        reading.skip(key, f"{value}: plan models sft, dpo and orpo from a tool's config")


def _val(key: str, value, reading: Reading) -> None:
    if value:
        reading.set("eval.split", number(reading.path, key, value, float))


def _pad(key: str, value, reading: Reading) -> None:
    if bool_of(reading.path, key, value):
        reading.notes.append("pad_to_sequence_len: multipack bins are nearly full; their padding is not counted")


def _gptq(key: str, value, reading: Reading) -> None:
    """A GPTQ base (Axolotl's `gptq: true`, 4 bits unless the model says): priced at GPTQ's bytes a weight
    (memory.gptq_bytes) as a 4-bit base; `train --from` runs it as QLoRA's NF4."""
    if bool_of(reading.path, key, value):
        reading.set("method", "qlora")
        reading.parts["gptq_bits"] = 4
        reading.notes.append("gptq: a 4-bit GPTQ base, group 128, assumed; tunelab trains it as NF4 (qlora)")


FAST_LORA = "Axolotl's fused LoRA Triton kernels: plan prices PEFT's unfused LoRA"
SHARDED = "sharding across GPUs of a tool's run is not modeled; one process assumed"
HANDLERS: dict[str, Handler] = {
    "base_model": lambda k, v, r: r.set("model", model_ref(str(v), r)),
    "adapter": _adapter,
    "load_in_4bit": switch("method", "qlora"),
    "load_in_8bit": switch("base_quant", "int8"),
    "gptq": _gptq,
    "lora_r": setting("lora.r", int),
    "lora_alpha": setting("lora.alpha", float),
    "lora_dropout": setting("lora.dropout", float),
    "lora_target_modules": _targets,
    "lora_target_linear": switch("lora.targets", "all-linear"),
    "lora_mlp_kernel": unmodeled(FAST_LORA),
    "lora_qkv_kernel": unmodeled(FAST_LORA),
    "lora_o_kernel": unmodeled(FAST_LORA),
    "sequence_len": setting("seq_len", int),
    "sample_packing": _packing,
    "pad_to_sequence_len": _pad,
    "micro_batch_size": setting("micro_batch", int),
    "gradient_accumulation_steps": setting("grad_accum", int),
    "num_epochs": setting("epochs", float),
    "max_steps": setting("max_steps", int),
    "optimizer": optim,
    "learning_rate": setting("lr", float),
    "warmup_ratio": setting("warmup_ratio", float),
    "weight_decay": setting("weight_decay", float),
    "max_grad_norm": setting("max_grad_norm", float),
    "bf16": TRAINING_ARGUMENTS["bf16"],
    "fp16": TRAINING_ARGUMENTS["fp16"],
    "gradient_checkpointing": checkpointing,
    "activation_offloading": switch("activation_offload"),
    "flash_attention": _attention("flash_attention_2"),
    "sdp_attention": _attention("sdpa"),
    "eager_attention": _attention("eager"),
    "attn_implementation": lambda k, v, r: r.hf.__setitem__("attn_implementation", str(v)),
    "plugins": _plugins,
    "cut_cross_entropy": ignored,  # read with plugins
    "liger_fused_linear_cross_entropy": ignored,
    **{k: _liger for k in ("liger_rope", "liger_rms_norm", "liger_glu_activation", "liger_layer_norm")},
    "datasets": _datasets,
    "val_set_size": _val,
    "group_by_length": hf_switch("group_by_length"),
    "output_dir": setting("output_dir"),
    "seed": setting("seed", int),
    "torch_compile": unmodeled("plan models an HF script's eager blocks only"),
    "deepspeed": deepspeed,
    **{k: unmodeled(SHARDED) for k in ("fsdp", "fsdp_config", "fsdp_version")},
    "rl": _rl,
}


def read(doc: dict, reading: Reading) -> None:
    where = reading.path
    reading.set("grad_ckpt", False)
    apply(doc, reading, HANDLERS, QUIET_HERE, "Axolotl")
    if reading.parts.get("gptq_bits"):  # whatever order `adapter` came in: a 4-bit base
        reading.set("method", "qlora")
    plugins = doc.get("plugins") or []
    cce = doc.get("cut_cross_entropy")
    if CCE_PLUGIN in plugins and (cce is None or bool_of(where, "cut_cross_entropy", cce)):
        reading.hf["cut_cross_entropy"] = True
    liger_loss = doc.get("liger_fused_linear_cross_entropy")
    if LIGER_PLUGIN in plugins and (
        liger_loss is None or bool_of(where, "liger_fused_linear_cross_entropy", liger_loss)
    ):
        reading.hf["use_liger_kernel"] = True
    if reading.hf.get("padding") == "multipack" and reading.hf.get("attn_implementation") != "flash_attention_2":
        reading.notes.append("sample_packing without flash attention: each bin's whole causal square is computed")
    reading.notes.append(
        "Axolotl's defaults where a key is absent: sdpa attention, rows padded to each batch's longest, no "
        "gradient checkpointing, optim adamw_torch_fused"
    )


def detect(doc: dict) -> bool:
    return "base_model" in doc and any(k in doc for k in ("micro_batch_size", "sequence_len", "datasets", "adapter"))


READER = Reader("axolotl", "an Axolotl config", detect, read)
