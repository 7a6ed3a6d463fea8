"""What a generation loads and how it prompts: the base model, row format and template of a trained adapter's run
(its `RUN/config.yaml`), the command line's choices winning. `tunelab eval` and `tunelab ui`'s Try it tab share
it, so both prompt an adapter as its training did. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import AdapterConfig, load_config
from ..data.read import iter_jsonl
from ..errors import TunelabError
from ..modelref import EMBEDDED
from .exact_match import parse_answer


@dataclass(frozen=True)
class Setup:
    """What to load and how to prompt, after merging the run's config with the command line."""

    model: str
    format: str
    template: str
    # A training checkpoint (RUN/checkpoints/step-N) rather than a saved adapter: the run's adapter settings, to
    # build the model as training did before its trainable weights are read.
    checkpoint_adapter: AdapterConfig | None = None


def is_checkpoint(folder: Path) -> bool:
    """A checkpoint `tunelab train` wrote (train/checkpoint.py: trainable weights, manifest written last)."""
    return (folder / "manifest.json").is_file() and (folder / "trainable.safetensors").is_file()


def resolve_setup(adapter: str | None, model: str | None, fmt: str | None, template: str | None) -> Setup:
    if adapter is None:
        return Setup(model or EMBEDDED, fmt or "alpaca", template or "alpaca")
    folder = Path(adapter)
    if is_checkpoint(folder):
        config_path = folder.parent.parent / "config.yaml"
        if not config_path.is_file():
            raise TunelabError(f"{config_path}: not found beside the checkpoint {folder}, so its run is unknown")
        cfg = load_config(config_path)
        return Setup(model or cfg.model, fmt or cfg.data.format, template or cfg.data.template, cfg.adapter)
    if not (folder / "adapter_config.json").is_file():
        raise TunelabError(
            f"{folder}: not an adapter directory (no adapter_config.json); pass RUN/adapter or "
            f"RUN/checkpoints/step-N of a training run"
        )
    config_path = folder.parent / "config.yaml"
    if not config_path.is_file():
        if model is None:
            raise TunelabError(
                f"{config_path}: not found, so the base model is unknown; pass --model (and --format/--template)"
            )
        return Setup(model, fmt or "alpaca", template or "alpaca")

    cfg = load_config(config_path)
    return Setup(model or cfg.model, fmt or cfg.data.format, template or cfg.data.template)


def prompt_row(fmt: str, text: str) -> dict:
    """A row of format `fmt` whose prompt is `text` (a user's typed prompt), for formats.prompt_text; `text`
    rows have no prompt part, so their text is the prompt as it stands."""
    if fmt == "alpaca":
        return {"instruction": text}
    if fmt == "completion":
        return {"prompt": text}
    if fmt == "chat":
        return {"messages": [{"role": "user", "content": text}]}
    if fmt == "sharegpt":
        return {"conversations": [{"from": "human", "value": text}]}
    return {"text": text}


def read_rows(path: Path, fmt: str, limit: int | None) -> list[dict]:
    """jsonl rows that can be prompted in `fmt` and carry a checkable `answer`; errors name the line."""
    if path.is_dir():
        raise TunelabError(f"{path}: is a directory; pass --data a .jsonl file")
    if not path.is_file():
        raise TunelabError(f"{path}: data file not found")
    rows = []
    for number, row in iter_jsonl(path, fmt):
        if limit is not None and len(rows) >= limit:
            break
        where = f"{path}:{number}"
        if "answer" not in row:
            raise TunelabError(f"{where}: no 'answer' field; eval compares the response's last integer against it")
        if parse_answer(row["answer"]) is None:
            raise TunelabError(f"{where}: answer {row['answer']!r} is not an integer or 'QUOTIENT R REMAINDER'")
        rows.append(row)
    if not rows:
        raise TunelabError(f"{path}: no rows to evaluate")
    return rows
