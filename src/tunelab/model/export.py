"""Folding a LoRA/DoRA adapter into its base weights (`tunelab export`, commands/export.py).

The result is a plain HF model directory (safetensors + tokenizer) that `AutoModelForCausalLM.from_pretrained`
loads without peft. Merging happens in fp32 and is saved in the dtype asked for (default fp32, lossless).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .. import sources
from ..config import load_config
from ..errors import TunelabError
from ..io import atomic_dir, check_output_dir
from . import load as mload
from .adapters import check_adapter, peft_from_pretrained


def base_model_ref(adapter: Path, override: str | None) -> str:
    """The run's config.yaml (beside the adapter) names the base model."""
    if override:
        return override
    run_config = adapter.parent / "config.yaml"
    if not run_config.is_file():
        raise TunelabError(f"{adapter}: no config.yaml beside it to name the base model; pass --model")
    return load_config(run_config).model


def merge(adapter: Path, out: Path, model_ref: str | None, dtype: torch.dtype) -> Path:
    if not (adapter / "adapter_config.json").is_file():
        raise TunelabError(f"{adapter}: not a PEFT adapter dir (no adapter_config.json)")
    check_output_dir(out, "--out")
    if out.exists() and any(out.iterdir()):
        raise TunelabError(f"{out}: exists and is not empty; choose a new --out")
    check_adapter(adapter)
    source = sources.resolve(base_model_ref(adapter, model_ref))
    if source.random_key:
        raise TunelabError(
            f"{adapter}: its base {source.ref} has random weights that were never saved; "
            "merging needs a real base model, pass one with --model"
        )
    base = mload.load_model(source, torch.float32, "none", torch.device("cpu"))
    merged = peft_from_pretrained(base, adapter, source.ref).merge_and_unload()
    merged.config.use_cache = True
    with atomic_dir(out) as tmp:
        merged.to(dtype).save_pretrained(tmp, safe_serialization=True)
        sources.load_tokenizer(source).save_pretrained(tmp)
    return out
