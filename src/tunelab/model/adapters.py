"""LoRA / DoRA / QLoRA adapters through peft, or full fine-tuning with every weight trainable."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from ..config import AdapterConfig
from ..errors import TunelabError


def linear_names(model: torch.nn.Module) -> dict[str, set[str]]:
    """Leaf names of the linear layers inside the decoder blocks, grouped as attention or MLP.

    Derived from the model rather than a table so presets work for any architecture whose blocks name
    their sub-modules `*attn*` and `*mlp*` (Llama, Mistral, Qwen2, Gemma, ...). bitsandbytes layers
    subclass nn.Linear, so quantized bases are found too.
    """
    groups: dict[str, set[str]] = {"attn": set(), "mlp": set()}
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or "lm_head" in name:
            continue
        parts = name.split(".")
        leaf = parts[-1]
        parent = parts[-2] if len(parts) > 1 else ""
        if "attn" in parent or "attention" in parent:
            groups["attn"].add(leaf)
        elif "mlp" in parent or "feed_forward" in parent:
            groups["mlp"].add(leaf)
    return groups


def resolve_targets(model: torch.nn.Module, targets: str | list[str] | tuple[str, ...]) -> list[str]:
    return resolve_all(model, targets)[0]


def resolve_all(model: torch.nn.Module, targets: str | list[str] | tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(linear module leaf names, stacked expert parameters as PEFT's target_parameters names them) for `targets`.

    A Mixture-of-Experts model's experts are stacked parameters, not linear layers: the `mlp` and `all-linear`
    presets take them, and a list takes `experts` (all of them) or a projection's name (`gate_up_proj`,
    `down_proj`: that projection of the experts, and any linear layer of that name). The routers and Qwen2-MoE's
    shared-expert gate (one output each) are never adapted: `lora.router` trains the routers whole."""
    from . import moe

    groups = linear_names(model)
    params = moe.expert_params(model)
    skip = set(moe.router_modules(model)) | ({"shared_expert_gate"} if params else set())
    groups = {k: v - skip for k, v in groups.items()}
    known = groups["attn"] | groups["mlp"]
    projections = {p.split(".")[-1] for p in params}
    if targets == "attn":
        chosen, chosen_params = groups["attn"], []
    elif targets == "mlp":
        chosen, chosen_params = groups["mlp"], params
    elif targets == "all-linear":
        chosen, chosen_params = known, params
    else:
        wanted = set(targets)
        every = {"experts"} if params else set()
        unknown = wanted - known - projections - every
        if unknown:
            extra = f"; its experts {', '.join(params)} (or experts for all)" if params else ""
            raise TunelabError(
                f"lora.targets: {', '.join(sorted(unknown))} not found in the model; "
                f"its linear layers are {', '.join(sorted(known))}{extra} (or use attn, mlp, all-linear)"
            )
        chosen = wanted & known
        chosen_params = [p for p in params if "experts" in wanted or p.split(".")[-1] in wanted]
    if not chosen and not chosen_params:
        raise TunelabError(f"lora.targets {targets!r}: no matching linear layers in this model")
    if params:
        check_moe_targets(model, sorted(chosen), chosen_params, targets)
    return sorted(chosen), chosen_params


def check_moe_targets(model: torch.nn.Module, modules: list[str], params: list[str], targets) -> None:
    """An MoE model's LoRA must adapt its attention or its experts: a target list naming neither (only a dense or
    shared-expert MLP, say) trains next to nothing of the model and is refused."""
    from . import moe

    attn = linear_names(model)["attn"]
    if not params and not set(modules) & attn:
        raise TunelabError(
            f"lora.targets {targets!r}: names no attention or expert module of this Mixture-of-Experts model; its "
            f"attention layers are {', '.join(sorted(attn))} and its experts {', '.join(moe.expert_params(model))} "
            "(or use attn, mlp, all-linear)"
        )


def apply_adapter(model: torch.nn.Module, adapter: AdapterConfig) -> torch.nn.Module:
    """Wrap `model` for training. Trainable weights are fp32 whatever the base dtype (peft casts adapters), but
    for full fine-tuning with `weights: bf16`."""
    if adapter.row.trains_base:
        # fp32 master weights (compute runs under autocast), or bf16 weights that train/optim.py updates in fp32.
        model.to(torch.bfloat16 if adapter.weights == "bf16" else torch.float32)
        for p in model.parameters():
            p.requires_grad_(True)
        return model
    from peft import LoraConfig, get_peft_model

    from . import moe
    from .lora_linear import use_fused_lora

    if moe.is_moe(model.config) and adapter.quant != "none" and not moe.quantized_stacks(model):
        raise TunelabError(
            f"method {adapter.method} (base_quant {adapter.quant}): this Mixture-of-Experts model's stacked experts "
            "are not quantized (bitsandbytes quantizes linear layers only; tunelab puts experts in 4 bits for nf4 "
            "only); use method qlora, or method lora with base_quant none"
        )
    modules, params = resolve_all(model, adapter.lora.targets)
    routers = moe.router_modules(model)
    if adapter.lora.router and not routers:
        raise TunelabError(
            f"lora.router: {getattr(model.config, 'model_type', 'this model')} has no router (not a "
            "Mixture-of-Experts model); drop lora.router"
        )
    if params and (adapter.lora.dropout or adapter.row.magnitude):
        what = "lora.dropout" if adapter.lora.dropout else f"method {adapter.row.name}"
        raise TunelabError(
            f"{what}: LoRA on stacked experts (PEFT's target_parameters) has no dropout or DoRA; set lora.dropout: 0 "
            "and method lora, or lora.targets: attn"
        )
    config = LoraConfig(
        r=adapter.lora.r,
        lora_alpha=adapter.lora.alpha,
        lora_dropout=adapter.lora.dropout,
        target_modules=modules,
        target_parameters=params or None,
        modules_to_save=routers if adapter.lora.router else None,
        use_dora=adapter.row.magnitude,
        bias="none",
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config, autocast_adapter_dtype=True)
    moe.fuse_lora(peft_model)
    if adapter.row.magnitude:
        _traceable_dora_weight()
    # peft casts every adapter input to the adapter's fp32 dtype: with a bf16 base that is two full copies
    # of each activation per adapted layer (to fp32, and back to bf16 under autocast), ~1000 copies a step
    # on a 30-layer model. Autocast already runs the adapter matmuls in the compute dtype against the fp32
    # master weights, so the cast buys nothing.
    for module in peft_model.modules():
        if hasattr(module, "cast_input_dtype_enabled"):
            module.cast_input_dtype_enabled = False
    # Base and adapter products in one fp32 accumulator, so bf16 does not round small updates away.
    use_fused_lora(peft_model)
    return peft_model


def _traceable_dora_weight() -> None:
    """Give peft's DoRA layers a base-weight lookup that dynamo traces. peft's `dequantize_module_weight` asks
    `type(weight).__module__.startswith("torchao.")`, which torch 2.13's dynamo cannot trace: every DoRA layer
    broke its compiled block's graph twice (tests/unit/recipes/test_finetune.py). A plain weight is returned as
    peft returns it; anything else (nf4, int8, HQQ, torchao, FSDP's DTensor) still goes through peft."""
    from peft.tuners.lora import dora

    peft_lookup = getattr(dora.dequantize_module_weight, "peft_lookup", dora.dequantize_module_weight)

    def base_weight(module: torch.nn.Module) -> torch.Tensor:
        weight = module.weight
        if type(weight) is torch.nn.Parameter and not hasattr(module, "W_q"):
            return weight
        return peft_lookup(module)

    base_weight.peft_lookup = peft_lookup
    dora.dequantize_module_weight = base_weight


def check_adapter(folder: Path) -> None:
    """A saved adapter's config and the header of its weights, read before any base model is loaded: peft
    fails on a damaged one (a copy cut short, a hand-edited config) with a traceback, after that load."""
    from safetensors import SafetensorError, safe_open

    config = folder / "adapter_config.json"
    try:
        peft_type = json.loads(config.read_bytes()).get("peft_type")
    except (ValueError, AttributeError) as e:  # not UTF-8, not JSON, or not an object
        reason = str(e).splitlines()[0] if isinstance(e, ValueError) else "not a JSON object"
        raise TunelabError(f"{config}: not an adapter config ({reason}); use the file `tunelab train` wrote") from None
    if not peft_type:
        raise TunelabError(f"{config}: no peft_type, so not a PEFT adapter config; use the file `tunelab train` wrote")
    weights = folder / "adapter_model.safetensors"
    if not weights.is_file():
        if (folder / "adapter_model.bin").is_file():
            return
        raise TunelabError(f"{folder}: no adapter_model.safetensors beside adapter_config.json; copy the whole folder")
    try:
        with safe_open(weights, framework="pt"):
            pass
    except SafetensorError as e:
        raise TunelabError(
            f"{weights}: cannot be read ({e}); the copy is damaged or cut short, copy it again"
        ) from None


def load_adapter(model: torch.nn.Module, path: str | Path, base: str) -> torch.nn.Module:
    """A saved LoRA/DoRA adapter on `model` (loaded from `base`), computed as training computed it, for evaluation.

    Not merged: merging rounds base + delta to bf16. Not peft's forward either, which adds the delta to
    the bf16-rounded base output and so drops updates below half an ulp of it (see lora_linear.py): the
    fused layer scores the model that training's forward saw.
    """
    from . import moe
    from .lora_linear import pack_for_inference, use_fused_lora

    model = peft_from_pretrained(model, path, base)
    moe.fuse_lora(model)
    use_fused_lora(model)
    pack_for_inference(model)
    return model


def load_adapters(model: torch.nn.Module, paths: dict[str, str | Path], base: str) -> torch.nn.Module:
    """Several saved adapters on one `model`, each under its name (`tunelab serve`: one base in memory, the adapter a
    request names switched on with `set_adapter`, all off under `disable_adapter`), each computed as
    `load_adapter` computes one. The first named is active."""
    from .lora_linear import pack_for_inference, use_fused_lora

    names = list(paths)
    model = peft_from_pretrained(model, paths[names[0]], base, names[0])
    for name in names[1:]:
        peft_from_pretrained(model, paths[name], base, name)
    model.set_adapter(names[0])
    model.requires_grad_(False)
    use_fused_lora(model)
    pack_for_inference(model)
    return model


def peft_from_pretrained(model: torch.nn.Module, path: str | Path, base: str, name: str | None = None):
    """`PeftModel.from_pretrained` (`name`: under that adapter name; onto a PeftModel, its `load_adapter`), where an
    adapter trained on another model (other layer sizes, or layers the model lacks) is one line naming the
    adapter, the model and the first layer that does not fit."""
    from peft import PeftModel

    try:
        if isinstance(model, PeftModel):
            model.load_adapter(str(path), adapter_name=name)
            return model
        return PeftModel.from_pretrained(model, str(path), adapter_name=name or "default")
    except (RuntimeError, ValueError) as e:
        text = str(e)
        size = re.search(
            r"size mismatch for (?:base_model\.model\.)?(?:model\.)?(\S+?)(?:\.default)?\.weight: copying a param with "
            r"shape torch\.Size\((\[[^]]*\])\) from checkpoint, the shape in current model is torch\.Size\((\[[^]]*\])\)",
            text,
        )
        if size is not None:
            detail = f"{size[1]} is {size[2]} in the adapter, {size[3]} in the model"
        elif "not found in the base model" in text:
            detail = _first_line(text)
        else:
            raise
        raise TunelabError(
            f"{path}: the adapter does not fit model {base} ({detail}); pass the model it was trained on with --model"
        ) from None


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0].rstrip(".")


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total). 4-bit bitsandbytes weights pack two values per stored element."""
    trainable = total = 0
    for p in model.parameters():
        n = p.numel() * (2 if p.__class__.__name__ == "Params4bit" else 1)
        total += n
        if p.requires_grad:
            trainable += n
    return trainable, total
