"""TrainConfig -> the typed specs components take: the config is read here, components never see it whole."""

from __future__ import annotations

from . import objectives
from .config import TrainConfig
from .data.pipeline import DataSpec, HeldOutSpec, MixPart


def data_spec(cfg: TrainConfig) -> DataSpec:
    """What the data pipeline needs: the source (or mixture), its format and template, masking, the row length."""
    d = cfg.data
    mix = tuple(MixPart(m.path, m.weight, m.format or d.format, m.template or d.template) for m in d.mix)
    pairs = objectives.get(cfg.objective.name).pairs
    return DataSpec(
        d.path,
        d.format,
        d.template,
        d.train_on_inputs,
        cfg.batch.seq_len,
        d.max_examples,
        mix,
        cfg.run.seed,
        pairs=pairs,
    )


def held_out_spec(cfg: TrainConfig) -> HeldOutSpec | None:
    """The evaluation data, or None when the config holds none out."""
    if not cfg.eval.enabled:
        return None
    e = cfg.eval
    return HeldOutSpec(e.split, e.path, e.max_rows, cfg.run.seed)


def preference_spec(cfg: TrainConfig) -> objectives.PreferenceSpec | None:
    """The preference loss's settings, or None for an objective that trains on single sequences."""
    if not objectives.get(cfg.objective.name).pairs:
        return None
    p = cfg.objective.preference
    return objectives.PreferenceSpec(
        cfg.objective.name,
        p.beta,
        p.label_smoothing,
        cfg.objective.reference_kind(cfg.adapter.method),
        p.precompute_reference,
    )
