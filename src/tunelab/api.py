"""tunelab from Python: load a config, plan it (`estimate`), train it (`finetune`), export the result; each
returns a typed result. (`tunelab.plan` and `tunelab.train` are the packages that do the work, hence the names.)

The functions are the commands' own paths (the CLI is a thin layer over the same recipes), so a notebook gets the
numbers `tunelab plan` prints and the run `tunelab train` makes. docs/api.md shows them in use. Torch is imported
only when a function needs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .config import TrainConfig
from .errors import TunelabError

EXPORT_FORMATS = ("safetensors", "gguf", "gguf-lora")


def load_config(path: str | Path | None = None, *overrides: str, **settings: Any) -> TrainConfig:
    """The validated config: a YAML file (or the defaults), then `key=value` overrides, then keyword settings by
    the keys the YAML uses (`lr=1e-3`, `seq_len=256`; dotted keys as `**{"lora.r": 16}`). Bad input raises
    TunelabError with the one line the CLI prints."""
    from . import config

    items = [*overrides, *(f"{key}={_yaml_value(value)}" for key, value in settings.items())]
    return config.load_config(path, items)


def finetune(config: TrainConfig | str | Path, *overrides: str, show_progress: bool = False, **settings: Any):
    """Fine-tune as `tunelab train` does, with the recipe the config's objective row names, and return the run's
    summary: a recipes.summary.RunSummary for every objective (also written to output_dir/summary.json).
    `config`: a TrainConfig, or a YAML path read with `overrides` and `settings`."""
    from .recipes import entry

    return entry.train(_config(config, overrides, settings), show_progress=show_progress)


def estimate(
    config: TrainConfig | str | Path | None = None,
    *overrides: str,
    gpu: str | list[str] = "h100-sxm",
    gpus: int = 1,
    examples: int | None = None,
    mean_tokens: float | None = None,
    loss_fraction: float = 0.5,
    stack: str = "tunelab",
    price_per_hour: float | None = None,
    tokenizer: str | None = None,
    hf: dict[str, Any] | None = None,
    parts: dict[str, Any] | None = None,
    completion_tokens: float | None = None,
    signal_share: float | None = None,
    from_run: str | Path | None = None,
    **settings: Any,
):
    """plan's prediction for `config` on each GPU in `gpu` (catalog ids or `local`): a list of plan.render.Result,
    one per GPU, whose `single` Estimate holds the time (`time_s`), the memory (`memory.total`, `fits`), the
    step by part (`step`), and whose `cost_usd(single)` prices it. `examples` (and `mean_tokens`) describe the
    workload when the config names no dataset. `hf`: with `stack="hf-peft"`, the HF script's choices by their
    TrainingArguments names (`{"attn_implementation": "eager", "gradient_checkpointing": True}`: `--hf`'s).
    `parts`: another tool's memory parts (plan.job.Parts: `{"loss_kernel": "chunked_output", "ckpt_every": 2}`).
    For objective grpo, a list of plan.grpo.GeneratingPlan (a generation batch by part, `time_s`,
    `memory_bytes`), with `completion_tokens` and `signal_share` (or both from a trial run's folder, `from_run`)
    in place of their upper bounds. The same functions `tunelab plan` prints from."""
    from .plan import hfstack
    from .plan.grpo import grpo_workload
    from .recipes.predict import PlanRequest, plan_config, plan_generating

    _, settings_of_hf = hfstack.parse(hf)
    if isinstance(config, TrainConfig) and settings_of_hf:
        from .errors import TunelabError

        raise TunelabError(f"hf: {', '.join(settings_of_hf)} are config settings; pass a config path or set them on it")
    cfg = _config(config, (*overrides, *settings_of_hf), settings)
    request = PlanRequest(
        gpu=gpu,
        gpus=gpus,
        examples=examples,
        mean_tokens=mean_tokens,
        loss_fraction=loss_fraction,
        tokenizer=tokenizer,
        stack=stack,
        price_per_hour=price_per_hour,
        hf=dict(hf or {}),
        parts=dict(parts or {}),
        grpo=grpo_workload(completion_tokens, signal_share, from_run),
    )
    return plan_generating(cfg, request) if cfg.objective.row.generates else plan_config(cfg, request)


def export(
    adapter: str | Path,
    out: str | Path,
    format: str = "gguf",
    *,
    model: str | None = None,
    quant: str = "bf16",
    dtype: str = "fp32",
) -> Path:
    """Write a trained run's adapter as `format`: `safetensors` (the merged model as an HF directory, in `dtype`),
    `gguf` (the merged model as one llama.cpp file, tensors in `quant`, with an Ollama Modelfile beside it) or
    `gguf-lora` (the adapter alone). `model`: the base, when not the one in the run's config.yaml. Returns what
    was written: the directory or the .gguf file."""
    from .commands.export import DTYPES, run_prompt
    from .model.export import export_gguf, export_gguf_lora, merge

    if format not in EXPORT_FORMATS:
        raise TunelabError(f"export format must be one of {', '.join(EXPORT_FORMATS)}; got {format!r}")
    adapter, out = Path(adapter), Path(out)
    if format == "safetensors":
        if dtype not in DTYPES:
            raise TunelabError(f"export dtype must be one of {', '.join(sorted(DTYPES))}; got {dtype!r}")
        return merge(adapter, out, model, DTYPES[dtype])
    write = export_gguf if format == "gguf" else export_gguf_lora
    return write(adapter, out, model, quant, run_prompt(adapter)).gguf


def _config(config: TrainConfig | str | Path | None, overrides: tuple[str, ...], settings: dict) -> TrainConfig:
    if isinstance(config, TrainConfig):
        if overrides or settings:
            raise TunelabError(
                "overrides and settings apply to a config file; pass the path, or change the TrainConfig"
            )
        return config
    return load_config(config, *overrides, **settings)


def _yaml_value(value: Any) -> str:
    """A Python value as the text of a `key=value` override (YAML reads it back as the same value)."""
    import yaml

    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
