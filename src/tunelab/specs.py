"""TrainConfig -> the typed specs components take: the config is read here, components never see it whole."""

from __future__ import annotations

from .config import TrainConfig
from .data.pipeline import DataSpec


def data_spec(cfg: TrainConfig) -> DataSpec:
    """What the data pipeline needs: the file, its format and template, masking, and the row length."""
    d = cfg.data
    return DataSpec(d.path, d.format, d.template, d.train_on_inputs, cfg.seq_len, d.max_examples)
