"""`tunelab export --adapter DIR`: the adapter merged into an HF model directory (`--merge --out DIR`), the merged
model as one GGUF file (`--format gguf --out FILE.gguf`), or the adapter alone as a GGUF LoRA
(`--format gguf-lora`); the GGUF formats write an Ollama Modelfile beside the file."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config import load_config
from ..device import DTYPES
from ..errors import TunelabError
from ..model.export import export_gguf, export_gguf_lora, merge
from ..model.gguf_export import QUANTS
from ..model.modelfile import PromptSpec

FORMATS = ("safetensors", "gguf", "gguf-lora")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--adapter", required=True, help="adapter dir written by `tunelab train` (OUTPUT_DIR/adapter)")
    p.add_argument("--format", choices=FORMATS, default="safetensors", help="what to write (default safetensors)")
    p.add_argument("--merge", action="store_true", help="merge the adapter into the base weights (safetensors)")
    p.add_argument("--out", required=True, help="directory (safetensors) or .gguf file to write")
    p.add_argument("--model", help="base model (default: the one in the run's config.yaml)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="dtype of the saved safetensors weights")
    p.add_argument("--quant", default="bf16", help=f"GGUF tensor type: {', '.join(QUANTS)} (default bf16)")


def run_prompt(adapter: Path) -> PromptSpec:
    """The run's data format and template (its config.yaml beside the adapter): the Modelfile's TEMPLATE."""
    run_config = adapter.parent / "config.yaml"
    if not run_config.is_file():
        return PromptSpec()
    cfg = load_config(run_config)
    return PromptSpec(format=cfg.data.format, template=cfg.data.template)


def run(args: argparse.Namespace) -> int:
    adapter, out = Path(args.adapter), Path(args.out)
    if args.format == "safetensors":
        if not args.merge:
            raise TunelabError(
                "export writes a merged model; pass --merge (the adapter dir itself is already the PEFT export)"
            )
        print(f"merged model written to {merge(adapter, out, args.model, DTYPES[args.dtype])}")
        return 0
    write = export_gguf if args.format == "gguf" else export_gguf_lora
    done = write(adapter, out, args.model, args.quant, run_prompt(adapter))
    print(f"{args.format} ({args.quant}) written to {done.gguf}")
    print(f"Ollama Modelfile written to {done.modelfile}; next: ollama create NAME -f {done.modelfile}")
    return 0
