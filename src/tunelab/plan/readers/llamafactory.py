"""LLaMA-Factory's YAML config (`llamafactory-cli train FILE`: its hparams ModelArguments, DataArguments,
FinetuningArguments and Seq2SeqTrainingArguments in one mapping) -> plan's HF stack: LLaMA-Factory trains with
the HF Trainer and PEFT.

Its own defaults where the file says nothing: gradient checkpointing on (`disable_gradient_checkpointing:
false`), attention as transformers picks it (`flash_attn: auto`: sdpa), no packing for SFT, rows padded to each
batch's longest, and no prepare_model_for_kbit_training on a quantized base (its own preparation leaves the
norms and the head in the compute dtype unless `upcast_layernorm`). Datasets are names in
`<dataset_dir>/dataset_info.json`, looked up beside the config and in the working directory.
"""

from __future__ import annotations

import json
from pathlib import Path

from .common import (
    TRAINING_ARGUMENTS,
    Handler,
    Reader,
    Reading,
    apply,
    bool_of,
    dataset_path,
    hf_switch,
    ignored,
    method_of,
    model_ref,
    number,
    objective_of,
    setting,
    switch,
    unmodeled,
)

ATTENTION = {"auto": "sdpa", "sdpa": "sdpa", "fa2": "flash_attention_2", "disabled": "eager", "eager": "eager"}
QUIET_HERE = {
    "template",
    "max_samples_eval",
    "val_size_seed",
    "tokenized_path",
    "streaming",
    "buffer_size",
    "mix_strategy",
    "interleave_probs",
    "ignore_pad_token_for_loss",
    "use_fast_tokenizer",
    "resize_vocab",
    "split_special_tokens",
    "new_special_tokens",
    "cache_dir",
    "infer_backend",
    "export_dir",
    "print_param_status",
    "default_system",
    "enable_thinking",
    "media_dir",
}
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _dataset(value: str, doc: dict, reading: Reading) -> None:
    names = [n.strip() for n in str(value).split(",") if n.strip()]
    folder = str(doc.get("dataset_dir", "data"))
    info = None
    for base in (Path(reading.path).parent, Path.cwd()):
        candidate = base / folder / "dataset_info.json"
        if candidate.is_file():
            info = candidate
            break
    if info is None:
        reading.notes.append(f"dataset {names[0]}: no {folder}/dataset_info.json beside the config; give --examples")
        return
    try:
        table = json.loads(info.read_text())
    except (OSError, json.JSONDecodeError) as e:
        from ...errors import TunelabError

        raise TunelabError(f"{info}: cannot read it ({e}); LLaMA-Factory's dataset_info.json is JSON") from None
    entry = table.get(names[0])
    if not isinstance(entry, dict):
        reading.notes.append(f"dataset {names[0]}: not in {info}; give --examples")
        return
    where = entry.get("file_name") or entry.get("hf_hub_url") or ""
    base = str(info.parent / where) if entry.get("file_name") else where
    path = dataset_path(base, reading.path, reading, f"dataset {names[0]}")
    if path:
        reading.set("data.path", path)
    reading.set("data.format", "sharegpt" if entry.get("formatting") == "sharegpt" else "alpaca")
    if entry.get("columns"):
        reading.skip(f"dataset {names[0]} columns", "renamed columns: rows rendered with the format's own fields")
    for extra in names[1:]:
        reading.skip(f"dataset {extra}", "only the first dataset's rows are counted")


def _stage(key: str, value, reading: Reading) -> None:
    if objective_of(value) is not None:
        reading.set("objective", objective_of(value))
    else:
        reading.skip(key, f"{value}: plan models the sft and dpo stages from a tool's config")


def _pref_loss(key: str, value, reading: Reading) -> None:
    if objective_of(value) is not None:
        reading.set("objective", objective_of(value))
    elif value != "sigmoid":
        reading.skip(key, f"{value}: a preference loss plan prices as DPO's")


def _finetuning(key: str, value, reading: Reading) -> None:
    from ... import methods

    if method_of(value) is not None:
        if methods.get(method_of(value)).trains_base:  # else the adapter quantization_bit and use_dora say
            reading.set("method", method_of(value))
    else:
        reading.skip(key, f"{value}: plan models lora and full")


def _method_of_quant(key: str, value, reading: Reading) -> None:
    """`quantization_method: gptq` (a 4-bit GPTQ checkpoint) priced at GPTQ's bytes a weight (memory.gptq_bytes)
    as a 4-bit base; bnb (the default) is NF4; others are listed."""
    if str(value) == "gptq" and reading.doc.get("quantization_bit") in (None, 4):
        reading.parts["gptq_bits"] = 4
        reading.set("method", "qlora")
    elif str(value) == "gptq":
        reading.skip(key, "GPTQ at other than 4 bits: priced as quantization_bit says (bitsandbytes)")
    elif str(value) not in ("bnb", "bitsandbytes", "None", ""):
        reading.skip(key, f"{value}: plan prices bitsandbytes' NF4 and GPTQ bases")


def _bits(key: str, value, reading: Reading) -> None:
    bits = number(reading.path, key, value) if value is not None else None
    if bits == 4:
        reading.set("method", "qlora")
    elif bits == 8:
        reading.set("base_quant", "int8")
    elif bits is not None:
        reading.skip(key, f"{bits}-bit: plan models 4-bit (nf4) and 8-bit bases")


def _target(key: str, value, reading: Reading) -> None:
    names = [n.strip() for n in str(value).split(",")]
    if names == ["all"]:
        reading.set("lora.targets", "all-linear")
        return
    kept = [n for n in names if n in LINEAR]
    if len(kept) < len(names):
        reading.skip(key, f"{', '.join(sorted(set(names) - set(kept)))}: plan adapts the decoder's linears only")
    reading.set("lora.targets", kept or "all-linear")


def _packing(key: str, value, reading: Reading) -> None:
    if bool_of(reading.path, key, value) and reading.hf.get("padding") != "multipack":
        reading.hf["padding"] = "packed"


def _neat(key: str, value, reading: Reading) -> None:
    if bool_of(reading.path, key, value):
        reading.hf["padding"] = "multipack"
        reading.hf["attn_implementation"] = "flash_attention_2"


def _flash(key: str, value, reading: Reading) -> None:
    if str(value) in ATTENTION:
        reading.hf["attn_implementation"] = ATTENTION[str(value)]
    else:
        reading.skip(key, f"{value}: plan knows {', '.join(ATTENTION)}")


def _val(key: str, value, reading: Reading) -> None:
    if value:
        reading.set("eval.split", number(reading.path, key, value, float))


HANDLERS: dict[str, Handler] = {
    "double_quantization": lambda k, v, r: r.parts.update(double_quant=bool_of(r.path, k, v)),
    **TRAINING_ARGUMENTS,
    "model_name_or_path": lambda k, v, r: r.set("model", model_ref(str(v), r)),
    "stage": _stage,
    "pref_loss": _pref_loss,
    "pref_beta": setting("preference.beta", float),
    "finetuning_type": _finetuning,
    "use_dora": switch("method", "dora"),
    "quantization_bit": _bits,
    "quantization_method": _method_of_quant,
    "lora_rank": setting("lora.r", int),
    "lora_alpha": setting("lora.alpha", float),
    "lora_dropout": setting("lora.dropout", float),
    "lora_target": _target,
    "dataset": lambda k, v, r: _dataset(v, r.doc, r),
    "dataset_dir": ignored,  # read with `dataset`
    "cutoff_len": setting("seq_len", int),
    "max_samples": setting("data.max_examples", int),
    "val_size": _val,
    "packing": _packing,
    "neat_packing": _neat,
    "flash_attn": _flash,
    "disable_gradient_checkpointing": lambda k, v, r: r.set("grad_ckpt", not bool_of(r.path, k, v)),
    "enable_liger_kernel": hf_switch("use_liger_kernel"),
    "upcast_layernorm": hf_switch("prepare_model_for_kbit_training"),
    # Unsloth's gradient checkpointing: the checkpointed layers' inputs offloaded to the host (memory.checkpointed_bytes)
    "use_unsloth_gc": switch("activation_offload"),
    **{
        k: unmodeled("a kernel or optimizer plan has no part for")
        for k in ("use_unsloth", "use_badam", "use_galore", "use_apollo", "use_adam_mini")
    },
}


def read(doc: dict, reading: Reading) -> None:
    reading.hf["prepare_model_for_kbit_training"] = False
    reading.set("grad_ckpt", True)
    reading.set("epochs", 3.0)  # TrainingArguments' num_train_epochs
    reading.doc = doc
    apply(doc, reading, HANDLERS, QUIET_HERE, "LLaMA-Factory")
    rank = reading.settings.get("lora.r")
    if rank is not None and "lora_alpha" not in doc:
        reading.set("lora.alpha", float(2 * rank))  # LLaMA-Factory's default: twice the rank
    reading.notes.append(
        "LLaMA-Factory's defaults where a key is absent: gradient checkpointing on, sdpa attention, rows padded to "
        "each batch's longest, optim adamw_torch_fused and 3 epochs (transformers')"
    )


def detect(doc: dict) -> bool:
    return "model_name_or_path" in doc and any(k in doc for k in ("stage", "finetuning_type", "cutoff_len", "template"))


READER = Reader("llamafactory", "a LLaMA-Factory config", detect, read)
