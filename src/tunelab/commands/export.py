"""`tunelab export --adapter DIR --merge --out DIR`: a plain HF model directory with the adapter merged in."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..device import DTYPES
from ..errors import TunelabError
from ..model.export import merge


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--adapter", required=True, help="adapter dir written by `tunelab train` (OUTPUT_DIR/adapter)")
    p.add_argument("--merge", action="store_true", help="merge the adapter into the base weights (required)")
    p.add_argument("--out", required=True, help="directory to write the merged model to")
    p.add_argument("--model", help="base model (default: the one in the run's config.yaml)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="dtype of the saved weights")


def run(args: argparse.Namespace) -> int:
    if not args.merge:
        raise TunelabError(
            "export writes a merged model; pass --merge (the adapter dir itself is already the PEFT export)"
        )
    out = merge(Path(args.adapter), Path(args.out), args.model, DTYPES[args.dtype])
    print(f"merged model written to {out}")
    return 0
