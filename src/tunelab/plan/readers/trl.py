"""TRL's config (`trl sft|dpo|grpo --config FILE`, YAML or JSON): SFTConfig, DPOConfig or GRPOConfig
(TrainingArguments and TRL's own fields), ModelConfig and ScriptArguments in one flat mapping; a plain
TrainingArguments file reads the same way. TRL trains with the HF Trainer and PEFT: plan's HF stack, except
GRPO, which plan prices with tunelab's GRPO model (read_grpo).

TRL 1.16's defaults where the file says nothing (checked against the installed trl, tests/unit/plan/
test_readers.py): max_length 1024, gradient checkpointing on, no packing (rows padded to each batch's longest),
full fine-tuning unless `use_peft`, PEFT's default targets (q_proj, v_proj) unless `lora_target_modules`, 3 epochs
(TrainingArguments' num_train_epochs); for GRPO, 8 completions a device batch, num_generations 8, max_completion_length 512, loss_type dapo, scale_rewards
group, beta 0.
`packing: true` with the default `packing_strategy: bfd` packs examples into rows with position ids (plan's
multipack feeding), `wrapped` concatenates and cuts (packed), `padding_free: true` flattens each batch.
"""

from __future__ import annotations

from typing import get_args

from ...config.objective import GrpoLossType
from ...errors import TunelabError
from .common import (
    TRAINING_ARGUMENTS,
    Handler,
    Reader,
    Reading,
    apply,
    bool_of,
    dataset_path,
    ignored,
    model_ref,
    number,
    setting,
    switch,
    targets,
    trains_base,
    unmodeled,
)

# TRL's own keys, by the config class that declares them (trl 1.16): what marks a file as DPO or GRPO.
DPO_KEYS = {"beta", "precompute_ref_log_probs", "ref_model_mixup_alpha", "sync_ref_model", "f_divergence_type"}
GRPO_KEYS = {"num_generations", "max_completion_length", "reward_funcs", "use_vllm", "steps_per_generation"}
SFT_KEYS = {
    "packing",
    "packing_strategy",
    "padding_free",
    "dataset_text_field",
    "completion_only_loss",
    "assistant_only_loss",
    "max_length",
    "max_seq_length",
}
MODEL_KEYS = {"model_name_or_path", "use_peft", "lora_r", "lora_target_modules", "load_in_4bit", "attn_implementation"}
QUIET_HERE = {
    "model_revision",
    "dataset_config",
    "dataset_train_split",
    "dataset_test_split",
    "dataset_streaming",
    "lora_task_type",
    "bnb_4bit_quant_type",
    "bnb_4bit_quant_storage",
    "eos_token",
    "pad_token",
    "chat_template_path",
    "truncation_mode",
    "shuffle_dataset",
    "pad_to_multiple_of",
    "dataset_kwargs",
    "model_init_kwargs",
    "ignore_bias_buffers",
    "disable_dropout",
}


def _peft(key: str, value, reading: Reading) -> None:
    if bool_of(reading.path, key, value) and trains_base(reading):
        reading.set("method", "lora")


def _targets(key: str, value, reading: Reading) -> None:
    if value in ("all-linear", ["all-linear"]):
        reading.set("lora.targets", "all-linear")
    elif value:
        reading.set("lora.targets", targets(list(value), reading, key))


def _nested(key: str, value, reading: Reading) -> None:
    """false: an fp32 absmax a block of 64 (memory.nf4_bytes), not the double-quantized one."""
    reading.parts["double_quant"] = bool_of(reading.path, key, value)


def _packing(key: str, value, reading: Reading) -> None:
    if bool_of(reading.path, key, value):
        wrapped = str(reading.doc.get("packing_strategy", "bfd")) == "wrapped"
        reading.hf["padding"] = "packed" if wrapped else "multipack"


def _padding_free(key: str, value, reading: Reading) -> None:
    if bool_of(reading.path, key, value) and not reading.doc.get("packing"):
        reading.hf["padding"] = "padding_free"


def _attention(key: str, value, reading: Reading) -> None:
    if value:
        name = str(value).removeprefix("kernels-community/")
        reading.hf["attn_implementation"] = "flash_attention_2" if "flash" in name else name


def _dataset(key: str, value, reading: Reading) -> None:
    path = dataset_path(str(value), reading.path, reading, key)
    if path:
        reading.set("data.path", path)


def _dtype(key: str, value, reading: Reading) -> None:
    if value in ("bfloat16", "float16") and trains_base(reading):
        reading.skip(key, f"{value} weights: plan keeps fp32 trained weights under autocast")


def _loss_type(key: str, value, reading: Reading) -> None:
    if value not in ("sigmoid", "nll", ["sigmoid"], None):
        reading.skip(key, f"{value}: priced as the default loss (the same passes)")


HANDLERS: dict[str, Handler] = {
    **TRAINING_ARGUMENTS,
    "model_name_or_path": lambda k, v, r: r.set("model", model_ref(str(v), r)),
    "use_peft": _peft,
    "load_in_4bit": switch("method", "qlora"),
    "load_in_8bit": switch("base_quant", "int8"),
    "use_dora": switch("method", "dora"),
    "lora_r": setting("lora.r", int),
    "lora_alpha": setting("lora.alpha", float),
    "lora_dropout": setting("lora.dropout", float),
    "lora_target_modules": _targets,
    "use_bnb_nested_quant": _nested,
    "max_length": setting("seq_len", int),
    "max_seq_length": setting("seq_len", int),
    "packing": _packing,
    "packing_strategy": ignored,  # read with `packing`
    "padding_free": _padding_free,
    "attn_implementation": _attention,
    "activation_offloading": switch("activation_offload"),
    "dataset_name": _dataset,
    "dataset_text_field": lambda k, v, r: r.set("data.format", "text"),
    "completion_only_loss": unmodeled("the loss mask follows data.format's prompt/response split", (None,)),
    "assistant_only_loss": unmodeled("the loss mask follows data.format's prompt/response split", (None, False)),
    "dtype": _dtype,
    "beta": setting("preference.beta", float),
    "precompute_ref_log_probs": switch("preference.precompute_reference"),
    "loss_type": _loss_type,
}


# GRPOConfig's own keys onto tunelab's grpo section (config/objective.GrpoConfig names them as TRL does).
GRPO_HANDLERS: dict[str, Handler] = {
    "num_generations": setting("grpo.num_generations", int),
    "max_completion_length": setting("grpo.max_completion_length", int),
    "temperature": setting("grpo.temperature", float),
    "top_p": setting("grpo.top_p", float),
    "epsilon": setting("grpo.epsilon", float),
    "epsilon_high": setting("grpo.epsilon_high", float),
    "num_iterations": setting("grpo.num_iterations", int),
    "beta": setting("grpo.beta", float),
    "per_device_train_batch_size": ignored,  # completions, read with num_generations (_grpo_batch)
    "gradient_accumulation_steps": ignored,
    "max_prompt_length": ignored,  # read with max_completion_length (_grpo_batch)
    "steps_per_generation": unmodeled(
        "a generation batch feeding several optimizer steps: priced as one per step (the same sampling per completion)",
        (None, 1),
    ),
    "generation_batch_size": unmodeled("priced as one generation batch per optimizer step", (None,)),
    "use_vllm": unmodeled("generation by vLLM: priced as tunelab's own sampler"),
    "reward_funcs": lambda k, v, r: r.skip(
        k, f"{v}: rewards are priced as rule-based, no forward pass (a reward model's is not modeled)"
    ),
    "reward_weights": ignored,
    "loss_type": lambda k, v, r: (
        r.set("grpo.loss_type", str(v))
        if str(v) in get_args(GrpoLossType)
        else r.skip(k, f"{v}: priced as dapo's (the same passes)")
    ),
    "scale_rewards": lambda k, v, r: r.set(
        "grpo.scale_rewards", {True: "group", False: "none"}.get(v, v) if not isinstance(v, str) else v
    ),
}


def _grpo_batch(doc: dict, reading: Reading) -> None:
    """TRL counts completions per device batch (per_device_train_batch_size, 8 by default) and samples
    `batch x accumulation / num_generations` prompts a step; tunelab counts prompts per micro-batch, each with its
    group of completions. A device batch of whole groups maps exactly; one that is less than a group is priced as
    one micro-batch of the step's prompts (the update's memory then counts every completion at once)."""
    where = reading.path
    completions = number(where, "per_device_train_batch_size", doc.get("per_device_train_batch_size", 8))
    accumulation = number(where, "gradient_accumulation_steps", doc.get("gradient_accumulation_steps", 1))
    group = number(where, "num_generations", doc.get("num_generations", 8))
    if completions * accumulation % group:
        raise TunelabError(
            f"{where}: per_device_train_batch_size {completions} x gradient_accumulation_steps {accumulation} is not a "
            f"multiple of num_generations {group} (TRL refuses it too); make it one"
        )
    if completions % group == 0:
        reading.set("micro_batch", completions // group)
        reading.set("grad_accum", accumulation)
    else:
        reading.set("micro_batch", completions * accumulation // group)
        reading.set("grad_accum", 1)
        reading.notes.append(
            f"a device batch of {completions} completions is less than a group of {group}: priced as one "
            f"micro-batch of the step's {completions * accumulation // group} prompts"
        )
    completion = number(where, "max_completion_length", doc.get("max_completion_length", 512))
    prompt = doc.get("max_prompt_length")
    if prompt is not None:  # older GRPOConfigs: prompts truncated to it; a row is the prompt and its completion
        reading.set("seq_len", number(where, "max_prompt_length", prompt) + completion)
    elif completion >= reading.settings["seq_len"]:
        reading.set("seq_len", completion + 512)
        reading.notes.append(
            f"prompts of up to 512 tokens beside completions of {completion} (seq_len {completion + 512})"
        )


def read_grpo(doc: dict, reading: Reading) -> None:
    """A GRPOConfig: objective grpo at TRL 1.16's defaults where the file says nothing, priced by tunelab's GRPO
    model (sampling, scoring passes and the update by part, plan/grpo.py): TRL's own GRPO step is not."""
    reading.stack = "tunelab"
    reading.set("objective", "grpo")
    for key, value in (("num_generations", 8), ("max_completion_length", 512), ("loss_type", "dapo")):
        reading.set(f"grpo.{key}", value)
    reading.set("grpo.scale_rewards", "group")
    # plan prices no reward's forward; `train --from` needs a reward tunelab runs (grpo.rewards=... replaces it).
    reading.set("grpo.rewards", [{"name": "exact_answer"}])
    _grpo_batch(doc, reading)
    apply(doc, reading, {**HANDLERS, **GRPO_HANDLERS}, QUIET_HERE, "TRL")
    reading.notes.append(
        "TRL's GRPOTrainer is priced as tunelab's GRPO at its settings (tunelab's measured 2.07x TRL's completions/s "
        "in bf16 on a 2-core CPU: benchmarks/grpo/grpo-bf16-peer_epyc-avx512bf16-2c_2026-12-07.md); the reward is "
        "exact_answer for `train --from` unless grpo.rewards=... is given"
    )


def read(doc: dict, reading: Reading) -> None:
    reading.set("seq_len", 1024)
    reading.set("grad_ckpt", True)
    reading.set("epochs", 3.0)  # TrainingArguments' num_train_epochs
    reading.set("method", "full")
    reading.set("lora.targets", ["q_proj", "v_proj"])
    if GRPO_KEYS & set(doc):
        read_grpo(doc, reading)
        return
    if DPO_KEYS & set(doc):
        reading.set("objective", "dpo")
    apply(doc, reading, HANDLERS, QUIET_HERE, "TRL")
    if reading.hf.get("padding") in ("multipack", "padding_free") and "attn_implementation" not in reading.hf:
        reading.notes.append("padding-free rows without attn_implementation: flash_attention_2 assumed (TRL needs it)")
        reading.hf["attn_implementation"] = "flash_attention_2"
    reading.notes.append(
        "TRL 1.16's defaults where a key is absent: max_length 1024, gradient checkpointing on, rows padded to each "
        "batch's longest, full fine-tuning unless use_peft, PEFT's targets q_proj and v_proj, optim adamw_torch_fused, "
        "3 epochs"
    )


def detect(doc: dict) -> bool:
    keys = set(doc)
    return bool(keys & (SFT_KEYS | DPO_KEYS | GRPO_KEYS | MODEL_KEYS)) or "per_device_train_batch_size" in keys


READER = Reader("trl", "a TRL config (SFTConfig, DPOConfig, GRPOConfig or TrainingArguments)", detect, read)
