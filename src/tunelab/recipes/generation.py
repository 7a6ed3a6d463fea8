"""The model and tokenizer a generation from the command line runs with: a base model, a trained adapter or a
checkpoint of a run, in the compute dtype. `tunelab eval` and `tunelab data pairs` share it, so on-policy pairs
are sampled from exactly the model eval scores."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import TunelabError
from ..eval.setup import Setup


def run_folder(adapter: Path, setup: Setup) -> Path:
    """The training run an adapter (RUN/adapter) or a checkpoint (RUN/checkpoints/step-N) belongs to."""
    return adapter.parent if setup.checkpoint_adapter is None else adapter.parent.parent


def trained_response_tokens(run: Path) -> int | None:
    """The longest response the run trained on (its summary.json), when recorded."""
    summary = run / "summary.json"
    try:
        value = json.loads(summary.read_text()).get("data", {}).get("response_tokens_max")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def load_checkpoint(model, folder: Path, adapter):
    """`model` built as training built it (`adapter`: the run's settings), with the checkpoint's trainable weights,
    packed for generation as a saved adapter is (model/adapters.load_adapter)."""
    from ..model.adapters import apply_adapter
    from ..model.lora_linear import pack_for_inference
    from ..train.checkpoint import load_weights, verify

    problem = verify(folder)
    if problem is not None:
        raise TunelabError(f"{folder}: not a complete checkpoint ({problem}); pick another under checkpoints/")
    model = apply_adapter(model, adapter)
    load_weights(folder, model)
    model.requires_grad_(False)
    pack_for_inference(model)
    return model


def tune(model, setup: Setup, adapter: str):
    """`model` (the base, loaded by `load_for_generation` without an adapter) with `adapter` on: a saved adapter or
    a run's checkpoint, as `load_for_generation` applies one."""
    from ..model.adapters import check_adapter, load_adapter

    if setup.checkpoint_adapter is not None:
        return load_checkpoint(model, Path(adapter), setup.checkpoint_adapter)
    check_adapter(Path(adapter))
    return load_adapter(model, adapter, setup.model)


def load_for_generation(setup: Setup, adapter: str | None, device, precision):
    """(model, tokenizer): `setup`'s base model in the compute dtype (bf16 on AMX CPUs: generation runs in the
    weights' dtype), with `adapter` (a saved adapter or a run's checkpoint) applied when given."""
    from ..model.adapters import check_adapter
    from ..model.load import load_model
    from ..sources import load_tokenizer, resolve

    if adapter and setup.checkpoint_adapter is None:
        check_adapter(Path(adapter))
    source = resolve(setup.model)
    tokenizer = load_tokenizer(source)
    model = load_model(source, precision.compute, "none", device)
    if setup.checkpoint_adapter is not None:
        model = load_checkpoint(model, Path(adapter), setup.checkpoint_adapter)
    elif adapter:
        from ..model.adapters import load_adapter

        model = load_adapter(model, adapter, setup.model)
    return model, tokenizer
