"""Folding a LoRA/DoRA adapter into its base weights (`tunelab export`, commands/export.py).

`merge` writes a plain HF model directory (safetensors + tokenizer) that `AutoModelForCausalLM.from_pretrained`
loads without peft. Merging happens in fp32 and is saved in the dtype asked for (default fp32, lossless).
`export_gguf` writes the merged model as one GGUF file, `export_gguf_lora` the adapter alone (gguf_export.py),
each with an Ollama Modelfile beside it (modelfile.py).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import sources
from ..config import load_config
from ..errors import TunelabError
from ..io import atomic_dir, check_output_dir, check_output_file, write_atomic
from ..modelref import EMBEDDED
from . import gguf_export
from . import load as mload
from .adapters import check_adapter, peft_from_pretrained
from .modelfile import PromptSpec, modelfile


def base_model_ref(adapter: Path, override: str | None) -> str:
    """The run's config.yaml (beside the adapter) names the base model."""
    if override:
        return override
    run_config = adapter.parent / "config.yaml"
    if not run_config.is_file():
        raise TunelabError(f"{adapter}: no config.yaml beside it to name the base model; pass --model")
    return load_config(run_config).model


def _check_adapter_dir(adapter: Path) -> None:
    if not (adapter / "adapter_config.json").is_file():
        raise TunelabError(f"{adapter}: not a PEFT adapter dir (no adapter_config.json)")


def _base(adapter: Path, model_ref: str | None, what: str = "merging"):
    source = sources.resolve(base_model_ref(adapter, model_ref))
    if source.random_key:
        raise TunelabError(
            f"{adapter}: its base {source.ref} has random weights that were never saved; "
            f"{what} needs a real base model, pass one with --model"
        )
    return source


def _merged(adapter: Path, source):
    base = mload.load_model(source, torch.float32, "none", torch.device("cpu"))
    merged = peft_from_pretrained(base, adapter, source.ref).merge_and_unload()
    merged.config.use_cache = True
    return merged


def merge(adapter: Path, out: Path, model_ref: str | None, dtype: torch.dtype) -> Path:
    _check_adapter_dir(adapter)
    check_output_dir(out, "--out")
    if out.exists() and any(out.iterdir()):
        raise TunelabError(f"{out}: exists and is not empty; choose a new --out")
    check_adapter(adapter)
    source = _base(adapter, model_ref)
    merged = _merged(adapter, source)
    with atomic_dir(out) as tmp:
        merged.to(dtype).save_pretrained(tmp, safe_serialization=True)
        sources.load_tokenizer(source).save_pretrained(tmp)
    return out


@dataclass(frozen=True)
class GGUFExport:
    """What an export wrote: the GGUF file and the Modelfile beside it."""

    gguf: Path
    modelfile: Path


def _check_gguf_out(out: Path) -> Path:
    """The GGUF path and its Modelfile, neither of which may exist: an export never replaces a file."""
    check_output_file(out, "--out")
    if out.suffix != ".gguf":
        raise TunelabError(f"--out {out}: a GGUF export is one file; name it *.gguf")
    target = out.parent / "Modelfile"
    for path in (out, target):
        if path.exists():
            raise TunelabError(f"{path}: exists; choose a new --out (in a folder without a Modelfile)")
    return target


def _tokenizer_folder(source, folder: Path):
    """The base's tokenizer and config as HF files in `folder`, which the GGUF vocabulary is read from: the
    tokenizer as the model ships it (load_tokenizer would give it a pad token the converter would not see)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source.path, **source.kwargs)
    tokenizer.save_pretrained(folder)
    config = sources.model_config(source)
    config.save_pretrained(folder)
    return tokenizer, config


def export_gguf(
    adapter: Path, out: Path, model_ref: str | None, quant: str, prompt: PromptSpec, name: str | None = None
) -> GGUFExport:
    """The merged model as one GGUF file at `out`, checked in full before the base model loads."""
    _check_adapter_dir(adapter)
    target = _check_gguf_out(out)
    gguf_export.quant_types(quant)
    check_adapter(adapter)
    source = _base(adapter, model_ref)
    with tempfile.TemporaryDirectory(prefix="tunelab-gguf-") as folder:
        tokenizer, config = _tokenizer_folder(source, Path(folder))
        plan = gguf_export.check_model(config, Path(folder), quant, source.ref)
        merged = _merged(adapter, source)
        gguf_export.write_model(merged, Path(folder), plan, out, name or out.stem)
    text = modelfile(f"./{out.name}", prompt, tokenizer.chat_template, tokenizer.eos_token)
    write_atomic(target, [text])
    return GGUFExport(out, target)


def export_gguf_lora(
    adapter: Path, out: Path, model_ref: str | None, quant: str, prompt: PromptSpec, name: str | None = None
) -> GGUFExport:
    """The adapter alone as a GGUF LoRA (llama.cpp's `--lora`, Ollama's ADAPTER); the base is not loaded."""
    from safetensors.torch import load_file

    _check_adapter_dir(adapter)
    target = _check_gguf_out(out)
    gguf_export.quant_types(quant, gguf_export.LORA_QUANTS)
    check_adapter(adapter)
    source = _base(adapter, model_ref, "a GGUF LoRA")
    adapter_config = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    config = sources.model_config(source)
    plan = gguf_export.check_lora(adapter_config, config, quant, source.ref)
    weights_file = adapter / "adapter_model.safetensors"
    if not weights_file.is_file():
        raise TunelabError(f"{adapter}: --format gguf-lora reads adapter_model.safetensors, which is not there")
    gguf_export.write_lora(load_file(weights_file), config, plan, out, name or out.stem)
    tokenizer = sources.load_tokenizer(source)
    # Ollama applies an ADAPTER to the model FROM names: the base's own GGUF where there is one.
    base = source.path / source.gguf_file if source.gguf_file else None
    if source.ref == EMBEDDED:
        base = sources.embedded_gguf()
    text = modelfile(str(base or source.ref), prompt, tokenizer.chat_template, tokenizer.eos_token, f"./{out.name}")
    write_atomic(target, [text])
    return GGUFExport(out, target)
