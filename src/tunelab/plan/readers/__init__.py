"""Another tool's own config -> what plan predicts of its run (`tunelab plan --from FILE`) and the tunelab config
that runs the same job (`tunelab train --from FILE`): one reader per tool, a row of READERS (each module's
READER), sharing readers/common.py.

Axolotl, LLaMA-Factory, TRL (SFTConfig / DPOConfig / GRPOConfig or plain TrainingArguments, YAML or JSON) and
torchtune recipe configs. A reader maps each key it knows onto tunelab's config keys (`settings`) and, for a tool
that runs on the HF Trainer + PEFT, onto plan's HF stack switches (`hf`, plan/hfstack.py); every other key is
listed in `skipped` with why, so nothing is dropped silently. Torch-free: it reads YAML/JSON and never imports the
tool.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from ...errors import TunelabError
from . import axolotl, llamafactory, torchtune, trl
from .common import Reading

if TYPE_CHECKING:
    from ...config import TrainConfig

# Tried in this order by `read` without a tool named: the most specific keys first (TRL's are TrainingArguments').
READERS = {r.name: r for r in (axolotl.READER, llamafactory.READER, torchtune.READER, trl.READER)}


def _load(path: Path) -> dict:
    if not path.is_file():
        raise TunelabError(f"--from {path}: file not found; give another tool's config (YAML or JSON)")
    try:
        text = path.read_text()
        doc = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TunelabError(f"--from {path}: cannot read it ({first}); give the tool's YAML or JSON config") from None
    if not isinstance(doc, dict):
        raise TunelabError(f"--from {path}: the top level must be a mapping of the tool's keys")
    return doc


def read(path: str | Path, tool: str | None = None) -> Reading:
    """Read `path` with the reader `tool` names, or the first whose `detect` accepts it."""
    path = Path(path)
    doc = _load(path)
    if tool is not None:
        if tool not in READERS:
            raise TunelabError(f"--tool {tool}: choose from {', '.join(READERS)}")
        reader = READERS[tool]
    else:
        reader = next((r for r in READERS.values() if r.detect(doc)), None)
        if reader is None:
            raise TunelabError(
                f"--from {path}: not a config of {', '.join(r.label for r in READERS.values())} as far as its keys "
                f"tell; name the tool with --tool ({', '.join(READERS)})"
            )
    reading = Reading(reader.name, str(path), reader.label, doc=doc)
    reader.read(doc, reading)
    return reading


def config_of(reading: Reading, overrides: list[str] = ()) -> TrainConfig:
    """The tunelab config that runs the job the tool's file describes: the reading's settings, then the user's
    own `overrides` on top. An error names the tool's file."""
    from ...config import load_config

    try:
        return load_config(None, [*reading.overrides, *overrides])
    except TunelabError as e:
        raise TunelabError(f"--from {reading.path}: {e}") from None


def hf_choices(reading: Reading) -> dict:
    """The HF stack's switches the tool's run makes (plan/hfstack.py): the reading's, over transformers' default
    optimizer (adamw_torch_fused in transformers 5); empty for a tool plan models as tunelab's step."""
    from ..job import STACK_ROWS

    if not STACK_ROWS[reading.stack].hf:
        return {}
    return {"optim": "adamw_torch_fused", **reading.hf}
