"""The grammar of the config's `model` string, torch-free and import-free so config, sources and plan all
read it without importing each other: `embedded` names the built-in SmolLM2-135M-Instruct (sources.py),
`random:<id>` a catalog shape with random weights and the embedded SmolLM2 tokenizer (plan/arch.py maps the id,
model/load.py builds it); anything else is a local directory, a .gguf file or a hub id."""

from __future__ import annotations

EMBEDDED = "embedded"
RANDOM = "random:"


def is_random(ref: str) -> bool:
    return ref.startswith(RANDOM)
